"""The rendezvous backends as rows (launcher/plan/elastic_backends.py): every row is whole (its modules exist and
keep their interface), a name is looked up or refused in one sentence, and no backend's name is a string
literal in the launcher outside its row and its own modules (its endpoint's module, its subpackage)."""

import ast
import importlib
import inspect
from dataclasses import replace

import pytest

from conftest import REPO
from launcher.errors import LaunchError
from launcher.plan import elastic_backends as eb
from launcher.plan.elastic_spec import ElasticSpec, Rendezvous

PACKAGE = REPO / "launcher"
# folders whose modules are not yet held to the rule (being rewritten): drop each once it passes
NOT_YET = ()
FORMING = ("spec", "job_id", "workers", "token")


def module_path(dotted: str):
    """The file of a module, or the folder of a package, of ``launcher``."""
    path = REPO.joinpath(*dotted.split("."))
    return path if path.is_dir() else path.with_suffix(".py")


def owners():
    """Each backend's name (of a row that forms a link), and the files and folders that may spell it."""
    allowed = [module_path("launcher.plan.elastic_backends")]
    for row in eb.ROWS:
        if row.forms:
            allowed += [module_path(row.subpackage)] + ([module_path(row.endpoint)] if row.endpoint else [])
    names = {name for row in eb.ROWS if row.forms for name in (*row.names, *filter(None, [row.url_scheme]))}
    return names, allowed


def literals(path, names):
    """(line, text) of every string constant of ``path`` that is one of ``names`` (in any case), or begins with a
    URL of one (``etcd://``: a value tested or built, where a sentence only mentions it further on)."""
    tree = ast.parse(path.read_text(), str(path))
    urls = tuple(f"{name}://" for name in names)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (node.value.strip().lower() in names or node.value.strip().lower().startswith(urls))]


def test_no_backend_name_is_a_string_literal_outside_its_row_and_its_own_modules():
    names, allowed = owners()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        shown = str(path.relative_to(REPO))
        if any(path == a or a in path.parents for a in allowed) or shown.startswith(NOT_YET):
            continue
        found += [f"{shown}:{line}: {text!r}" for line, text in literals(path, names)]
    assert not found, "a backend's name tested outside its row (use a property of launcher.plan.elastic_backends." \
                      "Backend instead): " + "; ".join(found)


def test_the_check_finds_a_literal_and_passes_a_docstring(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""etcd"""\n\ndef f(spec):\n    """About c10d and etcd."""\n    return spec.backend == "ETCD"\n'
                      '\n\ndef g(text):\n    """Takes --master etcd://HOST."""\n    return text.startswith("Etcd://")\n')
    assert literals(sample, {"etcd", "c10d"}) == [(1, "etcd"), (5, "ETCD"), (10, "Etcd://")]  # a name alone counts
    assert literals(sample, {"c10d"}) == []


@pytest.mark.parametrize("row", eb.ROWS, ids=lambda row: row.name)
def test_each_row_names_modules_that_keep_their_interface(row):
    assert row.names[0] == row.name and all(name == name.lower() for name in row.names)
    if row.forms:
        assert row.forms.startswith("launcher.nodes.elastic.") and row.forms.endswith(".start")
        assert module_path(row.subpackage).is_dir() and module_path(row.forms).is_file()
        assert list(inspect.signature(importlib.import_module(row.forms).form).parameters)[:4] == list(FORMING)
    if row.endpoint:
        assert row.endpoint.startswith("launcher.plan.") and row.elastic
        module = row.endpoint_module()
        assert callable(module.from_torchrun)
        if row.url_scheme or row.elastic_server:  # Paddle names it
            assert callable(module.from_paddle3) and callable(module.from_paddle2)
    assert row.elastic == bool(row.forms and row.endpoint)


def test_every_name_is_one_rows_and_the_defaults_are_rows():
    assert len(eb.NAMES) == len(set(eb.NAMES)) and set(eb.NAMES) == set(eb.BY_NAME)
    assert eb.FIXED in eb.ROWS and not eb.FIXED.elastic and eb.RANGE in eb.ROWS and eb.RANGE.has_node_0
    assert sum(row.elastic_server for row in eb.ROWS) == 1


def test_a_name_is_looked_up_in_any_case_and_an_unknown_one_refused_in_one_sentence():
    assert eb.backend_named(" ETCD-v2 ") is eb.backend_named("etcd") is eb.ETCD
    with pytest.raises(LaunchError) as refusal:
        eb.backend_named("zmq")
    assert str(refusal.value) == ("--rdzv-backend zmq is not a rendezvous backend of this launcher; give c10d, etcd "
                                  "or static.")


def test_what_the_rows_say_of_each_backend():
    c10d, etcd = eb.backend_named("c10d"), eb.backend_named("etcd")
    assert c10d.has_node_0 and not c10d.any_node_may_be_lost and not c10d.fixed_count_elastic
    assert not etcd.has_node_0 and etcd.any_node_may_be_lost and etcd.fixed_count_elastic
    assert (c10d.failure_grace(3.0), etcd.failure_grace(3.0)) == (0.0, 4.0)
    assert etcd.heartbeat_timeout == 10.0 and c10d.heartbeat_timeout is None


def test_a_spec_reads_its_backend_from_its_row():
    spec = ElasticSpec(2, 2, "c10d", rendezvous=Rendezvous(heartbeat_timeout=3.0))
    assert spec.backend_row is eb.C10D and not spec.elastic and spec.failure_grace == 0.0
    in_etcd = replace(spec, backend="etcd")
    assert in_etcd.backend_row is eb.ETCD and in_etcd.elastic and in_etcd.failure_grace == 4.0


def test_a_conf_key_of_another_backend_is_refused_naming_it():
    assert eb.split_conf("join_timeout=60,user=u,cacert=ca.pem", eb.ETCD) == (
        "join_timeout=60", {"user": "u", "cacert": "ca.pem"})
    with pytest.raises(LaunchError, match=r"^--rdzv-conf cacert= is for an etcd rendezvous; give --rdzv-backend etcd"):
        eb.split_conf("cacert=ca.pem", eb.C10D)


def test_paddles_url_names_its_backend_and_a_scheme_of_none_is_refused_naming_those_there_are():
    assert eb.for_url("10.0.0.1:8090") is None and eb.for_url(None) is None
    assert eb.for_url("etcd://h1:2379") is eb.ETCD and eb.for_url(" ETCD://h1") is eb.ETCD
    assert eb.elastic_server() is eb.ETCD
    with pytest.raises(LaunchError) as refusal:
        eb.for_url("redis://u:pw@h1:6379", "--elastic_server")
    assert str(refusal.value) == ("--elastic_server redis://...@h1:6379 is not IP:PORT; give node 0's address and a free "
                                  "port, such as 10.0.0.1:8090 (or etcd://HOST:PORT of etcd, with --nnodes).")


@pytest.mark.parametrize("text, shown", [
    ("etcd://root:secret@h1:2379", "etcd://...@h1:2379"), ("etcd://h1", "etcd://h1"), ("h1:2379", "h1:2379"),
    ("etcd://a@b@h1", "etcd://...@h1"), (" x://:@h ", "x://...@h"),
])
def test_a_url_is_shown_without_its_password(text, shown):
    assert eb.without_password(text) == shown
