"""A config file's ``strategy:`` (launcher.plan.strategy_fields): checked by the launcher, carried to the workers in
LAUNCHER_STRATEGY, and set by fleet over the program's own strategy (launcher.fleet.strategy.set_by_launcher). The
table the launcher checks with and the dataclass fleet keeps are the same fields."""

import ast
import pathlib

import pytest

from launcher import envvars as ev
from launcher.cli.main import request_of
from launcher.errors import LaunchError
from launcher.plan import strategy_fields

STRATEGY_PY = pathlib.Path(__file__).resolve().parent.parent / "launcher" / "fleet" / "strategy.py"


def dataclass_fields(name: str) -> set:
    """The annotated fields and the properties of a class of launcher/fleet/strategy.py, read without importing
    fleet (which imports torch)."""
    tree = ast.parse(STRATEGY_PY.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)} | \
        {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)}


def test_the_table_holds_every_field_of_fleets_strategy_and_no_other():
    fields = dataclass_fields("DistributedStrategy") - {"exec_strategy"}
    assert set(strategy_fields.FIELDS) == fields


def config(tmp_path, text: str, *args):
    path = tmp_path / "tuned.yaml"
    path.write_text(text)
    return request_of(["--config", str(path), *args]).options


def test_strategy_in_a_config_reaches_the_workers_as_one_variable(tmp_path):
    opts = config(tmp_path, "strategy:\n  use_local_sgd: true\n  local_sgd_steps: 4\nenv:\n  A: '1'\n", "t.py")
    assert dict(opts.extra_env) == {"A": "1", ev.STRATEGY: '{"local_sgd_steps":4,"use_local_sgd":true}'}


@pytest.mark.parametrize("text,fragment", [
    ("strategy:\n  fuse_all_ops: true\n", "strategy: fuse_all_ops is not a field of fleet's DistributedStrategy"),
    ("strategy:\n  nccl_comm_num: 0\n", "strategy: nccl_comm_num expects a whole number of at least 1, not 0"),
    ("strategy:\n  use_local_sgd: 'yes'\n", "strategy: use_local_sgd expects true or false, not 'yes'"),
    ("strategy: [fuse_all_reduce_ops]\n", "strategy must be a mapping of DistributedStrategy fields"),
])
def test_a_bad_strategy_is_refused_naming_the_field(tmp_path, text, fragment):
    with pytest.raises(LaunchError) as e:
        config(tmp_path, text, "t.py")
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_the_files_arguments_are_used_where_the_command_line_gives_none(tmp_path):
    text = "training_script: t.py\ntraining_script_args: [--batch-size, '64']\n"
    assert config(tmp_path, text, "t.py").training_script_args == ("--batch-size", "64")
    assert config(tmp_path, text, "t.py", "--lr", "1").training_script_args == ("--lr", "1")
    assert config(tmp_path, text).training_script_args == ("--batch-size", "64")
