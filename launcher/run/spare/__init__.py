"""Spare interpreters: a Python worker of the next attempt, started ahead and waiting at the end of
its interpreter's start-up, so that a restart does not wait for interpreters to start.

A spare is the worker's own command line (``python -u script.py args`` or ``python -u -m module
args``), started with the environment the worker will have, plus two variables: PYTHONPATH with
this folder first, so that Python's start-up imports the hook ``sitecustomize.py`` here, and
LAUNCHER_SPARE_FD, the descriptor it waits on. When woken, it is sent the worker's environment
(``message``); the hook takes it and removes every trace of itself, and Python goes on as in a
fresh process: the script's ``__main__``, ``sys.path``, ``sys.argv``, ``/proc/self/cmdline``,
traceback and imported modules are Python's own. Only what the kernel keeps of the process from
its start differs: ``/proc/PID/environ`` (the environment it was started with) and its start time.
"""

import os

FD_VAR = "LAUNCHER_SPARE_FD"  # the hook reads this name too
HOOK_DIR = os.path.dirname(os.path.abspath(__file__))


def can_wait(cmd) -> bool:
    """Whether ``cmd`` is a Python worker as the plan writes it (``python -u ...``): only such a
    command runs the hook; any other would run at once."""
    return len(cmd) >= 3 and cmd[1] == "-u" and os.path.basename(cmd[0]).startswith("python")


def waiting_env(env: dict, fd: int) -> dict:
    """The environment a spare starts with: the worker's, plus the hook's two variables."""
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": HOOK_DIR + (os.pathsep + path if path else ""), FD_VAR: str(fd)}


def message(env: dict) -> bytes:
    """What wakes a spare: the worker's environment, each ``NAME=value`` ended by NUL, then a NUL."""
    return b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items()) + b"\0"
