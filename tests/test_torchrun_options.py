"""torchrun 2.13's --virtual-local-rank, --duplicate-stdout/stderr-filters, --signals-to-handle and --event-log-handler:
their values read (launcher.plan.torchrun_values), their plan, and their effect on real workers (through
tests/launch_options.py, the launcher's path below the command line)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import PROBE, REPO, WORKERS, alive, assert_all_gone, pids_of, read_dumps, wait_for
from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.output import filtered, log_files, routes
from launcher.plan import torchrun_values as tv
from launcher.plan.model import HostFacts, Interface, LaunchOptions
from launcher.plan.planner import make_plan
from launcher.plan.streams import BOTH, ERR, NONE, OUT, Duplicate, parse_choice
from launcher.run.signals import SignalIntake

CPU_HOST = HostFacts(gpu_count=None, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),),
                     python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")
GPU_HOST = HostFacts(gpu_count=8, cpu_count=64, python="/usr/bin/python3", run_id="abc", temp_dir="/tmp")
DRIVER = str(REPO / "tests" / "launch_options.py")


def plan(host=CPU_HOST, env=None, **opts):
    opts.setdefault("training_script", "train.py")
    return make_plan(LaunchOptions(**opts), env or {}, host, lambda ip, n: tuple(range(41000, 41000 + n)))


def one_sentence(e) -> str:
    text = str(e.value)
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0, text
    return text


# ---------------------------------------------------------------- the values


def test_filters_are_read_as_torchrun_reads_them():
    assert tv.parse_filters(None) == ()
    assert tv.parse_filters("apple,orange") == ("apple", "orange")
    assert tv.parse_filters("a,,b,c") == ("a,b", "c")  # ",," is a comma in a filter
    assert tv.parse_filters("loss") == ("loss",)
    assert tv.parse_filters("") == ("",)  # torchrun keeps it: every line holds it
    assert tv.parse_filters("a,") == ("a", "")


def test_signals_are_names_with_or_without_sig_in_any_case_or_numbers_once_each_in_order():
    assert tv.parse_signals("SIGTERM,SIGINT,SIGHUP,SIGQUIT") == tuple(tv.DEFAULT_STOP_SIGNALS)
    assert tv.parse_signals(" SIGUSR1 , term,int, 12,sigusr1") == (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT,
                                                                     signal.SIGUSR2)
    assert tv.parse_signals("") == () and tv.parse_signals("SIGTERM,,") == (signal.SIGTERM,)
    assert all(type(s) is int for s in tv.parse_signals("SIGTERM,SIGUSR2"))
    assert tv.parse_signals("usr2,HUP") == (signal.SIGUSR2, signal.SIGHUP)


@pytest.mark.parametrize("text, named, fix", [
    ("SIGTERM,SIGFOO", "SIGFOO is not a signal name", "give names such as SIGTERM,SIGUSR1"),
    ("SIGKILL", "SIGKILL cannot be caught", "leave it out"),
    ("SIGTERM,stop", "SIGSTOP cannot be caught", "leave it out"),
    ("9", "SIGKILL cannot be caught", "leave it out"),
    ("SIGCHLD", "SIGCHLD is how the launcher learns", "leave it out"),
    ("SIGSEGV", "SIGSEGV reports a fault", "leave it out"),
    ("40", "40 is not the number of a signal", "give signal names"),
    ("0", "0 is not the number of a signal", "give signal names"),
])
def test_a_signal_the_launcher_cannot_handle_is_refused_in_one_sentence(text, named, fix):
    with pytest.raises(LaunchError) as e:
        tv.parse_signals(text)
    sentence = one_sentence(e)
    assert sentence.startswith(f"--signals-to-handle {text}: ") and named in sentence and fix in sentence


def test_event_log_handlers_are_torchruns_names():
    assert [tv.parse_event_log_handler(n) for n in ("null", "console", "dynamic_rendezvous")] == \
        ["null", "console", "dynamic_rendezvous"]
    with pytest.raises(LaunchError) as e:
        tv.parse_event_log_handler("file")
    assert one_sentence(e) == ("--event-log-handler 'file' is not an event handler; give one of null, console, "
                               "dynamic_rendezvous.")


# ---------------------------------------------------------------- the plan


def test_the_defaults_leave_the_plan_as_it_was():
    p = plan(nproc_per_node=2, log_dir="logs")
    assert p.stop_signals == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    assert p.duplicates == () and not p.events_to_console and p.notes == ()
    assert [w.duplicated for w in p.workers] == [NONE, NONE]
    assert [w.env[ev.LOCAL_RANK] for w in p.workers] == ["0", "1"]


def test_virtual_local_rank_gives_each_gpu_worker_local_rank_0_and_its_own_gpu_as_device_0():
    p = plan(host=GPU_HOST, nproc_per_node=4, virtual_local_rank=True)
    for local, w in enumerate(p.workers):
        assert w.env[ev.LOCAL_RANK] == w.env[ev.PADDLE_LOCAL_RANK] == w.env[ev.RANK_IN_NODE] == "0"
        assert w.env[ev.CUDA_VISIBLE_DEVICES] == str(local)
        assert w.env[ev.SELECTED_GPUS] == w.env[ev.SELECTED_ACCELERATORS] == w.env[ev.LOCAL_DEVICE_IDS] == "0"
        assert w.env[ev.LOCAL_WORLD_SIZE] == "4" and w.env[ev.RANK] == str(local) and w.gpu == str(local)
    usual = plan(host=GPU_HOST, nproc_per_node=4)
    assert [w.env[ev.LOCAL_RANK] for w in usual.workers] == ["0", "1", "2", "3"]
    assert all(ev.CUDA_VISIBLE_DEVICES not in w.env for w in usual.workers)


def test_virtual_local_rank_narrows_the_launchers_own_cuda_visible_devices():
    env = {ev.CUDA_VISIBLE_DEVICES: "4,5,GPU-abc,7"}
    p = plan(host=GPU_HOST, env=env, selected_gpus="5,GPU-abc", virtual_local_rank=True)
    assert [w.env[ev.CUDA_VISIBLE_DEVICES] for w in p.workers] == ["5", "GPU-abc"]
    assert [w.env[ev.SELECTED_GPUS] for w in p.workers] == ["0", "0"]
    assert p.base_env[ev.CUDA_VISIBLE_DEVICES] == "4,5,GPU-abc,7"  # each worker's own value overrides it


def test_virtual_local_rank_leaves_a_cpu_workers_devices_alone():
    p = plan(nproc_per_node=2, virtual_local_rank=True, env={ev.CUDA_VISIBLE_DEVICES: ""})
    assert p.device == "cpu"
    for w in p.workers:
        assert w.env[ev.LOCAL_RANK] == w.env[ev.PADDLE_LOCAL_RANK] == "0" and w.env[ev.LOCAL_WORLD_SIZE] == "2"
        assert ev.CUDA_VISIBLE_DEVICES not in w.env and ev.SELECTED_GPUS not in w.env


def test_duplicates_copy_the_teed_streams_into_the_log_dir():
    p = plan(nproc_per_node=2, log_dir="logs", stream_choice=parse_choice(None, "3", None),
             duplicate_stdout_filters=("loss",), duplicate_stderr_filters=("warn", "err"))
    assert p.duplicates == (Duplicate(OUT, ("loss",), "logs/filtered_stdout.log"),
                            Duplicate(ERR, ("warn", "err"), "logs/filtered_stderr.log"))
    assert [w.duplicated for w in p.workers] == [BOTH, BOTH] and p.notes == ()


def test_duplicates_follow_torchruns_teed_streams():
    def duplicated(**opts):
        p = plan(nproc_per_node=2, log_dir="logs", duplicate_stdout_filters=("a",), duplicate_stderr_filters=("b",),
                 **opts)
        return [w.duplicated for w in p.workers]

    assert duplicated() == [BOTH, NONE]  # the launcher's layout: the node's first worker is echoed from its log
    assert duplicated(stream_choice=parse_choice(None, "3", "1")) == [NONE, BOTH]  # rank 0 hidden from the console
    assert duplicated(stream_choice=parse_choice("2", "1", None)) == [OUT, OUT]  # only stdout is teed
    assert duplicated(stream_choice=parse_choice("3", None, None)) == [NONE, NONE]  # redirected, not teed


def test_filters_with_nothing_teed_copy_nothing_and_say_so():
    p = plan(nproc_per_node=2, log_dir="logs", stream_choice=parse_choice("3", None, None),
             duplicate_stdout_filters=("a",))
    assert p.duplicates == () and len(p.notes) == 1 and "--duplicate-stdout-filters" in p.notes[0]
    console_only = plan(nproc_per_node=2, duplicate_stderr_filters=("a",))
    assert console_only.duplicates == () and "--duplicate-stderr-filters" in console_only.notes[0]


def test_parameter_server_mode_refuses_the_collective_options():
    for opts in ({"virtual_local_rank": True}, {"duplicate_stdout_filters": ("a",)}):
        with pytest.raises(LaunchError, match="for collective jobs"):
            plan(server_num=1, worker_num=1, **opts)


def test_signals_and_the_event_handler_reach_the_plan_in_every_mode():
    p = plan(signals_to_handle=(signal.SIGUSR1, signal.SIGTERM), event_log_handler="console")
    assert p.stop_signals == (signal.SIGUSR1, signal.SIGTERM) and p.events_to_console
    ps = plan(server_num=1, worker_num=1, signals_to_handle=(), event_log_handler="dynamic_rendezvous")
    assert ps.stop_signals == () and not ps.events_to_console
    with pytest.raises(LaunchError, match="SIGKILL cannot be caught"):
        plan(signals_to_handle=(signal.SIGKILL,))
    with pytest.raises(LaunchError, match="is not an event handler"):
        plan(event_log_handler="file")


# ---------------------------------------------------------------- the run's pieces, in this process


def test_a_filtered_output_writes_the_log_and_copies_matching_whole_lines(tmp_path):
    p = plan(nproc_per_node=2, log_dir=str(tmp_path), stream_choice=parse_choice(None, "3", None),
             duplicate_stdout_filters=("loss", "acc"), duplicate_stderr_filters=("warn",))
    spec = p.workers[1]
    output = routes.worker_output(spec, log_files.open_log(spec.log_file, str(tmp_path), spec.label, spec.cmd),
                                  p.duplicates)
    assert isinstance(output, filtered.FilteredOutput) and len(output.pipes()) == 2
    out, err = output.child_fds()
    os.write(out, b"step 1 loss 0.5\nstep 1 lr 0.1\nstep 2 acc")
    os.write(err, b"a warning\nno\n")
    output.spawned()
    for fd in output.pipes():
        assert output.wants(fd) and output.read_pipe(fd)
    output.finish()
    log = (tmp_path / "workerlog.1").read_text()
    assert "step 1 loss 0.5\nstep 1 lr 0.1\n" in log and "a warning\nno\n" in log and "step 2 acc" in log
    assert (tmp_path / "filtered_stdout.log").read_text() == "[rank 1] step 1 loss 0.5\n[rank 1] step 2 acc\n"
    assert (tmp_path / "filtered_stderr.log").read_text() == "[rank 1] a warning\n"


def test_the_intake_handles_the_plans_signals_and_leaves_the_others_alone():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
    intake = SignalIntake((signal.SIGUSR1, signal.SIGHUP))
    try:
        intake.install()
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]  # not handled: the default action
        assert signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, signal.SIG_IGN)  # not Python's KeyboardInterrupt
        assert intake.stopping == {signal.SIGUSR1, signal.SIGHUP} and intake.passed_on == {signal.SIGUSR2}
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR2)
        got = []
        wait_for(lambda: got.extend(intake.received()) or len(got) >= 2, what="both signals")
        assert got == [signal.SIGUSR1, signal.SIGUSR2]
    finally:
        intake.restore()
        intake.close()
    assert {s: signal.getsignal(s) for s in before} == before


# ---------------------------------------------------------------- real workers


def start(tmp_path, **opts):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, DRIVER, json.dumps(opts)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def launch(tmp_path, **opts):
    proc = start(tmp_path, **opts)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_virtual_local_rank_reaches_real_workers(tmp_path):
    code, _, err = launch(tmp_path, training_script=PROBE, training_script_args=["--dump", str(tmp_path)],
                          nproc_per_node=2, selected_gpus="2,3", virtual_local_rank=True)
    assert code == 0, err
    envs = {rank: dump["env"] for rank, dump in read_dumps(tmp_path, 2).items()}
    assert [envs[r]["LOCAL_RANK"] for r in (0, 1)] == ["0", "0"]
    assert [envs[r]["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["2", "3"]
    assert [envs[r]["FLAGS_selected_gpus"] for r in (0, 1)] == ["0", "0"]
    assert [envs[r]["LOCAL_WORLD_SIZE"] for r in (0, 1)] == ["2", "2"] and envs[1]["RANK"] == "1"


def test_duplicate_filters_copy_the_matching_lines_of_real_workers(tmp_path):
    code, out, err = launch(tmp_path, training_script=str(WORKERS / "two_streams.py"), nproc_per_node=2,
                            log_dir="logs", stream_choice=[None, "3", None], duplicate_stdout_filters=["stdout"],
                            duplicate_stderr_filters=["nothing", "of 1"])
    assert code == 0, err
    logs = tmp_path / "logs"
    assert sorted((logs / "filtered_stdout.log").read_text().splitlines()) == ["[rank 0] stdout of 0",
                                                                             "[rank 1] stdout of 1"]
    assert (logs / "filtered_stderr.log").read_text() == "[rank 1] stderr of 1\n"
    for rank in (0, 1):
        log = (logs / f"workerlog.{rank}").read_text()
        assert f"stdout of {rank}\n" in log and f"stderr of {rank}\n" in log
        assert f"[rank {rank}] stdout of {rank}" in out + err  # still teed to the console


def test_a_signal_added_to_the_set_stops_the_job_passing_it_on_first(tmp_path):
    marks = tmp_path / "signals"
    marks.mkdir()
    proc = start(tmp_path, training_script=PROBE, training_script_args=["--dump", str(tmp_path), "--sleep", "120",
                                                                       "--signals", str(marks)],
                 nproc_per_node=2, signals_to_handle=[signal.SIGUSR1, signal.SIGTERM])
    try:
        pids = pids_of(read_dumps(tmp_path, 2))
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGUSR1, err
    assert "received SIGUSR1: passing it on and stopping the workers" in err
    assert {"signal.0.SIGUSR1", "signal.1.SIGUSR1"} <= set(os.listdir(marks))
    assert_all_gone(pids)


def test_a_default_signal_left_out_ends_the_launcher_and_nothing_is_left_running(tmp_path):
    proc = start(tmp_path, training_script=PROBE, training_script_args=["--dump", str(tmp_path), "--sleep", "120",
                                                                       "--ignore-term", "--setsid-child"],
                 nproc_per_node=2, signals_to_handle=[signal.SIGINT], shutdown_timeout=1)
    try:
        pids = pids_of(read_dumps(tmp_path, 2))
        assert all(alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err  # SIGTERM's default action: the launcher did not handle it
    assert_all_gone(pids, timeout=60)  # workers that ignore SIGTERM, and their children in sessions of their own


def test_the_console_event_handler_writes_each_event_as_a_json_line_on_stderr(tmp_path):
    code, out, err = launch(tmp_path, training_script=PROBE, nproc_per_node=2, event_log_handler="console")
    assert code == 0, err
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "job_started" and kinds[-1] == "job_ended" and kinds.count("worker_started") == 2
    assert not (tmp_path / "events.jsonl").exists()
    code, _, err = launch(tmp_path, training_script=PROBE, nproc_per_node=1, log_dir="logs", event_log_handler="null")
    assert code == 0 and not any(line.startswith("{") for line in err.splitlines())
    assert "job_ended" in (tmp_path / "logs" / "events.jsonl").read_text()
