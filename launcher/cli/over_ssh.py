"""A host's launcher under ``--hostfile``'s command (``python -m launcher.cli.over_ssh``, which that command's ssh
session runs in the command's working directory): it answers the check with this host's facts, then runs the job the
command sends, a node of an ordinary job, with the command's environment, and ends with the job's exit code and root
cause. Its stdin is its lifeline (``launcher.run.lifeline``): a stop, its end or its silence stops the workers. With
--report_log, the command may ask for the report logs' new lines (the run's ``reports``): a thread relays those of
every report log this host's launcher writes (``launcher.output.report_log.OwnLines``) every ``RELAY_EVERY`` seconds,
and the last ones before the end.

The environment (taken before this module was imported: ``launcher.plan.over_ssh.remote_command``) and the command
line arrive on stdin, so that neither is on any process's command line; the lifeline is moved off descriptor 0
first, so that no child ever reads it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from contextlib import contextmanager, suppress

from launcher.plan import over_ssh, report_lines
from launcher.run import lifeline

BAD_REQUEST = 2


def main() -> None:
    from launcher.output import standard_streams

    reader = lifeline.LineReader(_lifeline_fd())
    standard_streams.open_standard_streams()
    request = _next_request(reader)
    if request is None or not isinstance(request.get("probe"), dict):
        os._exit(BAD_REQUEST)
    from launcher.host import remote_facts

    key = str(request["probe"].get("key"))
    _tell(over_ssh.line(key=key, facts=remote_facts.facts(request["probe"], os.environ)))
    _import_the_launch()  # while the command waits for the other hosts' answers
    request = _next_request(reader)
    if request is None or not _is_run(request.get("run")):  # the command went on without this host
        os._exit(0)
    lifeline.watch(reader)
    causes = []
    from launcher.cli.main import run_command

    relay = Relay(key) if request["run"].get("reports") is True else None
    with _config_file(request["run"].get("config")) as config:
        code = run_command([*config, *request["run"]["argv"]], on_end=lambda _, cause: causes.append(cause),
                           a_host=True)
    if relay is not None:
        relay.end()
    cause = causes[0].as_dict() if causes and causes[0] is not None else None
    _tell(over_ssh.line(key=key, end=code, cause=cause))
    os._exit(code)


@contextmanager
def _config_file(text):
    """The job's --config as the command sent it, in a file of this host's own for the launch to read (``--config
    PATH``), removed after; nothing without one."""
    if not isinstance(text, str):
        yield []
        return
    fd, path = tempfile.mkstemp(prefix="launcher-config-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        yield ["--config", path]
    finally:
        with suppress(OSError):
            os.unlink(path)


def _import_the_launch() -> None:
    """The modules a launch imports, imported now: the job then starts as soon as the command sends it."""
    import launcher.cli.job  # noqa: F401
    import launcher.cli.main  # noqa: F401
    import launcher.plan.planner  # noqa: F401
    import launcher.run.attempts  # noqa: F401


def _lifeline_fd() -> int:
    """The ssh session's stdin on a descriptor of its own (closed on exec), and /dev/null on descriptor 0."""
    fd = os.dup(0)
    os.set_inheritable(fd, False)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return fd


def _next_request(reader: lifeline.LineReader):
    """The next line of the command that is not a beat; None when the stream ends, stays silent or asks a stop."""
    while True:
        line = reader.next(over_ssh.SILENT_AFTER)
        if line is None or line is lifeline.EOF:
            return None
        fields = over_ssh.read_line(line)
        if fields is None or "stop" in fields:
            return None
        if "beat" not in fields:
            return fields


def _is_run(run) -> bool:
    return isinstance(run, dict) and isinstance(run.get("argv"), list) and all(isinstance(a, str) for a in run["argv"])


class Relay:
    """The new lines of this host's report logs, sent to the command every RELAY_EVERY seconds from a thread of its
    own (the console's writes are whole: never inside a worker's line), behind the session's ``key``."""

    def __init__(self, key: str) -> None:
        from launcher.output.report_log import OwnLines

        self.lines = OwnLines(longest=report_lines.LONGEST, most=4 * report_lines.MOST_BYTES)
        self.key = key
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._relay, name="report relay", daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        while not self.ended.wait(over_ssh.RELAY_EVERY):
            self.send()

    def send(self) -> None:
        """The lines new since the last look sent."""
        from launcher.output.console import console

        for message in over_ssh.report_messages(self.lines.read(), self.key):
            console.write(1, message)

    def end(self) -> None:
        """The thread stopped, and every line left sent."""
        self.ended.set()
        self.thread.join()
        offset = None
        while offset != self.lines.offset:
            offset = self.lines.offset
            self.send()


def _tell(data: bytes) -> None:
    """A lifeline line on stdout, whole: between the console's writes, never inside one."""
    from launcher.output.console import console

    console.write(1, data)
    console.finish()


if __name__ == "__main__":
    sys.exit(main())
