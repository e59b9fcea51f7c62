"""The layers of the package, kept by a test (docs/architecture.md).

Launcher side, from the top: cli and tools, run, nodes, host, output, plan, then the base (envvars, errors).
A module imports only from its own folder or from a layer below its own; no import circle between modules
(imports inside functions count); no module uses another's private (``_name``) names; no module over 400
lines. Inside ``nodes`` the rooms have an order of their own (``NODES_ROOMS``): the transport at the bottom,
the static channel and the elastic core beside each other (neither imports the other), the backends over
the elastic core, and ``elastic.backends`` (which picks one) over them. The worker side (runtime, fleet, ps,
transpiler) imports nothing of the launcher but ``launcher.addresses``, ``launcher.envvars`` and
``launcher.local_channel``.
"""

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from conftest import REPO
from launcher.plan import elastic_backends

PACKAGE = REPO / "launcher"
MAX_LINES = 400

# layer: rank (an import must point to a lower or equal rank; equal only within the same layer)
LAUNCHER_LAYERS = {"cli": 7, "tools": 6, "run": 5, "nodes": 4, "host": 3, "output": 2, "plan": 1, "base": 0}
WORKER_LAYERS = ("runtime", "fleet", "ps", "transpiler")
BASE = ("addresses", "envvars", "errors", "local_channel", "progress_page", "untrusted")
# rooms inside nodes: module prefix -> rank (an import points to a lower rank, or stays in its own room)
# (each backend's subpackage, named by its row in launcher/plan/elastic_backends.py, is a room of rank 2)
NODES_ROOMS = {"launcher.nodes.transport": 0, "launcher.nodes.static": 1, "launcher.nodes.elastic": 1,
               "launcher.nodes.tune": 1,
               **{row.subpackage: 2 for row in elastic_backends.ROWS if row.subpackage},
               "launcher.nodes.elastic.backends": 3}
TOP = ("__init__", "__main__")  # the package itself: its docstring/version, and ``python -m launcher``


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in TOP):
        return "top"
    head = parts[1]
    if head in BASE:
        return "base"
    if head in WORKER_LAYERS:
        return "worker"
    return head


def imports(path: Path, known: Set[str]) -> List[Tuple[str, List[str], int]]:
    """(imported module, names taken from it, line) for every launcher import in the file, wherever it is."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "launcher"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "launcher":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:  # ``from launcher.x import module``
                    found.append((sub, [], node.lineno))
                else:
                    found.append((base, [alias.name], node.lineno))
    return found


def private_uses(path: Path, known: Set[str]) -> List[str]:
    """``module._name`` where ``module`` is a launcher module the file imported."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher"):
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("launcher") and a.asname:
                    aliases[a.asname] = a.name
    return [f"{aliases[n.value.id]}.{n.attr} (line {n.lineno})" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases
            and n.attr.startswith("_") and not n.attr.startswith("__")]


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def room(module: str) -> str:
    """The room of a module of nodes: the longest prefix of it in NODES_ROOMS."""
    found = [r for r in NODES_ROOMS if module == r or module.startswith(r + ".")]
    return max(found, key=len) if found else "launcher.nodes"


def allowed_in_nodes(importer: str, imported: str) -> bool:
    a, b = room(importer), room(imported)
    if a == b or imported == "launcher.nodes" or importer == "launcher.nodes":
        return True
    return a in NODES_ROOMS and b in NODES_ROOMS and NODES_ROOMS[a] > NODES_ROOMS[b]


def allowed(importer: str, imported: str) -> bool:
    a, b = layer(importer), layer(imported)
    if a == b == "nodes":
        return allowed_in_nodes(importer, imported)
    if a == "top" or (imported == "launcher" and a != "worker"):  # the package itself: its version
        return True
    if a == "worker":
        return b == "worker" or imported in ("launcher.addresses", "launcher.envvars", "launcher.local_channel",
                                             "launcher.progress_page")
    if b in ("worker", "top"):
        return False
    return a == b or LAUNCHER_LAYERS[a] > LAUNCHER_LAYERS[b]


