"""The docs cannot drift from the code: every command and output that README.md and docs/*.md show is
run here, or checked against the test that runs it.

The convention (docs/architecture.md, "Docs that cannot drift"):

- A ```console block holds `$ command` lines, each followed by the output it gives. Its commands are run
  here, in order, from one temporary folder holding links to the repository's examples/ and configs/,
  with PYTHONPATH at the repository, stdout and stderr merged, 120 s at most each. In the output shown,
  `...` stands for any text within a line, a line of `...` alone for any number of lines, and a run of
  spaces for any run of spaces.
- A block preceded by `<!-- tested: PATH[::TEST] "fragment" ... -->` is not run here (it needs GPUs,
  a second machine, a scheduler): PATH must exist and define TEST, and every fragment must be in both
  the block and PATH.
- Any other shell block (```sh, ```bash) may hold only `pip install` lines: each extra it names
  (`'.[torch]'`) must be one of setup.cfg.
- A ```yaml block parses; one whose first line is `# configs/NAME.yaml` shows that file's settings.
- A ```python block compiles.
- A block of output alone (``` or ```text) needs a `tested:` marker.
"""

import configparser
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from launcher.host import preflight

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELLS = {"sh", "bash", "shell"}
OUTPUT = {"", "text"}
COMMAND_TIMEOUT = 120
MARKER = re.compile(r"<!--\s*tested:\s*(\S+?)(?:::(\w+))?((?:\s+\"[^\"]+\")+)\s*-->")
# Pages that other branches of this step add (the integrator drops a name here once its page exists).
PAGES_OF_OTHER_BRANCHES = set()
HISTORY = ("before the spares", "this session", "came later", "development machine", "an earlier ")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    markers: tuple  # the `tested:` comments right above the fence

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def markers_above(lines: list) -> tuple:
    """The `tested:` lines right above a fence (blank lines between them aside), top first."""
    found = []
    for line in reversed(lines):
        if MARKER.search(line):
            found.insert(0, line.strip())
        elif line.strip():
            break
    return tuple(found)


def blocks_of(page: Path) -> list:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, start = len(fence.group(1)), i
        i += 1
        body = []
        while not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:])
            i += 1
        found.append(Block(page, start + 1, fence.group(2), "\n".join(body), markers_above(lines[:start])))
        i += 1
    return found


BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def of_kind(*kinds, marked=None):
    chosen = [b for b in BLOCKS if b.lang in kinds and (marked is None or bool(b.markers) == marked)]
    return pytest.mark.parametrize("block", chosen, ids=[b.name for b in chosen])


# ---------------------------------------------------------------- console blocks, run


def commands_of(text: str) -> list:
    """[(command, expected output lines)] of a console block; a command may go on after a trailing `\\`."""
    steps = []
    lines = text.splitlines()
    while lines:
        line = lines.pop(0)
        assert line.startswith("$ "), f"a console block starts with a `$ ` line, not {line!r}"
        command = line[2:]
        while command.endswith("\\"):
            command = command[:-1] + " " + lines.pop(0).strip()
        output = []
        while lines and not lines[0].startswith("$ "):
            output.append(lines.pop(0))
        steps.append((command, output))
    return steps


def pattern_of(expected: list) -> re.Pattern:
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = [r"[ \t]+".join(re.escape(word) for word in re.split(r"\s+", piece)) for piece in line.rstrip().split("...")]
        parts.append(".*?".join(pieces) + r"[ \t]*\n")
    return re.compile("".join(parts))


def matches(expected: list, output: str) -> bool:
    return pattern_of(expected).fullmatch(output if output.endswith("\n") or not output else output + "\n") is not None


def test_the_output_pattern_means_what_the_convention_says():
    assert matches(["a ... c", "...", "end"], "a b b c\nx\ny\nend\n")
    assert matches(["port 127.0.0.1:...  cpu"], "port 127.0.0.1:8080     cpu\n")
    assert matches([], "")
    assert not matches(["a"], "a\nb\n")
    assert not matches(["a ... c"], "a b\n")
    assert not matches(["a b"], "a\nb\n")


