"""Records everything a worker could see of how it was started, per attempt, then raises.

    twin.py DIR [ARGS...]      (also as a module: -m twin, with this folder on PYTHONPATH)

Nothing is imported before the first facts are taken (the modules already loaded are one of
them). DIR/<attempt>.rec gets a repr() of a dict (no json: a local json.py may shadow it); the
atexit handler and a thread each add DIR/<attempt>.<where>.pickle (a __main__ class pickled after
the main body); then the body raises, so the log has its traceback.
"""

facts = {
    "modules": sorted(__import__("sys").modules),
    "json_loaded": "json" in __import__("sys").modules,
    "globals": sorted(globals()),
    "builtins": type(__builtins__).__name__,
    "file": __file__,
    "cached": __cached__,
    "loader": type(__loader__).__name__,
    "spec": __spec__ and (__spec__.name, __spec__.origin, type(__spec__.loader).__name__),
}

import os  # noqa: E402
import sys  # noqa: E402

facts.update({
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "flags": repr(sys.flags),
    "importer_cache": list(sys.path_importer_cache), "main_is_me": sys.modules["__main__"].__dict__ is globals(),
    "frame_back": sys._getframe().f_back is not None, "cwd": os.getcwd(), "umask": os.umask(0o22),
    "env": dict(os.environ), "fds": sorted(os.listdir("/proc/self/fd")),
    "stdout": (sys.stdout.seekable(), sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding),
    "stdin": (sys.stdin.seekable(), sys.stdin.isatty(), sys.stdin.encoding),
    "excepthook": sys.excepthook is sys.__excepthook__,
})
with open("/proc/self/cmdline", "rb") as f:
    facts["cmdline"] = f.read()
with open("/proc/self/stat") as f:  # when this process was created, and now (clock ticks since boot)
    facts["started_ticks"] = int(f.read().rsplit(")", 1)[1].split()[19])
facts["now_ticks"] = __import__("time").clock_gettime(__import__("time").CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")

import atexit  # noqa: E402
import pickle  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402

facts["signals"] = {s.name: repr(signal.getsignal(s)) for s in signal.valid_signals() if s < signal.SIGRTMIN}
facts["blocked"] = sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))
facts["limits"] = {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")}
facts["sibling"] = __import__("sibling").WHERE if os.path.exists(os.path.join(sys.path[0], "sibling.py")) else None
import json  # noqa: E402

facts["json_is_local"] = getattr(json, "LOCAL", False)

folder = sys.argv[1]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
facts["restart"] = (attempt, os.environ["PADDLE_RESTART_COUNT"])
facts["site_saw"] = getattr(__builtins__, "SITE_SAW", None)  # set by a sitecustomize of the test's, if any


class Thing:
    pass


def pickled(where):
    data = pickle.dumps(Thing())  # fails where __main__ is not this module any more
    with open(os.path.join(folder, f"{attempt}.{where}.pickle"), "wb") as f:
        f.write(data)


def after_the_body():
    for _ in range(3000):  # bounded: 30 s
        if not threading.main_thread().is_alive():
            break
        threading.Event().wait(0.01)
    pickled("thread")


threading.Thread(target=after_the_body).start()
atexit.register(pickled, "atexit")
with open(os.path.join(folder, f"{attempt}.rec"), "w") as f:
    f.write(repr(facts))


def fail():
    raise RuntimeError(f"attempt {attempt} fails")


fail()
