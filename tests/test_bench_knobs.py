"""bench/fleet_knobs.py still works.

One ``--tiny`` run (a dozen launches of 2 torch workers, about two minutes on 2 cores: marked ``bench``, out
of the quick loop; CI runs it) of both models with a few variants under both launchers: every requested row
in each table, numbers in the JSON, the ranks' parameters in agreement (for local SGD right after its last averaging step), the
bound variant measured (or n/a, where the launcher lacks --bind_cores_to_rank). No timing is asserted. Then fast tests
that start no launcher: the table, the goals, the refusals of bad arguments, and ``--device cuda``
on a machine without CUDA.
"""

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import fleet_knobs  # noqa: E402
import harness  # noqa: E402
from fleet_knobs import Config, Row, Sample  # noqa: E402

# in the order of fleet_knobs.variants(), which the tables keep whatever the order of --only
TINY_VARIANTS = ("ddp", "model", "optimizer", "optimizer-nccl2", "optimizer-localsgd2", "optimizer-bound", "ddp-ours")
HAS_BIND = harness.ours_has_option(fleet_knobs.BIND)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("knobs") / "knobs.json"
    done = subprocess.run([sys.executable, "bench/fleet_knobs.py", "--tiny", "--models", "mlp,conv",
                           "--only", ",".join(reversed(TINY_VARIANTS)), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def table_rows(stdout: str, model: str) -> dict:
    """The rows of one model's table: variant -> its cells."""
    lines = stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"model {model}:")))
    assert lines[start + 1].split()[:3] == ["variant", "launcher", "steps/s"]
    rows = {}
    for line in lines[start + 3:]:
        if not line.strip() or line.startswith("  ["):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0].split(" [")[0]] = cells
    return rows


@pytest.mark.bench
@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_tiny_run_has_a_row_for_every_requested_variant(tiny, model):
    stdout, result = tiny
    rows = table_rows(stdout, model)
    assert list(rows) == list(TINY_VARIANTS)
    assert rows["ddp"][1] == "torchrun" and all(rows[v][1] == "ours" for v in TINY_VARIANTS[1:])
    assert [r["variant"] for r in result["models"][model]] == list(TINY_VARIANTS)
    assert result["complete"] is True and result["steps"] == 2 and result["rounds"] == 1 and result["nproc"] == 2


@pytest.mark.bench
@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_tiny_run_measures_every_variant_and_the_ranks_agree(tiny, model):
    _, result = tiny
    for r in result["models"][model]:
        if r["variant"] == "optimizer-bound" and not HAS_BIND:
            continue
        assert r["status"] == "ok", r
        assert r["steps_per_s"] > 0 and r["cpu_ms_per_step"] > 0, r
        assert r["steps_ratio_vs_ddp"] > 0 and r["cpu_ratio_vs_ddp"] > 0, r
        (sample,) = r["samples"]
        assert len(sample["checksums"]) == 2 and all(isinstance(c, float) for c in sample["checksums"])
        assert r["ranks_agree"] is True, r
    base = next(r for r in result["models"][model] if r["variant"] == "ddp")
    assert base["steps_ratio_vs_ddp"] == 1.0


@pytest.mark.bench
def test_tiny_run_compares_local_sgd_ranks_after_the_last_averaging(tiny):
    from launcher.fleet.optimizer import averaging_due
    from launcher.fleet.strategy import DistributedStrategy

    stdout, result = tiny
    strategy = DistributedStrategy(use_local_sgd=True, local_sgd_steps=2, local_sgd_is_warm_steps=1)
    total = result["warmup"] + result["steps"]
    last = max(i for i in range(total) if averaging_due(i, strategy))
    for model in ("mlp", "conv"):
        (local,) = [r for r in result["models"][model] if r["variant"] == "optimizer-localsgd2"]
        assert local["local_sgd"] is True and local["checksum_step"] == last and local["ranks_agree"] is True
        assert table_rows(stdout, model)["optimizer-localsgd2"][6].startswith(f"same@{last}")
        plain = next(r for r in result["models"][model] if r["variant"] == "optimizer")
        assert plain["checksum_step"] == total - 1


