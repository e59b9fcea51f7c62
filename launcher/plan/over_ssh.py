"""The whole cluster from one command (``--hostfile``, ``--hosts``): how each host is reached (the ssh command, or
none for this machine), the lifeline's lines between the command and each host's launcher, what a failed ssh means
in one reason, the ports every host has free, and each host's own launch options. Pure.

The lifeline is the ssh session itself. The command writes to each host on its stdin the job's environment first
(never on any process's command line: see ``remote_command``), then JSON lines: the check (``probe``), the job
(``run``: its command line),
then a ``beat`` every ``BEAT_EVERY`` seconds and, to stop, ``stop`` with the signal. The host's launcher answers on
its stdout, each line behind ``MARKER`` so that the workers' output around it is never taken for one: the host's
facts (``facts``), with --report_log the new lines of its report log (``reports``: the command asked for them with the
``run`` line's ``reports``, the file's path), and at its end the exit code and the job's root cause (``end``). A
launcher whose stdin ends (the command, its ssh or its machine gone) or stays silent for ``SILENT_AFTER`` stops its
workers by itself.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from launcher.plan import elastic_backends as backends, report_lines
from launcher.untrusted import json_object

MARKER = b"\x1elauncher-over-ssh "  # a record separator first: no program prints it at the start of a line
BEAT_EVERY = 10.0  # seconds between the command's beats to each host: 128 ssh clients then cost well under 1% of a core
SILENT_AFTER = 60.0  # seconds without a line from the command after which a host's launcher stops its workers
MAX_LINE = 16 << 20  # bytes of one lifeline line: a job's environment fits many times over
NO_FOLDER, NO_PYTHON = 201, 127  # the remote command's exit codes: no working directory, no Python
REMOTE_MODULE = "launcher.cli.over_ssh"
TABLE_HEADINGS = ("host", "address", "workers", "ranks", "ports", "check")
RELAY_EVERY = 0.5  # seconds between two looks of a host at its report log, for new lines to relay
PORT_TRIES = 8  # candidate port runs each host checks at once
PORT_LOW, PORT_HIGH = 20000, 32000  # where candidate runs are drawn: below Linux's ephemeral ports (32768 on)


@dataclass(frozen=True)
class Reach:
    """How every host is reached: the options of the command that make its ssh command line."""

    python: str  # the hosts' Python (--remote_python; default the command's own)
    directory: str  # the working directory, the same on every host
    port: Optional[int] = None  # --ssh_port
    identity_file: Optional[str] = None  # --ssh_identity_file
    extra: tuple = ()  # --ssh_args, split
    connect_timeout: float = 10.0


# Run by the host's Python before anything is imported: the job's environment, its first bytes on stdin (a length,
# a newline, then that many bytes of JSON), put in place, PYTHONPATH's folders put on the path as the interpreter's
# start would, and the host's launcher run in the same process (one interpreter start a host, not two). Standard
# library only: no launcher is imported before the environment is there.
_BOOTSTRAP = (
    "import os,sys,json,runpy\n"
    "def take(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,min(n-len(b),1<<20))\n"
    "  if not c: os._exit(0)\n"
    "  b+=c\n"
    " return b\n"
    "n=b''\n"
    "while not n.endswith(b'\\n') and len(n)<16: n+=take(1)\n"
    "os.environ.update(json.loads(take(int(n))))\n"
    "sys.path[1:1]=[p for p in os.environ.get('PYTHONPATH','').split(os.pathsep) if p]\n"
    "runpy.run_module(MODULE,run_name='__main__',alter_sys=True)\n")


def remote_command(reach: Reach, module: str = REMOTE_MODULE) -> str:
    """What a host's login shell runs, in the command's working directory: its Python, which takes the job's
    environment first (``environment``), then becomes the host's launcher (``module``)."""
    return (f"cd -- {shlex.quote(reach.directory)} 2>/dev/null || exit {NO_FOLDER}; "
            f"exec {shlex.quote(reach.python)} -c {shlex.quote(_BOOTSTRAP.replace('MODULE', repr(module)))}")


def environment(env: Mapping[str, str]) -> bytes:
    """The job's environment, as a host's Python takes it first on its stdin."""
    data = json.dumps(dict(env), ensure_ascii=True).encode()
    return f"{len(data)}\n".encode() + data


