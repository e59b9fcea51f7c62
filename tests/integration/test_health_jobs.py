"""A job of one node runs its own health checks before any worker starts (docs/health.md): a failed one refuses the
job, exit 2, in one sentence, and no worker ever runs. The checks fail for real: the user's own check failing or
hanging, a full tmpfs mounted for the log directory and for /dev/shm in a mount namespace of the launcher's own, the
NVML checks through a fake pynvml on PYTHONPATH (with a fake driver's /proc/driver: there is no GPU here)."""

import json
import os
import shutil
import subprocess

import pytest

from conftest import PROBE, REPO, assert_refused_in_one_line, launcher_cmd, run_launcher

FAKE_NVML = str(REPO / "tests" / "fake_nvml")
ERROR = "launcher: error: "


def refused(result, dumps) -> str:
    """The one error line of a launcher that refused to start; no worker ran."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith(ERROR)]
    assert len(errors) == 1, result.stderr
    assert not list(dumps.glob("env.*.json")), "a worker started"
    return errors[0][len(ERROR):]


def job(tmp_path, *args, env=None):
    dumps = tmp_path / "dumps"
    dumps.mkdir(exist_ok=True)
    return run_launcher("--nproc_per_node", 1, "--log_dir", tmp_path / "logs", *args, PROBE, "--dump", dumps,
                        env=env, timeout=120), dumps


def test_a_failing_user_check_refuses_the_job_before_any_worker_starts(tmp_path):
    r, dumps = job(tmp_path, "--health_check", "echo checking GPUs; echo 'GPU 2: diag failed'; exit 3")
    assert refused(r, dumps) == ("this node (127.0.0.1) failed the health check user: GPU 2: diag failed "
                                 "(--health_check exited with 3); mend the node, or skip the check with "
                                 "--skip_health_checks user")
    assert not (tmp_path / "logs" / "workerlog.0").exists()


def test_a_hanging_user_check_is_stopped_at_its_timeout_and_refuses_the_job(tmp_path):
    r, dumps = job(tmp_path, "--health_check", "sleep 600", "--health_check_timeout", 1)
    assert refused(r, dumps).startswith("this node (127.0.0.1) failed the health check user: --health_check did not "
                                        "end within 1 s (--health_check_timeout), and was stopped;")


def test_a_passing_user_check_lets_the_job_run_and_a_skipped_one_is_not_run(tmp_path):
    r, dumps = job(tmp_path, "--health_check", f"touch {tmp_path}/checked")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "checked").exists() and list(dumps.glob("env.*.json"))
    r, _ = job(tmp_path, "--health_check", f"touch {tmp_path}/again; exit 1", "--skip_health_checks", "user,disk")
    assert r.returncode == 0 and not (tmp_path / "again").exists(), r.stderr


def test_the_checks_are_options_of_a_config_file(tmp_path):
    (tmp_path / "job.yaml").write_text("health_check: 'echo from the file; exit 1'\n"
                                       "skip_health_checks: [disk, shm]\n")
    r, dumps = job(tmp_path, "--config", tmp_path / "job.yaml")
    assert refused(r, dumps).startswith("this node (127.0.0.1) failed the health check user: from the file")


@pytest.mark.parametrize("args, sentence", [
    (["--skip_health_checks", "disk,gpu"], "Invalid value for '--skip_health_checks' / '--skip-health-checks': 'gpu' "
                                           "is not a health check; give a comma list of disk, shm, ports, versions, "
                                           "script, clock, gpus, nvml, infiniband, user, or all."),
    (["--health_check_timeout", "0"], "Invalid value for '--health_check_timeout' / '--health-check-timeout': '0' is "
                                      "not a number of seconds from 1 to 86400 (one day)."),
    (["--health_interval", "soon"], "Invalid value for '--health_interval' / '--health-interval': 'soon' is not a "
                                    "number of seconds from 1 to 86400 (one day)."),
    (["--health_check", ""], "--health_check is empty; give the command that checks a node"),
])
def test_a_bad_health_option_is_refused_in_one_sentence(tmp_path, args, sentence):
    assert_refused_in_one_line(tmp_path, args, sentence)


def test_a_bad_check_name_in_a_config_file_is_refused_in_one_sentence(tmp_path):
    (tmp_path / "job.yaml").write_text("skip_health_checks: [disk, fans]\n")
    assert_refused_in_one_line(tmp_path, ["--config", "job.yaml"], "config file job.yaml: skip_health_checks: 'fans' "
                                                                   "is not a health check; give a comma list of disk,")


# ---------------------------------------------------------------- in a mount namespace of its own (root)


def mounts_allowed() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs t /dev/shm"],
                       capture_output=True, timeout=20)
    return r.returncode == 0


needs_mounts = pytest.mark.skipif(not mounts_allowed(), reason="a tmpfs in a mount namespace needs root and "
                                                                "unshare --mount")


def in_namespace(setup: list, *args, env=None):
    """``python -m launcher ARGS`` after the shell commands ``setup``, in a mount namespace of its own."""
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join(setup) + ' && exec "$@"', "sh",
           *launcher_cmd(*args)]
    full = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run(cmd, capture_output=True, text=True, env={**full, **(env or {})}, timeout=120, cwd=REPO)


def full_tmpfs(where) -> list:
    """Shell commands that mount a tmpfs of 1 MiB at ``where`` and fill it."""
    return [f"mount -t tmpfs -o size=1m full {where}", f"(cat /dev/zero > {where}/fill 2>/dev/null || true)"]


@needs_mounts
def test_a_full_log_directory_refuses_the_job(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "dumps").mkdir()
    r = in_namespace(full_tmpfs(tmp_path / "logs"), "--nproc_per_node", 1, "--log_dir", tmp_path / "logs" / "run",
                     PROBE, "--dump", tmp_path / "dumps")
    sentence = refused(r, tmp_path / "dumps")
    assert sentence.startswith(f"this node (127.0.0.1) failed the health check disk: only 0 B is free in its log "
                               f"directory {tmp_path}/logs/run (on {tmp_path}/logs), below the floor of 1 GiB;")


@needs_mounts
def test_a_full_dev_shm_refuses_the_job(tmp_path):
    (tmp_path / "dumps").mkdir()
    r = in_namespace(full_tmpfs("/dev/shm"), "--nproc_per_node", 1, PROBE, "--dump", tmp_path / "dumps")
    assert refused(r, tmp_path / "dumps") == (
        "this node (127.0.0.1) failed the health check shm: only 0 B is free in /dev/shm, below the floor of 16 MiB "
        "for CPU workers; mend the node, or skip the check with --skip_health_checks shm")


@needs_mounts
def test_a_small_dev_shm_as_a_containers_passes_cpu_workers(tmp_path):
    r = in_namespace(["mount -t tmpfs -o size=64m small /dev/shm"], "--nproc_per_node", 1, PROBE)
    assert r.returncode == 0, r.stderr


def fake_gpus(count: int) -> list:
    return ["mount -t tmpfs fake /proc/driver"] + [
        f"mkdir -p /proc/driver/nvidia/gpus/0000:{0x3b + i:02x}:00.0" for i in range(count)]


def healthy(**kw) -> dict:
    return {"ecc": 0, "recovery": 0, "links": [1, 1], "processes": [], **kw}


@needs_mounts
def test_a_gpu_with_uncorrectable_ecc_errors_refuses_the_job_through_nvml(tmp_path):
    (tmp_path / "dumps").mkdir()
    env = {"PYTHONPATH": os.pathsep.join([FAKE_NVML, str(REPO)]),
           "FAKE_NVML": json.dumps({"gpus": [healthy(), healthy(ecc=4)]})}
    r = in_namespace(fake_gpus(2), PROBE, "--dump", tmp_path / "dumps", env=env)
    assert refused(r, tmp_path / "dumps") == (
        "this node (127.0.0.1) failed the health check nvml: GPU 1 has 4 uncorrectable ECC error(s) since the driver "
        "loaded; mend the node, or skip the check with --skip_health_checks nvml")
    r = in_namespace(fake_gpus(2), "--skip_health_checks", "nvml", PROBE, "--dump", tmp_path / "dumps", env=env)
    assert r.returncode == 0, r.stderr


@needs_mounts
def test_a_gpu_job_without_nvml_says_once_that_the_check_is_skipped(tmp_path):
    r = in_namespace(fake_gpus(1), PROBE, env={"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "health check" in line]
    assert len(said) == 1 and "health check nvml skipped: " in said[0], r.stderr
