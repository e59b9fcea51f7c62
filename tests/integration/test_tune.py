"""launcher tune on real trials of a program that imports no torch (tests/integration/workers/tunable.py: its step
time made of sleeps, so that its best settings hold on a busy machine): the known best found and its config running
exactly those settings (fleet applying the strategy, which imports torch once) and the trials drawn (--plot), best
settings that cannot be written (--out on a full device) and --resume writing them, failed trials recorded and every
trial of the space failing, a program that reports nothing, Ctrl-C and --resume, a process of the same name outside
the job left alone. No test asserts a duration."""

import json
import os
import shlex
import signal
import subprocess
import sys

from conftest import REPO, WORKERS, alive, launcher_cmd, run_launcher, wait_for

TUNABLE = str(WORKERS / "tunable.py")


def space(tmp_path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


def tune(tmp_path, text: str, *args, own=(), env=None, timeout=300):
    """``own``: tune's own options (--out, --plot), which come before the launch's."""
    return run_launcher("tune", "--space", space(tmp_path, text), *own, "--nproc_per_node", "1", "--log_dir",
                        tmp_path / "logs", *args, TUNABLE, env=env, timeout=timeout)


def history(tmp_path) -> list:
    return [json.loads(line) for line in open(tmp_path / "logs" / "tune.jsonl")]


def pids_of_trial(folder) -> list:
    """The launcher's and the workers' pids its state file recorded."""
    state = json.loads((folder / "launcher.node0.json").read_text())
    return [state["launcher_pid"], *(p["pid"] for p in state["processes"])]


def test_the_known_best_is_found_and_its_config_runs_exactly_its_settings(tmp_path):
    done = tune(tmp_path, "metric: samples\ntrial_seconds: 20\nrepeats: 1\nknobs:\n  arg.--batch-size: [32]\n"
                "  strategy.use_local_sgd: [false, true]\n", own=("--plot", tmp_path / "trials.png"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "tune: best: arg.--batch-size=32 strategy.use_local_sgd=true, " in out, out  # 4x the defaults' rate
    assert out.count("tune: trial ") == 3 and "tune: trial 1: defaults: " in out
    assert [h["trial"] for h in history(tmp_path)] == [1, 2, 3]
    for n in range(1, 4):
        trial = tmp_path / "logs" / f"trial-{n}"
        assert (trial / "workerlog.0").exists() and (trial / "trial.yaml").exists() and (trial / "launcher.log").exists()
    assert f"tune: the trials drawn in {tmp_path / 'trials.png'}" in out
    assert (tmp_path / "trials.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tuned = tmp_path / "logs" / "tuned.yaml"
    command = f"python -m launcher --config {tuned} {TUNABLE}"
    assert f"tune: kept in {tuned}; run it with: {command}" in out
    ran = run_launcher("--config", tuned, TUNABLE, env={"TUNABLE_FLEET": "1"}, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = "launcher: fleet's strategy, set by the launcher (LAUNCHER_STRATEGY): use_local_sgd=True (the program's: False)"
    assert (ran.stdout + ran.stderr).count(said) == 1, ran.stdout + ran.stderr
    assert "in force: use_local_sgd=True batch=32" in ran.stdout


def test_failed_trials_are_recorded_and_a_space_whose_every_trial_fails_exits_non_zero(tmp_path):
    outside = subprocess.Popen([sys.executable, TUNABLE], env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # the same program, not a trial
    try:
        done = tune(tmp_path, "trial_seconds: 8\nrepeats: 1\nknobs:\n  env.TUNE_MODE: [crash, hang]\n")
        assert alive(outside.pid)
    finally:
        outside.kill()
        outside.wait()
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(x.startswith("tune: trial 1: defaults: ") and x.endswith(("(steady)", "(time)")) for x in lines), \
        done.stdout
    assert "tune: trial 2: env.TUNE_MODE=crash: failed: exit code 3: " in done.stdout
    assert "tune: trial 3: env.TUNE_MODE=hang: failed: hung: no report in its last " in done.stdout
    assert done.stderr.startswith("launcher: error: every trial failed; the first: exit code 3: ") and \
        done.stderr.count("\n") == 1, done.stderr
    assert [h["rate"] is None for h in history(tmp_path)] == [False, True, True]
    for pid in pids_of_trial(tmp_path / "logs" / "trial-3"):  # the hung trial's launcher and worker: stopped
        wait_for(lambda: not alive(pid), what=f"pid {pid} gone")


def test_a_program_that_reports_nothing_is_told_the_call_to_add_after_its_first_trial(tmp_path):
    done = tune(tmp_path, "metric: samples\nknobs:\n  env.A: [1, 2]\n", env={"TUNE_MODE": "silent"})
    assert done.returncode == 1
    assert done.stderr == ("launcher: error: the program reported nothing: call launcher.runtime.report(step=step, "
                           "samples=COUNT_SO_FAR) in its training loop after each step (from launcher.runtime import "
                           f"report) (the trial's own output: {tmp_path / 'logs' / 'trial-1' / 'launcher.log'}).\n"), \
        done.stderr
    assert sorted(os.listdir(tmp_path / "logs")) == ["trial-1", "tune.jsonl"]


def test_ctrl_c_stops_the_running_trial_keeps_the_history_and_resume_skips_what_was_measured(tmp_path):
    path = space(tmp_path, "trial_seconds: 60\nrepeats: 1\nknobs:\n  env.TUNE_MODE: [hang, ok]\n")
    proc = subprocess.Popen(launcher_cmd("tune", "--space", path, "--nproc_per_node", "1", "--log_dir",
                                         tmp_path / "logs", TUNABLE), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    trial = tmp_path / "logs" / "trial-2"
    wait_for(lambda: (trial / "reports.node0.jsonl").exists() or proc.poll() is not None, timeout=240,
             what="the second trial reporting")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert f"tune: interrupted; the 1 trials measured are kept in {tmp_path / 'logs' / 'tune.jsonl'}; resume with: " \
           "python -m launcher tune --resume --space " in out, out
    for pid in pids_of_trial(trial):
        wait_for(lambda: not alive(pid), what=f"pid {pid} gone")
    assert len(history(tmp_path)) == 1
    again = shlex.split(out.split("resume with: ")[1].splitlines()[0])
    assert again[:3] == ["python", "-m", "launcher"]
    (tmp_path / "space.yaml").write_text("trial_seconds: 8\nrepeats: 1\nknobs:\n  env.TUNE_MODE: [hang, ok]\n")
    resumed = run_launcher(*again[3:], timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "tune: trial 1: defaults: " in resumed.stdout and "(measured before)" in resumed.stdout
    assert "tune: trial 2: " not in resumed.stdout  # the interrupted trial's number is not taken again
    assert "tune: trial 3: env.TUNE_MODE=hang: failed: hung" in resumed.stdout
    assert "tune: best: env.TUNE_MODE=ok" in resumed.stdout


def test_best_settings_that_cannot_be_written_say_so_and_resume_writes_them_without_a_trial(tmp_path):
    done = tune(tmp_path, "metric: samples\ntrial_seconds: 20\nrepeats: 1\nknobs:\n  arg.--batch-size: [32]\n",
                own=("--out", "/dev/full"))  # no space left on it
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tune: best: arg.--batch-size=32, " in done.stdout and "tune: kept in" not in done.stdout, done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("launcher: error: cannot write the best settings to /dev/full (No space left on device); "
                           f"every trial is kept in {tmp_path / 'logs' / 'tune.jsonl'}; run python -m launcher tune "
                           "--resume "), last
    again = shlex.split(last.split("; run ")[1].split(" with another --out")[0])
    again[again.index("--out") + 1] = str(tmp_path / "tuned.yaml")
    resumed = run_launcher(*again[3:], timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.count("(measured before)") == 2 and "tune: trial 3" not in resumed.stdout, resumed.stdout
    assert "--batch-size" in (tmp_path / "tuned.yaml").read_text()


def test_a_refused_space_is_one_line_and_no_trial(tmp_path):
    done = tune(tmp_path, "knobs:\n  nprocs: [1, 2]\n")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("launcher: error: space file ") and done.stderr.count("\n") == 1, done.stderr
    assert "knob nprocs is neither a launch option" in done.stderr and not (tmp_path / "logs").exists()