def ssh_command(host: str, reach: Reach) -> list:
    """The ssh client's command line for ``host``: never a prompt (BatchMode: an unknown host key or a password
    refuses at once), a bounded connect, a dead host noticed within 45 s. The user's --ssh_args come first, so that
    theirs win (ssh takes the first value of an option)."""
    options = [*reach.extra, "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(reach.connect_timeout))}",
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]
    if reach.port is not None:
        options += ["-p", str(reach.port)]
    if reach.identity_file:
        options += ["-i", reach.identity_file]
    return ["ssh", *options, "--", host, remote_command(reach)]


def local_command(reach: Reach) -> list:
    """The same for this machine, without ssh."""
    return ["/bin/sh", "-c", remote_command(reach)]


# ---------------------------------------------------------------- the lifeline's lines


def line(**fields) -> bytes:
    return MARKER + json.dumps(fields, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def read_line(data: bytes, key: Optional[str] = None) -> Optional[dict]:
    """A lifeline line's fields; None for any other line (a worker's output) or a broken one, and, with ``key``, for
    one that does not carry it: the command's key for this session, sent with the check and never to a worker, so that
    no worker's output can pass for its launcher's facts or end."""
    if not data.startswith(MARKER):
        return None
    fields = json_object(data[len(MARKER):].rstrip(b"\r\n"))
    return fields if fields is not None and (key is None or fields.get("key") == key) else None


def report_messages(lines: Sequence[bytes], key: str) -> list:
    """The lifeline lines that relay a report log's ``lines`` (without their newlines) to the command, a batch each
    (``report_lines.batches``)."""
    return [line(key=key, reports=batch) for batch in report_lines.batches(lines)]


# ---------------------------------------------------------------- what went wrong with a host

_SSH_REASONS = (  # (text in ssh's stderr, the reason), first match wins
    ("Could not resolve hostname", "its name does not resolve; check the hostfile or /etc/hosts"),
    ("Host key verification failed", "its host key is not known here (ssh asks no question in batch mode); add it "
                                     "with ssh-keyscan HOST >> ~/.ssh/known_hosts"),
    ("No ED25519 host key is known", "its host key is not known here; add it with ssh-keyscan"),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "its host key changed; check the host, then ssh-keygen -R HOST"),
    ("password", "it asks for a password (ssh asks none in batch mode); give it your public key (ssh-copy-id)"),
    ("keyboard-interactive", "it asks for a password (ssh asks none in batch mode); give it your public key"),
    ("Permission denied", "it refuses the key; give it your public key (ssh-copy-id), or --ssh_identity_file"),
    ("banner exchange", "it accepted the connection but never answered ssh"),
    ("timed out", "it did not answer ssh"),
    ("Connection refused", "it refuses connections on the ssh port (is sshd running? --ssh_port)"),
    ("No route to host", "there is no route to it"),
    ("Network is unreachable", "its network is unreachable"),
    ("Connection closed", "it closed the connection"),
    ("Connection reset", "it reset the connection"),
)


def failure_reason(code: int, stderr: str, reach: Reach) -> str:
    """Why a host's ssh session ended before it answered the check, in words, from its exit code and stderr."""
    if code == NO_FOLDER:
        return f"it has no folder {reach.directory} (the command's working directory)"
    if code == NO_PYTHON:
        return f"it has no {reach.python} (give --remote_python)"
    if "No module named" in stderr:
        return f"its {reach.python} has no launcher installed (pip install it there, or give --remote_python)"
    if code == 255:
        for text, reason in _SSH_REASONS:
            if text in stderr:
                return reason
    last = next((s for s in reversed(stderr.strip().splitlines()) if s.strip()), "")
    return f"its ssh session ended with exit code {code}" + (f": {last.strip()[:300]}" if last else "")


# ---------------------------------------------------------------- the check's facts


def probe_request(script: Optional[str], config: Optional[str], starts: Sequence[int], limit: int, key: str) -> dict:
    """What the command asks each host: whether these files are there, and how many ports are free in a row from
    each of ``starts`` (up to ``limit``); ``key``: what the host's lines carry (``read_line``)."""
    return {"script": script, "config": config, "starts": list(starts), "limit": limit, "key": key}


