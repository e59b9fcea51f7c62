"""Parameter-server training on real processes and real RPC (TensorPipe over loopback), started with the
variables the launcher gives servers and trainers (tests/integration/psjob.py).

Every job starts at once (they share the two cores) and each test reads its job's results.
"""

import os
import signal
import sys
import time

import pytest
import torch

import psjob

sys.path.insert(0, str(psjob.WORKERS))
import ps_models  # noqa: E402

pytestmark = pytest.mark.training  # CI runs them after the quick loop (README's development lines)

TOLERANCE = 1e-5
STEPS = 5
KILL_DEADLINE_MS = "120000"  # far above the time a failure may take to spread: proves nobody waits for it
TABLE = (1_000_000, 16)  # a 64 MB table: no trainer may hold it


def single(steps=STEPS, **kw):
    return ps_models.train_single("ctr", steps, 2, **kw).state_dict()


def assert_close(state, reference, tol=TOLERANCE):
    assert state.keys() == reference.keys()
    for name, value in reference.items():
        diff = (state[name] - value).abs().max().item()
        assert diff <= tol, f"{name} differs by {diff}"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ps")
    start_from = root / "start"
    start_from.mkdir()
    torch.save(single(steps=2), start_from / "model.pt")  # the transpiler job starts where 2 steps left off
    specs = {
        "fleet_sync": (2, 2, "fleet", "sync", "ctr", STEPS),
        "fleet_sync_dense": (2, 2, "fleet", "sync", "mlp", STEPS),  # SGD with momentum: the servers keep it
        "transpiler_sync": (2, 2, "transpiler", "sync", "ctr", STEPS, "first_step=2", f"model_dir={start_from}",
                            "split=HashName"),
        "async_dc": (1, 2, "fleet", "dc_asgd", "mlp", 40),
        "geo": (1, 2, "fleet", "geo", "mlp", 40, "update_frequency=4"),
        "geo_ctr": (2, 1, "fleet", "geo", "ctr", 10, "update_frequency=3"),  # the trainer holds the table, as in Paddle
        "half_async": (1, 2, "transpiler", "half_async", "mlp", 40, "merge=2"),
    }
    kills = {
        "kill_server": (2, 2, "fleet", "sync", "ctr", 100000, "sleep=0.3", f"rows={TABLE[0]}", f"dim={TABLE[1]}"),
        "kill_trainer": (1, 2, "fleet", "async", "mlp", 100000, "sleep=0.3"),
    }
    started = {}
    try:
        for name, (servers, trainers, *args) in specs.items():
            out = root / name
            started[name] = psjob.start(out, servers, trainers, "ps_train.py", out, *args)
        for name, (servers, trainers, *args) in kills.items():
            out = root / name
            started[name] = psjob.start(out, servers, trainers, "ps_train.py", out, *args,
                                        extra_env={"FLAGS_rpc_deadline": KILL_DEADLINE_MS})
        yield started
    finally:
        for job in started.values():
            job.kill()


def finished(job, timeout=240):
    codes = job.wait(timeout)
    assert all(code == 0 for code in codes.values()), f"{codes}\n{job.logs()}"
    return job


def saved(job):
    return torch.load(job.out / "model" / "model.pt")


# the failure jobs first: they are done with once killed, and leave the cores to the others


