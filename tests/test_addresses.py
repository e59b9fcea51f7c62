"""``HOST[:PORT]`` read once (launcher/addresses.py): the forms it takes, the ones it refuses, and that every reader of an
address in the launcher and its workers goes through it."""

import ast

import pytest

from conftest import REPO
from launcher import addresses
from launcher.addresses import NotAnAddress, split


@pytest.mark.parametrize("text, default, expected", [
    ("10.0.0.1:29500", None, ("10.0.0.1", 29500)),
    ("node0:1", None, ("node0", 1)),
    ("node0:65535", None, ("node0", 65535)),
    ("compose_node-0.example:80", None, ("compose_node-0.example", 80)),
    (" node0:80 ", None, ("node0", 80)),
    ("[::1]:29500", None, ("::1", 29500)),
    ("[fe80::1%eth0]:29500", None, ("fe80::1%eth0", 29500)),
    ("[::1]", 29400, ("::1", 29400)),
    ("[fe80::1%eth0]", 29400, ("fe80::1%eth0", 29400)),
    ("node0", 29400, ("node0", 29400)),
    ("fe80::1", 29400, ("fe80::1", 29400)),
    ("::1:2950", 7, ("::1:2950", 7)),  # a bare IPv6 address: its last group is never a port
    ("::ffff:10.0.0.1", 7, ("::ffff:10.0.0.1", 7)),
])
def test_the_forms_taken(text, default, expected):
    assert split(text, default) == expected


@pytest.mark.parametrize("text, default, reason", [
    ("node0", None, "has no port"),
    ("fe80::1", None, "has no port (an IPv6 address takes its port in brackets: [fe80::1]:PORT)"),
    ("::1:29500", None, "is not HOST:PORT"),  # 29500 is no IPv6 group: not an address, and not split either
    ("node0:0", None, "has the port '0', not a whole number from 1 to 65535"),
    ("node0:65536", None, "has the port '65536', not a whole number from 1 to 65535"),
    ("node0:", 7, "has the port '', not a whole number from 1 to 65535"),
    ("node0:²", None, "has the port '²', not a whole number from 1 to 65535"),
    ("node0:-1", None, "has the port '-1', not a whole number from 1 to 65535"),
    ("node0:+80", None, "has the port '+80', not a whole number from 1 to 65535"),
    ("node0: 80", None, "has the port ' 80', not a whole number from 1 to 65535"),
    (":80", None, "has no host before its port"),
    ("", 7, "has no host before its port"),
    ("80", 7, "is not HOST:PORT"),
    ("10.0.0:80", None, "is not HOST:PORT"),
    ("h/x:80", None, "is not HOST:PORT"),
    ("u@h:80", None, "is not HOST:PORT"),
    ("u:pw@h:80", None, "is not HOST:PORT"),
    ("héte:80", None, "is not HOST:PORT"),
    ("[::1", 7, "is not HOST:PORT (brackets hold an IPv6 address, such as [::1]:29500)"),
    ("[::1]x", 7, "is not HOST:PORT (brackets hold an IPv6 address, such as [::1]:29500)"),
    ("[node0]:80", None, "is not HOST:PORT (brackets hold an IPv6 address, such as [::1]:29500)"),
    ("[]:80", None, "is not HOST:PORT (brackets hold an IPv6 address, such as [::1]:29500)"),
    ("[:::]:80", None, "is not HOST:PORT"),
    ("[::1]:", None, "has the port '', not a whole number from 1 to 65535"),
    ("[::1]:0", None, "has the port '0', not a whole number from 1 to 65535"),
    ("x" * 10_000 + ":80:", None, "is not HOST:PORT"),
])
def test_the_forms_refused_say_what_is_wrong(text, default, reason):
    with pytest.raises(NotAnAddress) as refusal:
        split(text, default)
    assert str(refusal.value) == reason and isinstance(refusal.value, ValueError)


@pytest.mark.parametrize("host, port", [("10.0.0.1", 80), ("::1", 29500), ("fe80::1%eth0", 1), ("node0", 65535)])
def test_an_endpoint_written_is_read_back(host, port):
    assert split(addresses.joined(host, port)) == (host, port)


def test_the_module_imports_nothing_of_the_launcher():
    tree = ast.parse((REPO / "launcher" / "addresses.py").read_text())
    imported = [n.module if isinstance(n, ast.ImportFrom) else a.name for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in getattr(n, "names", [])]
    assert not [m for m in imported if m and m.startswith("launcher")]


def test_no_module_splits_a_host_and_port_by_hand():
    """``rpartition(":")``/``partition(":")`` on an address, and ``strip("[]")``: the hand-made readers it replaced."""
    found = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("rpartition", "strip") and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in (":", "[]")):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found
