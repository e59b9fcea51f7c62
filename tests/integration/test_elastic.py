"""Elastic jobs (``--nnodes MIN:MAX``) on launchers that share 127.0.0.1: the same torchrun command line on
every node, no node rank. What is promised: the launcher that binds the rendezvous endpoint is node 0;
MAX launchers start the job at once, MIN of them once the last call has passed; the workers of each round
form one group (real gloo in the tests marked ``real_torch``, one per path; the launcher's store, spoken as
torch does, in the others) and see the round's WORLD_SIZE and contiguous ranks; every node exits 0; below MIN after join_timeout every
launcher exits 1 saying how many joined. While the job runs: a node powered off (its launcher and
workers killed at once) or gone silent (all of them stopped) is lost and the survivors re-form at
once, spending no restart; a launcher that comes is admitted below MAX (a new round) and waits as a
standby at MAX, taking the place of the next member lost; below MIN the survivors wait join_timeout,
then exit 1 naming the nodes lost; node 0's launcher leaving ends the job on every node. Every wait is
bounded, and nothing of a test is left running.
"""

import json
import subprocess
import time

import psutil
import pytest

from conftest import (REPO, WORKERS, assert_all_gone, finish_all, free_ports, launcher_cmd, listening, run_launcher,
                      start_launcher, wait_for)

WORKER = str(WORKERS / "elastic_worker.py")
HOST = "127.0.0.1"
pytestmark = pytest.mark.usefixtures("workers_without_torch")


def torchrun_line(port, folder, *extra, nnodes="2:3", steps=3):
    """The endpoint on PORT; each node's worker ports above it (leave PORT to PORT+5 free)."""
    return ("--nnodes", nnodes, "--nproc-per-node", 1, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{port}",
            "--rdzv-id", "elastic-test", *extra, WORKER, folder, steps)