def wait_for_progress(job, steps, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [job.out / f"progress.{j}" for j in range(2)]
        if all(f.exists() and f.read_text().strip() and int(f.read_text().split()[0]) >= steps for f in files):
            return [list(map(int, f.read_text().split())) for f in files]
        dead = {k: p.poll() for k, p in job.procs.items() if p.poll() is not None}
        assert not dead, f"exited before training: {dead}\n{job.logs()}"
        time.sleep(0.2)
    pytest.fail(f"no progress in {timeout} s\n{job.logs()}")


KILL_WAIT = 90  # below the RPC deadline: every process that ended by then did not wait for it


def kill_and_wait(job, key):
    """Kill one process of the job; {key: exit code} of each, None for one still running after KILL_WAIT s."""
    os.killpg(job.procs[key].pid, signal.SIGKILL)
    return job.wait(KILL_WAIT)


def test_a_dead_server_makes_everyone_fail_fast(jobs):
    job = jobs["kill_server"]
    progress = wait_for_progress(job, 3)
    codes = kill_and_wait(job, ("server", 1))
    # fast: every process failed before the RPC deadline (120 s) could end a wait
    assert None not in codes.values(), f"still running {KILL_WAIT} s after the kill: {codes}\n{job.logs()}"
    assert all(code != 0 for code in codes.values()), f"{codes}\n{job.logs()}"
    assert "server 1" in job.log(("trainer", 0)) + job.log(("trainer", 1))
    # no trainer ever held the 64 MB table: its resident memory grew by far less than the table
    table_bytes = TABLE[0] * TABLE[1] * 4
    for _step, before, now in progress:
        assert now - before < 0.5 * table_bytes, f"trainer grew by {(now - before) / 2**20:.0f} MiB"


def test_a_dead_trainer_makes_everyone_fail_fast(jobs):
    job = jobs["kill_trainer"]
    wait_for_progress(job, 3)
    codes = kill_and_wait(job, ("trainer", 1))
    # fast: every process failed before the RPC deadline (120 s) could end a wait
    assert None not in codes.values(), f"still running {KILL_WAIT} s after the kill: {codes}\n{job.logs()}"
    assert codes[("server", 0)] != 0 and codes[("trainer", 0)] != 0, f"{codes}\n{job.logs()}"
    assert "trainer 1" in job.log(("server", 0))


def test_sync_training_equals_one_process_on_the_whole_batch(jobs):
    job = finished(jobs["fleet_sync"])
    assert_close(saved(job), single())
    table = job.log(("server", 1))
    assert "mlp.0.weight.block1" in table and "emb.weight" in table  # print_log's placement table


def test_sync_training_of_a_dense_mlp_equals_one_process_on_the_whole_batch(jobs):
    job = finished(jobs["fleet_sync_dense"])
    assert_close(saved(job), ps_models.train_single("mlp", STEPS, 2).state_dict())


def test_the_transpiler_gives_what_fleet_gives_and_init_server_loads_a_saved_model(jobs):
    fleet_result = saved(finished(jobs["fleet_sync"]))
    job = finished(jobs["transpiler_sync"])
    assert_close(saved(job), fleet_result)  # 2 steps in one process, then 3 through the transpiler from model_dir


def test_the_saved_model_loads_into_the_plain_model(jobs):
    job = finished(jobs["fleet_sync"])
    model = ps_models.ctr_model()
    model.load_state_dict(torch.load(job.out / "model" / "model.pt"))
    assert float((job.out / "done.0").read_text()) == pytest.approx(ps_models.evaluate(model, "ctr"))


def test_geo_with_one_trainer_and_a_table_equals_one_process(jobs):
    # one trainer: (x - old) / 1 is sent, the server answers x, and x += server - old leaves x (communicator.cc,
    # GeoCommunicator::SendSparse / RecvSparse). 10 steps, exchanges after 3, 6, 9: the model saved before
    # stop_worker is what the servers hold, 9 steps (Paddle's save_persistables saves the servers' values too)
    job = finished(jobs["geo_ctr"])
    assert_close(saved(job), ps_models.train_single("ctr", 9, 1).state_dict())


@pytest.mark.parametrize("name", ["async_dc", "geo", "half_async"])
def test_async_modes_converge_on_a_toy_problem(jobs, name):
    job = finished(jobs[name])
    start = ps_models.evaluate(ps_models.mlp_model(), "mlp")
    end = float((job.out / "done.0").read_text())
    assert end < 0.5 * start, f"{name}: loss {start} -> {end}"


@pytest.mark.parametrize("name", ["fleet_sync", "transpiler_sync", "async_dc", "geo", "geo_ctr", "half_async"])
def test_a_clean_job_leaves_no_rpc_warnings_in_any_log(jobs, name):
    # every process shuts its RPC agent down together with the others: none reads from a pipe another closed
    job = finished(jobs[name])
    for key in job.procs:
        log = job.log(key)
        assert not any(w in log for w in ("tensorpipe", "EPIPE", "EOF", "Warning")), f"{key}:\n{log}"
