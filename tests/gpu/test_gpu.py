"""The GPU path on a real CUDA GPU: detection, CUDA_VISIBLE_DEVICES, FLAGS_selected_gpus, NCCL through
the runtime, Fleet with AMP, the memory-fraction flag, the flight recorder on a hang, a PS trainer on CUDA.

Every test skips, saying why, where torch sees no CUDA GPU; those marked needs_two_gpus also skip on a
machine with one (they are written but unverified until run on two). bench/gpu_check.sh runs this file
on the device machine and keeps the report."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_launcher
from gpu_support import COUNT, needs_gpu, needs_two_gpus, uuid_of

HERE = Path(__file__).resolve().parent / "workers"
PROBE = HERE / "cuda_probe.py"
pytestmark = needs_gpu


def env_without_visible(**extra):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PYTHONPATH=str(REPO), **extra)
    return env


def launch(*args, env=None, timeout=240):
    """python -m launcher ARGS with the environment given whole (CUDA_VISIBLE_DEVICES as the test says)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "launcher", *map(str, args)], capture_output=True, text=True,
                          env=env if env is not None else env_without_visible(), timeout=timeout, cwd=REPO)


def probes(result) -> list:
    records = [json.loads(line.split("CUDA_PROBE ", 1)[1]) for line in (result.stdout + result.stderr).splitlines()
               if "CUDA_PROBE " in line]
    return sorted(records, key=lambda r: r["rank"])


def test_one_worker_per_gpu_found_by_the_driver():
    r = launch(PROBE)
    assert r.returncode == 0, r.stderr
    found = probes(r)
    assert [p["flags"] for p in found] == [str(i) for i in range(COUNT)]
    assert all(p["sum"] == 8.0 and p["device"] == f"cuda:{p['flags']}" for p in found)
    assert f"{COUNT} GPU worker(s) here" in r.stderr