def records(folder) -> list:
    path = folder / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_nodes(count, args, timeout=120, env=None):
    procs = [start_launcher(*args, env=env) for _ in range(count)]
    try:
        return finish_all(procs, timeout=timeout), [p.pid for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def check_round(folder, world) -> None:
    done = records(folder)
    assert sorted(r["rank"] for r in done) == list(range(world))
    for r in done:
        env = r["env"]
        assert r["world"] == world and r["sum"] == world * (world + 1) / 2
        assert env["WORLD_SIZE"] == str(world) and env["RANK"] == str(r["rank"])
        assert env["GROUP_RANK"] == str(r["rank"]) and env["LOCAL_RANK"] == "0"
        assert env["PADDLE_TRAINERS_NUM"] == str(world) and env["PADDLE_TRAINER_ID"] == str(r["rank"])
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"


@pytest.mark.real_torch
def test_max_launchers_start_the_job_at_once(tmp_path):
    port = free_ports(6)
    # a last call far longer than the test: only MAX launchers joined can start it
    args = torchrun_line(port, tmp_path, "--rdzv-conf", "last_call_timeout=600")
    results, pids = run_nodes(3, args)  # gives up after 120 s: long before the last call could end
    for code, out, err in results:
        assert code == 0, err
    check_round(tmp_path, 3)
    errs = "".join(err for _, _, err in results)
    assert errs.count("elastic job: this launcher is node 0") == 1
    assert "round 1 (start): 3 node(s), world size 3" in errs
    assert sorted(errs.count(f"this launcher is node {n}") for n in (1, 2)) == [1, 1]
    assert_all_gone(pids + [r["pid"] for r in records(tmp_path)])


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_min_launchers_start_the_job_after_the_last_call(tmp_path, token):
    """With a job token (LAUNCHER_JOB_TOKEN) too: each hello proves it."""
    port = free_ports(6)
    env = {"LAUNCHER_JOB_TOKEN": token} if token else None
    results, pids = run_nodes(2, torchrun_line(port, tmp_path, "--rdzv-conf", "last_call_timeout=1"), env=env)
    for code, out, err in results:
        assert code == 0, err
    check_round(tmp_path, 2)
    assert "round 1 (start): 2 node(s), world size 2" in "".join(err for _, _, err in results)
    assert_all_gone(pids + [r["pid"] for r in records(tmp_path)])


def test_below_min_after_join_timeout_every_launcher_exits_1_saying_so(tmp_path):
    port = free_ports(6)
    results, pids = run_nodes(2, torchrun_line(port, tmp_path, "--rdzv-conf", "join_timeout=3", nnodes="3:4"),
                              timeout=60)
    for code, out, err in results:
        assert code == 1, err
        assert "Traceback" not in err
    errs = [err for _, _, err in results]
    assert any("only 2 node(s) joined within 3 s (join_timeout), 3 needed (--nnodes 3:4)" in e for e in errs), errs
    assert all("the elastic job did not start" in e or "did not take this launcher" in e for e in errs), errs
    assert records(tmp_path) == []
    assert_all_gone(pids)


def test_paddle3s_range_with_master_runs_the_same(tmp_path):
    port = free_ports(4)
    args = ("--nnodes", "2:3", "--master", f"{HOST}:{port}", "--nproc_per_node", 1, WORKER, tmp_path, 2)
    results, pids = run_nodes(2, args)
    for code, out, err in results:
        assert code == 0, err
    check_round(tmp_path, 2)
    assert all(r["env"]["MASTER_PORT"] == str(port + 1) for r in records(tmp_path))
    assert_all_gone(pids + [r["pid"] for r in records(tmp_path)])


def two_holding(folder):
    """Two launchers of a 2:3 job whose workers are in the group and hold until FOLDER/go; (port, procs)."""
    port = free_ports(6)
    procs = [start_launcher(*torchrun_line(port, folder, *FAST), "hold") for _ in range(2)]
    wait_ready(folder, 2, procs)
    return port, procs


FAST = ("--rdzv-conf", "last_call_timeout=0.5,heartbeat_timeout=3,keep_alive_interval=0.5")
# launchers that must all be in round 1 (MAX of them): they start it at once, however slow a loaded machine is
ALL_THREE = ("--rdzv-conf", "last_call_timeout=60,heartbeat_timeout=3,keep_alive_interval=0.5")


def ready(folder) -> dict:
    """rank -> (pid, world size) of the workers holding in the group now."""
    out = {}
    for path in folder.glob("ready.*"):
        if path.suffix != ".tmp":
            pid, world = path.read_text().split()
            out[int(path.name.split(".")[1])] = (int(pid), int(world))
    return out


def wait_ready(folder, world, procs, timeout=90, old=()):
    """Wait for WORLD workers of a round of that world size (none of them one of ``old``'s pids)."""
    def formed():
        now = ready(folder)
        return all(r in now and now[r][1] == world and now[r][0] not in old for r in range(world))
    try:
        wait_for(lambda: (folder / "ready.0").exists() and formed(), timeout=timeout, what=f"a round of {world}")
    except AssertionError:
        stop_all(procs)
        errs = "\n".join(f"--- launcher {p.pid}:\n{p.stderr.read() if p.stderr else ''}" for p in procs)
        raise AssertionError(f"no round of {world} within {timeout} s; the launchers said:\n{errs}") from None
    return {r: v for r, v in ready(folder).items() if r < world}


def stop_all(procs):
    for p in procs:
        for proc in family(p.pid):
            proc.kill()
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def family(pid) -> list:
    """A launcher and everything under it (its workers, its helpers), as psutil processes."""
    try:
        me = psutil.Process(pid)
        return [me] + me.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def power_off(proc) -> list:
    """Every process of the node killed at once; their pids."""
    procs = family(proc.pid)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return [p.pid for p in procs]


def go_and_finish(folder, procs, timeout=90):
    (folder / "go").touch()
    try:
        return finish_all(procs, timeout=timeout)
    finally:
        stop_all(procs)


def three_holding(folder, *extra):
    port = free_ports(6)
    procs = []
    for _ in range(3):
        procs.append(start_launcher(*torchrun_line(port, folder, *ALL_THREE, *extra), "hold"))
        if len(procs) == 1:  # the first one binds the endpoint: node 0, however busy the machine
            wait_for(lambda: listening(HOST, port), 60, "node 0's launcher on the endpoint")
    return port, procs, wait_ready(folder, 3, procs)


@pytest.mark.real_torch
def test_a_node_powered_off_while_the_job_runs_re_forms_the_survivors_spending_no_restart(tmp_path):
    logs = tmp_path / "logs"
    _, procs, first = three_holding(tmp_path, "--max-restarts", "0", "--log_dir", logs)
    lost = psutil.Process(first[2][0]).parent()  # node 2's launcher: not node 0
    gone = power_off(next(p for p in procs if p.pid == lost.pid))
    survivors = [p for p in procs if p.pid != lost.pid]
    wait_ready(tmp_path, 2, survivors, old={pid for pid, _ in first.values()})
    results = go_and_finish(tmp_path, survivors)
    for code, out, err in results:
        assert code == 0, err
        assert "round 2 (lost): 2 node(s), world size 2; left: node " in err and "its connection closed" in err, err
    check_round(tmp_path, 2)  # TORCHELASTIC_RESTART_COUNT 0: the loss spent none of --max-restarts 0
    headers = [line for line in (logs / "workerlog.0").read_text().splitlines() if line.startswith("=====")]
    assert "(round 1 (start): 3 node(s), world size 3)" in headers[0] and "(round 2 (lost)" in headers[1], headers
    shown = run_launcher("status", logs)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("round 1 (start): 3 node(s), world size 3") == 3, shown.stdout
    assert shown.stdout.count("round 2 (lost): 2 node(s), world size 2; left: node ") == 2, shown.stdout
    assert_all_gone([p.pid for p in procs] + gone + [r["pid"] for r in records(tmp_path)])


def test_a_silent_node_is_lost_after_the_heartbeat_timeout_and_the_survivors_go_on(tmp_path):
    _, procs, first = three_holding(tmp_path)
    silent = next(p for p in procs if p.pid == psutil.Process(first[1][0]).parent().pid)
    frozen = family(silent.pid)
    for p in frozen:
        p.suspend()  # a partition: every process of the node stopped
    try:
        survivors = [p for p in procs if p is not silent]
        wait_ready(tmp_path, 2, survivors, old={pid for pid, _ in first.values()})  # 90 s: a hang guard
    finally:
        for p in frozen:
            p.kill()
    results = go_and_finish(tmp_path, survivors)
    for code, out, err in results:
        assert code == 0, err
        assert "no heartbeat for" in err, err  # lost for its silence (how soon: bench/elastic.py, "silent node")
    check_round(tmp_path, 2)
    assert_all_gone([p.pid for p in procs] + [r["pid"] for r in records(tmp_path)])


def test_a_link_cut_is_a_silent_loss_on_both_sides(tmp_path, veth_namespaces):
    """Nodes 0 and 1 in one network namespace, node 2 in another; the veth between them goes down: node 0
    loses node 2 after the heartbeat timeout and the survivors go on; node 2 ends, saying node 0 went silent."""
    names, links, addrs = veth_namespaces
    port = free_ports(6)
    line = ("--nnodes", "2:3", "--nproc-per-node", 1, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addrs[0]}:{port}",
            "--rdzv-id", "cut", *ALL_THREE, WORKER, tmp_path, 3, "hold")
    procs = []
    for ns in (names[0], names[0], names[1]):
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *launcher_cmd(*line)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=REPO))
        time.sleep(0.3)
    first = wait_ready(tmp_path, 3, procs)
    subprocess.run(["ip", "-n", names[1], "link", "set", links[1], "down"], check=True, timeout=20)
    try:
        wait_ready(tmp_path, 2, procs[:2], old={pid for pid, _ in first.values()})
        _, cut_err = procs[2].communicate(timeout=60)
    finally:
        stop_all(procs[2:])
    assert procs[2].returncode == 1, cut_err
    assert "went silent for" in cut_err, cut_err
    results = go_and_finish(tmp_path, procs[:2])
    for code, out, err in results:
        assert code == 0, err
    assert f"({addrs[1]}) lost: no heartbeat for" in "".join(err for _, _, err in results)
    check_round(tmp_path, 2)
    assert_all_gone([p.pid for p in procs] + [pid for pid, _ in first.values()])


