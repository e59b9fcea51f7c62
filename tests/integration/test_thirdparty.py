"""Third-party programs written for torchrun, run unchanged from torchrun's own command line under
`python -m launcher` and under `torchrun` (torch.distributed.run), comparing exit codes, output and results.

accelerate's test scripts are those its package ships (accelerate/test_utils/scripts/); the Lightning run
is a plain Trainer(strategy="ddp") script (workers/lightning_ddp.py). Skipped where the package is missing
(.ci/run installs both).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, WORKERS

PREFIX = re.compile(r"^\[rank \d+\] ")
RUNNERS = {"launcher": [sys.executable, "-m", "launcher", "--print_config", "false"],
           "torchrun": [sys.executable, "-m", "torch.distributed.run"]}


def run_both(*args, timeout=300):
    """{runner: CompletedProcess} of the same torchrun command line under each launcher, one after the other."""
    results = {}
    for name, cmd in RUNNERS.items():
        results[name] = subprocess.run([*cmd, "--standalone", "--nproc-per-node", "2", *map(str, args)],
                                       capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return results


def output_lines(result, runner) -> list:
    """The workers' stdout lines, in order per rank but without our rank prefix (torchrun has none)."""
    lines = result.stdout.splitlines()
    return sorted(PREFIX.sub("", line) for line in lines) if runner == "launcher" else sorted(lines)


def accelerate_script(name):
    accelerate = pytest.importorskip("accelerate")
    return Path(accelerate.__file__).parent / "test_utils" / "scripts" / name


@pytest.mark.parametrize("script", ["test_ops.py", "test_sync.py"])
def test_accelerate_test_scripts(script):
    results = run_both(accelerate_script(script))
    for name, r in results.items():
        assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
    assert output_lines(results["launcher"], "launcher") == output_lines(results["torchrun"], "torchrun")


def test_lightning_ddp_run(tmp_path):
    pytest.importorskip("lightning")
    outs = {name: tmp_path / name for name in RUNNERS}
    for out in outs.values():
        out.mkdir()
    for name, cmd in RUNNERS.items():
        r = subprocess.run([*cmd, "--standalone", "--nproc-per-node", "2", WORKERS / "lightning_ddp.py", outs[name]],
                           capture_output=True, text=True, timeout=300, cwd=REPO)
        assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
    results = {name: [json.loads((out / f"result.{rank}.json").read_text()) for rank in (0, 1)]
               for name, out in outs.items()}
    assert results["launcher"] == results["torchrun"]
    assert {r["environment"] for r in results["launcher"]} == {"TorchElasticEnvironment"}
    assert [r["world_size"] for r in results["launcher"]] == [2, 2]