@pytest.mark.bench
def test_tiny_run_reports_a_missing_launcher_option_as_not_available(tiny):
    stdout, result = tiny
    for model in ("mlp", "conv"):
        (bound,) = [r for r in result["models"][model] if r["variant"] == "optimizer-bound"]
        if HAS_BIND:
            assert bound["status"] == "ok" and bound["refused"] is None
        else:
            assert bound["status"] == "n/a" and "No such option" in bound["refused"] and bound["steps_per_s"] is None
            assert table_rows(stdout, model)["optimizer-bound"][2].startswith("n/a")
            assert f"optimizer-bound: n/a (launcher refused: {bound['refused']})" in stdout
    goal_lines = [line for line in stdout.splitlines() if line.startswith("goal ")]
    assert goal_lines[0].startswith("goal optimizer >= 1.0x ddp steps/s: mlp ") and ", conv " in goal_lines[0]
    assert goal_lines[1].startswith("goal bound >= unbound steps/s: mlp optimizer-bound/optimizer ")
    assert stdout.rstrip().splitlines()[-len(goal_lines):] == goal_lines


# ---------------------------------------------------------------- no launcher started


def sample(steps_per_s, cpu_ms, sums=(1.5, 1.5), step=4):
    ranks = [{"cpus": [0, 1], "torch_threads": 1}, {"cpus": [0, 1], "torch_threads": 1}]
    return Sample(steps_per_s, cpu_ms, list(sums), step, len(set(sums)) == 1, ranks)


def by_name(name):
    return next(v for v in fleet_knobs.variants(2) if v.name == name)


def test_every_knob_of_the_brief_has_a_variant():
    names = [v.name for v in fleet_knobs.variants(2)]
    assert names[:3] == ["ddp", "model", "optimizer"] and len(set(names)) == len(names)
    assert by_name("optimizer-nofuse").strategy == {"fuse_all_reduce_ops": False}
    assert by_name("optimizer-fuse32").env == {"FLAGS_fuse_parameter_memory_size": "32"}
    assert by_name("optimizer-nccl2").strategy == {"nccl_comm_num": 2}
    assert by_name("optimizer-hier").strategy["use_hierarchical_allreduce"] is True
    assert {by_name(f"optimizer-threads{n}").strategy["num_threads"] for n in (1, 2)} == {1, 2}
    assert by_name("optimizer-syncar").env == {"FLAGS_sync_nccl_allreduce": "1"}
    assert [by_name(f"optimizer-localsgd{k}").strategy["local_sgd_steps"] for k in (2, 4)] == [2, 4]
    assert by_name("optimizer-bound").options == by_name("ddp-ours-bound").options == ("--bind_cores_to_rank",)
    assert by_name("optimizer-omp2").env == {"OMP_NUM_THREADS": "2"} and by_name("ddp-ours").launcher == "ours"
    from launcher.fleet.strategy import DistributedStrategy

    for v in fleet_knobs.variants(2):
        strategy = DistributedStrategy()
        for name, value in v.strategy.items():
            setattr(strategy, name, value)  # each is a real option
        strategy.check(2, 2)


