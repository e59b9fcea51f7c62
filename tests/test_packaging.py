"""What `pip install` of this package pulls: the launcher needs click, psutil and pyyaml only; torch is the
extra `torch` (a Paddle user's install pulls no torch, and no multi-GB CUDA build of it)."""

import configparser

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
