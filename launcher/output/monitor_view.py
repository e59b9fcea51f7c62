"""What the monitor (``--monitor_port``) serves, from a view of this node (``NodeView``, made by the event loop, and each
worker's live part, read when asked): Prometheus's text (/metrics, written with prometheus_client), the health
(/healthz), the status document (/status.json, the one ``launcher status --json`` prints) and the live page (/), which
follows /view.json's stream (/events, server-sent events). No socket here: ``launcher.run.monitor`` serves them."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from launcher.untrusted import json_object

STATES = ("starting", "running", "succeeded", "failed", "stopping")
CHANGES = ("lost", "silent", "joined", "left", "straggler", "unhealthy")
HEALTH_VALUES = {"ok": 1, "failed": 0, "skipped": -1}  # launcher_node_health's value of a check's state


@dataclass(frozen=True)
class WorkerView:
    rank: int
    local_rank: int
    label: str
    pid: Optional[int]
    state: str  # one of STATES
    restarts: int
    step: Optional[int] = None  # its last report (launcher.runtime.report)
    step_seconds: Optional[float] = None  # between its last two reports, per step
    scalars: dict = field(default_factory=dict)
    last_line: str = ""
    log_bytes: int = 0
    compute_seconds: Optional[float] = None  # its own work per step, over its window (launcher.plan.stragglers)
    relative_speed: Optional[float] = None  # the fastest rank's compute time over its own, among the ranks compared


@dataclass(frozen=True)
class NodeView:
    node: int
    node_ip: str
    nodes: int
    world_size: int
    run_id: str
    phase: str  # "running", "restarting", "ended"
    restarts: int  # restarts spent (every worker of the node restarts together)
    max_restarts: int
    round: Optional[int] = None  # an elastic job's
    changes: dict = field(default_factory=dict)  # kind (CHANGES) -> how many this node saw
    reason: str = ""  # why the workers are not running (a failure, the stop, the end)
    workers: tuple = ()  # WorkerView
    events: tuple = ()  # the last events (launcher.output.event_log's), oldest first
    heartbeats: dict = field(default_factory=dict)  # node -> seconds since heard (on the node that keeps them)
    checks: dict = field(default_factory=dict)  # node -> {check: (state, reason)}: its last checkup (where judged)
    node_ips: tuple = ()  # every node's address, by node rank (the current round's, in an elastic job)
    status: dict = field(default_factory=dict)  # the status document
    node_speeds: dict = field(default_factory=dict)  # node -> relative speed (its slowest rank's), of the nodes compared
    speeds: dict = field(default_factory=dict)  # rank -> relative speed, of every rank compared (other nodes' too)


def health(view: NodeView) -> tuple:
    """(HTTP status, one line): 200 while every worker of this node is starting or running, else 503 and why."""
    if view.phase == "running" and view.workers and all(w.state in ("starting", "running") for w in view.workers):
        return 200, f"ok: {len(view.workers)} worker(s) running"
    if view.reason:
        return 503, view.reason
    return 503, {"restarting": "between two attempts (or rounds)", "ended": "the job has ended"}.get(
        view.phase, "no worker is running")


def view_json(view: NodeView, peers: Optional[tuple] = None) -> bytes:
    """This node's view as JSON (what other nodes fetch); with ``peers``, the other nodes' rows too (the page's)."""
    doc = asdict(view)
    doc.pop("status")
    doc["health"] = health(view)[1]
    if peers is not None:
        doc["peers"] = list(peers)
    return json.dumps(doc, default=str, ensure_ascii=True, allow_nan=False).encode()


# ---------------------------------------------------------------- another node's view, as it came over the network

PEER_WORKERS = 1024  # workers kept of one peer's view
TEXT_WIDTH = 300  # characters kept of one of its texts


def unreachable(node: int, host: str, why: str) -> dict:
    """The row of a node whose view could not be had."""
    return {"node": node, "node_ip": host, "phase": "", "health": "", "round": None, "workers": [],
            "error": printable(why) or "no answer"}


def peer_view(body: bytes, node: int, host: str) -> dict:
    """What node ``node`` at ``host`` sent for its /view.json, kept where well formed: its phase, health, round and
    workers (each worker's fields checked one by one). Never raises: junk is a row that says so."""
    doc = json_object(body)
    if doc is None:
        return unreachable(node, host, "it sent what is not a JSON object")
    if not isinstance(doc.get("workers"), list):
        return unreachable(node, host, "it sent what is not a node's view")
    if _int(doc.get("node")) != node:
        return unreachable(node, host, f"it answers as another node, not as node {node}")
    workers = [w for w in map(_peer_worker, doc["workers"][:PEER_WORKERS]) if w is not None]
    return {"node": node, "node_ip": host, "phase": printable(doc.get("phase")), "health": printable(doc.get("health")),
            "round": _int(doc.get("round")), "workers": workers, "error": ""}


def _peer_worker(doc) -> Optional[dict]:
    if not isinstance(doc, dict) or _int(doc.get("rank")) is None:
        return None
    state = doc.get("state")
    return {"rank": _int(doc["rank"]), "label": printable(doc.get("label")) or f"rank {_int(doc['rank'])}",
            "state": state if state in STATES else "unknown", "pid": _int(doc.get("pid")),
            "restarts": _int(doc.get("restarts")) or 0, "step": _int(doc.get("step")),
            "step_seconds": _seconds(doc.get("step_seconds")), "last_line": printable(doc.get("last_line")),
            "compute_seconds": _seconds(doc.get("compute_seconds")), "relative_speed": _seconds(doc.get("relative_speed"))}


def _seconds(value) -> Optional[float]:
    """A finite number >= 0 as a float; else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 63 else None


def printable(value) -> str:
    """A text cut to TEXT_WIDTH characters, each one not printable a space ("" for what is not a text)."""
    return "".join(c if c.isprintable() else " " for c in value[:TEXT_WIDTH]) if isinstance(value, str) else ""


def metrics(view: NodeView) -> bytes:
    """The node's metrics in Prometheus's text format."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    def family(kind, name: str, text: str, label: str, values):
        """One metric by ``label`` (a state, a rank, a node): ``values`` as (that label's value, a number; None: left out)."""
        made = kind(name, text, labels=[label])
        for key, value in values:
            if value is not None:
                made.add_metric([str(key)], value)
        return made

    class Collector:
        def collect(self):
            yield family(GaugeMetricFamily, "launcher_workers", "Workers of this node by state", "state",
                         [(state, sum(1 for w in view.workers if w.state == state)) for state in STATES])
            yield CounterMetricFamily("launcher_worker_restarts", "Restarts of this node's workers", value=view.restarts)
            if view.round is not None:
                yield GaugeMetricFamily("launcher_round", "The elastic job's current round", value=view.round)
            yield GaugeMetricFamily("launcher_nodes", "Nodes in the job (the current round's)", value=view.nodes)
            yield family(CounterMetricFamily, "launcher_membership_changes", "Membership changes seen by this node",
                         "cause", [(kind, view.changes.get(kind, 0)) for kind in CHANGES])
            yield family(CounterMetricFamily, "launcher_log_bytes", "Bytes each worker wrote", "rank",
                         [(w.rank, w.log_bytes) for w in view.workers])
            yield family(GaugeMetricFamily, "launcher_worker_step", "The last step each worker reported", "rank",
                         [(w.rank, w.step) for w in view.workers])
            yield family(GaugeMetricFamily, "launcher_worker_step_seconds", "Seconds per step, between a worker's last "
                         "two reports", "rank", [(w.rank, w.step_seconds) for w in view.workers])
            yield family(GaugeMetricFamily, "launcher_worker_relative_speed", "The fastest rank's compute time per step "
                         "over this worker's (1: the fastest)", "rank", [(w.rank, w.relative_speed) for w in view.workers])
            yield family(GaugeMetricFamily, "launcher_node_relative_speed", "Each node's relative speed: its slowest "
                         "rank's", "node", sorted(view.node_speeds.items()))
            yield family(GaugeMetricFamily, "launcher_node_heartbeat_age_seconds", "Seconds since the node keeping the "
                         "membership last heard each member", "node", sorted(view.heartbeats.items()))
            checks = GaugeMetricFamily("launcher_node_health", "Each node's last health check, by check: 1 ok, 0 "
                                       "failed, -1 skipped (on the node that judges them)", labels=["node", "check"])
            for node, found in sorted(view.checks.items()):
                for check, (state, _) in sorted(found.items()):
                    checks.add_metric([node, check], HEALTH_VALUES.get(state, 0))
            yield checks

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry)


PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>launcher</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.2em;margin:0 0 .3em}
#summary{color:#555;margin-bottom:1em}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.25em .6em;border-bottom:1px solid #ddd;font-variant-numeric:tabular-nums}
td.line{font-family:ui-monospace,monospace;white-space:pre;max-width:50em;overflow:hidden;text-overflow:ellipsis}
tr.failed td,tr.unreachable td{background:#fde2e2} tr.stopping td{background:#fff4d6} tr.succeeded td{color:#2a7a2a}
#events{font-family:ui-monospace,monospace;font-size:12px;color:#444;margin-top:1em;white-space:pre}
#health.bad{color:#b00} #checks{white-space:pre;margin-bottom:1em;color:#555}
</style></head><body>
<h1>launcher: <span id="job"></span></h1>
<div id="summary"><span id="health"></span> <span id="membership"></span></div>
<div id="checks"></div>
<table><thead><tr><th>rank</th><th>node</th><th>state</th><th>pid</th><th>restarts</th><th>step</th>
<th>s/step</th><th>speed</th><th>last line</th></tr></thead><tbody id="rows"></tbody></table>
<div id="events"></div>
<script>
"use strict";
function cell(row, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; row.appendChild(td); }
function show(v) {
  document.getElementById("job").textContent = "node " + v.node + " (" + v.node_ip + ") of " + v.nodes + ", run " + v.run_id;
  const h = document.getElementById("health");
  h.textContent = v.health; h.className = v.phase === "running" && v.health.startsWith("ok") ? "" : "bad";
  document.getElementById("membership").textContent = v.round === null ? "" :
    "round " + v.round + ", world size " + v.world_size + "; lost " + (v.changes.lost || 0) + ", silent " +
    (v.changes.silent || 0) + ", joined " + (v.changes.joined || 0) + ", left " + (v.changes.left || 0);
  document.getElementById("checks").textContent = Object.entries(v.checks || {}).map(([node, found]) => {
    const bad = Object.entries(found).filter(([, s]) => s[0] === "failed");
    const said = bad.map(([c, s]) => c + " failed: " + s[1]).join("; ");
    return "health of node " + node + ": " + (bad.length ? said : "passed");
  }).join("\\n");
  const rows = document.getElementById("rows");
  const fresh = document.createElement("tbody"); fresh.id = "rows";
  const all = v.workers.map(w => [v.node, w]);
  const silent = [];
  for (const p of v.peers || []) {
    if (p.error) silent.push(p); else for (const w of p.workers) all.push([p.node, w]);
  }
  all.sort((a, b) => a[1].rank - b[1].rank);
  for (const [node, w] of all) {
    const tr = document.createElement("tr"); tr.className = w.state; tr.dataset.rank = w.rank; tr.dataset.node = node;
    cell(tr, w.label); cell(tr, node); cell(tr, w.state, "state"); cell(tr, w.pid === null ? "" : w.pid);
    cell(tr, w.restarts); cell(tr, w.step === null ? "" : w.step);
    cell(tr, w.step_seconds === null ? "" : w.step_seconds.toFixed(3));
    const speed = (v.speeds || {})[w.rank] ?? w.relative_speed;
    cell(tr, speed === null || speed === undefined ? "" : speed.toFixed(2), "speed"); cell(tr, w.last_line, "line");
    fresh.appendChild(tr);
  }
  for (const p of silent) {
    const tr = document.createElement("tr"); tr.className = "unreachable"; tr.dataset.node = p.node;
    cell(tr, "node " + p.node); cell(tr, p.node + " (" + p.node_ip + ")"); cell(tr, "unreachable", "state");
    for (let i = 0; i < 5; i++) cell(tr, "");
    cell(tr, p.error, "line"); fresh.appendChild(tr);
  }
  rows.replaceWith(fresh);
  document.getElementById("events").textContent = v.events.map(e =>
    new Date(e.time * 1000).toISOString() + " " + e.event + (e.rank !== undefined ? " rank " + e.rank : "") +
    (e.member ? " " + e.member : "") + (e.cause ? ": " + e.cause : "") + (e.reason ? ": " + e.reason : "")).join("\\n");
}
function poll() { fetch("job.json").then(r => r.json()).then(show).catch(() => {}).finally(() => setTimeout(poll, 1000)); }
if (window.EventSource) {
  const source = new EventSource("events");
  source.onmessage = m => show(JSON.parse(m.data));
  source.onerror = () => { if (source.readyState === EventSource.CLOSED) poll(); };
} else { poll(); }
</script></body></html>
"""
