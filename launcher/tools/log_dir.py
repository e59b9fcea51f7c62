"""A job's log dir as the tools read it: its listing, and every node's state file, each problem a
clear LaunchError. The writer side is ``launcher.output.state_file``; nothing here writes."""

from __future__ import annotations

import os

from launcher.errors import LaunchError
from launcher.host import files
from launcher.output import state_file as state

STATE_LIMIT = 64 << 20  # a state file is about 150 bytes a process: 64 MiB is 400,000 of them


def read_states(log_dir: str) -> list:
    """Every node's state in ``log_dir``, by node; a clear LaunchError for a missing folder or a bad file."""
    names = [name for name in listing(log_dir) if state.is_state_file(name)]  # a few among thousands of logs
    return [_read_state(os.path.join(log_dir, name)) for name in sorted(names, key=_node_of)]


def listing(log_dir: str) -> list:
    """What ``log_dir`` holds; a clear LaunchError when it cannot be listed."""
    try:
        return os.listdir(log_dir)
    except FileNotFoundError:
        raise LaunchError(f"{log_dir} does not exist; give the --log_dir of the job.") from None
    except NotADirectoryError:
        raise LaunchError(f"{log_dir} is not a folder; give the --log_dir of the job.") from None
    except OSError as e:
        raise LaunchError(f"cannot read {log_dir} ({e.strerror}); give a --log_dir you can read.") from None


def _node_of(name: str) -> tuple:
    number = name[len(state.PREFIX):-len(state.SUFFIX)]
    return (not number.isdigit(), int(number) if number.isdigit() else 0, name)


def _read_state(path: str) -> state.NodeState:
    try:
        data = files.read_regular(path, STATE_LIMIT)
    except OSError as e:
        raise LaunchError(f"cannot read {path} ({e.strerror}).") from None
    except files.NotReadable as e:
        raise LaunchError(f"{path} {e}, so it is no launcher state file; remove it, or start the job again "
                          f"with this --log_dir, which rewrites it.") from None
    try:
        return state.from_json(data)
    except ValueError as e:
        raise LaunchError(f"{path} is not a launcher state file ({e}); remove it, or start the job again "
                          f"with this --log_dir, which rewrites it.") from None


def job_over(s: state.NodeState, liveness: str) -> bool:
    return s.phase == "ended" or liveness == "gone"
