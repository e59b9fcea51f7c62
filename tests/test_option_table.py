"""The one table of options (launcher.cli.table): the click options, --help, the PET_* variables, the config file's
keys and the option tables of the docs all come from it, or are checked against it here."""

import pathlib
import re

import pytest
from click.testing import CliRunner

from launcher.cli import table
from launcher.cli.config_file import LIST_KEYS
from launcher.cli.main import launch

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
HELP = CliRunner().invoke(launch, ["--help"], terminal_width=200).output


def doc_table_lines(name: str) -> list:
    return [line for line in (DOCS / name).read_text().splitlines() if line.startswith("| ")]


def documented_options(name: str) -> set:
    """Every --option named in the first column of a table of that doc."""
    return {m for line in doc_table_lines(name) for m in re.findall(r"--[a-z][a-z0-9_-]*", line.split(" | ")[0])}


def test_every_click_option_of_the_launch_command_is_a_row():
    params = {p.name for p in launch.params} - {"training_script", "training_script_args", "version", "help"}
    assert params == set(table.ROW)
    spelled = {s for p in launch.params for s in getattr(p, "opts", ())}
    assert {s for r in table.ROWS for s in r.spellings} <= spelled


def test_each_row_is_well_formed():
    for row in table.ROWS:
        assert row.group in table.GROUPS, row.name
        assert row.status in (table.OURS, table.ALIAS, table.HONOURED, table.NO_EFFECT, table.REFUSED), row.name
        assert (row.status == table.ALIAS) == (row.maps_to is not None), row.name
        assert row.maps_to is None or table.ROW[row.maps_to].status != table.ALIAS, row.name  # the option, no alias
        assert (row.status in (table.REFUSED, table.NO_EFFECT)) == (row.reason is not None), row.name
        assert row.help.strip() and row.help.rstrip().endswith("."), row.name


