"""A hang stopped by --hang_timeout leaves each rank's NCCL flight-recorder dump in the log dir.

The worker plays torch's side of the protocol (a FIFO it watches, a dump it writes), so the launcher's
side runs for real here; tests/gpu/ runs the same with real NCCL on a GPU."""

from conftest import WORKERS, run_launcher

FAKE = WORKERS / "fake_flight_recorder.py"


def test_a_hang_asks_every_rank_for_its_flight_recorder_dump_before_the_stop(tmp_path):
    logs = tmp_path / "logs"
    r = run_launcher("--nproc_per_node", 2, "--log_dir", logs, "--hang_timeout", 2, FAKE, timeout=90)
    assert r.returncode != 0, r.stderr
    for rank in (0, 1):
        dump = logs / f"nccl_trace_rank_{rank}"
        assert dump.read_text() == f"fake flight recorder dump of rank {rank}\n", r.stderr
        assert f"rank {rank}: NCCL flight recorder dump: {dump}" in r.stderr
    assert "buffer=2000" in (logs / "workerlog.0").read_text()


def test_without_a_listening_recorder_the_stop_does_not_wait(tmp_path):
    logs = tmp_path / "logs"
    r = run_launcher("--nproc_per_node", 1, "--log_dir", logs, "--hang_timeout", 2, FAKE,
                     env={"TORCH_FR_BUFFER_SIZE": "0"}, timeout=90)
    assert r.returncode != 0
    assert "flight recorder" not in r.stderr
    assert not list(logs.glob("nccl_trace_rank_*"))
