"""Whether a node is fit to train, pure: the checks by name, their settings, what a node says of itself (its
``Checkup``: the facts it is compared on and what its own checks found) and the comparison with node 0's.

A node checks itself (``launcher.host.health`` runs the probes: disk, ``/dev/shm``, ports, GPUs, NVML,
InfiniBand, the user's command) and sends its ``Checkup`` in its hello; node 0 compares the facts with its own
(``compare``: versions, the script's hash, the clock) and admits it, or refuses it with the first failure's
sentence. Nothing here touches a file or reads the clock: the probes' results and the times are given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

# The checks, by the names the docs, the options (--skip_health_checks) and the refusals use.
DISK, SHM, PORTS, VERSIONS, SCRIPT, CLOCK, GPUS, NVML, INFINIBAND, USER = (
    "disk", "shm", "ports", "versions", "script", "clock", "gpus", "nvml", "infiniband", "user")
CHECKS = (DISK, SHM, PORTS, VERSIONS, SCRIPT, CLOCK, GPUS, NVML, INFINIBAND, USER)
COMPARED = (VERSIONS, SCRIPT, CLOCK)  # against node 0's facts; the rest each node checks on its own
ON_GPUS = (GPUS, NVML, INFINIBAND)  # run only for a node whose workers take GPUs
ALL = "all"  # --skip_health_checks all: every check off

OK, FAILED, SKIPPED = "ok", "failed", "skipped"  # a finding's state; skipped: the check cannot run here
DISK_FLOOR = 1 << 30  # bytes free in the log directory and the working directory
SHM_FLOOR = 256 << 20  # bytes free in /dev/shm, for GPU workers (NCCL's buffers between the GPUs of a node)
SHM_FLOOR_CPU = 16 << 20  # for CPU workers: a container's default /dev/shm (64 MB) passes
CLOCK_BOUND = 5.0  # seconds a node's clock may stand from node 0's
USER_TIMEOUT = 300.0  # seconds the user's --health_check may run
INTERVAL = 30.0  # seconds between the checks of a node kept out, or of a standby


@dataclass(frozen=True)
class HealthSettings:
    """The checks a job runs: all by default, less those turned off by name."""

    off: frozenset = frozenset()  # names of CHECKS not run
    disk_floor: int = DISK_FLOOR
    shm_floor: int = SHM_FLOOR
    shm_floor_cpu: int = SHM_FLOOR_CPU
    clock_bound: float = CLOCK_BOUND
    command: Optional[str] = None  # --health_check: the user's own check, run by a shell
    timeout: float = USER_TIMEOUT
    interval: float = INTERVAL

    def runs(self, check: str) -> bool:
        return check not in self.off and (check != USER or self.command is not None)


@dataclass(frozen=True)
class Subject:
    """What a node's checks look at: its folders, its workers' ports and GPUs, the program they run."""

    log_dir: Optional[str]  # None: no log directory (the workers' output goes to the console)
    workdir: str
    host: str  # this node's address, where the workers' ports must be free
    ports: Tuple[int, ...] = ()
    gpus: Tuple[str, ...] = ()  # the GPU ids its workers take (empty: CPU workers)
    script: Optional[str] = None  # the training script's path (None: a module or a command)
    python: Optional[str] = None  # the workers' interpreter (None: not Python)
    uses_torch: bool = False
    ib_hca: Optional[str] = None  # NCCL_IB_HCA of the workers' environment: the InfiniBand devices they use


@dataclass(frozen=True)
class Finding:
    check: str  # one of CHECKS
    state: str  # OK, FAILED or SKIPPED
    reason: str = ""  # one sentence: why it failed, or why it could not run


@dataclass(frozen=True)
class Facts:
    """What a node is compared with node 0 on."""

    python: str  # the workers' Python version, "3.11.9"
    launcher: str  # launcher.__version__
    torch: Optional[str]  # the installed torch's version, where the workers use torch
    script: Optional[str]  # the sha256 of the training script's content (None: a command, not a file)
    clock: float  # the node's wall clock as it sent its hello (seconds since the epoch)


@dataclass(frozen=True)
class Checkup:
    """What a node says of itself in its hello."""

    facts: Facts
    findings: Tuple[Finding, ...] = field(default=())

    def to_wire(self) -> dict:
        f = self.facts
        return {"facts": {"python": f.python, "launcher": f.launcher, "torch": f.torch, "script": f.script,
                          "clock": f.clock},
                "findings": [[x.check, x.state, x.reason] for x in self.findings]}

    @classmethod
    def from_wire(cls, value) -> Optional["Checkup"]:
        """A checkup off the wire, or None where it is not one (a wrong type anywhere); nothing raises."""
        if not isinstance(value, dict) or not isinstance(value.get("facts"), dict):
            return None
        f, findings = value["facts"], value.get("findings")
        text = (lambda v: isinstance(v, str))
        maybe = (lambda v: v is None or isinstance(v, str))
        clock = f.get("clock")
        if not (text(f.get("python")) and text(f.get("launcher")) and maybe(f.get("torch")) and maybe(f.get("script"))
                and isinstance(clock, (int, float)) and not isinstance(clock, bool) and clock == clock
                and abs(clock) < 1e12 and isinstance(findings, list)):
            return None
        read = []
        for item in findings:
            if not (isinstance(item, list) and len(item) == 3 and item[0] in CHECKS and item[1] in (OK, FAILED, SKIPPED)
                    and text(item[2])):
                return None
            read.append(Finding(*item))
        facts = Facts(f["python"], f["launcher"], f.get("torch"), f.get("script"), float(clock))
        return cls(facts, tuple(read))


def compare(mine: Facts, node0: Facts, received_at: float, settings: HealthSettings) -> Tuple[Finding, ...]:
    """``mine`` against node 0's facts; ``received_at``: node 0's clock when the hello came (its clock stands
    from the node's by the difference, a network's delay included)."""
    found = []
    if settings.runs(VERSIONS):
        differ = [f"{name} {a} where node 0 has {b}" for name, a, b in (
            ("Python", mine.python, node0.python), ("launcher", mine.launcher, node0.launcher),
            ("torch", mine.torch, node0.torch)) if a != b]
        found.append(Finding(VERSIONS, FAILED, "it runs " + ", ".join(differ)) if differ else Finding(VERSIONS, OK))
    if settings.runs(SCRIPT):
        same = mine.script == node0.script
        found.append(Finding(SCRIPT, OK) if same else Finding(
            SCRIPT, FAILED, "its training script differs from node 0's (another copy of the code)"))
    if settings.runs(CLOCK):
        offset = mine.clock - received_at
        found.append(Finding(CLOCK, OK) if abs(offset) <= settings.clock_bound else Finding(
            CLOCK, FAILED, f"its clock stands {offset:+.1f} s from node 0's (the bound is {settings.clock_bound:g} s)"))
    return tuple(found)


def first_failure(findings) -> Optional[Finding]:
    return next((f for f in findings if f.state == FAILED), None)


def sentence(node: str, finding: Finding) -> str:
    """The one sentence a failed check is said in, on every node's console."""
    return (f"{node} failed the health check {finding.check}: {finding.reason}; mend the node, or skip the check "
            f"with --skip_health_checks {finding.check}")


def read_check_names(text: str) -> Tuple[str, ...]:
    """--skip_health_checks: a comma list of CHECKS, or ``all``; ValueError saying which name is unknown."""
    names = [n.strip().lower() for n in str(text).split(",") if n.strip()]
    if ALL in names:
        return CHECKS
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a health check; give a comma list of {', '.join(CHECKS)}, or {ALL}")
    return tuple(n for n in CHECKS if n in names)