GRAPH = None


def graph() -> Dict[str, Set[str]]:
    global GRAPH
    if GRAPH is None:
        known = set(modules())
        GRAPH = {m: {i for i, _, _ in imports(p, known) if i in known and i != m} for m, p in modules().items()}
    return GRAPH


def test_every_folder_is_a_known_layer():
    assert {layer(m) for m in modules()} <= {"top", "worker", *LAUNCHER_LAYERS}


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_point_down(module):
    known = set(modules())
    wrong = [f"line {line}: {imported} ({layer(imported)})" for imported, _, line in imports(modules()[module], known)
             if imported in known and not allowed(module, imported)]
    assert not wrong, f"{module} ({layer(module)}) imports upward or across: {wrong}"


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_private_names_across_modules(module):
    path, known = modules()[module], set(modules())
    taken = [f"{imported}.{name} (line {line})" for imported, names, line in imports(path, known)
             for name in names if is_private(name) and imported != module]
    assert not taken + private_uses(path, known), f"{module} uses private names of other modules"


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_over_400_lines(module):
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines"


def test_no_import_circle():
    g, state, circles = graph(), {}, []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(g[m]):
            if state.get(n) == "open":
                circles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    # a package's __init__ importing its own modules is how a package exposes them, not a circle of jobs
    circles = [c for c in circles if not all(x == c[0] or x.startswith(c[0] + ".") or c[0].startswith(x + ".")
                                             for x in c)]
    assert not circles, "import circles: " + "; ".join(" → ".join(c) for c in circles)


# the checker checks itself: a wrong-way import and a circle are caught


def test_the_rooms_of_nodes_point_one_way():
    assert {"launcher.nodes.elastic.c10d", "launcher.nodes.elastic.etcd"} <= set(NODES_ROOMS)
    assert allowed("launcher.nodes.elastic.etcd.link", "launcher.nodes.elastic.link")
    assert allowed("launcher.nodes.elastic.c10d.keeper", "launcher.nodes.transport.wire")
    assert allowed("launcher.nodes.elastic.backends", "launcher.nodes.elastic.c10d.start")
    assert not allowed("launcher.nodes.elastic.etcd.link", "launcher.nodes.elastic.c10d.member")  # backends are apart
    assert not allowed("launcher.nodes.elastic.membership", "launcher.nodes.elastic.etcd.state")  # rules know no backend
    assert not allowed("launcher.nodes.static.hub", "launcher.nodes.elastic.link")
    assert not allowed("launcher.nodes.transport.connection", "launcher.nodes.static.endpoint")


def test_an_upward_import_is_caught():
    assert not allowed("launcher.plan.policy", "launcher.run.supervisor")
    assert not allowed("launcher.output.reports", "launcher.nodes.static.hub")
    assert not allowed("launcher.fleet.comm", "launcher.plan.policy")
    assert allowed("launcher.run.supervisor", "launcher.plan.policy")
    assert allowed("launcher.fleet.comm", "launcher.envvars")


def test_relative_and_function_level_imports_are_seen(tmp_path):
    pkg = REPO / "launcher" / "plan"
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from launcher.run import supervisor\n    from launcher.plan.policy import _x\n")
    found = imports(sample, {"launcher.run.supervisor", "launcher.plan.policy"})
    assert ("launcher.run.supervisor", [], 2) in found and ("launcher.plan.policy", ["_x"], 3) in found
    assert pkg.is_dir()


def test_architecture_lists_every_module():
    listed = (REPO / "docs" / "architecture.md").read_text()
    missing = [str(path.relative_to(REPO)) for name, path in modules().items()
               if layer(name) in LAUNCHER_LAYERS and layer(name) != "base" and path.name != "__init__.py"
               and f"`{path.relative_to(REPO)}`" not in listed]
    assert not missing, f"docs/architecture.md does not list {missing}"
