"""`python -m transformer_core embed ...` run through subprocess with sys.executable."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import transformer_core as tc
from conftest import MODEL_NAME

PAIR = ["A man is playing a guitar.", "The stock market crashed today."]
FILE_SENTENCES = ["The cat sat on the mat.", "A feline rested on the rug.", "Interest rates rose."]


def run_cli(*args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "transformer_core", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def encoder():
    return tc.SentenceEncoder.from_pretrained(MODEL_NAME)


def _floats(text):
    return [float(m) for m in re.findall(r"-?\d+\.\d+(?:[eE][-+]?\d+)?", text)]


def test_cli_embed_text_output(encoder):
    out = run_cli("embed", *PAIR)
    assert re.search(r"\(\s*2\s*,\s*384\s*\)", out), out
    emb = encoder.encode(PAIR)
    sim = emb @ emb.T
    nums = _floats(out)
    # the printed cosine-similarity matrix: the off-diagonal value and the diagonal ones
    assert any(abs(x - sim[0, 1]) < 5e-3 for x in nums), (sim[0, 1], out)
    assert sum(abs(x - 1.0) < 5e-3 for x in nums) >= 2, out


def test_cli_embed_json(encoder):
    out = run_cli("embed", "--json", *PAIR)
    data = json.loads(out)
    assert list(data["shape"]) == [2, 384]
    sim = np.asarray(data["similarity"], dtype=np.float64)
    emb = encoder.encode(PAIR)
    ref = (emb @ emb.T).astype(np.float64)
    assert sim.shape == (2, 2)
    np.testing.assert_allclose(sim, ref, atol=1e-5)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)
    np.testing.assert_allclose(sim, sim.T, atol=1e-6)


def test_cli_embed_file(encoder, tmp_path):
    f = tmp_path / "sentences.txt"
    f.write_text("\n".join(FILE_SENTENCES) + "\n", encoding="utf-8")
    data = json.loads(run_cli("embed", "--json", "--file", str(f)))
    assert list(data["shape"]) == [3, 384]
    emb = encoder.encode(FILE_SENTENCES)
    np.testing.assert_allclose(np.asarray(data["similarity"]), emb @ emb.T, atol=1e-5)


def test_cli_bad_usage_fails_cleanly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "transformer_core", "embed", "--file",
                           str(tmp_path / "does_not_exist.txt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "does_not_exist.txt" in proc.stderr + proc.stdout
