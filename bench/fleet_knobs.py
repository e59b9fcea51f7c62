"""Fleet's tuning knobs side by side: steps/s and CPU per step of each strategy setting, against DDP.

    python bench/fleet_knobs.py [--steps 100] [--rounds 3] [--models mlp,conv] [--only VARIANT,...]
                                [--device cpu|cuda] [--nproc 2] [--budget SECONDS] [--tiny] [--json FILE]

Two models (bench/knob_worker.py): the Fleet tutorial's MLP and a small CNN with BatchNorm. For each,
every variant below runs the same training (SGD, lr 0.01, ``--nproc`` workers, gloo on the CPU or
NCCL with one worker per GPU under ``--device cuda``), reporting rank 0's steps/s over STEPS timed steps
and the workers' CPU ms per step (time.process_time of each whole worker process, the mean over the
ranks), each the median over the rounds. Rounds alternate the variants (round 1 runs every variant
once, then round 2, ...), so that a drift of the machine's load hits them all alike; each ratio is the
median over the rounds of that round's pair (a variant's figure over ddp's of the same round).

  ddp                  hand-written DistributedDataParallel under torchrun: the baseline of the ratios
  model                fleet.distributed_model(model) + plain SGD, under python -m launcher
  optimizer            fleet.distributed_optimizer(SGD, DistributedStrategy()), optimizer.minimize(loss)
  optimizer-<knob>     the same with one knob set (the table's notes say which)
  optimizer-localsgd*  use_local_sgd with local_sgd_steps 2 or 4 (local_sgd_is_warm_steps=1)
  optimizer-bound, ddp-ours, ddp-ours-bound
                       our launcher with and without --bind_cores_to_rank (each worker its own cores,
                       OMP_NUM_THREADS matched to them), for optimizer and for DDP
  optimizer-omp2       oversubscribed: OMP_NUM_THREADS=2 set for each worker, unbound (vs optimizer-bound)

Every run checks that the ranks' parameters agree (a checksum of each rank's): at the end of the
run, or for local SGD right after the last step that averaged the parameters, the only place where
they must. A variant the launcher refuses (an option it does not have yet) is reported as n/a; a run
that fails is an error row; neither stops the benchmark. ``--budget``: start no run after that many
seconds (the rest stay unmeasured), for a caller with a hard time limit; ``--json`` is also rewritten
after every round. Ends with the goals: optimizer >= 1.0x ddp steps/s on each model, bound >= unbound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import harness  # noqa: E402
from launcher.plan.topology import format_cpu_list  # noqa: E402
from harness import BenchError, Job, PortReservations, Run, bench_env, progress, temp_root  # noqa: E402

WORKER = "knob_worker.py"
BIND = "--bind_cores_to_rank"
MODELS = ("mlp", "conv")
CHECKSUM_RTOL = 1e-9  # the ranks all-reduce the same sums: equal to the last bit in practice
LAUNCHERS = {launcher.name: launcher for launcher in harness.LAUNCHERS}  # "ours", "torchrun"
BOUND_PAIRS = (("optimizer-bound", "optimizer"), ("ddp-ours-bound", "ddp-ours"), ("optimizer-bound", "optimizer-omp2"))


@dataclass(frozen=True)
class Variant:
    name: str
    launcher: str  # "ours" or "torchrun"
    api: str  # knob_worker.py --api
    strategy: dict = field(default_factory=dict)  # DistributedStrategy attributes
    env: dict = field(default_factory=dict)  # added to the launcher's environment (FLAGS_*, OMP_NUM_THREADS)
    options: tuple = ()  # extra options of our launcher
    note: str = ""  # what the row is, for the table's notes

    @property
    def local_sgd(self) -> bool:
        return bool(self.strategy.get("use_local_sgd"))

    def setting(self) -> str:
        """The variant's settings in one phrase."""
        parts = [f"{k}={v}" for k, v in self.strategy.items()] + [f"{k}={v}" for k, v in self.env.items()] + list(self.options)
        return ", ".join(parts) or "defaults"


