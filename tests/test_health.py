"""A node's health checks (launcher.host.health, launcher.host.gpu_health; the rules in launcher.plan.health), each
made to fail for real: a port held by another process, a user check that fails, hangs or is killed, folders below
their floor, GPUs held through a fake /proc, the NVML checks through a fake pynvml (tests/fake_nvml: there is no GPU
here), InfiniBand ports through a fake sysfs; and a checkup off the wire fed what a hostile peer would send.
Whole jobs refused by a check are in tests/integration/test_health_jobs.py."""

import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sysfs_trees
from conftest import REPO, alive, free_port, listening, wait_for
from launcher.errors import LaunchError
from launcher.host import gpu_health, health
from launcher.plan import health as rules
from launcher.plan.health import CHECKS, FAILED, OK, SKIPPED, Checkup, Finding, HealthSettings, Subject
from launcher.plan.model import HostFacts, Interface, LaunchOptions
from launcher.plan.planner import health_settings, make_plan

FAKE_NVML = str(REPO / "tests" / "fake_nvml")
NOTHING = Path("/nonexistent-root")  # a sysfs or procfs with nothing in it


def subject(tmp_path, **kw) -> Subject:
    return Subject(**{"log_dir": str(tmp_path / "logs"), "workdir": str(tmp_path), "host": "127.0.0.1", **kw})


def found(settings, subj, **kw) -> dict:
    return {f.check: f for f in health.findings(settings, subj, **kw)}


def only(*names) -> HealthSettings:
    """Settings that run only the checks ``names``."""
    return HealthSettings(off=frozenset(CHECKS) - set(names))


# ---------------------------------------------------------------- options and settings


def test_check_names_are_read_whatever_their_case_and_spaces_and_all_is_every_check():
    assert rules.read_check_names(" Disk, nvml ,") == ("disk", "nvml")
    assert rules.read_check_names("all") == CHECKS
    assert rules.read_check_names("") == ()


def test_an_unknown_check_name_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(ValueError) as e:
        rules.read_check_names("disk,dsk")
    assert str(e.value) == ("'dsk' is not a health check; give a comma list of disk, shm, ports, versions, script, "
                            "clock, gpus, nvml, infiniband, user, or all")


def test_the_options_become_the_plans_settings():
    opts = LaunchOptions("train.py", health_check="dcgmi diag -r 1", health_check_timeout=60.0,
                         skip_health_checks=("disk", "user"), health_interval=5.0)
    settings = health_settings(opts)
    assert settings == HealthSettings(off=frozenset({"disk", "user"}), command="dcgmi diag -r 1", timeout=60.0,
                                      interval=5.0)
    assert not settings.runs("user") and not settings.runs("disk") and settings.runs("ports")
    assert not HealthSettings().runs("user")  # no command, no user check


def test_an_empty_user_check_is_refused():
    with pytest.raises(LaunchError, match="--health_check is empty; give the command"):
        health_settings(LaunchOptions("train.py", health_check="  "))


HOST = HostFacts(gpu_count=4, cpu_count=8, interfaces=(Interface("lo", "127.0.0.1", "255.0.0.0"),),
                 python="/usr/bin/python3", cwd="/work", importable=frozenset({"torch"}), torch_version="2.13.0")