def test_a_launcher_that_joins_a_running_job_below_max_is_admitted_in_a_new_round(tmp_path):
    port, procs = two_holding(tmp_path)
    first = ready(tmp_path)
    procs.append(start_launcher(*torchrun_line(port, tmp_path, *FAST), "hold"))
    wait_ready(tmp_path, 3, procs, old={pid for pid, _ in first.values()})
    results = go_and_finish(tmp_path, procs)
    for code, out, err in results:
        assert code == 0, err
    assert "round 2 (joined): 3 node(s), world size 3" in "".join(err for _, _, err in results)
    assert "this launcher is node 2" in results[2][2]
    check_round(tmp_path, 3)
    assert_all_gone([p.pid for p in procs] + [r["pid"] for r in records(tmp_path)])


def add_standby(folder, line, procs):
    """A launcher of ``line`` added to ``procs``, once it says that it waits as a standby; the file of its
    stderr (FOLDER/standby.err: read while it runs)."""
    err = folder / "standby.err"
    with open(err, "w") as f:
        procs.append(subprocess.Popen(launcher_cmd(*line, "hold"), cwd=REPO, stdout=subprocess.PIPE, stderr=f, text=True))
    wait_for(lambda: "this launcher waits as a standby" in err.read_text(), timeout=90, what="a standby")
    return err


