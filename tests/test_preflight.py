"""Read-only looks at the machine: addresses, ports and the script, checked before anything starts."""

import os
import shutil
import socket
import sys
import threading

import pytest

from launcher.host import preflight
from launcher.errors import LaunchError
from launcher.plan.model import HostFacts, Interface, LaunchOptions

HOST = HostFacts(gpu_count=None, cpu_count=2, interfaces=(
    Interface("lo", "127.0.0.1", "255.0.0.0"),
    Interface("eth0", "10.1.2.3", "255.255.255.0"),
    Interface("eth0", "fe80::1", "ffff:ffff:ffff:ffff::"),
))


# ---------------------------------------------------------------- addresses


@pytest.mark.parametrize("ip", ["127.0.0.1", "127.0.0.2", "127.255.1.9", "::1", "10.1.2.3", "fe80::1", "fe80:0::1"])
def test_local_addresses(ip):
    assert preflight.is_local_address(ip, HOST)


@pytest.mark.parametrize("ip", ["10.1.2.4", "192.0.2.1", "::2", "localhost", "", "10.1.2.3.4", "²"])
def test_not_local_addresses(ip):
    assert not preflight.is_local_address(ip, HOST)


def test_node_ip_of_another_machine_lists_this_machines_addresses():
    with pytest.raises(LaunchError) as e:
        preflight.check_node_ip("192.0.2.1", HOST)
    assert "--node_ip 192.0.2.1 is not an address of this machine (its addresses: 10.1.2.3, 127.0.0.1, fe80::1)" in str(e.value)


# ---------------------------------------------------------------- ports


def test_a_free_port_passes():
    port = preflight.find_free_ports("127.0.0.1", 1)[0]
    preflight._check_port("127.0.0.1", port)


def test_a_held_port_names_its_holder():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError) as e:
            preflight._check_port("127.0.0.1", port)
    message = str(e.value)
    assert f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()} (" in message
    assert "choose another --started_port" in message


def test_find_free_ports_gives_distinct_ports_that_can_be_bound():
    ports = preflight.find_free_ports("127.0.0.1", 5)
    assert len(ports) == len(set(ports)) == 5
    for port in ports:
        preflight._check_port("127.0.0.1", port)
    assert preflight.find_free_ports("127.0.0.1", 0) == []


def test_find_free_ports_on_an_address_of_another_machine_finds_none():
    assert preflight.find_free_ports("192.0.2.1", 2) == []


def test_port_finder_refuses_a_foreign_node_ip_first():
    with pytest.raises(LaunchError, match="is not an address of this machine"):
        preflight.port_finder(HOST)("192.0.2.1", 2)


# ---------------------------------------------------------------- the training script


def script(folder, name, text, mode=0o755):
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    path.chmod(mode)
    return path


def check_script(path, path_var=os.defpath, **opts):
    preflight._check_script(LaunchOptions(training_script=str(path), **opts), path_var)


def refused(path, path_var=os.defpath, **opts) -> str:
    with pytest.raises(LaunchError) as e:
        check_script(path, path_var, **opts)
    return str(e.value)


def test_python_scripts_pass(tmp_path):
    check_script(script(tmp_path, "train.py", "print(1)\n", mode=0o644))
    check_script(script(tmp_path, "env.py", "#!/usr/bin/env python3\nprint(1)\n"))
    check_script(script(tmp_path, "abs.py", "#!/opt/conda/bin/python3.8 -u\nprint(1)\n"))
    check_script(script(tmp_path, "uv.py", "#!/usr/bin/env -S uv run --script\nprint(1)\n"))
    (tmp_path / "pkg").mkdir()
    script(tmp_path / "pkg", "__main__.py", "print(1)\n")
    check_script(tmp_path / "pkg")
    check_script("some.module", module=True)  # found by the worker's interpreter, not checked here


def test_missing_python_script(tmp_path):
    assert f"training script {tmp_path / 'nope.py'} does not exist" in refused(tmp_path / "nope.py")
    assert "is a folder without __main__.py" in refused(tmp_path)


@pytest.mark.parametrize("name,text,fragment", [
    ("train.sh", "#!/bin/bash\necho hi\n", "is a script for /bin/bash (its #! line), not Python; add --no_python"),
    ("run", "#!/usr/bin/env bash\necho hi\n", "is a script for /usr/bin/env bash (its #! line), not Python; add --no_python"),
    ("train.py", "#!/usr/bin/perl\nprint 1;\n", "is a script for /usr/bin/perl"),
    ("train.sh", "echo hi\n", "looks like a shell script, not Python; add --no_python"),
    ("a.out", b"\x7fELF\x02\x01\x01" + bytes(64), "is a compiled program, not a Python script; add --no_python"),
], ids=["bash", "env-bash", "perl", "sh-suffix", "elf"])
def test_what_python_cannot_run_gets_the_no_python_hint(tmp_path, name, text, fragment):
    assert fragment in refused(script(tmp_path, name, text))


def test_no_python_runs_programs_the_kernel_can_exec(tmp_path):
    check_script(script(tmp_path, "run.sh", "#!/bin/sh\necho hi\n"), no_python=True)
    check_script(sys.executable, no_python=True)
    check_script("sh", os.environ["PATH"], no_python=True)  # a bare name is looked up on PATH


def test_no_python_without_a_shebang_line_is_refused(tmp_path):
    message = refused(script(tmp_path, "exe.sh", "echo hi\n"), no_python=True)
    assert "has no #! line, so the system cannot run it as a program; add one as its first line" in message


def test_no_python_with_an_interpreter_that_is_not_there(tmp_path):
    message = refused(script(tmp_path, "run.sh", "#!/nonexistent/bash\necho hi\n"), no_python=True)
    assert "names /nonexistent/bash in its #! line, which is not an executable file on this machine" in message


def test_no_python_needs_the_execute_bit(tmp_path):
    path = script(tmp_path, "run.sh", "#!/bin/sh\n", mode=0o644)
    assert f"is not executable; run chmod +x {path}" in refused(path, no_python=True)


def test_no_python_bare_name_in_the_current_folder_is_not_run_by_exec(tmp_path, monkeypatch):
    script(tmp_path, "exe.sh", "#!/bin/sh\necho hi\n")
    monkeypatch.chdir(tmp_path)
    message = refused("exe.sh", "/usr/bin:/bin", no_python=True)
    assert "exe.sh is not a command on PATH" in message and "write ./exe.sh" in message
    check_script("./exe.sh", "/usr/bin:/bin", no_python=True)


def test_no_python_bare_name_is_looked_up_on_the_workers_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir, "mytrain", "#!/bin/sh\necho hi\n")
    assert shutil.which("mytrain") is None
    check_script("mytrain", f"/usr/bin:{bin_dir}", no_python=True)
    assert "mytrain is not a command on PATH" in refused("mytrain", "/usr/bin", no_python=True)


