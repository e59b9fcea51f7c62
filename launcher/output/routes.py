"""Each worker's output made from where its streams go (launcher.plan.streams): its log file, followed
onto the console or not; pipes relayed to the console; or /dev/null. ``worker_output`` is the one
place that turns a worker's StreamRoute into the output object the supervisor drives."""

from __future__ import annotations

import os
from typing import Optional

from launcher.output.filtered import FilteredOutput
from launcher.output.lines import TAIL_LINES
from launcher.output.sinks import FileOutput, PipeOutput, WorkerOutput
from launcher.plan.streams import BOTH, ERR, NONE, OUT, StreamRoute


def worker_output(spec, log_fd: Optional[int], duplicates: tuple = ()) -> WorkerOutput:
    """The output of the worker of ``spec`` (a launcher.plan.model.WorkerSpec); ``log_fd``: its
    open log file (None without one). No route: the launcher's layout, the log file with local rank 0
    on the console, else pipes to the console. ``duplicates``: the plan's (launcher.plan.streams.Duplicate),
    for the streams that ``spec.duplicated`` names, which then reach the log file through the launcher."""
    output = _output(spec, log_fd)
    copied = [d for d in duplicates if d.stream & spec.duplicated] if log_fd is not None else []
    if not copied:
        return output
    try:
        return FilteredOutput(output, spec.label, copied)
    except OSError:
        output.finish()
        raise


def _output(spec, log_fd: Optional[int]) -> WorkerOutput:
    route = spec.route
    if route is None:
        return FileOutput(spec.log_file, log_fd, echo=spec.local_rank == 0) if log_fd is not None else PipeOutput(spec.label)
    prefix = f"[{spec.label}] ".encode()
    log = FileOutput(spec.log_file, log_fd, echo=bool(route.to_file & route.to_console), prefix=prefix) if route.to_file else None
    if route.to_file == BOTH:
        return log
    if route.to_file == NONE and route.to_console == BOTH:
        return PipeOutput(spec.label)
    return RoutedOutput(spec.label, route, log)


class RoutedOutput:
    """A worker whose two streams go to different places (torchrun's --redirects 1, a filtered rank):
    the log file's part through ``log``, the console's alone through pipes, the rest to /dev/null.
    The same methods as FileOutput and PipeOutput, each passed to the part it concerns."""

    def __init__(self, label: str, route: StreamRoute, log: Optional[FileOutput]) -> None:
        self.path = log.path if log else None
        self._route = route
        self._log = log
        self._pipes = PipeOutput(label) if route.to_console & ~route.to_file & BOTH else None
        dropped = BOTH & ~(route.to_file | route.to_console)
        self._null: Optional[int] = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC) if dropped else None

    @property
    def follows(self) -> bool:
        return self._log is not None and self._log.follows

    def child_fds(self):
        return self._fd_of(OUT, 0), self._fd_of(ERR, 1)

    def _fd_of(self, stream: int, index: int) -> int:
        if self._route.to_file & stream:
            return self._log.child_fds()[index]
        if self._route.to_console & stream:
            return self._pipes.child_fds()[index]
        return self._null

    def spawned(self) -> None:
        for part in self._parts():
            part.spawned()
        if self._null is not None:
            os.close(self._null)
            self._null = None

    def _parts(self) -> list:
        return [part for part in (self._log, self._pipes) if part is not None]

    def pipes(self):
        return self._pipes.pipes() if self._pipes else ()

    def wants(self, fd: int) -> bool:
        return self._pipes.wants(fd)

    def read_pipe(self, fd: int) -> bool:
        return self._pipes.read_pipe(fd)

    def follow(self) -> bool:
        return self._log.follow() if self._log else False

    def last_written(self) -> Optional[float]:
        times = [t for t in (part.last_written() for part in self._parts()) if t is not None]
        return max(times) if times else None

    def finish(self) -> None:
        for part in self._parts():
            part.finish()
        self.spawned()

    def catch_up(self) -> None:
        for part in self._parts():
            part.catch_up()

    def last_lines(self, n: int = TAIL_LINES) -> list:
        lines = [line for part in self._parts() for line in part.last_lines(n)]
        return lines[-n:]

    def bytes_written(self) -> int:
        return sum(part.bytes_written() for part in self._parts())
