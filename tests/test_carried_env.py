"""What a job started over ssh carries to every host (launcher.plan.carried_env): the command's environment less what
describes this machine or session, then an env file in DeepSpeed's .deepspeed_env form, then --env; values exactly as
they are, checked on random ones (hypothesis). Pure: no process."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from launcher import envvars as ev
from launcher.errors import LaunchError
from launcher.nodes.transport.auth import TOKEN_VAR
from launcher.plan.carried_env import (DROPPED, DROPPED_NAMES, DROPPED_PREFIXES, carried, is_dropped, parse_env_file,
                                       parse_env_option)
from launcher.plan.etcd import PASSWORD_VAR
from launcher.run import processes, spare

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None)

A_LOGIN = {  # what a shell on a desktop, logged in over ssh inside tmux, typically holds
    "HOSTNAME": "laptop", "PWD": "/home/me/run", "OLDPWD": "/home/me", "SHLVL": "2", "_": "/usr/bin/python3",
    "BASH_FUNC_module%%": "() {  eval `/usr/bin/modulecmd bash $*`\n}", "SSH_CONNECTION": "10.0.0.9 5022 10.0.0.1 22",
    "SSH_CLIENT": "10.0.0.9 5022 22", "SSH_TTY": "/dev/pts/3", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
    "SSH_AGENT_PID": "99", "HOME": "/home/me", "USER": "me", "LOGNAME": "me", "MAIL": "/var/mail/me", "DISPLAY": ":0",
    "WAYLAND_DISPLAY": "wayland-0", "XAUTHORITY": "/home/me/.Xauthority", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/x",
    "XDG_RUNTIME_DIR": "/run/user/1000", "XDG_SESSION_ID": "4", "XDG_SESSION_TYPE": "tty", "XDG_SEAT": "seat0",
    "XDG_VTNR": "2", "TMUX": "/tmp/tmux-1000/default,9,0", "TMUX_PANE": "%1", "STY": "1.pts-0.laptop",
    "KRB5CCNAME": "FILE:/tmp/krb5cc_1000", "CUDA_VISIBLE_DEVICES": "0,1",
    ev.RUN_ID: "r1", ev.ELASTIC_ROUND: "3", ev.CONTROL_SOCKET: "@launcher-1", ev.CONTROL_KEY: "k", ev.PROGRESS_FD: "7",
    ev.WARM_FD: "8", spare.FD_VAR: "9",
}
KEPT = {  # what the workers need, and what the job's nodes must share
    "PATH": "/opt/conda/bin:/usr/bin", "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "UCX_TLS": "rc", "OMP_NUM_THREADS": "4", "TERM": "xterm",
    "LANG": "C.UTF-8", "VIRTUAL_ENV": "/opt/venv", "XDG_CONFIG_HOME": "/home/me/.config", "SSH": "not a prefix",
    TOKEN_VAR: "secret-token", ev.JOB_ID: "job-7", PASSWORD_VAR: "etcd-pw", processes.NO_CGROUP_VAR: "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "WANDB_API_KEY": "w",
}


def refusal(call, *args) -> str:
    with pytest.raises(LaunchError) as e:
        call(*args)
    return str(e.value)


# ---------------------------------------------------------------- what is not carried


def test_what_describes_this_machine_or_login_is_dropped_and_the_rest_carried():
    assert carried({**A_LOGIN, **KEPT}, {}, {}) == KEPT


def test_every_dropped_row_drops_what_it_says():
    for name, why in DROPPED:
        assert why and is_dropped(name.rstrip("*") + ("X" if name.endswith("*") else ""))
    assert DROPPED_PREFIXES == ("BASH_FUNC_", "SSH_", "XDG_SESSION_", "TMUX")
    assert {"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "DISPLAY", "_", "HOME", "CUDA_VISIBLE_DEVICES"} <= DROPPED_NAMES


def test_the_launchers_own_names_agree_with_their_modules():
    """The job token must reach every node (each proves it); a node's own processes' marks and descriptors must not."""
    assert TOKEN_VAR == ev.JOB_TOKEN and not is_dropped(TOKEN_VAR) and not is_dropped(ev.JOB_ID)
    assert is_dropped(spare.FD_VAR) and is_dropped(processes.RUN_ID_VAR)
    assert not [n for n in vars(ev).values() if isinstance(n, str) and n.startswith("LAUNCHER_") and is_dropped(n)
                and n not in (ev.RUN_ID, ev.ELASTIC_ROUND, ev.CONTROL_SOCKET, ev.CONTROL_KEY, ev.PROGRESS_FD, ev.WARM_FD)]


def test_the_docs_list_every_name_not_carried():
    shown = "".join(page.read_text() for page in (REPO / "docs").glob("*.md"))
    assert not [name for name, _ in DROPPED if f"| `{name}` |" not in shown]


def test_an_env_file_or_env_option_may_set_a_dropped_name():
    assert carried({"DISPLAY": ":0", "HOME": "/a"}, {"DISPLAY": ":1"}, {"HOME": "/b"}) == {"DISPLAY": ":1", "HOME": "/b"}


def test_the_later_source_wins():
    env = {"A": "env", "B": "env", "C": "env"}
    assert carried(env, {"B": "file", "C": "file"}, {"C": "option"}) == {"A": "env", "B": "file", "C": "option"}


def test_nothing_given_is_changed():
    env, file_env, option_env = {"A": "1", "HOME": "/h"}, {"B": "2"}, {"C": "3"}
    carried(env, file_env, option_env)
    assert (env, file_env, option_env) == ({"A": "1", "HOME": "/h"}, {"B": "2"}, {"C": "3"})


# ---------------------------------------------------------------- the env file (DeepSpeed's .deepspeed_env)


def test_the_env_file_forms():
    text = ("NCCL_DEBUG=INFO\n"
            "\n"
            "# a comment\n"
            "   # an indented one\n"
            "  PADDED  =  both sides stripped, as DeepSpeed does  \r\n"
            "EQUALS==a=b\n"
            "EMPTY=\n"
            "HASH=x#y\n"  # no trailing comment: a # in a value is the value's
            "QUOTED=\"a b\" 'c'\n"  # no shell: quotes stay
            "DOLLAR=$HOME/${USER}`id`\n"
            "UNICODE=héllo ✓\n"
            "NCCL_DEBUG=WARN\n")  # a later line wins
    assert parse_env_file(text, ".deepspeed_env") == {
        "NCCL_DEBUG": "WARN", "PADDED": "both sides stripped, as DeepSpeed does", "EQUALS": "=a=b", "EMPTY": "",
        "HASH": "x#y", "QUOTED": "\"a b\" 'c'", "DOLLAR": "$HOME/${USER}`id`", "UNICODE": "héllo ✓"}
    assert parse_env_file("", "f") == {} == parse_env_file("\n# nothing\n", "f")
    assert parse_env_file("\ufeffA=1\n", "f") == {"A": "1"}  # a UTF-8 file some editors mark first


FORM = "NAME=VALUE, the name of letters, digits and _ (not first a digit)"


@pytest.mark.parametrize("text, sentence", [
    ("A=1\n\nNO_EQUALS", f"env.txt:3 has 'NO_EQUALS' with no '='; write {FORM}."),
    ("=1", f"env.txt:1 sets '', which is not a variable name; write {FORM}."),
    ("1A=1", f"env.txt:1 sets '1A', which is not a variable name; write {FORM}."),
    ("A-B=1", f"env.txt:1 sets 'A-B', which is not a variable name; write {FORM}."),
    ("export A=1", f"env.txt:1 sets 'export A', which is not a variable name; write {FORM}."),
    ("A B=1", f"env.txt:1 sets 'A B', which is not a variable name; write {FORM}."),
    ("A=1\nB=x\0y", "env.txt:2 gives B a value with a NUL character, which no variable can hold; remove it."),
])
def test_a_bad_env_file_line_is_refused_naming_its_line(text, sentence):
    assert refusal(parse_env_file, text, "env.txt") == sentence


def test_a_refusal_never_shows_the_value():
    assert "hunter2" not in refusal(parse_env_file, "BAD NAME=hunter2", "f")
    assert "hunter2" not in refusal(parse_env_option, ["1PASSWORD=hunter2"])


# ---------------------------------------------------------------- --env


def test_env_option_values_are_taken_exactly():
    assert parse_env_option(["A=1", "B= spaced ", "C=a=b", "D=", "E=line1\nline2", "A=2"]) == {
        "A": "2", "B": " spaced ", "C": "a=b", "D": "", "E": "line1\nline2"}
    assert parse_env_option([]) == {}


@pytest.mark.parametrize("item, sentence", [
    ("NCCL_DEBUG", f"--env has 'NCCL_DEBUG' with no '='; write {FORM}."),
    ("", f"--env has '' with no '='; write {FORM}."),
    ("=x", f"--env sets '', which is not a variable name; write {FORM}."),
    (" A=x", f"--env sets ' A', which is not a variable name; write {FORM}."),
    ("A.B=x", f"--env sets 'A.B', which is not a variable name; write {FORM}."),
    ("A=x\0", "--env gives A a value with a NUL character, which no variable can hold; remove it."),
])
def test_a_bad_env_option_is_refused(item, sentence):
    assert refusal(parse_env_option, ["OK=1", item]) == sentence


# ---------------------------------------------------------------- random names and values

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
VALUES = st.text(st.characters(exclude_characters="\0"), max_size=40) | st.sampled_from(
    ["a b", "'q'", '"q"', "$HOME", "${X:-y}", "`id`", "a\nb", "\n", " ", "x=y", "\\", "#", "é✓"])
DROPPED_LIKE = st.sampled_from(sorted(DROPPED_NAMES)) | st.builds(str.__add__, st.sampled_from(DROPPED_PREFIXES),
                                                                  NAMES)


@given(st.dictionaries(NAMES | DROPPED_LIKE, VALUES, max_size=12), st.dictionaries(NAMES, VALUES, max_size=4),
       st.dictionaries(NAMES, VALUES, max_size=4))
@SETTINGS
def test_any_value_survives_exactly_and_no_dropped_name_does(env, file_env, option_env):
    out = carried(env, file_env, option_env)
    for name, value in out.items():
        assert value == (option_env.get(name, file_env.get(name, env.get(name))))
        assert not is_dropped(name) or name in file_env or name in option_env
    assert set(out) == {n for n in env if not is_dropped(n)} | set(file_env) | set(option_env)


@given(st.dictionaries(NAMES, VALUES, max_size=8))
@SETTINGS
def test_any_value_given_with_env_arrives_exactly(values):
    assert parse_env_option([f"{k}={v}" for k, v in values.items()]) == values


@given(st.dictionaries(NAMES, VALUES.filter(lambda v: "\n" not in v and v == v.strip()), max_size=8),
       st.sampled_from(["\n", "\r\n", "\n\n# c\n"]))
@SETTINGS
def test_any_one_line_value_written_in_an_env_file_reads_back(values, between):
    assert parse_env_file(between.join(f"{k}={v}" for k, v in values.items()), "f") == values
