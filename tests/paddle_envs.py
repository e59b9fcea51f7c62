"""Real PaddlePaddle for the tests, each version in a virtual environment of its own, never in the
interpreter that runs the suite.

The suite runs in the README's development install (torch, no paddle). Paddle is installed beside it:
3.3.1 (collective, DataParallel, fleet) and 2.6.2, the last with a parameter-server runtime on CPU (it
needs protobuf<5 and numpy<2). Each lives in ``$LAUNCHER_PADDLE3_VENV`` / ``$LAUNCHER_PADDLE26_VENV``, or
in ``~/.cache/launcher-tests/paddle3`` / ``paddle26``, made on first use (``.ci/run`` makes both before the
tests). The launcher runs there from this checkout (PYTHONPATH), so each holds its three dependencies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

LAUNCHER_DEPS = ["click>=8.1", "psutil>=5.9", "pyyaml>=6.0"]
CACHE = Path.home() / ".cache" / "launcher-tests"


@dataclass(frozen=True)
class PaddleEnv:
    name: str  # the folder under ~/.cache/launcher-tests
    variable: str  # the variable that names another folder
    packages: tuple

    @property
    def folder(self) -> Path:
        return Path(os.environ.get(self.variable) or CACHE / self.name)

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"


PADDLE3 = PaddleEnv("paddle3", "LAUNCHER_PADDLE3_VENV", ("paddlepaddle==3.3.1", *LAUNCHER_DEPS))
PADDLE26 = PaddleEnv("paddle26", "LAUNCHER_PADDLE26_VENV",
                     ("paddlepaddle==2.6.2", "protobuf<5", "numpy<2", *LAUNCHER_DEPS))


def has_paddle(python) -> bool:
    probe = subprocess.run([str(python), "-c", "import paddle"], capture_output=True, timeout=120)
    return probe.returncode == 0


def existing(env: PaddleEnv) -> Optional[str]:
    """The environment's Python if it is there with paddle in it, else None (nothing is made)."""
    return str(env.python) if env.python.exists() and has_paddle(env.python) else None


def make(env: PaddleEnv) -> str:
    """The environment's Python, made first when missing; OSError or SubprocessError when it cannot be."""
    found = existing(env)
    if found:
        return found
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env.folder)], check=True, capture_output=True,
                   timeout=300)
    subprocess.run([str(env.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *env.packages],
                   check=True, capture_output=True, timeout=1800)
    return str(env.python)


if __name__ == "__main__":  # .ci/run: python tests/paddle_envs.py, before the tests
    for wanted in (PADDLE3, PADDLE26):
        print(f"{wanted.name}: {make(wanted)}", flush=True)