def test_the_subject_of_a_gpu_plan_names_the_machines_gpus_its_ports_and_the_workers_python(tmp_path):
    opts = LaunchOptions("train.py", selected_gpus="1,3", started_port=41000, log_dir="logs")
    plan = make_plan(opts, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_IB_HCA": "mlx5_0"}, HOST)
    subj = health.subject_of(plan, opts, HOST)
    assert subj == Subject(log_dir="logs", workdir="/work", host="127.0.0.1", ports=(41000, 41001), gpus=("1", "3"),
                           script="train.py", python="/usr/bin/python3", uses_torch=True, ib_hca="mlx5_0")
    assert plan.health == HealthSettings()


def test_the_subject_of_a_program_a_module_and_another_interpreter():
    program = LaunchOptions("./run.sh", no_python=True, nproc_per_node=1)
    subj = health.subject_of(make_plan(program, {}, HOST, lambda ip, n: [40000 + i for i in range(n)]), program, HOST)
    assert (subj.script, subj.python, subj.uses_torch, subj.gpus) == ("./run.sh", None, False, ("0",))
    module = LaunchOptions("pkg.train", module=True, nproc_per_node=1)
    plan = make_plan(module, {"PYTHON_EXEC": "/opt/py/bin/python"}, dataclasses.replace(HOST, importable=frozenset()),
                     lambda ip, n: [40000])
    subj = health.subject_of(plan, module, dataclasses.replace(HOST, importable=frozenset()))
    assert (subj.script, subj.python, subj.uses_torch) == (None, "/opt/py/bin/python", True)  # asked, not known


def test_ids_passed_on_as_given_where_no_gpu_is_detected_take_no_gpu_check():
    host = dataclasses.replace(HOST, gpu_count=None)
    opts = LaunchOptions("train.py", selected_gpus="0,1", started_port=41000)
    assert health.subject_of(make_plan(opts, {}, host), opts, host).gpus == ()


# ---------------------------------------------------------------- disk and /dev/shm


def test_folders_with_room_pass_and_a_floor_above_the_free_space_fails_naming_the_folder(tmp_path):
    subj = subject(tmp_path)
    assert found(only("disk", "shm"), subj) == {"disk": Finding("disk", OK), "shm": Finding("shm", OK)}
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    disk = found(dataclasses.replace(only("disk"), disk_floor=free + (1 << 40)), subj)["disk"]
    assert disk.state == FAILED
    assert disk.reason.startswith("only ") and f"is free in its log directory {tmp_path}/logs (on {tmp_path})" in \
        disk.reason and "below the floor of 1" in disk.reason


def test_no_log_directory_checks_the_working_directory_only(tmp_path):
    subj = subject(tmp_path, log_dir=None)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    disk = found(dataclasses.replace(only("disk"), disk_floor=free + (1 << 40)), subj)["disk"]
    assert f"is free in its working directory {tmp_path}, below the floor of" in disk.reason


def test_shm_takes_the_gpu_workers_floor_only_for_gpu_workers(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    free = os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize
    settings = dataclasses.replace(only("shm"), shm_floor=free + (1 << 40))
    places = health.Places(shm=str(shm), sys=str(NOTHING), proc=str(NOTHING), dev=str(NOTHING))
    assert found(settings, subject(tmp_path), places=places)["shm"].state == OK  # CPU workers: the lower floor
    gpu = found(settings, subject(tmp_path, gpus=("0",)), places=places)["shm"]
    assert gpu.state == FAILED and gpu.reason.startswith("only ")
    assert gpu.reason.endswith(f"is free in {shm}, below the floor of {health.size(free + (1 << 40))} for GPU workers")


def test_a_folder_on_no_disk_is_not_judged(tmp_path):
    """/proc and /sys have no blocks, hence no free space: a log dir there is the log writer's to refuse."""
    assert found(only("disk"), subject(tmp_path, log_dir="/proc/self/logs"))["disk"] == Finding("disk", OK)


def test_no_dev_shm_is_skipped_saying_so(tmp_path):
    places = health.Places(shm=str(tmp_path / "none"))
    assert found(only("shm"), subject(tmp_path), places=places)["shm"] == Finding(
        "shm", SKIPPED, f"there is no {tmp_path}/none here")


def test_sizes_in_words():
    assert [health.size(n) for n in (0, 1023, 1536, 12 << 20, 3 << 29, 1 << 40, 1 << 52)] == [
        "0 B", "1023 B", "1.5 KiB", "12 MiB", "1.5 GiB", "1 TiB", "4096 TiB"]


# ---------------------------------------------------------------- ports


def listener_process(port) -> int:
    """The pid of another process, not this one's child (a launcher's children are its workers), listening on
    ``port`` of 127.0.0.1, once it listens."""
    code = ("import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\n"
            "time.sleep(600)")
    spawn = (f"import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', {code!r}, '{port}'], "
             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    pid = int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, timeout=60).stdout)
    wait_for(lambda: listening("127.0.0.1", port), 30, "the other process to listen")
    return pid


def test_a_port_held_by_another_process_fails_naming_its_pid_and_command(tmp_path):
    port, other = free_port(), free_port()
    holder = listener_process(port)
    try:
        ports = found(only("ports"), subject(tmp_path, ports=(other, port)))["ports"]
        assert ports.state == FAILED
        assert ports.reason.startswith(f"port {port} of its workers on 127.0.0.1 is already in use by pid {holder} (")
        assert "time.sleep(600)" in ports.reason and ports.reason.endswith("(Address already in use)")
        assert "\n" not in ports.reason
        assert found(only("ports"), subject(tmp_path, ports=(port,)), job_pids=(holder,))["ports"].state == OK
    finally:
        os.kill(holder, signal.SIGKILL)


def test_ports_the_launcher_itself_holds_or_has_reserved_pass(tmp_path):
    from launcher.host import preflight

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()  # this launcher's own store
        reserved = preflight.reserve_port("127.0.0.1", free_port())  # a store's port held before the workers start
        try:
            ports = (listening.getsockname()[1], reserved.getsockname()[1])
            assert found(only("ports"), subject(tmp_path, ports=ports))["ports"] == Finding("ports", OK)
        finally:
            reserved.close()


def test_a_port_held_by_a_child_of_the_launcher_its_worker_passes(tmp_path):
    port = free_port()
    code = "import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\ntime.sleep(600)"
    worker = subprocess.Popen([sys.executable, "-c", code, str(port)])
    try:
        wait_for(lambda: listening("127.0.0.1", port), 30, "the worker to listen")
        assert found(only("ports"), subject(tmp_path, ports=(port,)))["ports"] == Finding("ports", OK)
    finally:
        worker.kill()
        worker.wait()


# ---------------------------------------------------------------- the user's check


def user(tmp_path, command, timeout=60.0) -> Finding:
    settings = dataclasses.replace(only("user"), command=command, timeout=timeout)
    return found(settings, subject(tmp_path))["user"]


def test_a_user_check_that_exits_0_passes_and_runs_in_the_working_directory(tmp_path):
    assert user(tmp_path, "touch ran-here; echo fine") == Finding("user", OK)
    assert (tmp_path / "ran-here").exists()


def test_a_failing_user_check_gives_its_last_line_that_is_not_blank_as_the_reason(tmp_path):
    reason = user(tmp_path, "echo checking; echo 'GPU 3: diag level 1 failed' >&2; printf '\\n  \\n'; exit 3").reason
    assert reason == "GPU 3: diag level 1 failed (--health_check exited with 3)"
    assert user(tmp_path, "exit 1").reason == "--health_check exited with 1, saying nothing"
    assert user(tmp_path, "kill -9 $$").reason == "--health_check was killed by SIGKILL, saying nothing"


def test_a_reason_is_a_line_not_a_log(tmp_path):
    reason = user(tmp_path, "head -c 100000 /dev/zero | tr '\\0' x; printf '\\377\\n'; yes | head -c 5000 | tr -d '\\n';"
                            " exit 2").reason
    assert len(reason) < 400 and reason.endswith("... (--health_check exited with 2)")
    assert user(tmp_path, "printf 'bad \\377 byte\\n'; exit 4").reason == "bad \ufffd byte (--health_check exited with 4)"


def test_a_hanging_user_check_fails_naming_the_timeout_and_its_whole_group_is_killed(tmp_path):
    pids = tmp_path / "pids"
    start = time.monotonic()
    finding = user(tmp_path, f"sleep 600 & echo $! > {pids}; echo started; wait", timeout=1.0)
    assert finding == Finding("user", FAILED, "--health_check did not end within 1 s (--health_check_timeout), "
                                              "and was stopped")
    assert time.monotonic() - start < 60  # a bound for a hang, not a timing
    grandchild = int(pids.read_text())
    wait_for(lambda: not alive(grandchild), 20, "the check's background sleep to be killed")


def test_what_a_user_check_leaves_running_is_killed_with_it(tmp_path):
    pids = tmp_path / "pids"
    assert user(tmp_path, f"sleep 600 > /dev/null & echo $! > {pids}; echo done").state == OK
    wait_for(lambda: not alive(int(pids.read_text())), 20, "what the check left running to be killed")


def test_a_user_check_that_says_a_lot_is_read_to_its_last_line(tmp_path):
    reason = user(tmp_path, "yes 'a line of output' | head -c 3000000; echo; echo the end; exit 1").reason
    assert reason == "the end (--health_check exited with 1)"


def test_a_user_check_that_cannot_start_fails(tmp_path):
    finding = found(dataclasses.replace(only("user"), command="true"), subject(tmp_path, workdir=str(tmp_path / "gone")))
    assert finding["user"].state == FAILED and "could not start" in finding["user"].reason


# ---------------------------------------------------------------- GPUs without NVML: /proc


def fake_proc(root: Path, gpus: int, holders: dict) -> Path:
    """A procfs with the driver's ``gpus`` and processes holding device files: {pid: (comm, [targets])}."""
    proc = root / "proc"
    for i in range(gpus):
        (proc / "driver" / "nvidia" / "gpus" / f"0000:{0x18 + i:02x}:00.0").mkdir(parents=True)
    for pid, (comm, targets) in holders.items():
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        for fd, target in enumerate(targets):
            (proc / str(pid) / "fd" / str(fd)).symlink_to(target)
    return proc


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails as where it is not installed


def gpu_places(tmp_path, proc) -> health.Places:
    return health.Places(shm=str(tmp_path), sys=str(NOTHING), proc=str(proc), dev=str(NOTHING))


def test_without_nvml_a_gpu_held_by_another_process_fails_and_the_drivers_daemons_do_not(tmp_path, no_nvml):
    proc = fake_proc(tmp_path, 2, {4242: ("python", ["/dev/null", "/dev/nvidiactl", "/dev/nvidia1"]),
                                   77: ("nvidia-persiste", ["/dev/nvidia0", "/dev/nvidia1"])})
    gpus = found(only("gpus", "nvml"), subject(tmp_path, gpus=("0", "1")), places=gpu_places(tmp_path, proc))
    assert gpus["gpus"] == Finding("gpus", FAILED, "GPU 1 is held by pid 4242 (?), a process outside this job")
    assert gpus["nvml"] == Finding("nvml", SKIPPED, "nvidia-ml-py is not installed (pip install 'launcher[gpu]')")
    ok = found(only("gpus"), subject(tmp_path, gpus=("0",)), places=gpu_places(tmp_path, proc))
    assert ok["gpus"] == Finding("gpus", OK)
    mine = found(only("gpus"), subject(tmp_path, gpus=("1",)), job_pids=(4242,), places=gpu_places(tmp_path, proc))
    assert mine["gpus"] == Finding("gpus", OK)


def test_without_nvml_fewer_gpus_than_the_workers_take_fails(tmp_path, no_nvml):
    proc = fake_proc(tmp_path, 1, {})
    gpus = found(only("gpus"), subject(tmp_path, gpus=("0", "1")), places=gpu_places(tmp_path, proc))["gpus"]
    assert gpus == Finding("gpus", FAILED, "its workers take 2 GPU(s) but the driver shows 1")


def test_cpu_workers_take_no_gpu_check_and_never_load_nvml(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(FAKE_NVML)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    assert set(found(HealthSettings(), subject(tmp_path))) == {"disk", "shm", "ports"}
    assert "pynvml" not in sys.modules
    found(only("infiniband"), subject(tmp_path, gpus=("0",)))
    assert "pynvml" not in sys.modules  # nor for GPU workers whose NVML checks are off


# ---------------------------------------------------------------- NVML, through a fake library


@pytest.fixture
def nvml(monkeypatch):
    """The fake pynvml loaded in place of the real one; set(machine) describes the GPUs it reports."""
    monkeypatch.syspath_prepend(FAKE_NVML)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import pynvml

    pynvml.calls.update(init=0, shutdown=0)
    yield lambda machine: monkeypatch.setenv("FAKE_NVML", json.dumps(machine))
    sys.modules.pop("pynvml", None)


def healthy(**kw) -> dict:
    return {"ecc": 0, "retired_pending": False, "remap_pending": False, "recovery": 0, "links": [1] * 18,
            "processes": [], **kw}


def nvml_findings(tmp_path, gpus=("0", "1"), **kw) -> dict:
    places = health.Places(shm=str(tmp_path), sys=str(NOTHING), proc=str(NOTHING), dev=str(NOTHING))
    return found(only("gpus", "nvml"), subject(tmp_path, gpus=gpus), places=places, **kw)


def test_healthy_gpus_pass_and_nvml_is_started_and_shut_down_once(tmp_path, nvml):
    import pynvml

    nvml({"gpus": [healthy(), healthy()]})
    assert nvml_findings(tmp_path) == {"gpus": Finding("gpus", OK), "nvml": Finding("nvml", OK)}
    assert pynvml.calls == {"init": 1, "shutdown": 1}


@pytest.mark.parametrize("gpu, reason", [
    (healthy(ecc=2), "GPU 1 has 2 uncorrectable ECC error(s) since the driver loaded"),
    (healthy(retired_pending=True), "GPU 1 has retired pages pending (a GPU reset retires them)"),
    (healthy(remap_pending=True), "GPU 1 has a row remapping pending (a GPU reset applies it)"),
    (healthy(recovery=2), "GPU 1 needs the recovery action NODE_REBOOT (NVML)"),
    (healthy(recovery=1), "GPU 1 needs the recovery action GPU_RESET (NVML)"),
    (healthy(recovery=9), "GPU 1 needs the recovery action number 9 (NVML)"),
    (healthy(links=[1, 1, 0, 1, 0]), "GPU 1 has NVLink 2, 4 down"),
])
def test_each_nvml_sickness_fails_naming_the_gpu(tmp_path, nvml, gpu, reason):
    nvml({"gpus": [healthy(), gpu]})
    assert nvml_findings(tmp_path)["nvml"] == Finding("nvml", FAILED, reason)


def test_every_sick_gpu_is_named(tmp_path, nvml):
    nvml({"gpus": [healthy(ecc=1), healthy(links=[0])]})
    assert nvml_findings(tmp_path)["nvml"].reason == ("GPU 0 has 1 uncorrectable ECC error(s) since the driver loaded; "
                                                      "GPU 1 has NVLink 0 down")


def test_what_a_gpu_or_driver_does_not_report_is_not_judged(tmp_path, nvml):
    nvml({"gpus": [healthy(ecc=None, recovery=None, links=[])]})
    assert nvml_findings(tmp_path, gpus=("0",))["nvml"] == Finding("nvml", OK)


def test_no_driver_skips_nvml_once_saying_why_and_the_gpus_check_falls_back_to_proc(tmp_path, nvml):
    nvml({"driver": False})
    result = nvml_findings(tmp_path)
    assert result["nvml"] == Finding("nvml", SKIPPED, "NVML cannot start here (Driver Not Loaded)")
    assert result["gpus"] == Finding("gpus", FAILED, "its workers take 2 GPU(s) but the driver shows none")


def test_a_gpu_nvml_cannot_reach_fails_the_gpus_check(tmp_path, nvml):
    nvml({"gpus": [healthy(), healthy(lost=True)]})
    result = nvml_findings(tmp_path)
    assert result["gpus"] == Finding("gpus", FAILED, "GPU 1 of its workers cannot be reached through NVML (GPU is lost)")
    assert result["nvml"] == Finding("nvml", OK)  # the lost GPU is the gpus check's to name


def test_a_gpu_computed_on_by_a_process_outside_the_job_fails_and_the_jobs_own_pass(tmp_path, nvml):
    nvml({"gpus": [healthy(), healthy(processes=[999999])]})
    assert nvml_findings(tmp_path)["gpus"] == Finding(
        "gpus", FAILED, "GPU 1 is held by pid 999999 (?), a process outside this job")
    assert nvml_findings(tmp_path, job_pids=(999999,))["gpus"] == Finding("gpus", OK)
    nvml({"gpus": [healthy(processes=[os.getpid()])]})
    assert nvml_findings(tmp_path, gpus=("0",))["gpus"] == Finding("gpus", OK)  # the launcher's own


def test_a_gpu_named_by_its_uuid_is_looked_up_by_it(tmp_path, nvml):
    nvml({"gpus": [healthy(uuid="GPU-aaaa", ecc=5)]})
    assert nvml_findings(tmp_path, gpus=("GPU-aaaa",))["nvml"].reason.startswith("GPU GPU-aaaa has 5 uncorrectable")


def test_a_real_pynvml_without_a_driver_is_skipped(tmp_path):
    """nvidia-ml-py itself, where it is installed (the extra gpu), on this machine without a GPU."""
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("a real NVIDIA driver is here")
    code = ("import importlib.util; from launcher.host import health; from launcher.plan.health import *\n"
            "print(importlib.util.find_spec('pynvml') is not None)\n"
            "print(health.findings(HealthSettings(), Subject(None, '.', '127.0.0.1', gpus=('0',)))[4])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    installed, finding = r.stdout.splitlines()
    if installed == "True":
        assert finding.startswith("Finding(check='nvml', state='skipped', reason='NVML cannot start here ("), finding
    else:
        assert "nvidia-ml-py is not installed (pip install 'launcher[gpu]')" in finding, finding


# ---------------------------------------------------------------- InfiniBand, through a fake sysfs


def ib(tmp_path, ports, hca=None) -> Finding:
    root = sysfs_trees.infiniband(tmp_path / "tree", ports)
    return gpu_health.check_infiniband(str(root), hca)


A, D = (sysfs_trees.IB_ACTIVE, sysfs_trees.PHYS_LINK_UP), (sysfs_trees.IB_DOWN, sysfs_trees.PHYS_POLLING)


def test_active_ports_pass_and_one_down_fails_naming_it(tmp_path):
    assert ib(tmp_path, {("mlx5_0", 1): A, ("mlx5_1", 1): A}) == Finding("infiniband", OK)
    down = ib(tmp_path, {("mlx5_0", 1): A, ("mlx5_1", 1): D, ("mlx5_2", 1): (sysfs_trees.IB_INIT, "5: LinkUp")})
    assert down == Finding("infiniband", FAILED, "InfiniBand mlx5_1 port 1 is DOWN (Polling), mlx5_2 port 1 is INIT "
                                                 "(LinkUp)")


def test_a_port_turned_off_on_purpose_is_left_out(tmp_path):
    off = (sysfs_trees.IB_DOWN, sysfs_trees.PHYS_DISABLED)
    assert ib(tmp_path, {("mlx5_0", 1): A, ("mlx5_0", 2): off}) == Finding("infiniband", OK)


def test_only_the_devices_nccl_uses_are_judged(tmp_path):
    ports = {("mlx5_0", 1): A, ("mlx5_0", 2): D, ("mlx5_1", 1): D, ("mlx5_10", 1): A}
    assert ib(tmp_path, ports, "mlx5_0:1,mlx5_10").state == OK
    assert ib(tmp_path, ports, "^mlx5_1,mlx5_0:2").state == OK  # a prefix: mlx5_1 leaves out mlx5_10 too
    assert ib(tmp_path, ports, "^=mlx5_1,mlx5_0:2").state == OK
    assert ib(tmp_path, ports, "=mlx5_1").reason == "InfiniBand mlx5_1 port 1 is DOWN (Polling)"
    assert ib(tmp_path, ports, "mlx5_0").reason == "InfiniBand mlx5_0 port 2 is DOWN (Polling)"


def test_no_infiniband_is_skipped_saying_so(tmp_path):
    assert ib(tmp_path, {}) == Finding("infiniband", SKIPPED, f"no InfiniBand port here ({tmp_path}/tree/sys/class/"
                                                              "infiniband)")
    assert ib(tmp_path, {("mlx5_0", 1): D}, "mlx4").reason.startswith("no InfiniBand port here among NCCL_IB_HCA=mlx4")


def test_infiniband_is_checked_for_gpu_workers_only(tmp_path, no_nvml):
    root = sysfs_trees.infiniband(tmp_path / "tree", {("mlx5_0", 1): D})
    places = health.Places(shm=str(tmp_path), sys=str(root), proc=str(fake_proc(tmp_path, 1, {})), dev=str(NOTHING))
    assert "infiniband" not in found(HealthSettings(), subject(tmp_path), places=places)
    assert found(HealthSettings(), subject(tmp_path, gpus=("0",)), places=places)["infiniband"].state == FAILED


# ---------------------------------------------------------------- a check that breaks is skipped, not failed


def test_a_probe_that_breaks_on_this_machine_is_skipped_with_its_error(tmp_path, monkeypatch):
    from launcher.host import preflight

    monkeypatch.setattr(preflight, "port_taken", lambda ip, port: 1 / 0)
    ports = found(only("ports"), subject(tmp_path, ports=(1,)))["ports"]
    assert ports == Finding("ports", SKIPPED, "the check could not run here (ZeroDivisionError: division by zero)")


# ---------------------------------------------------------------- facts and the comparison


def test_the_facts_of_the_launchers_own_interpreter_cost_no_process(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("asked a process"))
    facts = health.facts_of(subject(tmp_path, python=sys.executable, script=str(script), uses_torch=True),
                            clock=lambda: 1234.5)
    assert facts.python == ".".join(map(str, sys.version_info[:3])) and facts.clock == 1234.5
    assert facts.script == hashlib.sha256(b"print(1)\n").hexdigest()
    assert facts.torch == health.preflight.installed_version("torch")


def test_another_interpreter_is_asked_its_versions_once(tmp_path):
    other = tmp_path / "python-other"
    other.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    other.chmod(0o755)
    health.interpreter_versions.cache_clear()
    python, torch = health.interpreter_versions(str(other))
    assert python == ".".join(map(str, sys.version_info[:3]))
    assert torch == health.preflight.installed_version("torch")
    other.unlink()
    assert health.interpreter_versions(str(other)) == (python, torch)  # not asked again
    assert health.interpreter_versions(str(tmp_path / "missing"))[0] == f"unknown ({tmp_path}/missing did not say)"


def test_a_node_whose_script_differs_fails_the_comparison(tmp_path):
    (tmp_path / "a.py").write_text("lr = 0.1\n")
    (tmp_path / "b.py").write_text("lr = 0.01\n")
    mine = health.facts_of(subject(tmp_path, script=str(tmp_path / "b.py")), clock=lambda: 100.0)
    node0 = health.facts_of(subject(tmp_path, script=str(tmp_path / "a.py")), clock=lambda: 100.0)
    result = {f.check: f for f in rules.compare(mine, node0, 100.0, HealthSettings())}
    assert result["script"].state == FAILED and result["versions"].state == OK and result["clock"].state == OK


def test_a_script_that_is_a_fifo_is_not_read():
    assert health.script_hash(None) is None
    fifo = Path(f"/tmp/health-fifo-{os.getpid()}")
    os.mkfifo(fifo)
    try:
        assert health.script_hash(str(fifo)) is None  # would block
    finally:
        fifo.unlink()


# ---------------------------------------------------------------- a checkup off the wire


def test_a_checkup_goes_over_the_wire_and_back(tmp_path):
    up = health.checkup(dataclasses.replace(HealthSettings(), command="exit 1"), subject(tmp_path, ports=(free_port(),)))
    wire = json.loads(json.dumps(up.to_wire()))
    assert Checkup.from_wire(wire) == up


GOOD = {"facts": {"python": "3.11.9", "launcher": "0.1.0", "torch": None, "script": None, "clock": 1.0},
        "findings": [["disk", "ok", ""]]}


def deep(depth: int):
    value = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [
    None, 1, "checkup", [], {}, {"facts": []}, {"facts": None, "findings": []},
    {**GOOD, "facts": {**GOOD["facts"], "python": 3}},
    {**GOOD, "facts": {**GOOD["facts"], "torch": ["2.13"]}},
    {**GOOD, "facts": {**GOOD["facts"], "clock": "1.0"}},
    {**GOOD, "facts": {**GOOD["facts"], "clock": True}},
    {**GOOD, "facts": {**GOOD["facts"], "clock": float("nan")}},
    {**GOOD, "facts": {**GOOD["facts"], "clock": float("inf")}},
    {**GOOD, "facts": {**GOOD["facts"], "clock": 10 ** 400}},
    {**GOOD, "findings": None},
    {**GOOD, "findings": {"disk": "ok"}},
    {**GOOD, "findings": [["disk", "ok"]]},
    {**GOOD, "findings": [["disk", "ok", "", ""]]},
    {**GOOD, "findings": [["fans", "ok", ""]]},
    {**GOOD, "findings": [["disk", "sick", ""]]},
    {**GOOD, "findings": [["disk", "failed", None]]},
    {**GOOD, "findings": [[["disk"], "ok", ""]]},
    {**GOOD, "findings": [[{"disk": 1}, "ok", ""]]},
    {**GOOD, "findings": deep(10000)},
    {**GOOD, "facts": {**GOOD["facts"], "python": deep(10000)}},
])
def test_a_hostile_checkup_is_none_and_never_raises(value):
    assert Checkup.from_wire(value) is None


def test_a_huge_checkup_is_read_without_raising():
    many = {**GOOD, "findings": [["user", "failed", "x" * 1000]] * 20000}
    assert len(Checkup.from_wire(many).findings) == 20000
    assert Checkup.from_wire({**GOOD, "facts": {**GOOD["facts"], "python": "9" * 10 ** 6}}).facts.python == "9" * 10 ** 6


def test_the_refusal_is_one_sentence_naming_the_node_the_check_and_the_way_out():
    text = rules.sentence("node 3 (10.0.0.4)", Finding("user", FAILED, "GPU 3: diag failed (--health_check exited with 1)"))
    assert text == ("node 3 (10.0.0.4) failed the health check user: GPU 3: diag failed (--health_check exited with 1); "
                    "mend the node, or skip the check with --skip_health_checks user")
    assert "\n" not in text


def test_check_alone_refuses_on_the_first_failure_and_leaves_infiniband_out(tmp_path):
    settings = dataclasses.replace(HealthSettings(), command="echo sick; exit 1")
    with pytest.raises(LaunchError) as e:
        health.check_alone(settings, subject(tmp_path), "this node (127.0.0.1)")
    assert str(e.value).startswith("this node (127.0.0.1) failed the health check user: sick (--health_check exited")
    assert health.check_alone(HealthSettings(), subject(tmp_path), "this node") == ()
