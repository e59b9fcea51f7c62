"""The state file's records of a launch (--log_dir only): its phase, attempt and processes, for
``launcher status``; writing one never fails the launch."""

from __future__ import annotations

import os
from typing import Callable, Optional

from launcher.output import state_file
from launcher.plan import admission
from launcher.plan.model import Plan
from launcher.run.starter import Clock

STATE_INTERVAL = 0.2  # the state file is rewritten at most this often while a stop ends workers


class Records:
    def __init__(self, plan: Plan, run_id: str, clock: Clock) -> None:
        self.plan = plan
        self.run_id = run_id
        self.clock = clock
        self.state = state_file.Writer(state_file.path_for(plan.log_dir, plan.node_rank)) if plan.log_dir else None
        self.started_wall = clock.time()
        self._processes: tuple = ()  # the last attempt's, as the state file shows them
        self._attempt = 0
        self.rounds: Optional[tuple] = None  # an elastic job's rounds on this node, in a line each
        self.health: Callable[[], dict] = dict  # node -> {check: (state, reason)}, where this node judges them
        self._phase = ""
        self._recorded = 0.0  # when the state file was last written (clock.monotonic())
        self.kept = self.state is not None or plan.monitor is not None  # the state file, or the monitor's /status.json
        self._exit_code: Optional[int] = None
        self._me = (state_file.this_host(), os.getpid(), state_file.process_start(os.getpid())) if self.kept else None

    def record_processes(self, snapshot: Callable[[], tuple], attempt: int) -> None:
        """The state file shows the processes ``snapshot()`` gives (``WorkerGroup.snapshot``) as they are now."""
        if self.kept:
            self._processes = snapshot()
            self.record("running", attempt=attempt)

    def record(self, phase: str, exit_code: Optional[int] = None, attempt: Optional[int] = None,
               console: Optional[str] = None) -> None:
        """Rewrite the state file (--log_dir only): "running", "restarting" or "ended"; never fails.
        ``console``: what the console dropped unread, in a sentence (``Console.note``)."""
        if not self.kept:
            return
        self._attempt = self._attempt if attempt is None else attempt
        self._phase = phase
        self._exit_code = exit_code
        self._recorded = self.clock.monotonic()
        if self.state is not None:
            self.state.write(self.current(console))

    def current(self, console: Optional[str] = None) -> state_file.NodeState:
        """The node's state as the state file shows it (also without --log_dir, when ``kept`` for the monitor)."""
        plan = self.plan
        host, pid, start = self._me
        return state_file.NodeState(
            node=plan.node_rank, node_ip=plan.node_ip, nodes=len(plan.node_ips), host=host,
            run_id=self.run_id, launcher_pid=pid, launcher_start=start,
            attempt=self._attempt, max_restarts=plan.max_restarts, phase=self._phase or "running",
            exit_code=self._exit_code, started=self.started_wall, updated=self.clock.time(), processes=self._processes,
            console=console, rounds=self.rounds[-state_file.ROUNDS_KEPT:] if self.rounds else None,
            health=admission.lines(self.health(), state_file.ROUNDS_KEPT) or None)

    def due(self) -> bool:
        return self.clock.monotonic() - self._recorded >= STATE_INTERVAL

    def close(self) -> None:
        if self.state is not None and self.state.written and self._phase != "ended":
            self.record("ended")  # ended by an error: the launcher says which on its console
