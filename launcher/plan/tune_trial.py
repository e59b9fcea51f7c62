"""What one trial of ``launcher tune`` runs, pure: the job's config (the same mapping ``--config`` takes: the launch
options, ``env``, ``strategy``, the script and its arguments), made of the launch given to ``tune`` with one point of
the space over it. Each trial runs ``python -m launcher --config`` of its own file, and the best one's file is what
``--out`` keeps: the config that runs the best trial is the one that ran it."""

from __future__ import annotations

from launcher.plan.tune_space import ARG, ENV, OPTION, STRATEGY, Space

def config(base: dict, space: Space, point: tuple) -> dict:
    """``base`` (the launch's settings, by config key, without the tuner's own) with the point's knobs over it."""
    out = dict(base)
    env, strategy = dict(out.pop("env", None) or {}), dict(out.pop("strategy", None) or {})
    args = list(out.get("training_script_args") or ())
    kinds = {k.name: k for k in space.knobs}
    for name, value in point:
        knob = kinds[name]
        if knob.kind == OPTION:
            out[knob.key] = value
        elif knob.kind == ENV:
            env[knob.key] = str(value).lower() if isinstance(value, bool) else str(value)
        elif knob.kind == STRATEGY:
            strategy[knob.key] = value
        elif knob.kind == ARG:
            args = with_argument(args, knob.key, value)
    out["training_script_args"] = args
    if env:
        out["env"] = env
    if strategy:
        out["strategy"] = strategy
    return out


def with_argument(args: list, flag: str, value) -> list:
    """The program's ``args`` with ``flag``'s value replaced (``--flag V`` or ``--flag=V``), else added at the end; a
    value of true is the flag alone, false leaves it out."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    out, i, found = [], 0, False
    while i < len(args):
        arg = args[i]
        if arg == flag or arg.startswith(flag + "="):
            takes_next = arg == flag and not isinstance(value, bool) and i + 1 < len(args) and not args[i + 1].startswith("-")
            i += 2 if takes_next else 1
            out += [] if found else _flag(flag, value, text)  # the first in its place, the others dropped
            found = True
            continue
        out.append(arg)
        i += 1
    return out if found else out + _flag(flag, value, text)


def _flag(flag: str, value, text: str) -> list:
    if isinstance(value, bool):
        return [flag] if value else []
    return [flag, text]


def to_yaml(settings: dict, header: str) -> str:
    """The config file's text: ``header`` as comment lines, then the settings."""
    import yaml

    comments = "".join(f"# {line}\n" for line in header.splitlines())
    return comments + yaml.safe_dump(settings, sort_keys=False, default_flow_style=False, allow_unicode=True)
