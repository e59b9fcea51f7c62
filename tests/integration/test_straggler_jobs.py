"""The straggler found on a real job: two gloo ranks under ``python -m launcher --nproc_per_node 2``, rank 1 slowed on
purpose (0.2 s more of its own work per step), its waits counted by fleet's gradient sync or by
``timed_allreduce_hook`` under DistributedDataParallel. Rank 1's compute time is the larger, rank 0's wait the
larger, and the launcher names rank 1: in its log, in events.jsonl, in /metrics and /view.json. Every wait is for an
event, bounded; no duration is asserted."""

import json
import urllib.request

import pytest

from conftest import WORKERS, read_until, start_launcher, wait_for

pytest.importorskip("prometheus_client")
pytest.importorskip("torch")
WORKER = WORKERS / "straggler.py"
WAIT = 120


def events(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("mode", ["fleet", "ddp"])
def test_a_rank_slowed_on_purpose_is_named_as_the_straggler(tmp_path, mode):
    from prometheus_client.parser import text_string_to_metric_families

    log = tmp_path / "logs" / "events.jsonl"
    proc = start_launcher("--nproc_per_node", 2, "--log_dir", tmp_path / "logs", "--monitor_port", 0, WORKER, tmp_path,
                          mode)
    try:
        head = read_until(proc, "monitor: http://", timeout=WAIT)
        url = head.split("monitor: ", 1)[1].split(" ", 1)[0]
        wait_for(lambda: proc.poll() is not None or any(e["event"] == "straggler" for e in events(log)), timeout=WAIT,
                 what="a straggler event")
        assert proc.poll() is None, proc.communicate()
        (named,) = [e for e in events(log) if e["event"] == "straggler"]
        assert (named["node"], named["ranks"]) == (0, [1]) and named["speed"] < 0.7, named
        assert (named["compared_nodes"], named["compared_ranks"]) == (1, 2), named
        with urllib.request.urlopen(url + "metrics", timeout=10) as r:
            samples = {(s.name, tuple(s.labels.values())): s.value
                       for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
        assert samples[("launcher_worker_relative_speed", ("1",))] < 0.7
        assert samples[("launcher_worker_relative_speed", ("0",))] == 1.0
        assert samples[("launcher_node_relative_speed", ("0",))] < 0.7
        with urllib.request.urlopen(url + "view.json", timeout=10) as r:
            view = json.loads(r.read())
        slow, fast = sorted(view["workers"], key=lambda w: -w["rank"])
        assert slow["compute_seconds"] > fast["compute_seconds"] and slow["relative_speed"] < 0.7
    finally:
        (tmp_path / "stop").touch()
        try:
            out, err = proc.communicate(timeout=WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    assert "launcher: warning: straggler: node 0 (" in head + err and ") is a straggler: rank 1 at 0." in head + err
    first, second = (json.loads((tmp_path / f"result.{rank}").read_text()) for rank in (0, 1))
    assert first["waited"] > second["waited"], (first, second)  # rank 0 waits for rank 1 at every all-reduce
    assert second["elapsed"] - second["waited"] > first["elapsed"] - first["waited"], (first, second)


def test_the_hook_s_clock_counts_only_the_wait_after_the_last_bucket(monkeypatch):
    from launcher.runtime import hooks, timing

    times = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: next(times))
    monkeypatch.setattr(timing, "waits", timing.Waits())
    clock = hooks.WaitClock()
    clock.sent(last=False)
    clock.done()  # 1.0: back during backward, nothing waited
    clock.sent(last=False)
    clock.sent(last=True)  # 2.0: backward's work is done
    clock.done()
    clock.done()  # 4.0: the last all-reduce is back
    assert timing.waited() == 2.0 and clock.in_flight == 0 and clock.last_sent is None


def test_a_slow_node_is_named_by_a_node_whose_page_watches_the_whole_job(tmp_path):
    """Two launchers (127.0.0.1 and 127.0.0.2), one rank each, the same --monitor_port: no node can compare its ranks
    among themselves, but node 0 has node 1's ranks (its view, fetched while a client reads /job.json, and the control
    channel's speeds), and names node 1."""
    from conftest import finish_all, free_ports, listening

    port, monitor = free_ports(3), free_ports(1)
    procs = [start_launcher("--cluster_node_ips", "127.0.0.1,127.0.0.2", "--node_ip", ip, "--started_port", port,
                            "--nproc_per_node", 1, "--monitor_port", monitor, "--log_dir", tmp_path / f"logs.{ip}",
                            WORKER, tmp_path, "fleet")
             for ip in ("127.0.0.2", "127.0.0.1")]
    log, other = (tmp_path / f"logs.{ip}" / "events.jsonl" for ip in ("127.0.0.1", "127.0.0.2"))

    def named():
        if any(p.poll() is not None for p in procs):
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/job.json", timeout=5) as r:
                r.read()  # a watcher: node 0 fetches node 1's view meanwhile
        except OSError:
            return False
        return all(any(e["event"] == "straggler" for e in events(path)) for path in (log, other))

    try:
        wait_for(lambda: listening("127.0.0.1", monitor), WAIT, "node 0's monitor")
        wait_for(named, WAIT, "node 0 naming node 1, and node 1 itself")
        assert all(p.poll() is None for p in procs)
        (straggler,) = [e for e in events(log) if e["event"] == "straggler"]
        assert (straggler["node"], straggler["host"], straggler["ranks"]) == (1, "127.0.0.2", [1]), straggler
        assert (straggler["compared_nodes"], straggler["compared_ranks"]) == (2, 2)
    finally:
        (tmp_path / "stop").touch()
        results = finish_all(procs, timeout=WAIT)
    assert [code for code, _, _ in results] == [0, 0], results
    # node 1 has node 0's ranks over the control channel: it names itself too
    assert {e["node"] for e in events(other) if e["event"] == "straggler"} == {1}
