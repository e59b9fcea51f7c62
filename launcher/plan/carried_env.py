"""The environment a job started over ssh carries to every host: the command's own, less what describes this machine
or this login session, then the lines of an env file (DeepSpeed's ``.deepspeed_env`` form), then ``--env NAME=VALUE``;
the later wins. Values are carried exactly, as they are (spaces, quotes, ``$``, newlines). Pure.

What is not carried, and why, is one table (``DROPPED``): horovodrun drops ``BASH_FUNC_*``, ``OLDPWD`` and
``CUDA_VISIBLE_DEVICES``; the rest name this shell, this terminal's session, this login or this launcher's own
processes, and the remote login sets its own. The job's token (LAUNCHER_JOB_TOKEN), its id and every other variable
are carried. An env file or --env may still set a dropped name: what the user writes is carried.
"""

from __future__ import annotations

import re
from typing import Dict, Mapping, Sequence

from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.plan.hostfile import BOM

# (a name, or a prefix ending in *; why it is not carried)
DROPPED = (
    ("HOSTNAME", "this machine's name"),
    ("PWD", "this shell's directory: the remote launcher starts in the same directory and its shell sets PWD"),
    ("OLDPWD", "this shell's previous directory (horovodrun drops it too)"),
    ("SHLVL", "how deep this shell is nested"),
    ("_", "the last command this shell ran"),
    ("BASH_FUNC_*", "bash functions exported from this shell (horovodrun drops them too)"),
    ("SSH_*", "this login's own ssh session and agent (SSH_CONNECTION, SSH_TTY, SSH_AUTH_SOCK...): each host's sshd "
              "sets its own"),
    ("HOME", "the remote account's own: sshd sets it, and the account (or its home) may differ from this one"),
    ("USER", "the remote account's own, set by sshd (~/.ssh/config may log in as another user)"),
    ("LOGNAME", "the remote account's own, set by sshd"),
    ("MAIL", "this account's mailbox on this machine"),
    ("DISPLAY", "this machine's X display"),
    ("WAYLAND_DISPLAY", "this machine's Wayland display"),
    ("XAUTHORITY", "the key file of this machine's X display"),
    ("DBUS_SESSION_BUS_ADDRESS", "this login session's message bus"),
    ("XDG_RUNTIME_DIR", "this login session's runtime folder (/run/user/UID), made by this machine's logind"),
    ("XDG_SESSION_*", "this machine's login session"),
    ("XDG_SEAT", "this machine's seat"),
    ("XDG_VTNR", "this machine's virtual terminal"),
    ("TMUX*", "this machine's tmux server and pane"),
    ("STY", "this machine's screen session"),
    ("KRB5CCNAME", "this login's Kerberos ticket cache, a file of this machine"),
    ("CUDA_VISIBLE_DEVICES", "this machine's GPUs (horovodrun drops it too): each host's GPUs come from its own "
                             "facts, the hostfile's slots and --include/--exclude"),
    (ev.RUN_ID, "marks the processes of one node's launch on this machine; each node makes its own"),
    (ev.ELASTIC_ROUND, "a round of the elastic job this command may itself run in"),
    (ev.CONTROL_SOCKET, "a launcher's socket on this machine, given to its workers"),
    (ev.CONTROL_KEY, "the key of that socket"),
    (ev.PROGRESS_FD, "a file descriptor of a worker on this machine"),
    (ev.WARM_FD, "a file descriptor of a warm worker on this machine"),
    ("LAUNCHER_SPARE_FD", "a file descriptor of a spare worker on this machine (launcher.run.spare.FD_VAR)"),
)
DROPPED_NAMES = frozenset(name for name, _ in DROPPED if not name.endswith("*"))
DROPPED_PREFIXES = tuple(name[:-1] for name, _ in DROPPED if name.endswith("*"))

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FORM = "NAME=VALUE, the name of letters, digits and _ (not first a digit)"


def is_dropped(name: str) -> bool:
    """Whether the command's variable ``name`` describes this machine or session, and is not carried."""
    return name in DROPPED_NAMES or name.startswith(DROPPED_PREFIXES)


def carried(env: Mapping[str, str], file_env: Mapping[str, str], option_env: Mapping[str, str]) -> Dict[str, str]:
    """What every host's launcher gets: ``env`` (the command's) less the dropped names, then the env file's lines,
    then --env; the later wins."""
    return {**{k: v for k, v in env.items() if not is_dropped(k)}, **file_env, **option_env}


def parse_env_file(text: str, source: str) -> Dict[str, str]:
    """DeepSpeed's ``.deepspeed_env``: ``NAME=VALUE`` a line, split at the first ``=``, name and value stripped of
    the spaces around them (as DeepSpeed does); the value is taken as written, no shell: quotes and ``$`` stay.
    Blank lines and lines that start with ``#`` are skipped; a later line of a name wins."""
    env = {}
    for number, line in enumerate(text.removeprefix(BOM).split("\n"), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            name, equals, value = line.partition("=")
            env[_checked(name.strip(), equals, value.strip(), f"{source}:{number}")] = value.strip()
    return env


def parse_env_option(items: Sequence[str], option: str = "--env") -> Dict[str, str]:
    """Each ``--env NAME=VALUE``, split at the first ``=``, the value exactly as given; a later one of a name wins."""
    env = {}
    for item in items:
        name, equals, value = item.partition("=")
        env[_checked(name, equals, value, option)] = value
    return env


def _checked(name: str, equals: str, value: str, where: str) -> str:
    """``name``, refused where it is no variable name (never echoing the value, which may be a secret)."""
    if not equals:
        raise LaunchError(f"{where} has {name[:40]!r} with no '='; write {FORM}.")
    if not NAME.fullmatch(name):
        raise LaunchError(f"{where} sets {name[:40]!r}, which is not a variable name; write {FORM}.")
    if "\0" in value:
        raise LaunchError(f"{where} gives {name} a value with a NUL character, which no variable can hold; remove it.")
    return name
