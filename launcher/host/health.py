"""A node's look at itself before it takes part in a job: the facts it is compared with node 0's on, and its
own checks (``launcher.plan.health`` names them and judges the comparison)."""

from __future__ import annotations

import hashlib
import platform
import time
from typing import Callable, Optional

import launcher
from launcher.host.preflight import installed_version
from launcher.plan.health import Checkup, Facts, HealthSettings, Subject


def checkup(settings: HealthSettings, subject: Subject, clock: Callable[[], float] = time.time) -> Checkup:
    """This node's facts and what its own checks found (the checks that cannot run here are SKIPPED)."""
    facts = Facts(python=platform.python_version(), launcher=launcher.__version__,
                  torch=installed_version("torch") if subject.uses_torch else None,
                  script=script_hash(subject.script), clock=clock())
    return Checkup(facts, ())


def script_hash(path: Optional[str]) -> Optional[str]:
    """The sha256 of the file at ``path``'s content; None for no path, or a file that cannot be read."""
    if path is None:
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()