def fact_problems(facts: Mapping, expected: Mapping) -> list:
    """What makes a host unfit, each in words: another Python or launcher version than the command's, a missing
    script or config file."""
    problems = []
    for key, what in (("python", "Python"), ("launcher", "launcher")):
        if facts.get(key) != expected.get(key):
            problems.append(f"{what} {facts.get(key)} there, {expected.get(key)} here")
    for key in ("script", "config"):
        if expected.get(key) and facts.get(f"{key}_found") is not True:
            problems.append(f"no {expected[key]} in {expected.get('directory')}")
    return problems


def candidate_starts(given: Optional[int], draw) -> tuple:
    """The ports each host is asked about, each the first of a run (the control port, then the workers'): the one
    before the user's --started_port, or PORT_TRIES drawn by ``draw(low, high)``."""
    if given is not None:
        return (max(1, given - 1),)
    return tuple(draw(PORT_LOW, PORT_HIGH) for _ in range(PORT_TRIES))


def common_start(starts: Sequence[int], free_runs: Sequence[Sequence[int]], needs: Sequence[int]) -> Optional[int]:
    """The first of ``starts`` with, on every host, as many free ports after it as the host needs (``free_runs``:
    each host's answer, a run length for each start); None when no start has."""
    for index, start in enumerate(starts):
        if all(_run(free, index) >= need for free, need in zip(free_runs, needs)):
            return start
    return None


def _run(free, index: int) -> int:
    value = free[index] if isinstance(free, list) and index < len(free) else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def host_options(names: Sequence[str], node: int, counts: Sequence[int], gpus: Optional[tuple], start: int,
                 elastic: bool = False, endpoint_given: bool = False) -> list:
    """The options each host's launcher is given over the user's. A fixed job: the nodes in hostfile order, its own
    address and workers, each node's workers where they differ, the worker ports after the control port ``start``.
    An elastic one: node 0's launcher keeps the membership at ``start`` (unless the user named the rendezvous), and
    each host joins it with its own address and workers. The plan table is node 0's alone."""
    options = ["--node_ip", names[node], "--nproc_per_node", str(counts[node])]
    if elastic:
        if not endpoint_given:
            options += ["--rdzv_backend", backends.C10D.name, "--rdzv_endpoint", f"{_bracketed(names[0])}:{start}"]
    else:
        options += ["--cluster_env", "cli", "--cluster_node_ips", ",".join(names), "--started_port", str(start + 1)]
        if len(set(counts)) > 1:
            options += ["--node_workers", ",".join(map(str, counts))]
    if gpus is not None:
        options += ["--selected_gpus", ",".join(map(str, gpus))]
    if node > 0:
        options += ["--print_config", "false"]
    return options


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


# ---------------------------------------------------------------- each host's place in the job


@dataclass(frozen=True)
class Placed:
    """A host after the check: its node, the address the job uses, its workers and GPU ids, what makes it unfit."""

    node: int
    name: str
    address: str = "?"
    workers: int = 0
    gpus: Optional[tuple] = None  # --selected_gpus for it; None: its default
    problems: tuple = field(default_factory=tuple)


def table_rows(placed: Sequence[Placed], start: Optional[int], elastic: bool) -> list:
    """The check's table, its headings first, then a row a host: its ranks in hostfile order (by round in an elastic
    job) and its ports (node 0's control port first)."""
    rows, first = [TABLE_HEADINGS], 0
    for p in placed:
        last = first + p.workers - 1
        ranks = "-" if not p.workers else "by round" if elastic else str(first) if last == first else f"{first}-{last}"
        ports = "-" if start is None or not p.workers else f"{start if p.node == 0 else start + 1}-{start + p.workers}"
        rows.append((p.name, p.address, str(p.workers or "-"), ranks, ports, "; ".join(p.problems) or "ok"))
        first += p.workers
    return rows


def outcome(ends: Sequence[Optional[dict]]) -> tuple:
    """(the job's exit code, its root cause's fields or None) from each host's last line (None: it sent none): the
    nodes agree on both; a host lost before it said anything makes a good end 255."""
    cause = next((e["cause"] for e in ends if isinstance(e, dict) and isinstance(e.get("cause"), dict)), None)
    codes = [e["end"] for e in ends if isinstance(e, dict) and isinstance(e.get("end"), int)
             and not isinstance(e.get("end"), bool)]
    code = next((c for c in codes if c != 0), 0 if codes else 255)
    if code == 0 and any(e is None for e in ends):
        code = 255
    return code, cause
