"""The README's quick start, as written: the example job on this machine's defaults (tests/test_docs.py runs it too)."""

from conftest import run_launcher


def test_quick_start_example_runs_as_the_readme_says(tmp_path):
    r = run_launcher("--log_dir", tmp_path, "examples/hello_allreduce.py", timeout=120)
    assert r.returncode == 0, r.stderr
    # no GPU here: 2 CPU workers with gloo, rank 0 echoed on the console
    assert "rank 0 of 2 (gloo on cpu): all_reduce sum = 3, expected 3" in r.stdout
    assert "rank 1 of 2 (gloo on cpu): all_reduce sum = 3, expected 3" in (tmp_path / "workerlog.1").read_text()
