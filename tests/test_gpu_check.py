"""bench/gpu_check.sh, the one script run on a GPU machine, runs anywhere: here, with a fake
nvidia-smi and no CUDA, every GPU test skips saying why, the timing says there is no GPU, and the
report has each part."""

import os
import subprocess
import sys

from conftest import REPO


def test_the_gpu_check_runs_without_a_gpu_and_writes_its_report(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "0, Fake GPU, 555.42, 143771 MiB"\n')
    fake.chmod(0o755)
    py = bin_dir / "python3"  # the script's python3 is this one; a symlink to a venv's python would lose the venv
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh")], capture_output=True, text=True, env=env,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["machine.txt", "report.md", "tests.txt", "timing.err", "timing.json"]
    report = (out / "report.md").read_text()
    assert "0, Fake GPU, 555.42, 143771 MiB" in report
    assert "needs a CUDA GPU" in report and "needs two CUDA GPUs" in report and " skipped" in report
    assert '"skipped": "torch sees no CUDA GPU here"' in report
