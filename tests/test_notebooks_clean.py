"""The notebooks are committed without outputs (the test command executes them; see .ci/test)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_is_one_notebook_per_seed_tutorial():
    # 00-04: one per tutorial; 05: training from scratch (the training sections of two of them)
    assert len(NOTEBOOKS) == 6, [p.name for p in NOTEBOOKS]
    assert [p.name[:2] for p in NOTEBOOKS] == ["00", "01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "a notebook without code"
    assert all(c.get("outputs") == [] and c.get("execution_count") is None for c in code)
