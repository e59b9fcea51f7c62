"""examples/train_ctr_ps.py is examples/train_ctr_single.py with only the lines marked "# PS" changed."""

import ast
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def unmarked(name):
    """The file's code lines (no docstring, no blank lines, indentation dropped) that carry no "# PS" mark."""
    text = (EXAMPLES / name).read_text()
    doc = ast.get_docstring(ast.parse(text), clean=False)
    text = text.replace(f'"""{doc}"""', "", 1)
    return [line.strip() for line in text.splitlines() if line.strip() and "# PS" not in line and not line.startswith("#")]


def test_the_parameter_server_example_differs_from_the_single_one_only_in_marked_lines():
    assert unmarked("train_ctr_ps.py") == unmarked("train_ctr_single.py")


def test_the_parameter_server_example_uses_a_sparse_table():
    assert "nn.Embedding(VOCAB, DIM, sparse=True)" in (EXAMPLES / "train_ctr_ps.py").read_text()
