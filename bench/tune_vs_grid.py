"""launcher tune against an exhaustive grid, on bench/knob_worker.py's two models (docs/tuning.md's goal).

    python bench/tune_vs_grid.py [--models mlp,conv] [--knobs full|small|tiny] [--nproc 2] [--steps 60] [--rounds 3]
                                 [--trial-seconds 60] [--confirm N] [--json FILE] [--save-grid FILE] [--grid FILE]

The space: fleet's knobs (fuse_all_reduce_ops, nccl_comm_num, use_hierarchical_allreduce, local SGD every 4 steps),
OMP_NUM_THREADS and --bind_cores_to_rank (``--knobs small``: fuse, local SGD, OMP_NUM_THREADS and binding). For each
model:

- the grid: every point run ``--rounds`` times as a job of STEPS timed steps (``python -m launcher --config`` of the
  point's config, the same file a trial of tune runs), the rounds alternated (round 2 in the reverse order, ...); a
  point's rate is the median of its rounds' (rank 0's steps/s, bench/knob_worker.py's own timing);
- the tuner: ``python -m launcher tune`` over the same space, timed whole;
- the goals: the grid's rate of the tuner's pick within 5% of the grid's best, and the tuner's time at most 0.4x
  the grid's.

``--save-grid FILE`` keeps each model's grid (every point's rates and the grid's time) as JSON; ``--grid FILE`` takes
one kept so, and runs the tuner alone against it. ``--confirm N``: where the tuner's pick is not the grid's best,
both are run N rounds more, alternated, and the pick is judged by the medians of all their rounds (the grid's own
rounds of one point can differ by more than the 5% asked on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from harness import bench_env, progress, temp_root  # noqa: E402
from launcher.plan import tune_space, tune_trial  # noqa: E402

WORKER = str(Path(__file__).resolve().parent / "knob_worker.py")
KNOBS = {
    "full": {"strategy.fuse_all_reduce_ops": [True, False], "strategy.nccl_comm_num": [1, 2],
             "strategy.use_hierarchical_allreduce": [False, True], "strategy.use_local_sgd": [False, True],
             "strategy.local_sgd_steps": [4], "env.OMP_NUM_THREADS": [1, 2], "bind_cores_to_rank": [False, True]},
    "small": {"strategy.fuse_all_reduce_ops": [True, False], "strategy.use_local_sgd": [False, True],
              "strategy.local_sgd_steps": [4], "env.OMP_NUM_THREADS": [1, 2], "bind_cores_to_rank": [False, True]},
    "tiny": {"strategy.use_local_sgd": [False, True], "strategy.local_sgd_steps": [4]},  # the script's own check
}
PICK_WITHIN = 0.95
TIME_AT_MOST = 0.4


def space_of(knobs: dict, trial_seconds: float) -> dict:
    return {"metric": "steps", "trial_seconds": trial_seconds, "knobs": knobs}


def base_of(model: str, nproc: int, steps: int, out: Path) -> dict:
    return {"nproc_per_node": nproc, "training_script": WORKER, "print_config": False,
            "training_script_args": ["--model", model, "--api", "optimizer", "--steps", str(steps), "--out", str(out)]}


def grid(model: str, space: tune_space.Space, args, root: Path) -> tuple:
    """({point: [its rounds' steps/s]}, seconds the grid took): measured, or as ``--grid`` kept it."""
    if args.grid:
        kept = json.loads(Path(args.grid).read_text())[model]
        by_label = {tune_space.label(p): p for p in space.points()}
        return {by_label[label]: rates for label, rates in kept["rates"].items()}, kept["seconds"]
    start = time.monotonic()
    rates = alternated(model, space.points(), args.rounds, "grid", space, args, root)
    seconds = time.monotonic() - start
    if args.save_grid:
        path = Path(args.save_grid)
        kept = json.loads(path.read_text()) if path.exists() else {}
        kept[model] = {"seconds": seconds, "rates": {tune_space.label(p): v for p, v in rates.items()}}
        path.write_text(json.dumps(kept, indent=1))
    return rates, seconds


def alternated(model: str, points: list, rounds: int, name: str, space: tune_space.Space, args, root: Path) -> dict:
    """{point: [steps/s of each round]}: every point run once a round, every other round in the reverse order."""
    rates = {}
    for r in range(rounds):
        for i, point in enumerate(points if r % 2 == 0 else points[::-1]):
            rate = one_run(model, point, space, args, root / f"{name}-{model}-{r}-{points.index(point)}")
            rates.setdefault(point, []).append(rate)
            progress(f"  {name} {model} round {r + 1} {i + 1}/{len(points)}: {tune_space.label(point)}: {rate:.3g} steps/s")
    return rates


def one_run(model: str, point: tuple, space: tune_space.Space, args, folder: Path) -> float:
    """Rank 0's steps/s over one job of ``--steps`` steps at ``point`` (0 when the job failed)."""
    out = folder / "out"
    out.mkdir(parents=True)
    config = folder / "point.yaml"
    config.write_text(tune_trial.to_yaml(tune_trial.config(base_of(model, args.nproc, args.steps, out), space, point),
                                         ""))
    done = subprocess.run([sys.executable, "-m", "launcher", "--config", str(config), "--log_dir",
                           str(folder / "logs")], env=bench_env(), capture_output=True, text=True, timeout=900)
    result = out / "result.0.json"
    return json.loads(result.read_text())["steps_per_s"] if done.returncode == 0 and result.exists() else 0.0


def tuner(model: str, space_doc: dict, space: tune_space.Space, args, root: Path) -> tuple:
    """(the tuner's pick, seconds it took)."""
    folder = root / f"tune-{model}"
    folder.mkdir()
    path = folder / "space.yaml"
    path.write_text(json.dumps(space_doc))  # JSON is YAML
    out = folder / "tuned.yaml"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "launcher", "tune", "--space", str(path), "--out", str(out),
                           "--nproc_per_node", str(args.nproc), "--print_config", "false", "--log_dir",
                           str(folder / "logs"), WORKER, "--model", model, "--api", "optimizer", "--steps", "1000000",
                           "--out", str(folder / "out")], env=bench_env(), capture_output=True, text=True)
    seconds = time.monotonic() - start
    progress(done.stdout[-3000:] + done.stderr[-1000:])
    if done.returncode != 0:
        return None, seconds
    import yaml

    tuned = yaml.safe_load(out.read_text())
    base = base_of(model, args.nproc, 0, folder / "out")
    keys = ("env", "strategy", "bind_cores_to_rank")
    pick = next((p for p in space.points() if all(tune_trial.config(base, space, p).get(k) == tuned.get(k)
                                                  for k in keys)), None)
    return pick, seconds


def confirm(model: str, best: tuple, pick: tuple, rounds: dict, space: tune_space.Space, args, root: Path) -> float:
    """The pick's rate over the grid's best's when both are measured ``--confirm`` rounds more, alternated: the
    medians of all their rounds. A grid's best over three rounds is itself an estimate; where the machine's noise is
    above the 5% asked, only more rounds of the two points in question say whether the pick is within it."""
    more = alternated(model, [best, pick], args.confirm, "confirm", space, args, root)
    best_rate = statistics.median(rounds[best] + more[best])
    return statistics.median(rounds[pick] + more[pick]) / best_rate if best_rate else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,conv")
    p.add_argument("--knobs", choices=sorted(KNOBS), default="full")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trial-seconds", type=float, default=60.0)
    p.add_argument("--json", default=None)
    p.add_argument("--save-grid", default=None, help="keep each model's grid here (JSON)")
    p.add_argument("--confirm", type=int, default=0,
                   help="where the pick is not the grid's best, run both this many rounds more (alternated) and judge "
                        "the pick by the medians of all their rounds")
    p.add_argument("--grid", default=None, help="a grid kept by --save-grid: the tuner alone is run against it")
    args = p.parse_args(argv)
    space_doc = space_of(KNOBS[args.knobs], args.trial_seconds)
    space = tune_space.parse(space_doc, "space", lambda name, value, where: name)
    found, ok = [], True
    with temp_root() as root:
        for model in args.models.split(","):
            rounds, grid_seconds = grid(model, space, args, root)
            pick, tune_seconds = tuner(model, space_doc, space, args, root)
            rates = {p: statistics.median(v) for p, v in rounds.items()}
            best = max(rates, key=rates.get)
            within = rates.get(pick, 0.0) / rates[best] if rates[best] else 0.0
            confirmed = None
            if args.confirm and pick is not None and pick != best:
                confirmed = confirm(model, best, pick, rounds, space, args, root)
            share = tune_seconds / grid_seconds
            met = (within if confirmed is None else confirmed) >= PICK_WITHIN and share <= TIME_AT_MOST
            ok &= met
            found.append({"model": model, "points": len(rates), "grid_best": tune_space.label(best),
                          "grid_best_steps_per_s": rates[best], "pick": tune_space.label(pick) if pick else None,
                          "pick_steps_per_s": rates.get(pick), "pick_of_best": within,
                          "pick_of_best_confirmed": confirmed, "grid_seconds": grid_seconds,
                          "tune_seconds": tune_seconds, "time_share": share, "met": met})
            rank = sorted(rates.values(), reverse=True).index(rates[pick]) + 1 if pick in rates else None
            print(f"model {model}: {len(rates)} points; grid best {tune_space.label(best)} {rates[best]:.3g} steps/s; "
                  f"tune's pick {tune_space.label(pick) if pick else '(none)'} {within:.3f} of it, #{rank} "
                  f"(goal >= {PICK_WITHIN})"
                  + ("" if confirmed is None else f"; over {args.rounds + args.confirm} rounds each: {confirmed:.3f}")
                  + f"; tune took {tune_seconds:.0f} s, {share:.2f}x the grid's {grid_seconds:.0f} s "
                  f"(goal <= {TIME_AT_MOST}): {'met' if met else 'NOT met'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
