"""This node's view for the monitor (``launcher.output.monitor_view.NodeView``), made in the event loop's thread from
what the launch holds: its workers and their output, the policy's state, the progress pages, the event log's
counts and last events, and the state file's record. Read only; cheap (a stat and a short read per worker)."""

from __future__ import annotations

from typing import Optional

from launcher.output import state_file
from launcher.output.monitor_view import CHANGES, NodeView, WorkerView, printable
from launcher.plan import policy


def build(launch, job, group=None, state: Optional[policy.State] = None) -> NodeView:
    plan, events = launch.plan, launch.events
    workers = tuple(_worker(launch, job, spec, group, state) for spec in plan.workers)
    launch.last_views = {w.rank: w for w in workers}
    last_stop = next((e for e in reversed(events.recent) if e["event"] in ("stop", "job_ended")), None)
    record = launch.records.current()
    return NodeView(
        node=plan.node_rank, node_ip=plan.node_ip, nodes=len(plan.node_ips), world_size=plan.world_size,
        run_id=launch.run_id, phase=record.phase, restarts=job.attempt, max_restarts=plan.max_restarts,
        round=events.round, changes={kind: events.counts.get(f"member_{kind}", 0) for kind in CHANGES},
        reason=_reason(last_stop, workers), workers=workers, events=tuple(events.recent),
        heartbeats=job.heartbeat_ages(), checks=job.health_states(), node_ips=tuple(plan.node_ips),
        status={"nodes": [state_file.document(record, "running, this launcher")]},
        node_speeds=dict(launch.stragglers.verdict.nodes), speeds=dict(launch.stragglers.verdict.ranks))


def _worker(launch, job, spec, group, state) -> WorkerView:
    worker = group.workers.get(spec.rank) if group is not None else None
    if worker is None:  # between two attempts, or not started: as it was last seen
        seen = getattr(launch, "last_views", {}).get(spec.rank)
        if seen is not None:
            return seen
        return WorkerView(spec.rank, spec.local_rank, spec.label, None, "starting", job.attempt)
    report = launch.progress.last(spec.local_rank)
    line = _last_line(worker.output)
    now = launch.clock.monotonic()
    return WorkerView(
        rank=spec.rank, local_rank=spec.local_rank, label=spec.label, pid=worker.pid,
        state=_state(worker, state, line, report), restarts=job.attempt,
        step=report["step"] if report else None, step_seconds=launch.progress.pace(spec.local_rank),
        scalars=dict(report["scalars"]) if report else {}, last_line=line,
        log_bytes=worker.output.bytes_written(), compute_seconds=launch.stragglers.compute(spec.rank, now),
        relative_speed=launch.stragglers.verdict.ranks.get(spec.rank))


def _state(worker, state: Optional[policy.State], line: str, report) -> str:
    if worker.returncode is not None:
        return "succeeded" if worker.returncode == 0 else "failed"
    if state is not None and state.stopping:
        return "stopping"
    return "running" if line or report is not None or worker.output.last_written() is not None else "starting"


def _last_line(output) -> str:
    try:
        lines = output.last_lines(1)
    except (OSError, RuntimeError):  # a tail being written: the next view has it
        return ""
    text = lines[-1] if lines else ""
    text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    return printable(text)


def _reason(last_stop: Optional[dict], workers: tuple) -> str:
    failed = next((w for w in workers if w.state == "failed"), None)
    if last_stop is not None and last_stop.get("cause"):
        return f"stopping: {last_stop['cause']}" if last_stop["event"] == "stop" else last_stop["cause"]
    if last_stop is not None and last_stop["event"] == "job_ended":
        return f"the job ended with exit code {last_stop.get('code')}"
    if failed is not None:
        return f"{failed.label} failed"
    return ""