def test_no_python_folder_or_missing_path(tmp_path):
    assert "is a folder, not a program" in refused(tmp_path, no_python=True)
    assert "does not exist" in refused(tmp_path / "nope", no_python=True)
    assert "/dev/null is not a regular file" in refused("/dev/null", no_python=True)


def test_check_uses_the_workers_path(tmp_path, monkeypatch):
    from launcher.plan.planner import make_plan

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir, "mytrain", "#!/bin/sh\necho hi\n")
    opts = LaunchOptions("mytrain", no_python=True, nproc_per_node=1, extra_env=(("PATH", f"/bin:{bin_dir}"),))
    free = preflight.find_free_ports("127.0.0.1", 1)
    plan = make_plan(opts, {"PATH": "/bin"}, HOST, lambda ip, n: free)
    preflight.check(plan, opts, HOST)
    opts = LaunchOptions("mytrain", no_python=True, nproc_per_node=1)
    plan = make_plan(opts, {"PATH": "/bin"}, HOST, lambda ip, n: free)
    with pytest.raises(LaunchError, match="mytrain is not a command on PATH"):
        preflight.check(plan, opts, HOST)


def test_port_finder_holds_rank_0_port_for_a_store_only():
    finder = preflight.port_finder(HOST)
    ports = finder("127.0.0.1", 3)
    try:
        assert len(set(ports)) == 3 and [s.getsockname()[1] for s in finder.held] == ports[:1]
        with socket.socket() as s:
            with pytest.raises(OSError):
                s.bind(("127.0.0.1", ports[0]))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", ports[0]))
            s.listen()
        for port in ports[1:]:  # the others are not held: a worker's own bind must work
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
    finally:
        for s in finder.held:
            s.close()


def test_a_scheduler_file_that_is_a_fifo_is_left_out_without_blocking(tmp_path):
    """LSB_DJOB_RANKFILE naming a FIFO: opening it to read would wait for a writer forever."""
    fifo = tmp_path / "rankfile"
    os.mkfifo(fifo)
    done = []
    reader = threading.Thread(target=lambda: done.append(preflight.probe_host({"LSB_DJOB_RANKFILE": str(fifo)})),
                              daemon=True)
    reader.start()
    reader.join(20)
    if reader.is_alive():  # unblock the stuck open, so that the run can go on
        with open(fifo, "w"):
            pass
        reader.join(5)
        pytest.fail("probe_host blocked on a FIFO")
    assert done[0].env_files == ()