def variants(nproc: int) -> list[Variant]:
    """Every variant, in the order of a round and of the tables."""
    return [
        Variant("ddp", "torchrun", "ddp", note="DistributedDataParallel under torchrun: the baseline"),
        Variant("model", "ours", "model", note="fleet.distributed_model + plain SGD"),
        Variant("optimizer", "ours", "optimizer", note="fleet.distributed_optimizer, default strategy"),
        Variant("optimizer-nofuse", "ours", "optimizer", {"fuse_all_reduce_ops": False},
                note="one all-reduce per gradient"),
        Variant("optimizer-fuse32", "ours", "optimizer", {"fuse_all_reduce_ops": True},
                {"FLAGS_fuse_parameter_memory_size": "32"}, note="32 MB buckets: each model's gradients in one bucket"),
        Variant("optimizer-nccl2", "ours", "optimizer", {"nccl_comm_num": 2}, note="two communicators, buckets in turn"),
        Variant("optimizer-hier", "ours", "optimizer",
                {"use_hierarchical_allreduce": True, "hierarchical_allreduce_inter_nranks": nproc},
                note=f"one node of {nproc}: degenerates to a reduce to rank 0 and a broadcast from it (the all-reduce "
                     "between node leaders has one member), each bucket waited for"),
        Variant("optimizer-threads1", "ours", "optimizer", {"num_threads": 1}, note="torch.set_num_threads(1)"),
        Variant("optimizer-threads2", "ours", "optimizer", {"num_threads": 2}, note="torch.set_num_threads(2)"),
        Variant("optimizer-syncar", "ours", "optimizer", env={"FLAGS_sync_nccl_allreduce": "1"},
                note="each bucket's all-reduce waited for on the spot"),
        Variant("optimizer-localsgd2", "ours", "optimizer",
                {"use_local_sgd": True, "local_sgd_steps": 2, "local_sgd_is_warm_steps": 1},
                note="parameters averaged every 2 steps, no gradient all-reduce"),
        Variant("optimizer-localsgd4", "ours", "optimizer",
                {"use_local_sgd": True, "local_sgd_steps": 4, "local_sgd_is_warm_steps": 1},
                note="parameters averaged every 4 steps, no gradient all-reduce"),
        Variant("optimizer-bound", "ours", "optimizer", options=(BIND,), note="each worker bound to its own cores"),
        Variant("ddp-ours", "ours", "ddp", note="DistributedDataParallel under our launcher, unbound"),
        Variant("ddp-ours-bound", "ours", "ddp", options=(BIND,), note="the same, each worker bound to its own cores"),
        Variant("optimizer-omp2", "ours", "optimizer", env={"OMP_NUM_THREADS": "2"},
                note="OMP_NUM_THREADS=2 for each worker, unbound: oversubscribed on 2 cores"),
    ]


# ---------------------------------------------------------------- one run


@dataclass
class Sample:
    """One run of one variant."""

    steps_per_s: float  # rank 0's
    cpu_ms_per_step: float  # the mean over the ranks
    checksums: list  # one per rank
    checksum_step: int  # the step (from 0, warm-up included) after which the checksums were taken
    agree: bool
    ranks: list  # each rank's result.<rank>.json


@dataclass
class Refused:
    """Our launcher refused the variant's options (not merged yet): n/a, not an error."""

    line: str


@dataclass(frozen=True)
class Config:
    steps: int
    device: str
    nproc: int
    warmup: int = 3


def command(variant: Variant, model: str, cfg: Config, out: Path, ports: PortReservations) -> list[str]:
    args = ("--model", model, "--api", variant.api, "--steps", cfg.steps, "--out", out, "--device", cfg.device,
            "--warmup", cfg.warmup, "--strategy", json.dumps(variant.strategy))
    argv = LAUNCHERS[variant.launcher].job_command(Job(cfg.nproc, WORKER, args), ports)
    if variant.options:
        if variant.launcher != "ours":
            raise BenchError(f"{variant.name}: launcher options are for ours")
        at = argv.index("launcher") + 1  # python -m launcher <here> ...
        argv[at:at] = list(variant.options)
    return argv


def environment(variant: Variant, cfg: Config) -> dict[str, str]:
    env = {**bench_env(), **variant.env}
    if cfg.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU workers with gloo, also on a machine with GPUs
    return env


