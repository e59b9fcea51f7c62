"""``--hostfile``'s command: every host's launcher started over its own ssh session (``launcher.plan.over_ssh``) and
followed to the end from one event loop, with no thread of its own.

Two steps. The check: at most ``fanout`` sessions connect at once; each is sent the job's environment, and answers
with its host's facts, or fails with a reason (its ssh's exit and stderr, or no answer within twice the connect
timeout). The run: each session is sent its node's command line, then a beat every ``BEAT_EVERY`` seconds; the hosts' output is
relayed, each line behind its host's name (node 0's stdout, its first worker's, as it is); with --report_log, each
host reached over ssh is asked for its report log's new lines, kept in ``reports.nodeN.relayed.jsonl`` of the log dir
here (``launcher.output.report_log``; N: the node this command knows the session is). A signal to the command is
sent on as a stop: to node 0 in a fixed job (which stops every node, each once, with the one cause), else to
every host; a second one, or the hosts still running ``shutdown_timeout`` + ``STOP_SLACK``
seconds later, ends the ssh sessions themselves, and each host's launcher then stops by itself (its stdin ends).
Nothing is signalled but the ssh clients this command started.
"""

from __future__ import annotations

import os
import selectors
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from launcher.output.console import console
from launcher.output.report_log import ReportLog
from launcher.plan import over_ssh
from launcher.run.signals import SignalIntake

STOP_SLACK = 10.0  # seconds past the workers' shutdown_timeout that a host's launcher has to end after a stop
STDERR_KEPT = 8192  # bytes of a session's stderr kept before it answered the check, for the reason it failed


@dataclass(eq=False)
class Remote:
    """One host's ssh session and what came back on it."""

    node: int
    name: str
    command: list
    prefix: bytes
    proc: Optional[subprocess.Popen] = None
    started: float = 0.0
    facts: Optional[dict] = None
    failure: Optional[str] = None
    end: Optional[dict] = None  # its launcher's last line: {"end": code, "cause": {...} or None}
    outgoing: bytearray = field(default_factory=bytearray)
    partial: Dict[int, bytes] = field(default_factory=dict)
    stderr: bytearray = field(default_factory=bytearray)
    open_streams: int = 0
    ssh: bool = True  # reached over ssh (else run here without: it writes into this machine's log dir itself)
    relayed: Optional[ReportLog] = None  # where its relayed reports go (--report_log)

    @property
    def over(self) -> bool:
        """Its ssh client has exited and its output is read to the end."""
        return self.proc is not None and self.open_streams == 0 and self.proc.poll() is not None

    @property
    def answered(self) -> bool:
        return self.facts is not None


