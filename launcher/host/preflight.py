"""Read-only looks at this machine: facts for the plan, and the checks made before anything starts."""

from __future__ import annotations

import glob
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
import uuid

from launcher.errors import LaunchError
from launcher.host import files
from launcher.plan.clusters.registry import FILE_VARIABLES
from launcher.plan.model import HostFacts, Interface, LaunchOptions, Plan


def probe_host(env=None, topology: bool = False) -> HostFacts:
    """This machine's facts; its CPU and GPU topology (sysfs) only when ``topology`` (a placement option asks)."""
    if topology:
        from launcher.host.topology import read_topology
    return HostFacts(
        gpu_count=count_gpus(),
        cpu_count=len(os.sched_getaffinity(0)),
        interfaces=tuple(interfaces()),
        python=sys.executable,
        run_id=uuid.uuid4().hex[:12],
        temp_dir=tempfile.gettempdir(),
        hostname=socket.gethostname(),
        env_files=tuple(_scheduler_files(env or {})),
        importable=importable(("torch", "paddle")),
        torch_version=installed_version("torch"),
        topology=read_topology() if topology else None,
    )


def importable(names) -> frozenset:
    """Those of ``names`` the launcher's own interpreter can import: found on its path, not imported."""
    import importlib.util

    found = set()
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                found.add(name)
        except (ImportError, ValueError):
            continue
    return frozenset(found)


