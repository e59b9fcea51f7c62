"""launcher.run.flight: poking torch's flight-recorder FIFOs and waiting for the dumps (real FIFOs, no torch)."""

import os
import threading

from launcher.run import flight


def env_for(tmp_path):
    stem = str(tmp_path / "nccl_trace_rank_")
    return {flight.PIPE_VARIABLE: stem, flight.DUMP_VARIABLE: stem}, stem


def test_only_ranks_whose_recorder_listens_are_asked(tmp_path):
    env, stem = env_for(tmp_path)
    os.mkfifo(f"{stem}0.pipe")
    reader = os.open(f"{stem}0.pipe", os.O_RDONLY | os.O_NONBLOCK)  # as torch opens it
    os.mkfifo(f"{stem}1.pipe")  # made, but its process is gone: nobody reads it
    (tmp_path / "nccl_trace_rank_2.pipe").write_text("")  # not a FIFO: never written to
    try:
        assert flight.request([0, 1, 2, 3], env) == {0: f"{stem}0"}
        assert os.read(reader, 16) == b"1\n"
    finally:
        os.close(reader)
    assert (tmp_path / "nccl_trace_rank_2.pipe").read_text() == ""


def test_nothing_is_asked_without_the_variables(tmp_path):
    assert flight.request([0], {}) == {}
    env, _ = env_for(tmp_path)
    assert flight.request([0], {flight.PIPE_VARIABLE: env[flight.PIPE_VARIABLE]}) == {}


def test_wait_returns_the_dumps_once_they_stop_growing_and_gives_up_at_its_bound(tmp_path):
    done, missing = tmp_path / "d0", tmp_path / "d1"
    writer = threading.Timer(0.2, lambda: done.write_bytes(b"x" * 100))
    writer.start()
    try:
        assert flight.wait({0: str(done)}, timeout=5.0) == {0: str(done)}
    finally:
        writer.cancel()
    t = [0.0]
    clock = lambda: t[0]  # noqa: E731

    def sleep(s):
        t[0] += s

    assert flight.wait({0: str(done), 1: str(missing)}, timeout=1.0, clock=clock, sleep=sleep) == {0: str(done)}
    assert t[0] >= 1.0


def test_the_wait_is_torchs_own_where_the_user_set_it():
    """torch waits TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC for a dump (15 s by default); so does a stop.
    One dump took 6 s on an H200 with torch 2.11, so 5 s lost it (bench/gpu_check.sh)."""
    assert flight.wait_seconds({}) == flight.WAIT_SECONDS == 15.0
    assert flight.wait_seconds({"TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC": "30000"}) == 30.0
    assert flight.wait_seconds({"TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "2500"}) == 2.5
    for odd in ("", "0", "-1", "soon", "1.5", "\u00b2", "\u0663"):  # "²" and an Arabic-Indic 3 are digits to isdigit()
        assert flight.wait_seconds({"TORCH_FR_WAIT_TIMEOUT_DUMP_MILSEC": odd}) == 15.0
