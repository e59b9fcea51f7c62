"""``--config FILE.yaml``: long options by their underscore names, plus the script, its args, ``env`` and ``strategy``
(fields of fleet's DistributedStrategy set over the program's own, carried to the workers in ``envvars.STRATEGY``)."""

from __future__ import annotations

import difflib
import reprlib
from typing import Mapping

import click

from launcher import envvars as ev
from launcher.cli import table
from launcher.host import files
from launcher.errors import LaunchError
from launcher.plan import strategy_fields

LIST_KEYS = tuple(r.name for r in table.ROWS if r.listed)  # a YAML list is joined with commas
EXTRA_KEYS = ("training_script", "training_script_args", "env", "strategy")
MAX_SIZE = 1 << 20  # a config of options is a few hundred bytes; a bigger file is the wrong one
SCALARS = (str, int, float, bool)  # YAML also makes dates, timestamps and bytes: refused, not guessed at
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60
_short.maxlevel = 2


def load(path: str, options: Mapping[str, click.Parameter]) -> dict:
    """The file's settings by option name, converted and checked with the options' own types."""
    data = read(path)
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
        elif name == "strategy":
            settings[name] = _strategy(value, where)
        elif name in options:
            settings[name] = convert(options[name], name, value, where)
        else:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else f"; valid keys: {', '.join(known)}."
            raise LaunchError(f"config file {path} has an unknown key {_short.repr(key)}{hint}")
    if settings.get("strategy"):
        settings["env"] = (*settings.get("env", ()), (ev.STRATEGY, strategy_fields.encode(settings["strategy"])))
    settings.pop("strategy", None)
    return settings


def read(path: str, what: str = "config file", option: str = "--config") -> dict:
    """The mapping in the YAML file at ``path`` (``what`` it is and the ``option`` that gave it, for the errors)."""
    import yaml

    try:
        raw = files.read_regular(path, MAX_SIZE)
    except FileNotFoundError:
        raise LaunchError(f"{what} {path} does not exist; check the path given to {option}.") from None
    except OSError as e:
        raise LaunchError(f"{what} {path} cannot be read ({e.strerror}); check its path and permissions.") from None
    except files.NotReadable as e:
        raise LaunchError(f"{what} {path} {e}; give {option} a YAML file of options (at most "
                          f"{files.size_text(MAX_SIZE)}).") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise LaunchError(f"{what} {path} is not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); save it as UTF-8.") from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise LaunchError(f"{what} {path} nests its values too deeply to read; a launcher config is a flat mapping of option names to values.") from None
    except yaml.reader.ReaderError as e:
        char = e.character if isinstance(e.character, int) else ord(e.character)
        raise LaunchError(f"{what} {path} holds a character YAML does not allow (U+{char:04X} at offset {e.position}); remove it.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise LaunchError(f"{what} {path} is not valid YAML{at} ({problem}); fix its syntax.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LaunchError(f"{what} {path} holds {_kind(data)}, not a mapping of option names to values.")
    return data


def convert(param: click.Parameter, name: str, value, where: str):
    """A YAML value for the option ``param``, checked and converted by the option's own type (LaunchError naming
    ``where``); also a tuning space's values (``launcher.cli.tune``)."""
    if isinstance(value, list) and name in LIST_KEYS:
        value = ",".join(_scalar_list(value, where))
    _check_scalar(value, where)
    is_bool = getattr(param, "is_flag", False) or param.type is click.BOOL
    if isinstance(value, bool) != is_bool:
        want = "true or false" if is_bool else param.type.name
        raise LaunchError(f"{where} expects {want}, not {_short.repr(value)}.")
    if isinstance(param.type, click.types.IntParamType) and isinstance(value, float):
        raise LaunchError(f"{where} expects a whole number, not {_short.repr(value)}.")
    try:
        return param.type.convert(value, param, None)
    except click.BadParameter as e:
        raise LaunchError(f"{where}: {e.message}") from None


def _strategy(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise LaunchError(f"{where} must be a mapping of DistributedStrategy fields to values, not {_kind(value)}.")
    return {str(k): strategy_fields.check(str(k), v, f"{where}: {k}") for k, v in value.items()}


def _env(value, where: str) -> tuple:
    if not isinstance(value, dict):
        raise LaunchError(f"{where} must be a mapping of variable names to values, not {_kind(value)}.")
    pairs = []
    for k, v in value.items():
        _check_env_name(k, where)
        _check_scalar(v, f"{where}: {k}")
        pairs.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
    return tuple(pairs)


def _check_env_name(name, where: str) -> None:
    """A name the kernel can pass on: text, not empty, without '=' or NUL."""
    if not isinstance(name, str):
        raise LaunchError(f"{where}: {_kind(name)} is not a variable name; put the name in quotes.")
    if not name:
        raise LaunchError(f"{where} has an empty variable name; give each variable a name.")
    for bad, what in (("=", "'='"), ("\0", "a NUL character")):
        if bad in name:
            raise LaunchError(f"{where}: the variable name {_short.repr(name)} contains {what}, which no variable name can hold; rename it.")


def _check_scalar(value, where: str) -> None:
    if isinstance(value, str) and "\0" in value:
        raise LaunchError(f"{where} has a NUL character in its value, which no argument, path or variable can hold; remove it.")
    if isinstance(value, SCALARS):
        return
    if isinstance(value, (list, dict)) or value is None:
        raise LaunchError(f"{where} must be a single value, not {_kind(value)}.")
    raise LaunchError(f"{where} is {_kind(value)}, not text, a number or true/false; put it in quotes to give it as text.")


def _scalar_list(value, where: str) -> list:
    if not isinstance(value, list):
        raise LaunchError(f"{where} must be a list of values, not {_kind(value)}.")
    for i, v in enumerate(value):
        _check_scalar(v, f"{where}: item {i + 1}")
    return [str(v) for v in value]


def _string(value, where: str) -> str:
    if not isinstance(value, str):
        raise LaunchError(f"{where} must be a path (a string), not {_kind(value)}.")
    return value


def _kind(value) -> str:
    """What a YAML value is, briefly: the type's name and a shortened repr."""
    if value is None:
        return "null (nothing)"
    name = type(value).__name__
    kind = {"date": "a date", "datetime": "a timestamp", "bytes": "binary data", "dict": "a mapping"}
    article = "an" if name[0] in "aeiou" else "a"
    return f"{kind.get(name, f'{article} {name}')} ({_short.repr(value)})"


def read_text(path: str, option: str) -> str:
    """A small text file a user names (a hostfile, an env file), or LaunchError naming ``option`` and the fix."""
    try:
        return files.read_regular(path, MAX_SIZE).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise LaunchError(f"{option} {path} does not exist; check the path.") from None
    except OSError as e:
        raise LaunchError(f"{option} {path} cannot be read ({e.strerror}); check its path and permissions.") from None
    except files.NotReadable as e:
        raise LaunchError(f"{option} {path} {e}; give a text file of at most {files.size_text(MAX_SIZE)}.") from None


def env_file(path: str) -> dict:
    """The variables of --env_file (DeepSpeed's .deepspeed_env form: NAME=VALUE a line)."""
    from launcher.plan.carried_env import parse_env_file

    return parse_env_file(read_text(path, "--env_file"), path)
