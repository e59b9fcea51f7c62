"""The launcher's side of the watchdog (``launcher.run.watchdog``): start it, tell it of each
worker and of the cgroup, notice once if it died, and let it quit at the end."""

from __future__ import annotations

import os
import subprocess
from contextlib import suppress
from typing import Optional

from launcher.output.messages import log
from launcher.run.starter import ProcessStarter

WATCHDOG_QUIT_WAIT = 2.0


class WatchdogLink:
    def __init__(self) -> None:
        self.process: Optional[subprocess.Popen] = None
        self.lost = False
        self.done = False  # told to quit: its exit is expected

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process is not None else None

    def start(self, starter: ProcessStarter, run_id: str, grace: float, cgroup_path: Optional[str]) -> None:
        self.process = starter.start_watchdog(run_id, grace)
        if cgroup_path is not None:
            self.tell(f"cgroup {cgroup_path}")

    def tell(self, line: str) -> None:
        if self.process is None or self.lost:
            return
        try:
            self.process.stdin.write(f"{line}\n".encode())
            self.process.stdin.flush()
        except (OSError, ValueError):
            self.check()

    def check(self) -> None:
        """Once the watchdog is gone, say so once and go on: the job is not its to lose."""
        if self.process is None or self.lost or self.done:
            return
        try:
            info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            info = True
        if info is None:
            return
        self.lost = True
        self.process.returncode = 0
        log.warning("the watchdog (pid %d) died: protection against kill -9 of the launcher is gone; "
                    "the job goes on", self.process.pid)

    def stop(self) -> None:
        if self.process is None:
            return
        if not self.lost:
            self.tell("quit")
        self.done = True
        with suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(WATCHDOG_QUIT_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        except ChildProcessError:
            pass