def test_our_launcher_gets_the_variant_options_before_the_script(tmp_path):
    cfg = Config(steps=5, device="cpu", nproc=2)
    with harness.PortReservations() as ports:
        argv = fleet_knobs.command(by_name("optimizer-bound"), "conv", cfg, tmp_path, ports)
        theirs = fleet_knobs.command(by_name("ddp"), "mlp", cfg, tmp_path, ports)
    assert argv[1:5] == ["-m", "launcher", "--bind_cores_to_rank", "--nproc_per_node"]
    assert argv[argv.index("--model") + 1] == "conv" and argv.index("--bind_cores_to_rank") < argv.index("--model")
    assert theirs[1:3] == ["-m", "torch.distributed.run"] and "--master-port" in theirs
    assert fleet_knobs.environment(by_name("optimizer-omp2"), cfg)["OMP_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in fleet_knobs.environment(by_name("optimizer"), cfg)
    assert fleet_knobs.environment(by_name("optimizer"), cfg)["CUDA_VISIBLE_DEVICES"] == ""


def test_an_option_our_launcher_lacks_is_refused_not_an_error(tmp_path):
    """What the bound variants gave before --bind_cores_to_rank existed (the launcher stops before any worker)."""
    variant = fleet_knobs.Variant("optimizer-x", "ours", "optimizer", options=("--no_such_option_here",))
    got = fleet_knobs.run_once(variant, "mlp", Config(steps=2, device="cpu", nproc=2), tmp_path / "run", timeout=60)
    assert isinstance(got, fleet_knobs.Refused)
    assert "No such option" in got.line and "--no_such_option_here" in got.line and "\n" not in got.line


def test_table_goals_and_notes():
    cfg = Config(steps=100, device="cpu", nproc=2)
    rows = [Row("mlp", by_name("ddp"), [sample(40.0, 50.0), sample(44.0, 52.0), sample(42.0, 60.0)], [0, 1, 2]),
            Row("mlp", by_name("optimizer"), [sample(44.0, 49.0)], [1]),
            Row("mlp", by_name("optimizer-localsgd4"), [sample(80.0, 30.0, step=101)], [0]),
            Row("mlp", by_name("optimizer-nccl2"), [sample(40.0, 50.0, sums=(1.5, 1.25))], [0]),
            Row("mlp", by_name("optimizer-bound"), refused="launcher: error: No such option '--bind_cores_to_rank'."),
            Row("mlp", by_name("optimizer-hier"), error="exit code 1: ValueError: boom")]
    text = fleet_knobs.table("mlp", rows, cfg)
    cells = {line.split()[0]: line.split() for line in text.splitlines()[3:9]}
    assert cells["ddp"][2:7] == ["42", "52", "1", "1", "same"]  # medians over the rounds
    assert cells["optimizer"][2:6] == ["44", "49", "1", "0.942"]  # against ddp's round 1
    assert cells["optimizer-localsgd4"][7].startswith("same@101")
    assert cells["optimizer-nccl2"][7] == "DIFFER"
    assert cells["optimizer-bound"][3] == "n/a" and cells["optimizer-hier"][3] == "error"
    assert "optimizer-bound: n/a (launcher refused: launcher: error: No such option '--bind_cores_to_rank'.)" in text
    assert "optimizer-hier: exit code 1: ValueError: boom" in text
    found = fleet_knobs.goals({"mlp": rows})
    assert found[0] == {"model": "mlp", "goal": "optimizer >= 1.0x ddp steps/s", "pair": ["optimizer", "ddp"],
                        "ratio": 1.0, "met": True, "why_not": None}
    assert fleet_knobs.goals_lines(found) == [
        "goal optimizer >= 1.0x ddp steps/s: mlp 1.00x yes",
        "goal bound >= unbound steps/s: mlp optimizer-bound/optimizer n/a (optimizer-bound n/a)",
    ]


def test_a_ratio_pairs_each_round_with_the_baseline_of_the_same_round():
    """The machine slows down by half after round 0: each round's pair still compares like with like."""
    ddp = Row("mlp", by_name("ddp"), [sample(40.0, 50.0), sample(20.0, 100.0), sample(20.0, 100.0)], [0, 1, 2])
    ours = Row("mlp", by_name("optimizer"), [sample(44.0, 45.0), sample(22.0, 90.0), sample(22.0, 90.0)], [0, 1, 2])
    assert fleet_knobs.paired(ours, ddp, "steps_per_s") == pytest.approx(1.1)
    assert fleet_knobs.paired(ours, ddp, "cpu_ms_per_step") == pytest.approx(0.9)
    late = Row("mlp", by_name("optimizer"), [sample(44.0, 45.0)], [3])  # a round the baseline did not run
    assert fleet_knobs.paired(late, ddp, "steps_per_s") is None


def test_bad_arguments_are_refused_in_one_line():
    for args, words in ((["--only", "ddp,nope"], "unknown variant nope"), (["--models", "mlp,vit"], "unknown vit")):
        done = subprocess.run([sys.executable, "bench/fleet_knobs.py", "--tiny", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr


def test_cuda_without_a_gpu_is_one_clear_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run([sys.executable, "bench/fleet_knobs.py", "--device", "cuda", "--tiny"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "fleet_knobs: --device cuda needs a CUDA GPU, and torch sees none on this machine\n"


def test_gpu_check_script_is_valid_bash_and_runs_the_knobs():
    script = REPO / "bench" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "bench/fleet_knobs.py --device cuda" in text and "--only ddp,model,optimizer,optimizer-nccl2" in text
