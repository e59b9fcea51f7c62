"""The GPU path on a machine without one: the launcher's detection reads the driver's
/proc/driver/nvidia/gpus, which each test fakes in a mount namespace of its own (root), so detection,
CUDA_VISIBLE_DEVICES (a remapped list, one that hides every GPU, UUIDs) and FLAGS_selected_gpus run for
real. What needs CUDA itself is in tests/gpu/."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import PROBE, REPO, read_dumps

UUID = "GPU-5e1c6b1a-93d2-4c4e-9a57-1f0f0b6c2d11"


def fake_driver_available():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs fake /proc/driver"], capture_output=True, timeout=20)
    return r.returncode == 0


pytestmark = pytest.mark.skipif(not fake_driver_available(),
                                reason="faking the NVIDIA driver needs root and a mount namespace (unshare --mount)")


def launch_with_gpus(count, *args, env=None, timeout=90):
    """`python -m launcher ARGS` on a machine whose driver reports ``count`` GPUs."""
    fake = " && ".join(["mount -t tmpfs fake /proc/driver"] +
                       [f"mkdir -p /proc/driver/nvidia/gpus/0000:{0x3b + i:02x}:00.0" for i in range(count)])
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", fake + ' && exec "$@"', "sh",
           sys.executable, "-m", "launcher", *map(str, args)]
    full = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run(cmd, capture_output=True, text=True, env={**full, **(env or {})}, timeout=timeout, cwd=REPO)


def selected(tmp_path, count, *args, env=None, workers=None):
    tmp_path.mkdir(exist_ok=True)
    r = launch_with_gpus(count, *args, PROBE, "--dump", tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    dumps = read_dumps(tmp_path, workers if workers is not None else count)
    return [dumps[rank]["env"].get("FLAGS_selected_gpus") for rank in sorted(dumps)], r.stderr


def test_one_worker_per_gpu_the_driver_reports(tmp_path):
    gpus, err = selected(tmp_path, 2)
    assert gpus == ["0", "1"]
    assert "2 GPU worker(s) here" in err and "gpu 1" in err


def test_a_visible_list_is_remapped_to_the_indices_cuda_will_use(tmp_path):
    gpus, _ = selected(tmp_path, 4, env={"CUDA_VISIBLE_DEVICES": "3,1"}, workers=2)
    assert gpus == ["0", "1"]  # CUDA numbers the visible GPUs from 0


def test_selected_gpus_name_machine_ids_within_the_visible_list(tmp_path):
    gpus, _ = selected(tmp_path, 2, "--selected_gpus", "0", env={"CUDA_VISIBLE_DEVICES": "1,0"}, workers=1)
    assert gpus == ["1"]  # machine GPU 0 is the second visible one


def test_an_empty_visible_list_hides_every_gpu_and_the_workers_run_on_cpu(tmp_path):
    gpus, err = selected(tmp_path, 2, env={"CUDA_VISIBLE_DEVICES": ""}, workers=2)
    assert gpus == [None, None]
    assert "CPU worker(s)" in err


def test_a_gpu_named_by_its_uuid(tmp_path):
    gpus, err = selected(tmp_path, 1, env={"CUDA_VISIBLE_DEVICES": UUID}, workers=1)
    assert gpus == ["0"]
    gpus, _ = selected(tmp_path / "again", 1, "--selected_gpus", UUID, env={"CUDA_VISIBLE_DEVICES": UUID}, workers=1)
    assert gpus == ["0"]


def test_a_gpu_that_is_not_there_is_refused(tmp_path):
    r = launch_with_gpus(1, "--selected_gpus", "0,1", PROBE)
    assert r.returncode == 2
    assert "GPU 1 of --selected_gpus=0,1 does not exist: this machine has 1 GPU(s)" in r.stderr


def test_a_gpu_worker_whose_torch_has_no_cuda_is_told_and_runs_on_gloo(tmp_path):
    """A Paddle-style script on a machine whose driver is there but whose torch is the CPU build."""
    r = launch_with_gpus(1, REPO / "examples" / "hello_allreduce.py")
    if "cuda" in r.stdout and r.returncode == 0:
        pytest.skip("this torch has CUDA: tests/gpu covers it")
    assert r.returncode == 0, r.stderr
    assert "rank 0 of 1 (gloo on cpu): all_reduce sum = 1, expected 1" in r.stdout + r.stderr