def test_help_groups_the_options_by_what_they_are_for_and_shows_every_row_not_hidden():
    headings = [line[:-1] for line in HELP.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert headings == [*table.GROUPS, "Other"]
    for row in table.ROWS:
        if not row.click.get("hidden"):
            section = HELP.split(f"\n{row.group}:\n", 1)[1].split("\n\n", 1)[0]
            assert f"{row.shown[0]} " in section or f"{row.shown[0]}," in section, row.name
    for row in table.rows(status=table.NO_EFFECT, dialect=table.TORCHRUN):
        assert "no effect" in row.help, row.name  # an option accepted with no effect says so


def test_the_most_used_options_come_first():
    first = [line.split(",")[0].strip() for line in HELP.split("\nThe job:\n")[1].splitlines()[:3]]
    assert first[0].startswith("--nproc_per_node")


def test_config_lists_come_from_the_table():
    assert set(LIST_KEYS) == {r.name for r in table.ROWS if r.listed}


def test_docs_options_lists_every_option_of_ours_and_no_other():
    ours = {r.spellings[0] for r in table.rows(status=table.OURS) if table.PADDLE18 in r.dialects}
    documented = documented_options("options.md")
    assert ours - documented == set()
    known = {s for r in table.ROWS for s in r.spellings} | {"--version", "--help"}
    assert documented - known == set()


def test_docs_torchrun_lists_every_torchrun_option_with_its_status():
    lines = doc_table_lines("torchrun.md")
    for row in table.rows(dialect=table.TORCHRUN):
        dashed = "--" + row.name.replace("_", "-")
        line = next((line for line in lines if re.search(rf"[`/]{re.escape(dashed)}[` /\\]", line.split(" | ")[0])), None)
        assert line is not None, f"docs/torchrun.md has no row for {dashed}"
        if row.status == table.NO_EFFECT:
            assert "no effect" in line, dashed
        if row.status == table.REFUSED:
            assert "refused" in line, dashed
    assert "No such option" not in (DOCS / "torchrun.md").read_text()


def test_docs_paddle_lists_every_paddle_option_and_says_which_are_refused():
    lines = doc_table_lines("paddle.md")
    for row in table.rows(dialect=table.PADDLE3) + table.rows(dialect=table.FLEETRUN):
        line = next((line for line in lines if f"`{row.spellings[0]}`" in line or f"`{row.spellings[0]} " in line), None)
        assert line is not None, f"docs/paddle.md has no row for {row.spellings[0]}"
        if row.status == table.REFUSED:
            assert "refused" in line, row.name


@pytest.mark.parametrize("row", table.rows(status=table.REFUSED), ids=lambda r: r.name)
def test_a_refused_row_says_its_reason_in_one_sentence(row):
    from launcher.cli.main import request_of
    from launcher.errors import LaunchError

    shown = row.spellings[-1] if table.TORCHRUN in row.dialects else row.spellings[0]
    with pytest.raises(LaunchError) as e:
        request_of([shown, "1", "train.py"], {})
    assert str(e.value) == f"{shown} 1 cannot be honoured: {row.reason}; drop {shown}."


def test_no_refusal_says_elastic_training_is_not_supported():
    """--master etcd://..., --elastic_server and --nnodes MIN:MAX run elastic jobs: no sentence may deny it."""
    import launcher.cli as cli_package

    for path in pathlib.Path(cli_package.__file__).parent.glob("*.py"):
        assert "elastic training (etcd) is not supported" not in path.read_text(), path
        assert "asks for elastic training" not in path.read_text(), path
    assert "elastic training" not in HELP  # the list of refused options said so


def test_the_cluster_sources_in_help_are_every_source():
    from launcher.plan.clusters.registry import SOURCES

    for name in SOURCES:
        assert name in HELP.split("--cluster_env", 1)[1].split("\n  --", 1)[0]


def test_each_value_knows_where_it_came_from_and_the_command_line_wins_over_config_over_pet(tmp_path):
    from launcher.cli.main import request_of

    config = tmp_path / "job.yaml"
    config.write_text("max_restarts: 2\nlog_dir: from_config\nrole: config_role\n")
    env = {"PET_MAX_RESTARTS": "3", "PET_ROLE": "pet_role", "PET_SHUTDOWN_TIMEOUT": "5"}
    request = request_of(["--max_restarts", "1", "--config", str(config), "train.py"], env)
    opts, sources = request.options, request.sources
    assert (opts.max_restarts, opts.log_dir, opts.role, opts.shutdown_timeout) == (1, "from_config", "config_role", 5)
    assert sources["max_restarts"] == "command line"
    assert sources["log_dir"] == sources["role"] == f"config file {config}"
    assert sources["shutdown_timeout"] == "PET_SHUTDOWN_TIMEOUT"
    assert request_of(["train.py"], env).sources["max_restarts"] == "PET_MAX_RESTARTS"
    assert sources["heartbeat_timeout"] == "default"


def command_of_the_table():
    """The launch command made from the table as it is now (a test's rows included), as launcher.cli.main makes it."""
    import click

    from launcher.cli import options

    @click.command(cls=options.GroupedCommand)
    @options.launch_options
    @click.argument("training_script", required=False)
    @click.argument("training_script_args", nargs=-1, type=click.UNPROCESSED)
    def launch_again(**values):
        """A command of the table's options."""

    return launch_again


def with_a_row(monkeypatch, row):
    """The table with ``row`` added: ``request_of(argv, env)``, the request of a command line made from it."""
    from launcher.cli import request

    rows = (*table.ROWS, row)
    monkeypatch.setattr(table, "ROWS", rows)
    monkeypatch.setattr(table, "ROW", {r.name: r for r in rows})
    command = command_of_the_table()

    def request_of(argv, env=None):
        with command.make_context("launcher", [*argv, "train.py"]) as ctx:
            return request.resolve(ctx, dict(ctx.params), env or {})

    return request_of


@pytest.mark.parametrize("dialect", [table.PADDLE18, table.TORCHRUN, table.PADDLE3, table.FLEETRUN])
@pytest.mark.parametrize("maps_to, value, arrived", [
    ("job_id", "j7", lambda request: request.options.job_id),  # one of ours
    ("rdzv_id", "j7", lambda request: request.options.job_id),  # torchrun's, turned into ours
    ("log_dir", "logs", lambda request: request.options.log_dir),  # ours, and torchrun's spelling too
    ("master", "127.0.0.1:8090", lambda request: str(request.options.control_port)),  # Paddle's, mapped onto ours
])
def test_an_alias_row_of_any_dialect_gives_its_value_to_the_option_it_names(monkeypatch, dialect, maps_to, value,
                                                                           arrived):
    row = table.Row("new_spelling", table.JOB, "A new spelling.", (dialect,), table.ALIAS, maps_to=maps_to,
                    click={"metavar": "V"})
    request_of = with_a_row(monkeypatch, row)
    for spelling in row.spellings:
        assert arrived(request_of([spelling, value])) == value.rpartition(":")[2], spelling


def test_an_alias_row_given_beside_the_option_it_names_must_agree(monkeypatch):
    from launcher.errors import LaunchError

    row = table.Row("new_spelling", table.JOB, "A new spelling.", (table.TORCHRUN,), table.ALIAS, maps_to="job_id",
                    pet=True, click={"metavar": "V"})
    request_of = with_a_row(monkeypatch, row)
    assert request_of(["--new-spelling", "a", "--job_id", "a"]).options.job_id == "a"
    with pytest.raises(LaunchError) as refusal:
        request_of(["--new-spelling", "a", "--job_id", "b"])
    assert str(refusal.value) == "--new-spelling a disagrees with --job_id b, which is the same option; give one of them."
    with pytest.raises(LaunchError) as refusal:
        request_of(["--job_id", "b"], {"PET_NEW_SPELLING": "a"})
    assert str(refusal.value) == "PET_NEW_SPELLING a disagrees with --job_id b, which is the same option; give one of them."


def test_two_aliases_of_one_option_must_agree_too():
    from launcher.cli.main import request_of
    from launcher.errors import LaunchError

    assert request_of(["--host", "127.0.0.2", "--local-addr", "127.0.0.2", "train.py"], {}).options.node_ip == "127.0.0.2"
    with pytest.raises(LaunchError) as refusal:
        request_of(["--host", "127.0.0.1", "--local-addr", "127.0.0.2", "train.py"], {})
    assert str(refusal.value) == ("--host 127.0.0.1 disagrees with --local-addr 127.0.0.2, which is the same option; "
                                  "give one of them.")


def test_no_module_of_the_command_line_lists_option_names_by_hand():
    """A tuple, list or set of two or more row names written out is a list the table should say (a tag, a field)."""
    import ast

    import launcher.cli as cli_package

    found = []
    for path in sorted(pathlib.Path(cli_package.__file__).parent.glob("*.py")):
        if path.name == "table.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in table.ROW]
                if len(names) > 1:
                    found.append(f"{path.name}:{node.lineno}: {names}")
    assert not found, found
