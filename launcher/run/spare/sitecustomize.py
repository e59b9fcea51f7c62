"""The hook of a spare interpreter (see ``launcher/run/spare/__init__.py``): Python imports this file
while it starts up, because the spare's PYTHONPATH names this folder first. It waits here, at the
end of the interpreter's start-up, until the launcher sends the worker's environment on the
descriptor named by LAUNCHER_SPARE_FD; then it takes that environment, removes every trace of
itself, imports the real ``sitecustomize`` (if there is one) in its place, and returns: Python then
runs the worker's command line as it would have done in a fresh process.

End of file before a complete message (the job is over, or the launcher died) ends the
interpreter quietly. Standard library modules that are already loaded only: nothing else may be
imported here, since the script would see it.
"""

import os
import sys


def _wait_for_environment() -> dict:
    fd = int(os.environ["LAUNCHER_SPARE_FD"])  # launcher.run.spare.FD_VAR
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    data = b"".join(chunks)
    if not (data == b"\0" or data.endswith(b"\0\0")):  # no order, or a cut one
        os._exit(0)
    return dict(entry.split(b"=", 1) for entry in data[:-1].split(b"\0")[:-1])


def _become_the_worker() -> None:
    env = _wait_for_environment()
    os.environb.clear()
    os.environb.update(env)
    here = os.path.dirname(__file__)
    while here in sys.path:
        sys.path.remove(here)
    sys.path_importer_cache.pop(here, None)
    del sys.modules["sitecustomize"]


_become_the_worker()
# the real one, found now that this folder is gone; or ModuleNotFoundError, which site.py ignores, as
# in a fresh start. The import system then keeps whatever sys.modules holds for the name.
import sitecustomize  # noqa: E402,F401