def test_a_visible_list_that_hides_the_gpu_gives_cpu_workers():
    r = launch("--nproc_per_node", 1, PROBE, env=env_without_visible(CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr
    assert [(p["flags"], p["count"]) for p in probes(r)] == [(None, 0)]
    assert "CPU worker(s)" in r.stderr


def test_a_gpu_named_by_its_uuid_in_cuda_visible_devices():
    uuid = uuid_of(0)
    for extra in ((), ("--selected_gpus", uuid)):
        r = launch(*extra, PROBE, env=env_without_visible(CUDA_VISIBLE_DEVICES=uuid))
        assert r.returncode == 0, r.stderr
        assert [(p["flags"], p["count"], p["uuid"]) for p in probes(r)] == [("0", 1, uuid)]


def test_selected_gpus_against_a_remapped_visible_list():
    last = str(COUNT - 1)  # one GPU: "0"; several: the last one, listed first
    visible = ",".join([last] + [str(i) for i in range(COUNT - 1)])
    r = launch("--selected_gpus", last, PROBE, env=env_without_visible(CUDA_VISIBLE_DEVICES=visible))
    assert r.returncode == 0, r.stderr
    (p,) = probes(r)
    assert p["flags"] == "0" and p["uuid"] == uuid_of(int(last))


@needs_two_gpus
def test_selected_gpus_zero_is_the_second_visible_gpu_when_the_list_is_reversed():
    r = launch("--selected_gpus", "0", PROBE, env=env_without_visible(CUDA_VISIBLE_DEVICES="1,0"))
    assert r.returncode == 0, r.stderr
    (p,) = probes(r)
    assert p["flags"] == "1" and p["uuid"] == uuid_of(0)


def test_a_paddle_style_script_puts_its_work_on_flags_selected_gpus():
    r = launch("--selected_gpus", "0", PROBE)
    assert r.returncode == 0, r.stderr
    assert [(p["flags"], p["device"], p["sum"]) for p in probes(r)] == [("0", "cuda:0", 8.0)]


def test_one_rank_nccl_job_through_the_runtime():
    r = launch("--selected_gpus", "0", HERE / "nccl_runtime.py")
    assert r.returncode == 0, r.stderr
    assert "NCCL_RESULT rank=0 backend=nccl device=cuda:0 current=0 sum=1 expected=1" in r.stdout + r.stderr


def test_the_quick_start_example_uses_nccl_on_the_gpu():
    r = launch("--selected_gpus", "0", REPO / "examples" / "hello_allreduce.py")
    assert r.returncode == 0, r.stderr
    assert "rank 0 of 1 (nccl on cuda): all_reduce sum = 1, expected 1" in r.stdout + r.stderr


@needs_two_gpus
def test_nccl_between_two_ranks_on_two_gpus():
    r = launch("--selected_gpus", "0,1", HERE / "nccl_runtime.py")
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "rank=0 backend=nccl device=cuda:0" in out and "rank=1 backend=nccl device=cuda:1" in out
    assert out.count("sum=3 expected=3") == 2


def test_fleet_with_amp_and_grad_scaler_equals_one_process(tmp_path):
    fleet_out, plain_out = tmp_path / "fleet.pt", tmp_path / "plain.pt"
    r = launch("--selected_gpus", "0", HERE / "fleet_amp.py", "--out", fleet_out)
    assert r.returncode == 0, r.stderr
    import subprocess

    one = subprocess.run([sys.executable, str(HERE / "fleet_amp.py"), "--plain", "--out", str(plain_out)],
                         capture_output=True, text=True, env=env_without_visible(), timeout=240, cwd=REPO)
    assert one.returncode == 0, one.stderr
    a, b = torch.load(fleet_out), torch.load(plain_out)
    assert a["scale"] == b["scale"]
    worst = max((a["state"][k] - b["state"][k]).abs().max().item() for k in a["state"])
    print(f"fleet (1 rank, AMP) vs one process: max parameter difference {worst:.3g}")
    assert worst <= 1e-6


def test_the_memory_fraction_flag_caps_what_torch_may_take():
    r = launch("--selected_gpus", "0", HERE / "memory_fraction.py", "--within", 0.02, "--beyond", 0.2,
               env=env_without_visible(FLAGS_fraction_of_gpu_memory_to_use="0.1"))
    assert r.returncode == 0, r.stderr
    assert "FRACTION within=ok beyond=oom" in r.stdout + r.stderr
    r = launch("--selected_gpus", "0", HERE / "memory_fraction.py", "--within", 0.02, "--beyond", 0.2)
    assert "FRACTION within=ok beyond=ok" in r.stdout + r.stderr  # without the flag, 20 % is allowed


def test_a_hang_leaves_the_nccl_flight_recorder_dump_in_the_log_dir(tmp_path):
    logs = tmp_path / "logs"
    r = launch("--selected_gpus", "0", "--log_dir", logs, "--hang_timeout", 8, HERE / "nccl_hang.py", timeout=240)
    assert r.returncode != 0
    assert "collectives done; hanging now" in (logs / "workerlog.0").read_text()
    dump = logs / "nccl_trace_rank_0"
    assert dump.is_file() and dump.stat().st_size > 0, r.stderr
    assert f"rank 0: NCCL flight recorder dump: {dump}" in r.stderr


def test_a_parameter_server_trainer_keeps_its_dense_part_on_cuda():
    r = launch("--server_num", 1, "--worker_num", 1, HERE / "ps_cuda.py", timeout=240)
    assert r.returncode == 0, r.stderr
    line = next(l for l in (r.stdout + r.stderr).splitlines() if "PS_CUDA" in l)
    fields = dict(f.split("=", 1) for f in line.split("PS_CUDA ", 1)[1].split(" ", 3))
    assert fields["devices"] == "['cuda:0']"
    assert float(fields["last"]) < float(fields["first"])


# ---------------------------------------------------------------- in-process re-form with NCCL (launcher.runtime.elastic)


def test_nccl_round_over_in_a_world_of_one_keeps_the_process(tmp_path):
    """The round's end reaches a rank training alone with NCCL (no collective blocks there); it leaves its group and
    goes on in the next round's, in the same process."""
    from test_runtime_elastic import Launcher, entries, env_of, lines
    from conftest import free_port

    port = free_port()
    with Launcher(tmp_path) as launcher:
        worker = launcher.start(0, 1, port, REFORM_BACKEND="nccl")
        launcher.serve(lambda: any(r["event"] == "step" for r in lines(worker)), "NCCL steps")
        launcher.stop([worker])
        launcher.go({worker: env_of(0, 1, port)})
        last = entries(worker)[-1]
        assert (last["round"], last["pid"], last["world_size"]) == (1, worker.pid, 1)
        steps = last["step"]
        launcher.serve(lambda: lines(worker)[-1]["step"] > steps, "NCCL steps in the next round")


@needs_two_gpus
def test_nccl_collective_blocked_on_a_frozen_peer_is_aborted(tmp_path):
    """Rank 1 frozen (SIGSTOP) while rank 0 waits in an NCCL all-reduce: the round's end aborts rank 0's communicator,
    and rank 0 goes on alone in the same process."""
    from test_runtime_elastic import Launcher, go_on_past_a_frozen_peer

    with Launcher(tmp_path) as launcher:
        go_on_past_a_frozen_peer(launcher, {"REFORM_BACKEND": "nccl"})
