"""transformer_core.generation's logits processing vs Hugging Face's logits processors.

``next_tokens`` is given a stand-in generator that records the distribution it samples from; the
tokens it keeps (probability > 0) and their probabilities are compared with transformers'
``TopKLogitsWarper`` / ``TopPLogitsWarper`` / ``RepetitionPenaltyLogitsProcessor`` applied to the
same float64 scores, tied scores included: which of two equal tokens survives a cut is part of the
contract (ours: HF's top-p with a stable sort; HF calls ``torch.sort`` without ``stable=True``, which
promises no order among ties but gives the stable one on these small CPU tensors).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformer_core.generation import GenerationConfig, next_tokens

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


class _Recorder:
    """Stands in for ``np.random.Generator``: keeps each row's sampling distribution."""

    def __init__(self):
        self.probs = []

    def choice(self, n, p):
        self.probs.append(np.array(p, copy=True))
        return 0


def _ours(scores, **options) -> np.ndarray:
    rec = _Recorder()
    cfg = GenerationConfig(1, do_sample=True, **options)
    next_tokens(np.array(scores, np.float64), np.zeros((len(scores), 1), np.int64), cfg, rec)
    return np.stack(rec.probs)


def _hf(scores, top_k=None, top_p=None) -> np.ndarray:
    s = torch.tensor(np.asarray(scores, np.float64))
    if top_k is not None:
        s = TopKLogitsWarper(top_k)(None, s)
    if top_p is not None:
        s = TopPLogitsWarper(top_p)(None, s)
    return torch.softmax(s, -1).numpy()


def _check(scores, **options):
    ours, ref = _ours(scores, **options), _hf(scores, **options)
    np.testing.assert_array_equal(ours > 0, ref > 0, err_msg=f"kept tokens differ for {options}")
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("scores, top_p, kept", [
    (np.log([[0.4, 0.3, 0.3]]), 0.5, [[True, False, True]]),
    ([[0.0, -0.0]], 0.5, [[False, True]]),
    ([[1.0, 1.0, 1.0, 1.0]], 0.3, [[False, False, True, True]]),
    ([[2.0, 0.5, 2.0, 0.5, 2.0]], 0.5, [[False, False, True, False, True]]),
], ids=["0.4-0.3-0.3", "signed-zeros", "four-equal", "two-levels"])
def test_top_p_ties_broken_as_hf(scores, top_p, kept):
    """Of tokens tied at the cut, the later ones are kept: HF's TopPLogitsWarper with a stable sort
    drops from the bottom of the ascending order (of tied scores, the lower id first); ours kept
    the earlier ones."""
    probs = _ours(scores, top_p=top_p)
    np.testing.assert_array_equal(probs > 0, kept)
    _check(scores, top_p=top_p)


def test_top_p_random_ties_match_hf():
    rng = np.random.default_rng(0)
    for trial in range(300):
        V = int(rng.integers(2, 12))
        levels = rng.normal(size=int(rng.integers(1, 4)))
        scores = rng.choice(levels, size=(3, V))  # few distinct values: many ties
        top_p = float(rng.uniform(0.05, 0.99))
        _check(scores, top_p=top_p)
        _check(scores, top_k=int(rng.integers(1, V + 1)), top_p=top_p)


def test_top_k_ties_match_hf():
    """Every token tied with the k-th highest is kept, as HF's TopKLogitsWarper keeps it."""
    np.testing.assert_array_equal(_ours([[1.0, 2.0, 2.0, 0.0]], top_k=1) > 0, [[False, True, True, False]])
    rng = np.random.default_rng(1)
    for trial in range(200):
        V = int(rng.integers(1, 10))
        scores = rng.choice(rng.normal(size=3), size=(2, V))
        _check(scores, top_k=int(rng.integers(1, V + 3)))


@pytest.mark.parametrize("penalty", [0.7, 1.5])
def test_repetition_penalty_prompt_ignore_length_matches_hf(penalty):
    """``prompt_ignore_length`` (each row's left padding) is not penalized, as HF's
    RepetitionPenaltyLogitsProcessor(prompt_ignore_length=...) that generate builds from the mask;
    the greedy token and the sampling distribution both follow the penalized scores."""
    rng = np.random.default_rng(2)
    for trial in range(100):
        N, V, T = 3, int(rng.integers(2, 9)), int(rng.integers(1, 8))
        scores = rng.normal(size=(N, V)) * 3
        seqs = rng.integers(0, V, size=(N, T))
        lead = rng.integers(0, T + 1, size=N)
        ref = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=torch.from_numpy(lead))(
            torch.from_numpy(seqs), torch.from_numpy(scores.copy())).numpy()
        greedy = next_tokens(scores.copy(), seqs, GenerationConfig(1, repetition_penalty=penalty),
                             np.random.default_rng(), lead)
        np.testing.assert_array_equal(greedy, ref.argmax(-1))
        rec = _Recorder()
        next_tokens(scores.copy(), seqs, GenerationConfig(1, do_sample=True, repetition_penalty=penalty), rec, lead)
        np.testing.assert_allclose(np.stack(rec.probs), torch.softmax(torch.from_numpy(ref), -1).numpy(),
                                   rtol=1e-12, atol=1e-15)
