"""``--config FILE.yaml``: long options by their underscore names, plus the script, its args and ``env``."""

from __future__ import annotations

import difflib
from typing import Mapping

import click

from launcher.errors import LaunchError

LIST_KEYS = ("cluster_node_ips", "selected_gpus")  # a YAML list is joined with commas
EXTRA_KEYS = ("training_script", "training_script_args", "env")


def load(path: str, options: Mapping[str, click.Parameter]) -> dict:
    """The file's settings by option name, converted and checked with the options' own types."""
    data = _read(path)
    known = sorted(set(options) | set(EXTRA_KEYS))
    settings = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        where = f"config file {path}: {key}"
        if name == "env":
            settings[name] = _env(value, where)
        elif name == "training_script_args":
            settings[name] = tuple(_scalar_list(value, where))
        elif name == "training_script":
            settings[name] = _string(value, where)
        elif name in options:
            settings[name] = _convert(options[name], name, value, where)
        else:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else f"; valid keys: {', '.join(known)}."
            raise LaunchError(f"config file {path} has an unknown key {key!r}{hint}")
    return settings


def _read(path: str) -> dict:
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise LaunchError(f"config file {path} does not exist; check the path given to --config.") from None
    except OSError as e:
        raise LaunchError(f"config file {path} cannot be read ({e.strerror}); check its permissions.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise LaunchError(f"config file {path} is not valid YAML{at} ({problem}); fix its syntax.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LaunchError(f"config file {path} holds a {type(data).__name__}, not a mapping of option names to values.")
    return data


def _convert(param: click.Parameter, name: str, value, where: str):
    if isinstance(value, list) and name in LIST_KEYS:
        value = ",".join(_scalar_list(value, where))
    if isinstance(value, (list, dict)) or value is None:
        raise LaunchError(f"{where} must be a single value, not {_kind(value)}.")
    is_bool = getattr(param, "is_flag", False) or param.type is click.BOOL
    if isinstance(value, bool) != is_bool:
        want = "true or false" if is_bool else param.type.name
        raise LaunchError(f"{where} expects {want}, not {value!r}.")
    try:
        return param.type.convert(value, param, None)
    except click.BadParameter as e:
        raise LaunchError(f"{where}: {e.message}") from None


def _env(value, where: str) -> tuple:
    if not isinstance(value, dict):
        raise LaunchError(f"{where} must be a mapping of variable names to values, not {_kind(value)}.")
    pairs = []
    for k, v in value.items():
        if isinstance(v, (list, dict)) or v is None:
            raise LaunchError(f"{where}: {k} must be a single value, not {_kind(v)}.")
        pairs.append((str(k), str(v).lower() if isinstance(v, bool) else str(v)))
    return tuple(pairs)


def _scalar_list(value, where: str) -> list:
    if not isinstance(value, list) or any(isinstance(v, (list, dict)) or v is None for v in value):
        raise LaunchError(f"{where} must be a list of values, not {_kind(value)}.")
    return [str(v) for v in value]


def _string(value, where: str) -> str:
    if not isinstance(value, str):
        raise LaunchError(f"{where} must be a path (a string), not {_kind(value)}.")
    return value


def _kind(value) -> str:
    return "nothing" if value is None else f"a {type(value).__name__} ({value!r})"
