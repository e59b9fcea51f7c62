"""What `pip install` of this package pulls: the launcher needs click, psutil and pyyaml only; torch is the
extra `torch` (a Paddle user's install pulls no torch, and no multi-GB CUDA build of it)."""

import configparser
import re

from tests.conftest import REPO


def _requirements(text):
    return sorted(line.split(">")[0].split("=")[0].strip() for line in text.strip().splitlines())


def test_the_launcher_requires_no_torch_and_the_torch_extra_brings_the_runtime():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert _requirements(cfg["options"]["install_requires"]) == ["click", "psutil", "pyyaml"]
    extras = cfg["options.extras_require"]
    assert _requirements(extras["torch"]) == ["numpy", "torch"]
    assert {"numpy", "torch", "pytest"} <= set(_requirements(extras["test"]))


def _development_block():
    """The README's development lines, found as .ci/run finds them (which then runs them in a new venv)."""
    ci = (REPO / ".ci" / "run").read_text()
    pattern = re.search(r'block = re\.search\(r"(.+?)", pathlib', ci).group(1)
    return re.search(pattern, (REPO / "README.md").read_text(), re.S).group(1).splitlines()


def test_the_development_install_takes_the_cpu_torch_first_and_ci_runs_it_as_shown():
    lines = _development_block()
    assert lines == ["pip install torch --index-url https://download.pytorch.org/whl/cpu",
                     "pip install -e '.[test]'",
                     "python -m pytest -m 'not slow'",
                     "python -m pytest -m 'bench or training'"]
    users = (REPO / "README.md").read_text().split("## Install", 1)[1].split("## Quick start", 1)[0]
    assert "\n".join(lines[:2]) in users  # the Install section shows the same two lines