def installed_version(name: str):
    """The version of the package ``name`` the launcher's own interpreter would import, from its
    package metadata (the ``NAME-VERSION.dist-info`` folder beside it), never imported; None if not found."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in {os.path.dirname(p) for p in places}:
        for found in glob.glob(os.path.join(glob.escape(folder), f"{name}-*.dist-info")):
            version = os.path.basename(found)[len(name) + 1:-len(".dist-info")]
            if version:
                return version
    return None


def _scheduler_files(env) -> list:
    """(path, text) of each file a scheduler's variable names (LSF's rank file), for the plan; unreadable ones are left out."""
    found = []
    for name in FILE_VARIABLES:
        path = env.get(name, "").strip()
        try:
            with files.open_regular(path) as f:  # a FIFO would block the launcher
                found.append((path, f.read(16 * 1024 * 1024).decode("utf-8", "replace")))
        except (OSError, ValueError):  # files.NotReadable is a ValueError
            continue
    return found


def count_gpus(proc: str = "/proc", dev: str = "/dev"):
    """NVIDIA GPUs the driver reports, without loading CUDA; None when none can be detected (``proc``, ``dev``: where
    procfs and the device files are, a fake tree in tests)."""
    found = glob.glob(os.path.join(proc, "driver/nvidia/gpus/*")) or glob.glob(os.path.join(dev, "nvidia[0-9]*"))
    return len(found) or None


def interfaces():
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                yield Interface(name, a.address.split("%")[0], a.netmask)


class PortFinder:
    """For the plan: ``count`` distinct ports free on this node's ``ip``. The first (rank 0's store)
    stays reserved in ``held`` until the job ends; see ``reserve_port``. ``check_limits(count)``
    first makes room for a socket per port (the descriptors ``count`` workers will need)."""

    def __init__(self, host: HostFacts, check_limits=lambda count: None) -> None:
        self.host = host
        self.held: list = []
        self.check_limits = check_limits

    def __call__(self, ip: str, count: int) -> list:
        check_node_ip(ip, self.host)
        self.check_limits(count)
        socks = bind_free_ports(ip, count)
        ports = [s.getsockname()[1] for s in socks]
        for s in socks[1:]:
            s.close()
        self.held += socks[:1]
        return ports


def port_finder(host: HostFacts, check_limits=lambda count: None) -> PortFinder:
    return PortFinder(host, check_limits)


def find_free_ports(ip: str, count: int) -> list:
    """``count`` distinct ports free on ``ip`` right now (nothing held)."""
    socks = bind_free_ports(ip, count)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def bind_free_ports(ip: str, count: int) -> list:
    """``count`` sockets bound to distinct free ports of ``ip``, not listening. SO_REUSEADDR is set
    after the bind, so that the kernel picks ports nobody holds, and a store can bind them later."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(_family(ip), socket.SOCK_STREAM)
            socks.append(s)
            s.bind((ip, 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return socks
    except OSError:
        for s in socks:
            s.close()
        return []


def reserve_port(ip: str, port: int):
    """Hold ``port`` so that nothing else takes it before rank 0's store binds it, or None.

    The socket is bound with SO_REUSEADDR and never listens: torch's TCPStore (which sets
    SO_REUSEADDR too) binds and listens on the port all the same, while a bind without
    SO_REUSEADDR, and the kernel choosing a port for an outgoing connection, keep off it. Not kept
    off: any other program that sets SO_REUSEADDR (tests/integration/test_checks.py pins both).
    """
    try:
        return _bound(ip, port)
    except OSError:
        return None


def _bound(ip: str, port: int) -> socket.socket:
    """A socket bound to ``port`` on ``ip`` (its first address) with SO_REUSEADDR, not listening; OSError if not."""
    addresses = [ip] if is_ip(ip) else (_resolve(ip)[:1] or [ip])
    s = socket.socket(_family(addresses[0]), socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addresses[0], port))
        return s
    except OSError:
        s.close()
        raise


def reserve_store_port(plan: Plan) -> list:
    """The socket that holds the rendezvous store's port until the launch takes it ([] where this node
    hosts no store, or the port cannot be held now: the store's own listen then says why)."""
    if plan.store_port is None:
        return []
    held = reserve_port(plan.node_ip, plan.store_port)
    return [held] if held is not None else []


def check(plan: Plan, opts: LaunchOptions, host: HostFacts) -> None:
    """Refuse, with one sentence, anything that would make the job fail right after it starts."""
    check_script(plan, opts)
    check_node_ip(plan.node_ip, host)
    for port in plan.ports:
        _check_port(plan.node_ip, port)
    if plan.monitor is not None:
        check_monitor(*plan.monitor)


def check_monitor(host: str, port: int) -> None:
    """--monitor_port can be served: prometheus_client is there, and the port is free on ``host``."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise LaunchError("--monitor_port needs prometheus_client: pip install 'launcher[monitor]' "
                          "(or pip install prometheus_client).") from None
    _check_port(host, port, lambda e: monitor_refused(host, port, e))


def monitor_refused(host: str, port: int, e: OSError) -> LaunchError:
    return LaunchError(f"--monitor_port {port} cannot listen on {host} ({e.strerror or e}); give a free port, "
                       "or 0 for any.")


ELF_MAGIC = b"\x7fELF"
PYTHON_RUNNERS = ("uv", "uvx", "pipx")  # #! programs that run a Python script (besides python*, pypy*)
SHELL_SUFFIXES = (".sh", ".bash", ".zsh", ".ksh")


def check_script(plan: Plan, opts: LaunchOptions) -> None:
    """The script can be run the way the workers will run it."""
    _check_script(opts, plan.base_env.get("PATH", os.defpath))


def _check_script(opts: LaunchOptions, path_var: str) -> None:
    """The script can be run the way the workers will run it (``path_var``: the workers' PATH)."""
    if opts.module:
        return  # a module is found by the worker's interpreter, with its own sys.path
    if opts.no_python:
        _check_executable(opts.training_script, path_var)
    else:
        _check_python_script(opts.training_script)


def _check_executable(script: str, path_var: str) -> None:
    """``script`` is what exec finds and the kernel can start: a path with a slash, or a command on PATH."""
    if "/" not in script:
        found = shutil.which(script, path=path_var)
        if found is None and os.path.isfile(script):
            raise LaunchError(f"training script {script} is not a command on PATH, and exec runs a file of the current folder only by its path; write ./{script}.")
        if found is None:
            raise LaunchError(f"training script {script} is not a command on PATH; give the path to the program, or drop --no_python to run a Python script.")
        script = found
    elif not os.path.isfile(script):
        what = "is a folder, not a program" if os.path.isdir(script) else \
            "is not a regular file" if os.path.exists(script) else "does not exist"
        raise LaunchError(f"training script {script} {what}; check the path (relative paths start from {os.getcwd()}).")
    if not os.access(script, os.X_OK):
        raise LaunchError(f"training script {script} is not executable; run chmod +x {script}, or drop --no_python to run it with Python.")
    head = _head(script)
    if head.startswith(ELF_MAGIC):
        return
    if not head.startswith(b"#!"):
        raise LaunchError(f"training script {script} has no #! line, so the system cannot run it as a program; add one as its first line (such as #!/bin/sh), or drop --no_python to run it with Python.")
    words = _shebang(head).split()
    interpreter = words[0] if words else ""
    if not (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):
        raise LaunchError(f"training script {script} names {interpreter or 'no interpreter'} in its #! line, which is not an executable file on this machine; fix that line.")


def _check_python_script(script: str) -> None:
    if os.path.isdir(script):
        if os.path.isfile(os.path.join(script, "__main__.py")):
            return  # python runs a folder's __main__.py
        raise LaunchError(f"training script {script} is a folder without __main__.py; give the Python file to run.")
    if not os.path.isfile(script):
        raise LaunchError(f"training script {script} does not exist; check the path (relative paths start from {os.getcwd()}).")
    head = _head(script)
    if head.startswith(ELF_MAGIC):
        raise LaunchError(f"training script {script} is a compiled program, not a Python script; add --no_python to run it as a program.")
    shebang = _shebang(head)
    if shebang and not _runs_python(shebang):
        raise LaunchError(f"training script {script} is a script for {shebang} (its #! line), not Python; add --no_python to run it as a program.")
    if not head.startswith(b"#!") and script.endswith(SHELL_SUFFIXES):
        raise LaunchError(f"training script {script} looks like a shell script, not Python; add --no_python to run it as a program, and a #! line such as #!/bin/bash as its first line.")


def _runs_python(shebang: str) -> bool:
    """Whether a #! line runs Python: /usr/bin/python3, /usr/bin/env python, env -S uv run --script, ..."""
    words = shebang.split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    name = os.path.basename(words[0]) if words else ""
    return name.startswith(("python", "pypy")) or name in PYTHON_RUNNERS


def _head(path: str) -> bytes:
    """The first bytes of a file: enough for its magic number or its #! line."""
    try:
        with open(path, "rb") as f:
            return f.read(256)
    except OSError as e:
        raise LaunchError(f"training script {path} cannot be read ({e.strerror}); check its permissions.") from None


def _shebang(head: bytes) -> str:
    """The interpreter and its arguments from a #! line ('' when there is none)."""
    if not head.startswith(b"#!"):
        return ""
    return head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def is_local_address(ip: str, host: HostFacts) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return addr.is_loopback or any(ipaddress.ip_address(i.address) == addr for i in host.interfaces)


def check_node_ip(node_ip: str, host: HostFacts) -> None:
    """``node_ip`` is an address of this machine (also checked before an MPI job gathers its node list)."""
    if is_local_address(node_ip, host) or any(is_local_address(a, host) for a in _resolve(node_ip)):
        return
    mine = ", ".join(sorted({i.address for i in host.interfaces})) or "none found"
    raise LaunchError(f"--node_ip {node_ip} is not an address of this machine (its addresses: {mine}); give this node's own address.")


def _resolve(name: str) -> list:
    try:
        return [info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)]
    except (socket.gaierror, UnicodeError):
        return []


def _family(ip: str) -> int:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def _check_port(ip: str, port: int, refused=None) -> None:
    """``port`` can be bound on ``ip``; else LaunchError (``refused(e)``'s, or one naming the holder)."""
    error = port_taken(ip, port)
    if error is None:
        return
    if refused is not None:
        raise refused(error)
    holder = _port_holder(port)
    who = f" by {holder}" if holder else ""
    raise LaunchError(f"port {port} on {ip} is already in use{who} ({error.strerror}); stop that process or choose another --started_port.")


def port_taken(ip: str, port: int):
    """The error a bind of ``port`` on ``ip`` meets now (an OSError), or None when it can be bound: a bind with
    SO_REUSEADDR, as a store's, so a port in TIME_WAIT or held by ``reserve_port`` is free."""
    try:
        _bound(ip, port).close()
    except OSError as e:
        return e
    return None


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _port_holder(port: int):
    """'pid N (command)' of the process listening on ``port``, when it can be found."""
    holder = port_holder(port)
    return f"pid {holder[0]} ({holder[1]})" if holder else None


def port_holder(port: int):
    """(pid, command) of the process listening on ``port``, when it can be found; else None."""
    import psutil

    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return None
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            return c.pid, command_of(c.pid)
    return None


def command_of(pid: int) -> str:
    """A process's command line in one line of at most 200 characters (its name where that is empty), '?' where it
    cannot be read."""
    import psutil

    try:
        text = " ".join(" ".join(psutil.Process(pid).cmdline()).split()) or psutil.Process(pid).name()
    except psutil.Error:
        return "?"
    return text if len(text) <= 200 else text[:197] + "..."
