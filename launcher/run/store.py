"""Node 0's store host: the workers' rendezvous store, started beside each attempt's workers, watched, stopped.

The launcher listens on MASTER_PORT itself from the start of the launch (``AgentStore.listen``), on
the socket that held the port since the plan: a rank that connects before the store host is up
waits in that socket's queue, not in the TCPStore client's back-off. Each attempt gets a store host
of its own (``launcher.runtime.store_host``, run with the workers' Python), handed that socket: torch's
keys carry no attempt, so a restart starts from an empty store, as a first start does. It is its
own process group, dies with the launcher (PDEATHSIG, the end of its standard input), and the
watchdog knows it; it is not one of the job's processes, so a job's end does not wait for it.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from launcher.errors import LaunchError
from launcher.host import preflight
from launcher.output.messages import log
from launcher.plan import policy
from launcher.plan.agent_store import StoreHostSpec

STORE_HOST_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "store_host.py")
RUN_FILE = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"  # no package import in that Python
NO_TORCH = 3  # launcher.runtime.store_host's exit codes (it imports nothing of the launcher)
CANNOT_LISTEN = 4


@dataclass
class StoreHost:
    """One attempt's store host process."""

    proc: subprocess.Popen
    returncode: Optional[int] = None
    told: bool = False  # its unexpected end was made an event already

    def ended(self) -> Optional[int]:
        """Its exit code once it has ended (not reaped, so that its pid stays its own), else None."""
        if self.returncode is None:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                self.returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        return self.returncode

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if self.ended() is None:
            self.proc.kill()  # it holds nothing worth a grace period
        self.proc.wait()


class AgentStore:
    """The store hosts of a launch (none where ``spec`` is None: then every method does nothing)."""

    def __init__(self, spec: Optional[StoreHostSpec], reserved: Sequence[socket.socket]) -> None:
        self.spec = spec
        self.reserved = reserved
        self.listener: Optional[socket.socket] = None
        self.host: Optional[StoreHost] = None

    def listen(self) -> None:
        """Listen on the store's port, on the socket that holds it (one bound now if none does)."""
        if self.spec is None:
            return
        port = self.spec.port
        held = [s for s in self.reserved if s.getsockname()[1] == port]
        self.listener = held[0] if held else preflight.reserve_port(self.spec.address, port)
        try:
            if self.listener is None:
                raise OSError("it is in use")
            self.listener.listen(socket.SOMAXCONN)
        except OSError as e:
            raise LaunchError(f"port {port} on {self.spec.address}, the rendezvous store's (MASTER_PORT), cannot be "
                              f"listened on ({e.strerror or e}); stop the program holding it, or choose another "
                              "--started_port (--master_port).") from None

    def start(self, env: dict, child_setup: Callable[[], None], tell_watchdog: Callable[[str], None]) -> None:
        """This attempt's store host, started (the watchdog told of it), unless its Python cannot be run."""
        if self.spec is None:
            return
        fd = self.listener.fileno()
        cmd = [self.spec.python, "-c", RUN_FILE, STORE_HOST_FILE, self.spec.address, str(self.spec.port), str(fd)]
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=(fd,),
                                    start_new_session=True, preexec_fn=child_setup)
        except OSError as e:  # the workers' Python cannot be run: they say so themselves
            log.debug("no store host: %s", e)
            return
        self.host = StoreHost(proc)
        tell_watchdog(f"pid {proc.pid}")
        log.debug("store host (pid %d) on %s:%d", proc.pid, self.spec.address, self.spec.port)

    def events(self, workers_running: bool) -> list:
        """A stop of the job when the store host ended while workers still need it; none for a Python without
        torch (its workers cannot use torch's store either)."""
        host = self.host
        if host is None or host.told or host.ended() is None or not workers_running:
            return []
        host.told = True
        if host.returncode == NO_TORCH:
            log.debug("the store host's Python cannot import torch; the workers go on without it")
            return []
        what = "could not listen" if host.returncode == CANNOT_LISTEN else f"ended ({policy.describe_exit(host.returncode)})"
        return [policy.StartFailed(0, f"the rendezvous store on {self.spec.address}:{self.spec.port} "
                                      f"(pid {host.proc.pid}) {what}")]

    def pids(self) -> set:
        return {self.host.proc.pid} if self.host is not None else set()

    def stop(self) -> None:
        """This attempt's store host, ended and reaped."""
        if self.host is not None:
            self.host.stop()
            self.host = None

    def close(self) -> None:
        self.stop()
        if self.listener is not None and self.listener not in self.reserved:
            self.listener.close()