class FanOut:
    """Every host's session, from one event loop (``clock``: monotonic seconds)."""

    def __init__(self, remotes: Sequence[Remote], reach: over_ssh.Reach, fanout: int, stop_node_0_only: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.remotes = list(remotes)
        self.reach = reach
        self.key = secrets.token_hex(16)  # what the hosts' lines carry (over_ssh.read_line)
        self.stop_node_0_only = stop_node_0_only  # a fixed job: node 0 stops every node, each once, with one cause
        self.fanout = fanout
        self.answer_within = 2 * reach.connect_timeout
        self.clock = clock
        self.selector = selectors.DefaultSelector()
        self.signals: List[int] = []  # the stop signals received, in order
        self.next_beat = 0.0
        self.intake = SignalIntake()  # the launcher's own: a wakeup pipe the loop waits on, no work in a handler
        self.selector.register(self.intake.fd, selectors.EVENT_READ, None)

    # ---------------------------------------------------------------- the two steps

    def check(self, environment: bytes, probe: dict) -> bool:
        """Every host given the job's ``environment`` and asked ``probe`` (at most ``fanout`` connecting at once)
        until each answered or failed; False when a signal came first."""
        waiting = list(self.remotes)
        active: List[Remote] = []
        while waiting or active:
            while waiting and len(active) < self.fanout:
                remote = waiting.pop(0)
                self._start(remote)
                self._send(remote, environment + over_ssh.line(probe=probe))
                active.append(remote)
            deadline = min(r.started + self.answer_within for r in active)
            self._turn(max(0.0, min(deadline, self.next_beat) - self.clock()))
            if self.signals:
                return False
            for remote in [r for r in active if r.answered or self._failed(r)]:
                active.remove(remote)
            self._beat([r for r in self.remotes if r.answered])
        return True

    def run(self, runs: Dict[int, list], shutdown_timeout: float, report_dir: Optional[str] = None,
            config: Optional[str] = None) -> Optional[int]:
        """Every host sent its command line (``runs``: by node), followed until every session is over; the first
        signal received meanwhile (None without one). ``report_dir``: the log dir of --report_log, where each host
        over ssh has its reports relayed; ``config``: the text of the job's --config, which each host's launcher
        reads as its own (no host needs the file)."""
        for remote in self.remotes:
            run = {"argv": runs[remote.node], **({"config": config} if config is not None else {})}
            if report_dir is not None and remote.ssh:
                remote.relayed = ReportLog(report_dir, remote.node, relayed=True)
                run["reports"] = True  # the host's own report logs' lines
            self._send(remote, over_ssh.line(run=run))
        stop_by: Optional[float] = None
        told = 0
        while not all(r.over for r in self.remotes):
            wake = self.next_beat if stop_by is None else min(self.next_beat, stop_by)
            self._turn(max(0.0, min(wake - self.clock(), 1.0)))
            self._beat(self.remotes)
            if len(self.signals) > told:
                if told == 0:
                    for remote in self.remotes[:1] if self.stop_node_0_only else self.remotes:
                        self._send(remote, over_ssh.line(stop=self.signals[0]))
                    stop_by = self.clock() + shutdown_timeout + STOP_SLACK
                else:
                    self.end_sessions()
                told = len(self.signals)
            if stop_by is not None and self.clock() >= stop_by:
                self.end_sessions()
                stop_by = None
        return self.signals[0] if self.signals else None

    def end_sessions(self) -> None:
        """Every ssh client still running ended (SIGKILL to the process this command started): each host's launcher
        then sees its stdin end and stops its workers by itself."""
        for remote in self.remotes:
            if remote.proc is not None and remote.proc.poll() is None:
                remote.proc.kill()

    def close(self) -> None:
        """Every session's stdin closed (a host that was only checked ends there), waited for a moment, then ended."""
        for remote in self.remotes:
            if remote.proc is not None and remote.proc.stdin is not None:
                remote.proc.stdin.close()
        deadline = self.clock() + 5.0
        while any(r.proc is not None and not r.over for r in self.remotes) and self.clock() < deadline:
            self._turn(0.1)
        self.end_sessions()
        for remote in self.remotes:
            if remote.proc is not None:
                remote.proc.wait()
            if remote.relayed is not None:
                remote.relayed.close(self.clock())
        self.selector.close()
        self.intake.restore()
        self.intake.close()

    # ---------------------------------------------------------------- signals

    def catch_signals(self) -> None:
        """The stop signals noted (and the loop woken) instead of their default, as the launcher's own are."""
        self.intake.install()

    # ---------------------------------------------------------------- one session

    def _start(self, remote: Remote) -> None:
        remote.started = self.clock()
        try:
            remote.proc = subprocess.Popen(remote.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except OSError as e:
            remote.failure = f"its command could not start ({e.strerror}: {remote.command[0]})"
            return
        for stream in (remote.proc.stdout, remote.proc.stderr):
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream.fileno(), selectors.EVENT_READ, (remote, stream))
        remote.open_streams = 2
        os.set_blocking(remote.proc.stdin.fileno(), False)

    def _failed(self, remote: Remote) -> bool:
        """Whether ``remote`` failed the check (its failure then set)."""
        if remote.failure is not None:
            return True
        if remote.over:
            text = remote.stderr.decode(errors="replace")
            remote.failure = over_ssh.failure_reason(remote.proc.returncode, text, self.reach)
        elif self.clock() - remote.started >= self.answer_within:
            remote.failure = f"it did not answer within {self.answer_within:g} s"
            remote.proc.kill()
        return remote.failure is not None

    def _send(self, remote: Remote, data: bytes) -> None:
        if remote.proc is None or remote.proc.stdin is None or remote.proc.stdin.closed:
            return
        remote.outgoing += data
        self._flush(remote)

    def _flush(self, remote: Remote) -> None:
        stdin = remote.proc.stdin
        try:
            while remote.outgoing:
                written = os.write(stdin.fileno(), remote.outgoing)
                del remote.outgoing[:written]
        except BlockingIOError:
            pass
        except OSError:  # its session is gone: what is left is never read
            remote.outgoing.clear()

    def _beat(self, remotes: Sequence[Remote]) -> None:
        now = self.clock()
        if now < self.next_beat:
            return
        self.next_beat = now + over_ssh.BEAT_EVERY
        for remote in remotes:
            self._send(remote, over_ssh.line(beat=1))

    # ---------------------------------------------------------------- the loop

    def _turn(self, timeout: float) -> None:
        """One wait for output (or a signal), and what came read and relayed; pending input pushed on."""
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self.signals += [s for s in self.intake.received() if s in self.intake.stopping]
                continue
            remote, stream = key.data
            self._read(remote, stream)
        for remote in self.remotes:
            if remote.outgoing and remote.proc is not None:
                self._flush(remote)

    def _read(self, remote: Remote, stream) -> None:
        fd = stream.fileno()
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.selector.unregister(fd)
            rest = remote.partial.pop(fd, b"")
            if rest:
                self._line(remote, stream is remote.proc.stdout, rest + b"\n")
            remote.open_streams -= 1
            return
        lines = (remote.partial.pop(fd, b"") + chunk).split(b"\n")
        for line in lines[:-1]:
            self._line(remote, stream is remote.proc.stdout, line + b"\n")
        if lines[-1]:
            remote.partial[fd] = lines[-1][-over_ssh.MAX_LINE:]

    def _line(self, remote: Remote, is_stdout: bool, line: bytes) -> None:
        if is_stdout:
            fields = over_ssh.read_line(line, self.key)
            if fields is not None:
                if isinstance(fields.get("facts"), dict) and remote.facts is None:
                    remote.facts = fields["facts"]
                elif "end" in fields:
                    remote.end = fields
                elif "reports" in fields and remote.relayed is not None:
                    remote.relayed.relay(fields.get("reports"))
                return
        if not remote.answered:  # ssh's own words before the host answered: the reason, if it fails
            remote.stderr += line
            del remote.stderr[:-STDERR_KEPT]
            return
        bare = is_stdout and remote.node == 0
        console.write(1 if is_stdout else 2, line if bare else remote.prefix + line)
