"""The command lines of the tests (and one of every option's spelling, good and bad), each with the request the
launch command made of it before the one-table rewrite: its options, its elastic spec and the nodes it expects, or its
error sentence and exit code (tests/golden/command_lines.json, recorded from the code before the rewrite). The
rewrite reproduces every one, except the corrections each case names in its ``corrected`` entry (the new outcome
and why)."""

import contextlib
import dataclasses
import io
import json
import os
import pathlib
import tempfile

import click
import pytest

from launcher.cli.main import request_of
from launcher.errors import LaunchError
from launcher.plan.model import LaunchOptions

CASES = json.loads((pathlib.Path(__file__).parent / "golden" / "command_lines.json").read_text())


def expected(case) -> dict:
    return case["corrected"]["outcome"] if "corrected" in case else case["outcome"]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}:{' '.join(c['argv'])[:60]}" for i, c in enumerate(CASES)])
def test_the_command_line_gives_what_it_gave_before_the_rewrite(case, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name not in ("PATH", "HOME"):
            monkeypatch.delenv(name)
    for name, value in case["env"].items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "config.yaml"
    if case["config"] is not None:
        config.write_text(case["config"], errors="surrogateescape")
    argv = [a.replace("{config}", str(config)) for a in case["argv"]]
    got = json.loads(json.dumps(summary(argv)).replace(str(config), "{config}"))
    assert without_new_defaults(got, expected(case)) == expected(case)


def without_new_defaults(got: dict, want: dict) -> dict:
    """``got`` less the options added since the recording that are at their defaults (they ask for nothing new)."""
    if "options" not in got or "options" not in want:
        return got
    defaults = {f.name: plain(f.default) for f in dataclasses.fields(LaunchOptions)}
    options = {k: v for k, v in got["options"].items() if k in want["options"] or v != defaults.get(k)}
    return {**got, "options": options}


def summary(argv) -> dict:
    """What the request of ``argv`` is, as plain data: its options, elastic spec and nodes expected; or the error
    and exit code; or the exit and output of --help and --version."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            request = request_of(argv)
    except LaunchError as e:
        return {"error": str(e), "code": getattr(e, "exit_code", 2) or 2}
    except click.exceptions.Exit as e:
        return {"exit": e.exit_code, "stdout": out.getvalue()}
    except click.ClickException as e:
        return {"error": e.format_message(), "code": 2}
    return {"options": plain(request.options), "elastic": plain(request.elastic), "nodes": request.nodes_expected}


def plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, str) and value.startswith(os.path.join(tempfile.gettempdir(), "torchelastic_")):
        return "<torchelastic temp dir>"
    return value