def test_a_standby_takes_the_place_of_a_lost_member(tmp_path):
    port = free_ports(6)
    line = torchrun_line(port, tmp_path, *FAST, nnodes="1:2")
    procs = [start_launcher(*line, "hold")]
    time.sleep(0.3)
    procs.append(start_launcher(*line, "hold"))
    first = wait_ready(tmp_path, 2, procs)
    standby = add_standby(tmp_path, line, procs)  # at MAX
    assert ready(tmp_path).keys() == {0, 1}  # it stays out of the running round
    lost = next(p for p in procs if p.pid == psutil.Process(first[1][0]).parent().pid)
    gone = power_off(lost)
    kept = [p for p in procs if p is not lost]
    wait_ready(tmp_path, 2, kept, old={pid for pid, _ in first.values()})
    results = go_and_finish(tmp_path, kept)
    for code, out, err in results:
        assert code == 0, err
    assert "takes its place" in "".join(err for _, _, err in results[:-1]) + standby.read_text()
    check_round(tmp_path, 2)
    assert_all_gone([p.pid for p in procs] + gone + [r["pid"] for r in records(tmp_path)])


def test_a_standby_whose_job_finishes_without_it_exits_0(tmp_path):
    port = free_ports(6)
    line = torchrun_line(port, tmp_path, *ALL_THREE, nnodes="1:2")  # both in round 1: MAX=2 start it at once
    procs = [start_launcher(*line, "hold") for _ in range(2)]
    wait_ready(tmp_path, 2, procs)
    standby = add_standby(tmp_path, line, procs)
    results = go_and_finish(tmp_path, procs)
    assert [code for code, _, _ in results] == [0, 0, 0], results
    assert "the job ended without this launcher: every worker of round 1 finished" in standby.read_text()
    check_round(tmp_path, 2)
    assert_all_gone([p.pid for p in procs] + [r["pid"] for r in records(tmp_path)])


def test_below_min_the_survivors_wait_join_timeout_then_exit_1_naming_the_node_lost(tmp_path):
    port = free_ports(6)
    line = torchrun_line(port, tmp_path, "--rdzv-conf", "last_call_timeout=0.5,join_timeout=3", nnodes="2:3")
    procs = [start_launcher(*line, "hold") for _ in range(2)]
    first = wait_ready(tmp_path, 2, procs)
    node_0 = next(p for p in procs if p.pid == psutil.Process(first[0][0]).parent().pid)
    gone = power_off(next(p for p in procs if p is not node_0))
    try:
        _, err = node_0.communicate(timeout=60)
    finally:
        stop_all(procs)
    assert node_0.returncode == 1, err
    assert "1 node(s) left after 3 s (join_timeout), 2 needed (--nnodes 2:3); lost: node " in err, err
    assert_all_gone([p.pid for p in procs] + gone + [pid for pid, _ in first.values()])


def test_node_0s_launcher_leaving_ends_the_job_on_every_node_saying_so(tmp_path):
    _, procs = two_holding(tmp_path)
    first = ready(tmp_path)
    node_0 = psutil.Process(first[0][0]).parent().pid  # rank 0's launcher
    other = next(p for p in procs if p.pid != node_0)
    gone = power_off(next(p for p in procs if p.pid == node_0))
    try:
        _, err = other.communicate(timeout=60)
    finally:
        stop_all(procs)
    assert other.returncode == 1, err
    assert "node 0's launcher leaving ends an elastic job" in err, err
    assert_all_gone([p.pid for p in procs] + gone + [pid for pid, _ in first.values()])