@of_kind("console", marked=False)
def test_console_block_gives_the_output_shown(block, tmp_path):
    if preflight.count_gpus():
        pytest.skip("the docs' console blocks show a machine without GPU")
    for name in ("examples", "configs"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    for command, expected in commands_of(block.text):
        run = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT)
        assert matches(expected, run.stdout), f"{block.name}: `{command}` gave\n{run.stdout}"


# ---------------------------------------------------------------- blocks run elsewhere: the marker


def test_every_block_that_needs_it_has_a_marker():
    unmarked = [b.name for b in BLOCKS if not b.markers and (b.lang in OUTPUT or (b.lang in SHELLS and not only_pip(b.text)))]
    assert not unmarked, f"blocks of output or commands without a `tested:` marker: {unmarked}"


MARKED = [(b, marker) for b in BLOCKS for marker in b.markers]


@pytest.mark.parametrize("block,marker", MARKED, ids=[f"{b.name}#{b.markers.index(m) + 1}" for b, m in MARKED])
def test_a_marked_block_names_a_test_that_runs_it(block, marker):
    m = MARKER.search(marker)
    path, test, fragments = REPO / m.group(1), m.group(2), re.findall(r"\"([^\"]+)\"", m.group(3))
    assert path.is_file(), f"{block.name}: {m.group(1)} does not exist"
    source = path.read_text()
    if test:
        assert re.search(rf"^\s*def {test}\(", source, re.M), f"{block.name}: {m.group(1)} has no test {test}"
    for fragment in fragments:
        assert fragment in block.text, f"{block.name}: the block does not show {fragment!r}"
        assert fragment in source, f"{block.name}: {m.group(1)} does not hold {fragment!r}"


# ---------------------------------------------------------------- install lines, config files, Python


def only_pip(text: str) -> bool:
    lines = [ln.split("#")[0].strip() for ln in text.splitlines()]
    return all(not ln or ln.startswith("pip install ") for ln in lines)


def extras_named(text: str) -> set:
    return {extra for line in text.splitlines() if line.strip().startswith("pip install")
            for word in shlex.split(line.split("#")[0]) for extra in re.findall(r"^\.\[(\w+)\]$", word)}


@of_kind(*SHELLS, marked=False)
def test_install_lines_name_extras_that_exist(block):
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert extras_named(block.text) <= set(cfg["options.extras_require"]), block.name


@of_kind("yaml")
def test_yaml_block_parses_and_shows_its_config_file(block):
    shown = [*yaml.safe_load_all(block.text)]
    shown = shown[0] if len(shown) == 1 else shown  # a manifest may hold several documents (docs/kubernetes.md)
    first = block.text.splitlines()[0]
    named = re.match(r"#\s*(configs/\S+\.yaml)", first)
    if named:
        assert shown == yaml.safe_load((REPO / named.group(1)).read_text()), f"{block.name} differs from {named.group(1)}"


@of_kind("python")
def test_python_block_compiles(block):
    compile(block.text, block.name, "exec")


# ---------------------------------------------------------------- the pages themselves


def anchors_of(page: Path) -> set:
    heads = re.findall(r"^#+\s+(.*)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_links_between_the_pages_lead_somewhere(page):
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]+))?\)", page.read_text()):
        path = (page.parent / target).resolve() if target else page
        where = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        if where in PAGES_OF_OTHER_BRANCHES:
            continue
        assert path.exists(), f"{page.name}: a link to {target}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in anchors_of(path), f"{page.name}: a link to {target}#{anchor}, no such heading"


@pytest.mark.parametrize("page", ["docs/options.md", "docs/paddle.md"])
def test_every_option_in_a_reference_table_is_one_the_launcher_takes(page):
    shown = subprocess.run([sys.executable, "-m", "launcher", "--help"], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=COMMAND_TIMEOUT).stdout
    taken = set(re.findall(r"--[\w-]+|-\w\b", shown))
    rows = [line.split("|")[1] for line in (REPO / page).read_text().splitlines() if line.startswith("| `-")]
    named = {option for cell in rows for option in re.findall(r"`(--?[\w-]+)`", cell)}
    assert named, page
    assert not {o for o in named if o not in taken and o.replace("_", "-") not in taken}, page


def test_the_readme_is_read_in_minutes():
    assert len((REPO / "README.md").read_text().splitlines()) <= 450


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_user_docs_tell_no_development_history(page):
    text = page.read_text().lower()
    assert not [h for h in HISTORY if h in text], page.name
