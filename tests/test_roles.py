"""The roles table: each kind of process the plan starts is one row, read wherever roles differ."""

from launcher.plan import roles
from launcher.plan.model import HostFacts, LaunchOptions, WorkerSpec
from launcher.plan.planner import make_plan
from launcher.plan.roles import ROLES, SERVER, TRAINER, WORKER, Role

CPU = HostFacts(gpu_count=None, cpu_count=8, python="/usr/bin/python3", run_id="r", temp_dir="/tmp")


def ports(ip, n):
    return tuple(range(42000, 42000 + n))


def test_each_role_is_one_row():
    assert ROLES == {"": WORKER, "trainer": TRAINER, "server": SERVER}
    assert [(r.label_of(3), r.log_name_of(3), r.ends_job) for r in (WORKER, TRAINER, SERVER)] == [
        ("rank 3", "workerlog.3", True), ("trainer 3", "workerlog.3", True), ("server 3", "serverlog.3", False)]
    assert (WORKER.paddle_role, TRAINER.paddle_role, SERVER.paddle_role) == (None, "TRAINER", "PSERVER")
    assert WORKER.by_rank and not TRAINER.by_rank and not SERVER.by_rank
    assert roles.PS_ROLES == (SERVER, TRAINER)


def test_a_collective_worker_is_named_and_logged_by_its_rank():
    p = make_plan(LaunchOptions("train.py", nproc_per_node=2, log_dir="logs",
                                cluster_node_ips="127.0.0.1,127.0.0.2", node_ip="127.0.0.2"), {}, CPU)
    assert [(w.kind, w.label, w.log_file) for w in p.workers] == [
        (WORKER, "rank 2", "logs/workerlog.2"), (WORKER, "rank 3", "logs/workerlog.3")]


def test_servers_and_trainers_are_named_and_logged_by_their_id():
    p = make_plan(LaunchOptions("train.py", server_num=2, worker_num=2, log_dir="logs"), {}, CPU, ports)
    assert [(w.kind, w.label, w.log_file) for w in p.workers] == [
        (TRAINER, "trainer 0", "logs/workerlog.0"), (TRAINER, "trainer 1", "logs/workerlog.1"),
        (SERVER, "server 0", "logs/serverlog.0"), (SERVER, "server 1", "logs/serverlog.1")]
    assert {w.label: w.env["TRAINING_ROLE"] for w in p.workers} == {
        "trainer 0": "TRAINER", "trainer 1": "TRAINER", "server 0": "PSERVER", "server 1": "PSERVER"}
    assert [w.rank for w in p.workers if w.kind.ends_job] == [2, 3]  # the trainers, keyed after the servers


def test_a_new_role_is_one_row(monkeypatch):
    evaluator = Role("evaluator", "evaluator {}", "evallog.{}", ends_job=False)
    monkeypatch.setitem(ROLES, evaluator.name, evaluator)
    spec = WorkerSpec(7, 0, "127.0.0.1:6000", None, ("python3",), {}, None, role="evaluator", role_index=1)
    assert (spec.kind, spec.label, spec.kind.log_name_of(spec.role_index)) == (evaluator, "evaluator 1", "evallog.1")