@pytest.mark.parametrize("restarts, codes", [pytest.param(1, [0, 0], marks=pytest.mark.real_torch), (0, [3, 3])])
def test_a_worker_failure_spends_one_restart_of_the_job_the_same_on_every_node(tmp_path, restarts, codes):
    port = free_ports(6)
    line = torchrun_line(port, tmp_path, *FAST, "--max-restarts", restarts)
    results, pids = run_nodes(2, (*line, "fail_once"))
    assert [code for code, _, _ in results] == codes, results
    errs = "".join(err for _, _, err in results)
    if restarts:
        assert "round 2 (restart): 2 node(s), world size 2" in errs
        assert "restarting the job (1 of 1 restarts)" in errs
        done = records(tmp_path)
        assert sorted(r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in done) == ["1", "1"]
    else:
        assert "failed (exit code 3) (restarts spent: 0 of 0)" in errs, errs
        assert records(tmp_path) == []
    assert_all_gone(pids + [r["pid"] for r in records(tmp_path)])


def test_a_launcher_stopped_with_sigterm_takes_its_node_out_and_the_others_go_on(tmp_path):
    _, procs, first = three_holding(tmp_path)
    leaving = next(p for p in procs if p.pid == psutil.Process(first[2][0]).parent().pid)
    leaving.terminate()
    _, err = leaving.communicate(timeout=60)
    assert leaving.returncode == 128 + 15, err
    assert "received SIGTERM: this node leaves the job" in err
    others = [p for p in procs if p is not leaving]
    wait_ready(tmp_path, 2, others, old={pid for pid, _ in first.values()})
    for code, out, err in go_and_finish(tmp_path, others):
        assert code == 0, err
    check_round(tmp_path, 2)
    assert_all_gone([p.pid for p in procs] + [pid for pid, _ in first.values()])


def test_paddles_elastic_level_0_takes_the_failing_node_out_and_the_others_go_on(tmp_path):
    port = free_ports(6)
    line = ("--nnodes", "2:3", "--master", f"{HOST}:{port}", "--nproc_per_node", 1, "--elastic_level", "0",
            "--elastic_timeout", "60", WORKER, tmp_path, 2, "fail_once")  # all three in round 1
    procs = []
    for _ in range(3):
        procs.append(start_launcher(*line))
        time.sleep(0.3)
    results = finish_all(procs, timeout=120)
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 0, 3], results
    errs = "".join(err for _, _, err in results)
    assert "it leaves the job (--elastic_level 0)" in errs and "round 2 (lost): 2 node(s), world size 2" in errs
    check_round(tmp_path, 2)
    assert_all_gone([p.pid for p in procs] + [r["pid"] for r in records(tmp_path)])


@pytest.mark.parametrize("args, fragment", [
    (("--nnodes", "3:2", "--rdzv-backend", "c10d"), "'--nnodes' / '--np': '3:2' has its minimum above its maximum"),
    (("--nnodes", "0:2", "--rdzv-backend", "c10d"), "'--nnodes' / '--np': '0:2' has a minimum of 0 nodes"),
    (("--nnodes", "2:x", "--rdzv-backend", "c10d"), "'--nnodes' / '--np': '2:x' is not a number of nodes or a MIN:MAX"),
    (("--nnodes", "2:3", "--rdzv-backend", "c10d", "--node-rank", "1"), "drop --node-rank"),
    (("--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-conf", "joint_timeout=5"), "unknown key 'joint_timeout'"),
    (("--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=0"), "join_timeout=0 is outside"),
    (("--nnodes", "2:3"), "a static rendezvous has a fixed number of nodes"),
    (("--nnodes", "2:3", "--master", "etcd://"), "--master 'etcd://' names no etcd endpoint"),
    (("--nnodes", "2:3", "--rdzv-backend", "etcd"), "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd"),
    (("--nnodes", "2:3", "--master", "127.0.0.1:8090", "--server_num", "1"), "parameter-server mode"),
])
def test_a_bad_elastic_line_exits_2_with_one_sentence_before_anything_starts(tmp_path, args, fragment):
    done = run_launcher(*args, WORKER, tmp_path, 1, timeout=60)
    assert done.returncode == 2, done.stderr
    assert fragment in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "elastic job:" not in done.stderr


