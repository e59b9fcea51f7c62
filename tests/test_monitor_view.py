"""What the monitor serves (launcher.output.monitor_view), from views made by hand: the health's one line, the metrics
as Prometheus's own parser reads them, the view's JSON."""

import json

import pytest

from launcher.output.monitor_view import NodeView, WorkerView, health, metrics, view_json

pytest.importorskip("prometheus_client")


def view(*states, phase="running", reason="", **more) -> NodeView:
    workers = tuple(WorkerView(r, r, f"rank {r}", 100 + r, s, 0) for r, s in enumerate(states))
    return NodeView(0, "127.0.0.1", 1, len(states), "run", phase, 0, 0, workers=workers, reason=reason, **more)


@pytest.mark.parametrize("made, expected", [
    (view("running", "starting"), (200, "ok: 2 worker(s) running")),
    (view("running", "failed", reason="stopping: rank 1 failed (exit code 3)"), (503, "stopping: rank 1 failed (exit code 3)")),
    (view("stopping", "stopping"), (503, "no worker is running")),
    (view("succeeded", phase="ended"), (503, "the job has ended")),
    (view(phase="restarting"), (503, "between two attempts (or rounds)")),
    (view(), (503, "no worker is running")),
])
def test_health_is_200_only_while_every_worker_starts_or_runs(made, expected):
    assert health(made) == expected


def test_the_metrics_read_back_with_prometheus_s_parser():
    from prometheus_client.parser import text_string_to_metric_families

    made = view("running", "failed", round=3, changes={"lost": 2, "joined": 1, "straggler": 1})
    made = NodeView(**{**made.__dict__, "workers": (WorkerView(0, 0, "rank 0", 1, "running", 0, step=7, step_seconds=0.5,
                                                               log_bytes=10, relative_speed=0.25),),
                       "node_speeds": {0: 0.25, 1: 1.0}})
    samples = {(s.name, tuple(s.labels.values())): s.value
               for f in text_string_to_metric_families(metrics(made).decode()) for s in f.samples}
    assert samples[("launcher_round", ())] == 3
    assert samples[("launcher_membership_changes_total", ("lost",))] == 2
    assert samples[("launcher_membership_changes_total", ("silent",))] == 0
    assert samples[("launcher_membership_changes_total", ("straggler",))] == 1  # a node that left, named a straggler
    assert samples[("launcher_worker_step", ("0",))] == 7 and samples[("launcher_worker_step_seconds", ("0",))] == 0.5
    assert samples[("launcher_log_bytes_total", ("0",))] == 10
    assert samples[("launcher_worker_relative_speed", ("0",))] == 0.25
    assert samples[("launcher_node_relative_speed", ("0",))] == 0.25 and samples[("launcher_node_relative_speed", ("1",))] == 1


def test_the_view_is_plain_json_with_its_health():
    made = view("running", round=None, events=({"time": 1.0, "event": "job_started", "node": 0},))
    doc = json.loads(view_json(made))
    assert doc["health"] == "ok: 1 worker(s) running" and "status" not in doc and doc["events"][0]["event"] == "job_started"


def test_every_metric_the_grafana_dashboard_queries_is_one_the_launcher_exports():
    import re
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    dashboard = json.loads((Path(__file__).parent.parent / "docs" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries.append(dashboard["templating"]["list"][1]["query"])
    named = {m for q in queries for m in re.findall(r"\blauncher_[a-z_]+", q)}
    made = view("running", round=2, heartbeats={"n1": 0.4})
    made = NodeView(**{**made.__dict__, "workers": (WorkerView(0, 0, "rank 0", 1, "running", 0, step=1, step_seconds=0.1),)})
    exported = {s.name for f in text_string_to_metric_families(metrics(made).decode()) for s in f.samples}
    assert named and named <= exported, named - exported
    assert {p["type"] for p in dashboard["panels"]} <= {"timeseries", "stat"}


# ---------------------------------------------------------------- another node's view, as the network gives it

from launcher.output.monitor_view import peer_view  # noqa: E402


def test_a_peer_s_view_reads_back_as_its_rows():
    made = view("running", "failed")
    made = NodeView(**{**made.__dict__, "node": 1, "workers": (WorkerView(2, 0, "rank 2", 9, "running", 1, step=5,
                                                                         step_seconds=0.25, last_line="step 5",
                                                                         compute_seconds=0.2, relative_speed=0.5),)})
    row = peer_view(view_json(made), 1, "127.0.0.2")
    assert row["error"] == "" and row["node_ip"] == "127.0.0.2" and row["health"].startswith("ok")
    assert row["workers"] == [{"rank": 2, "label": "rank 2", "state": "running", "pid": 9, "restarts": 1, "step": 5,
                               "step_seconds": 0.25, "last_line": "step 5", "compute_seconds": 0.2,
                               "relative_speed": 0.5}]


@pytest.mark.parametrize("body, why", [
    (b"", "not a JSON object"), (b"\xff\xfe", "not a JSON object"), (b"[" * 100_000 + b"]" * 100_000, "not a JSON object"),
    (b'{"node": 1, "workers": [], "x": ' + b"9" * 5000 + b"}", "not a JSON object"),  # past int's digits
    (b"[]", "not a JSON object"), (b'{"node": 1, "workers": {}}', "not a node's view"),
    (b'{"node": 0, "workers": []}', "another node"), (b'{"node": true, "workers": []}', "another node"),
    (b'{"node": "1", "workers": []}', "another node"),
])
def test_what_a_peer_sends_that_is_not_its_view_is_a_row_saying_so(body, why):
    row = peer_view(body, 1, "127.0.0.2")
    assert why in row["error"] and row["workers"] == []
    json.dumps(row, allow_nan=False)


def test_a_peer_s_workers_are_kept_field_by_field():
    workers = [{"rank": 0, "state": "running", "step_seconds": float("inf"), "last_line": "\x1b[2Jx" + "y" * 1000,
                "label": ["no"], "pid": 2 ** 70, "restarts": "3", "step": 1.5, "compute_seconds": -1.0,
                "relative_speed": float("nan")},
               {"rank": True}, {"rank": "1"}, "junk", None, {"rank": 1, "state": "<script>", "step_seconds": 2}]
    text = json.dumps({"node": 1, "workers": workers + [{"rank": r} for r in range(2, 5000)]})
    row = peer_view(text.encode(), 1, "h")
    first, second = row["workers"][:2]
    assert first == {"rank": 0, "label": "rank 0", "state": "running", "pid": None, "restarts": 0, "step": None,
                     "step_seconds": None, "last_line": " [2Jx" + "y" * 295, "compute_seconds": None,
                     "relative_speed": None}
    assert second["rank"] == 1 and second["state"] == "unknown" and second["step_seconds"] == 2.0
    assert len(row["workers"]) <= 1024
    json.dumps(row, allow_nan=False)  # what the page gets parses in a browser (no Infinity, no NaN)