def run_once(variant: Variant, model: str, cfg: Config, folder: Path, timeout: float) -> Sample | Refused:
    """Run ``variant`` on ``model`` once, in ``folder``; its sample, or Refused. BenchError when it fails."""
    out = folder / "out"
    out.mkdir(parents=True)
    with PortReservations() as ports:
        run = Run(command(variant, model, cfg, out, ports), folder, env=environment(variant, cfg))
        try:
            code = run.wait(timeout)
        finally:
            left = run.leftovers()
            run.stop()
    if code != 0:
        text = _read(run.stderr_path)
        if variant.options and "No such option" in text:
            return Refused(_first_line(text, "No such option"))
        raise BenchError(f"exit code {code}: {_first_line(text + _read(run.stdout_path), 'Error', last=True)}")
    if left:
        progress(f"    note: {left} process(es) outlived the launcher")
    ranks = []
    for rank in range(cfg.nproc):
        path = out / f"result.{rank}.json"
        if not path.exists():
            raise BenchError(f"rank {rank} wrote no {path.name}")
        ranks.append(json.loads(path.read_text()))
    sums = [r["checksum"] for r in ranks]
    agree = all(abs(s - sums[0]) <= CHECKSUM_RTOL * max(1.0, abs(sums[0])) for s in sums)
    return Sample(ranks[0]["steps_per_s"], statistics.fmean(r["cpu_ms_per_step"] for r in ranks), sums,
                  ranks[0]["checksum_step"], agree, ranks)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _first_line(text: str, marker: str, last: bool = False) -> str:
    """The first (or last) line holding ``marker``; else the last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line for line in lines if marker in line]
    if marked:
        return marked[-1 if last else 0]
    return lines[-1] if lines else "(no output)"


# ---------------------------------------------------------------- rounds and rows


@dataclass
class Row:
    model: str
    variant: Variant
    samples: list = field(default_factory=list)
    rounds: list = field(default_factory=list)  # the round of each sample
    refused: Optional[str] = None
    error: Optional[str] = None

    @property
    def measured(self) -> bool:
        return bool(self.samples)

    def steps_per_s(self) -> Optional[float]:
        return statistics.median(s.steps_per_s for s in self.samples) if self.samples else None

    def cpu_ms(self) -> Optional[float]:
        return statistics.median(s.cpu_ms_per_step for s in self.samples) if self.samples else None

    def agree(self) -> Optional[bool]:
        return all(s.agree for s in self.samples) if self.samples else None

    def status(self) -> str:
        if self.refused is not None:
            return "n/a"
        if self.error is not None:
            return "error"
        return "ok" if self.samples else "not run"

    def as_json(self, base: Optional[Row]) -> dict:
        last = self.samples[-1] if self.samples else None
        return {
            "variant": self.variant.name, "launcher": self.variant.launcher, "api": self.variant.api,
            "strategy": self.variant.strategy, "env": self.variant.env, "options": list(self.variant.options),
            "status": self.status(), "refused": self.refused, "error": self.error,
            "steps_per_s": self.steps_per_s(), "cpu_ms_per_step": self.cpu_ms(),
            "steps_ratio_vs_ddp": paired(self, base, "steps_per_s"),
            "cpu_ratio_vs_ddp": paired(self, base, "cpu_ms_per_step"),
            "ranks_agree": self.agree(), "local_sgd": self.variant.local_sgd,
            "checksum_step": last.checksum_step if last else None,
            "samples": [{"steps_per_s": s.steps_per_s, "cpu_ms_per_step": s.cpu_ms_per_step, "checksums": s.checksums,
                         "agree": s.agree} for s in self.samples],
            "rank0_cpus": last.ranks[0]["cpus"] if last else None,
            "rank0_threads": last.ranks[0]["torch_threads"] if last else None,
        }



def paired(a: Row, b: Optional[Row], metric: str) -> Optional[float]:
    """The median over the rounds both ran of a's ``metric`` over b's in that round: the machine's speed drifts
    between rounds (by 20% on a shared 2-core machine), much less between two runs of one round."""
    if b is None:
        return None
    theirs = {r: getattr(s, metric) for r, s in zip(b.rounds, b.samples)}
    ratios = [getattr(s, metric) / theirs[r] for r, s in zip(a.rounds, a.samples) if theirs.get(r)]
    return statistics.median(ratios) if ratios else None


def bench(models: list[str], chosen: list[Variant], cfg: Config, rounds: int, budget: Optional[float],
          json_path: Optional[str]) -> dict[str, list[Row]]:
    rows = {m: [Row(m, v) for v in chosen] for m in models}
    timeout = 90 + cfg.steps * 1.0
    began = time.monotonic()
    with temp_root() as root:
        for r in range(rounds):
            for model in models:
                for row in rows[model]:
                    if row.refused is not None or row.error is not None:
                        continue  # every later run would say the same
                    if budget is not None and time.monotonic() - began > budget:
                        progress(f"  budget of {budget:.0f} s spent: round {r + 1} {model} {row.variant.name} not run")
                        continue
                    t0 = time.monotonic()
                    folder = root / f"{model}-{row.variant.name}-{r}"
                    try:
                        got = run_once(row.variant, model, cfg, folder, timeout)
                    except Exception as e:  # one variant failing must not end the benchmark
                        row.error = str(e) if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"
                        progress(f"  round {r + 1} {model} {row.variant.name}: error: {row.error}")
                        continue
                    if isinstance(got, Refused):
                        row.refused = got.line
                        progress(f"  round {r + 1} {model} {row.variant.name}: n/a (launcher refused: {got.line})")
                        continue
                    row.samples.append(got)
                    row.rounds.append(r)
                    progress(f"  round {r + 1} {model} {row.variant.name}: {got.steps_per_s:.1f} steps/s, "
                             f"{got.cpu_ms_per_step:.1f} CPU ms/step, ranks {'agree' if got.agree else 'DIFFER'} "
                             f"({time.monotonic() - t0:.1f} s)")
            if json_path:
                write_json(json_path, rows, cfg, rounds, complete=r == rounds - 1)
    return rows


# ---------------------------------------------------------------- report


def fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def ranks_cell(row: Row, cfg: Config) -> str:
    agree = row.agree()
    if agree is None:
        return "-"
    if cfg.nproc == 1:
        return "1 rank"
    word = "same" if agree else "DIFFER"
    if row.variant.local_sgd:
        return f"{word}@{row.samples[-1].checksum_step}"
    return word


def table(model: str, rows: list[Row], cfg: Config) -> str:
    base = next((r for r in rows if r.variant.name == "ddp"), None)
    head = ["variant", "launcher", "steps/s", "CPU ms/step", "steps vs ddp", "CPU vs ddp", "ranks", "rank0 cpus/threads"]
    body, notes = [], []

    def note(text: str) -> str:
        notes.append(text)
        return f" [{len(notes)}]"

    for r in rows:
        v = r.variant
        name = v.name + (note(f"{v.name}: {v.setting()}; {v.note}") if v.name not in ("ddp", "model", "optimizer") else "")
        if r.refused is not None:
            sps = cpu = "n/a" + note(f"{v.name}: n/a (launcher refused: {r.refused})")
        elif r.error is not None:
            sps = cpu = "error" + note(f"{v.name}: {r.error}")
        else:
            sps, cpu = fmt(r.steps_per_s()), fmt(r.cpu_ms())
        ranks = ranks_cell(r, cfg)
        if v.local_sgd and r.measured and cfg.nproc > 1:
            ranks += note(f"{v.name}: local SGD keeps the ranks apart between averagings: compared right after step "
                          f"{r.samples[-1].checksum_step} (from 0, warm-up included), the last that averaged")
        where = "-"
        if r.measured:
            info = r.samples[-1].ranks[0]
            where = f"{format_cpu_list(info['cpus'])} x{info['torch_threads']}"
        body.append([name, v.launcher, sps, cpu, fmt(paired(r, base, "steps_per_s")),
                     fmt(paired(r, base, "cpu_ms_per_step")), ranks, where])
    widths = [max(len(str(line[i])) for line in [head] + body) for i in range(len(head))]
    lines = [f"model {model}: {cfg.nproc} workers on {cfg.device}, {cfg.steps} timed steps, median over rounds (ratios: of the rounds' pairs)",
             "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
    lines += [f"  [{i}] {text}" for i, text in enumerate(notes, 1)]
    return "\n".join(lines)


def goals(rows: dict[str, list[Row]]) -> list[dict]:
    """optimizer >= 1.0x ddp steps/s on each model; bound >= unbound (steps/s) for each pair measured."""
    found = []
    for model, model_rows in rows.items():
        by = {r.variant.name: r for r in model_rows}
        pairs = [("optimizer", "ddp", "optimizer >= 1.0x ddp steps/s")]
        pairs += [(b, u, "bound >= unbound steps/s") for b, u in BOUND_PAIRS]
        for a, b, what in pairs:
            if a not in by or b not in by:
                continue
            x, y = by[a], by[b]
            why = next((f"{r.variant.name} {r.status()}" for r in (x, y) if not r.measured), None)
            value = paired(x, y, "steps_per_s")
            found.append({"model": model, "goal": what, "pair": [a, b], "ratio": value,
                          "met": None if value is None else value >= 1.0, "why_not": why})
    return found


def goals_lines(found: list[dict]) -> list[str]:
    out = []
    for what in dict.fromkeys(g["goal"] for g in found):
        parts = []
        for g in (g for g in found if g["goal"] == what):
            pair = "" if what.startswith("optimizer >=") else f" {g['pair'][0]}/{g['pair'][1]}"
            verdict = f"n/a ({g['why_not']})" if g["ratio"] is None else f"{g['ratio']:.2f}x {'yes' if g['met'] else 'NO'}"
            parts.append(f"{g['model']}{pair} {verdict}")
        out.append(f"goal {what}: " + ", ".join(parts))
    return out


def write_json(path: str, rows: dict[str, list[Row]], cfg: Config, rounds: int, complete: bool = True) -> None:
    data = {
        "device": cfg.device, "nproc": cfg.nproc, "steps": cfg.steps, "warmup": cfg.warmup, "rounds": rounds,
        "complete": complete, "load_average": os.getloadavg(),
        "models": {m: [r.as_json(next((b for b in rs if b.variant.name == "ddp"), None)) for r in rs] for m, rs in rows.items()},
        "goals": goals(rows),
    }
    Path(path + ".tmp").write_text(json.dumps(data, indent=1))
    os.replace(path + ".tmp", path)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="timed steps per run (default 100)")
    p.add_argument("--rounds", type=int, default=3, help="runs of every variant, alternated (default 3)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: mlp, conv")
    p.add_argument("--only", default=None, help="comma-separated variants (default: all)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nproc", type=int, default=None, help="workers (default: 2 on the CPU, every GPU with --device cuda)")
    p.add_argument("--budget", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--tiny", action="store_true", help="2 steps, 1 round: does it all work")
    p.add_argument("--json", default=None, help="write the results there too")
    args = p.parse_args(argv)
    if args.tiny:
        args.steps, args.rounds = 2, 1

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        p.error(f"--models: unknown {','.join(unknown) or '(none given)'}; choose among {','.join(MODELS)}")
    if args.device == "cuda":
        import gpu_timing  # its GPU count, read in a child so that this process never touches CUDA

        gpus = gpu_timing.gpus()
        if not gpus:
            print("fleet_knobs: --device cuda needs a CUDA GPU, and torch sees none on this machine", file=sys.stderr)
            return 1
        nproc = args.nproc or gpus
        if nproc > gpus:
            p.error(f"--nproc {nproc}: this machine has {gpus} GPU(s)")
    else:
        nproc = args.nproc or 2
    every = variants(nproc)
    chosen = every
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        known = {v.name for v in every}
        wrong = [n for n in names if n not in known]
        if wrong:
            p.error(f"--only: unknown variant {','.join(wrong)}; choose among {','.join(v.name for v in every)}")
        chosen = [v for v in every if v.name in names]
    cfg = Config(steps=args.steps, device=args.device, nproc=nproc)

    progress(f"fleet knobs: {len(chosen)} variants x {len(models)} models x {args.rounds} rounds, {nproc} workers on "
             f"{args.device}, {args.steps} steps (load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    rows = bench(models, chosen, cfg, args.rounds, args.budget, args.json)
    if args.json:
        write_json(args.json, rows, cfg, args.rounds)
    print("\n\n".join(table(m, rows[m], cfg) for m in models))
    print()
    for line in goals_lines(goals(rows)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
