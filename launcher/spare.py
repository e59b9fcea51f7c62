"""A spare interpreter: started ahead of a restart, it runs a worker's script in itself when told.

    python -u spare.py FD

It waits on descriptor FD for one JSON line from the launcher: the worker's environment, its
arguments (``argv``), whether it is a module (``-m``) and, with --log_dir, its log file. Then it
takes that environment, sends its output to the log file, and runs the script (or module) as
``__main__``, as ``python -u script args...`` would. So a restarted worker does not wait for an
interpreter to start. End of file on FD (the job is over) makes it exit quietly.

Standard library only; it must not import anything of the launcher, nor leave anything behind
that the script could see, except the ``runpy`` frames under the script's own in a traceback.
"""

import json
import os
import runpy
import sys


def main() -> None:
    fd = int(sys.argv[1])
    with os.fdopen(fd, "rb") as f:
        line = f.readline()
    if not line:
        os._exit(0)
    order = json.loads(line)
    os.environ.clear()
    os.environ.update(order["env"])
    if order.get("log"):
        out = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
    sys.argv = list(order["argv"])
    if order.get("module"):
        sys.path[0] = os.getcwd()
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
