"""transformer_core.masks against torch: the tutorial's create_causal_mask, torch.tril, torch's
CausalBias (upper-left / lower-right), nn.MultiheadAttention's key_padding_mask / attn_mask and
F.scaled_dot_product_attention with the converted masks."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformer_core._validation as tcv
import transformer_core.functional as tcf
import transformer_core.nn as tcnn
from conftest import DTYPE_IDS, FLOAT_DTYPES, TORCH_DTYPE, assert_close, module_state_to_numpy, randn, to_torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left
from transformer_core import masks as M


def seed_create_causal_mask(seq_len):
    """The overview tutorial's code."""
    mask = torch.triu(torch.ones(seq_len, seq_len), diagonal=1)
    return mask == 0


SEED_PRINTED_4x4 = np.array([[True, False, False, False],
                             [True, True, False, False],
                             [True, True, True, False],
                             [True, True, True, True]])


# --------------------------------------------------------------------------------------------------
# causal_mask
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [1, 2, 4, 7, 64, 65])
def test_causal_mask_square_matches_seed_and_tril(L):
    m = M.causal_mask(L)
    assert m.dtype == np.bool_ and m.shape == (L, L)
    assert np.array_equal(m, seed_create_causal_mask(L).numpy())
    assert np.array_equal(m, (torch.tril(torch.ones(L, L)) == 1).numpy())
    assert np.array_equal(m, M.causal_mask(L, L, alignment="bottom_right"))


def test_causal_mask_seed_printout():
    assert np.array_equal(M.causal_mask(4), SEED_PRINTED_4x4)


@pytest.mark.filterwarnings("ignore:Lower right causal bias")
@pytest.mark.parametrize("L, S", [(1, 1), (1, 5), (3, 5), (5, 3), (7, 9), (9, 7), (4, 4)])
def test_causal_mask_alignments_match_torch_causal_bias(L, S):
    top_left = M.causal_mask(L, S, alignment="top_left")
    bottom_right = M.causal_mask(L, S, alignment="bottom_right")
    assert top_left.shape == bottom_right.shape == (L, S)
    assert np.array_equal(top_left, causal_upper_left(L, S)._materialize().numpy())
    assert np.array_equal(bottom_right, causal_lower_right(L, S)._materialize().numpy())
    ones = torch.ones(L, S)
    assert np.array_equal(top_left, (torch.tril(ones) == 1).numpy())
    assert np.array_equal(bottom_right, (torch.tril(ones, diagonal=S - L) == 1).numpy())


@pytest.mark.filterwarnings("ignore:Lower right causal bias")
@pytest.mark.parametrize("L, S", [(1, 1), (1, 5), (3, 5), (5, 3), (4, 4)])
def test_causal_mask_takes_torchs_alignment_names(L, S):
    """torch's names of the two alignments (``CausalVariant.UPPER_LEFT`` / ``LOWER_RIGHT``:
    ``causal_upper_left`` / ``causal_lower_right``) were a ValueError ("lower_right"); they are
    taken as top_left / bottom_right and give torch's masks."""
    from torch.nn.attention.bias import CausalVariant

    for name, bias, ours in (("upper_left", causal_upper_left, "top_left"),
                             ("lower_right", causal_lower_right, "bottom_right")):
        assert bias(L, S).variant is CausalVariant[name.upper()]
        m = M.causal_mask(L, S, alignment=name)
        assert m.dtype == np.bool_ and m.shape == (L, S)
        np.testing.assert_array_equal(m, bias(L, S)._materialize().numpy())
        np.testing.assert_array_equal(m, M.causal_mask(L, S, ours))


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("L, S", [(1, 1), (1, 40), (40, 1), (2, 3), (32, 33), (33, 34), (34, 35), (40, 100),
                                  (100, 40), (33, 200), (200, 33), (65, 64), (64, 65), (300, 301), (301, 300)])
def test_causal_mask_equals_tril_for_every_way_it_is_built(L, S, alignment):
    """Every shape and alignment equals torch.tril (rows allowing no key, some keys, every key)."""
    ref = torch.tril(torch.ones(L, S, dtype=torch.bool), diagonal=0 if alignment == "top_left" else S - L)
    m = M.causal_mask(L, S, alignment)
    assert m.dtype == np.bool_ and m.flags.c_contiguous and m.flags.writeable and m.flags.owndata
    np.testing.assert_array_equal(m, ref.numpy())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("alignment, bias", [("top_left", causal_upper_left), ("bottom_right", causal_lower_right)])
@pytest.mark.parametrize("L, S", [(1, 6), (3, 7), (5, 5)])
def test_causal_mask_in_attention_equals_torch_sdpa(L, S, alignment, bias, dtype, rng):
    q, k, v = randn(rng, (2, 3, L, 8), dtype), randn(rng, (2, 3, S, 8), dtype), randn(rng, (2, 3, S, 5), dtype)
    ours = tcf.scaled_dot_product_attention(q, k, v, attn_mask=M.causal_mask(L, S, alignment))
    ref = F.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), attn_mask=bias(L, S))
    assert_close(ours, ref, dtype)
    # the float form gives the same
    additive = M.to_additive(M.causal_mask(L, S, alignment), dtype)
    assert_close(tcf.scaled_dot_product_attention(q, k, v, attn_mask=additive), ref, dtype)


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((0,), {}, ValueError, "L"),
    ((3, 0), {}, ValueError, "S"),
    ((3.0,), {}, TypeError, "L"),
    ((3,), {"alignment": "lower_left"}, ValueError,
     r"^alignment: expected one of 'top_left', 'bottom_right' \(or torch's names of the same, 'upper_left', "
     r"'lower_right'\), got 'lower_left'$"),
    ((3,), {"alignment": 1}, TypeError, r"^alignment: expected a str"),  # torch's CausalVariant is an IntEnum
])
def test_causal_mask_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        M.causal_mask(*args, **kwargs)


# --------------------------------------------------------------------------------------------------
# padding masks
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lengths, max_len", [([3, 1, 5], None), ([1], None), ([0, 2], 7), ([4, 4], 4)])
def test_padding_mask(lengths, max_len):
    m = M.padding_mask(np.array(lengths), max_len)
    width = max(lengths) if max_len is None else max_len
    ref = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    assert m.dtype == np.bool_ and np.array_equal(m, ref.numpy())
    assert np.array_equal(M.padding_mask(torch.tensor(lengths), max_len), m)


def test_padding_mask_all_empty_has_one_column():
    assert np.array_equal(M.padding_mask([0, 0]), np.zeros((2, 1), bool))


@pytest.mark.parametrize("lengths, max_len, exc, match", [
    ([1.5, 2.0], None, TypeError, "lengths"),
    ([[1, 2]], None, ValueError, "lengths"),
    ([], None, ValueError, "lengths"),
    ([-1, 2], None, ValueError, "lengths"),
    ([3, 5], 4, ValueError, "max_len"),
    ([3], 0, ValueError, "max_len"),
    (None, None, TypeError, "lengths"),
])
def test_padding_mask_bad_input(lengths, max_len, exc, match):
    with pytest.raises(exc, match=match):
        M.padding_mask(lengths, max_len)


def test_padding_mask_from_ids():
    ids = np.array([[101, 7, 102, 0, 0], [101, 8, 9, 10, 102]])
    m = M.padding_mask_from_ids(ids, 0)
    assert np.array_equal(m, (torch.from_numpy(ids) != 0).numpy())
    assert np.array_equal(M.padding_mask_from_ids([5, 5, 1], 1), np.array([[True, True, False]]))
    with pytest.raises(TypeError, match="pad_token_id"):
        M.padding_mask_from_ids(ids, 0.0)
    with pytest.raises(TypeError, match="input_ids"):
        M.padding_mask_from_ids(np.array([[0.5]]), 0)
    with pytest.raises(ValueError, match="input_ids"):
        M.padding_mask_from_ids(np.zeros((1, 2, 3), int), 0)


# --------------------------------------------------------------------------------------------------
# converters
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_from_torch_mha_key_padding_and_attn_mask(dtype, rng):
    """torch MHA (True = blocked) -> ours (True = may attend): the same outputs."""
    E, H, N, L, S = 12, 3, 2, 5, 7
    tmha = torch.nn.MultiheadAttention(E, H, batch_first=True).to(torch.float64 if dtype == np.float64 else
                                                                   torch.float32).eval()
    ours = tcnn.MultiheadAttention(E, H, dtype=dtype)
    ours.load_state_dict(module_state_to_numpy(tmha))
    q, kv = randn(rng, (N, L, E), dtype), randn(rng, (N, S, E), dtype)
    key_padding_mask = torch.tensor([[False] * 5 + [True] * 2, [False] * 7])
    attn_mask = torch.from_numpy(~M.causal_mask(L, S, "bottom_right"))  # torch: True = blocked
    with torch.no_grad():
        ref, _ = tmha(to_torch(q), to_torch(kv), to_torch(kv), key_padding_mask=key_padding_mask,
                      attn_mask=attn_mask, need_weights=False)
    # the layers' attn_mask takes float masks only: torch's bool mask -> ours -> 0 / -inf
    out, _ = ours(q, kv, kv, key_mask=M.from_torch_mha(key_padding_mask),
                  attn_mask=M.to_additive(M.from_torch_mha(attn_mask), dtype))
    assert_close(out, ref, dtype)


def test_from_torch_mha_float_is_passed_through():
    m = torch.tensor([[0.0, float("-inf")], [-0.5, 0.0]])
    out = M.from_torch_mha(m)
    assert out.dtype == np.float32 and np.array_equal(out, m.numpy())
    # float16 / float64 keep their dtype; bfloat16 (not a numpy dtype) becomes float32, values exact
    for dt, want in ((torch.float16, np.float16), (torch.float64, np.float64), (torch.bfloat16, np.float32)):
        t = torch.tensor([[0.0, -9984.0], [-0.5, float("-inf")]], dtype=dt)
        out = M.from_torch_mha(t)
        assert out.dtype == want and np.array_equal(out, t.float().numpy().astype(want))
    assert np.array_equal(M.from_torch_mha(np.array([True, False])), [False, True])
    with pytest.raises(TypeError, match="mask"):
        M.from_torch_mha(np.array([1, 0], np.uint8))
    with pytest.raises(TypeError, match="mask"):
        M.from_torch_mha(None)


@pytest.mark.parametrize("blocked", [float("-inf"), -1e4, -1e9, -1e20, float(np.finfo(np.float32).min)])
def test_from_additive_blocked_values(blocked):
    m = np.array([[0.0, blocked], [-3.5, 0.0]], np.float32)
    assert np.array_equal(M.from_additive(m), [[True, False], [True, True]])


def test_from_additive_hf_extended_mask_and_threshold():
    am = torch.tensor([[1, 1, 0], [1, 0, 0]])
    extended = (1.0 - am[:, None, None, :].float()) * torch.finfo(torch.float32).min  # HF's
    assert np.array_equal(M.from_additive(extended)[:, 0, 0], am.numpy() == 1)
    for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        bert_old = (1.0 - am.to(dt)) * -10000.0  # the original BERT's (bfloat16 rounds it to -9984)
        assert bert_old.dtype == dt and bert_old.min().item() == (-9984.0 if dt == torch.bfloat16 else -10000.0)
        assert np.array_equal(M.from_additive(bert_old), am.numpy() == 1)
        hf_min = (1.0 - am.to(dt)) * torch.finfo(dt).min  # HF's, in this dtype
        assert np.array_equal(M.from_additive(hf_min), am.numpy() == 1)
    assert np.array_equal(M.from_additive(np.array([-50.0, -200.0]), blocked_at=-100.0), [True, False])
    with pytest.raises(ValueError, match="mask"):
        M.from_additive(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="mask"):
        M.from_additive(np.array([0.0, np.inf]))
    with pytest.raises(TypeError, match="mask"):
        M.from_additive(np.array([True]))
    with pytest.raises(ValueError, match="blocked_at"):
        M.from_additive(np.array([0.0]), blocked_at=float("-inf"))


@pytest.mark.parametrize("num_heads", [1, 8, 12, 112])
def test_from_additive_keeps_alibi_biases_allowed(num_heads):
    """The default cut (-9000) lies below ALiBi's biases ``-m·|i - j|`` for keys up to 8999 positions
    away, the slopes m taken from Hugging Face's BLOOM (largest: 2^(-8/H); 0.958 for its 112 heads)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    slopes = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1]  # (H,): m · position 1
    assert 0 < slopes.max().item() < 1
    distance = torch.arange(9000, dtype=torch.float32)
    for dt in (torch.float32, torch.bfloat16):
        alibi = (-slopes[:, None] * distance).to(dt)  # (H, S): one query's biases to keys 0..8999 away
        assert M.from_additive(alibi).all()
    assert M.ADDITIVE_BLOCKED_AT == -9000.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_to_additive_and_back(dtype, rng):
    m = rng.random((3, 4, 5)) > 0.4
    add = M.to_additive(m, dtype)
    assert add.dtype == np.dtype(dtype)
    assert np.array_equal(add == 0, m) and np.all(np.isneginf(add[~m]))
    assert np.array_equal(M.from_additive(add), m)
    # used in torch SDPA, the float mask equals the bool one
    q, k, v = (to_torch(randn(rng, (3, n, 6), dtype)) for n in (4, 5, 5))  # mask (N, L, S)
    m[..., 0] = True  # no fully masked rows (torch would give NaN)
    ref_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(m))
    ref_add = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(M.to_additive(m, dtype)))
    assert_close(ref_add.numpy(), ref_bool, dtype)
    with pytest.raises(TypeError, match="mask"):
        M.to_additive(np.array([1, 0]))
    with pytest.raises(TypeError, match="dtype"):
        M.to_additive(np.array([True]), np.int32)


def test_from_hf():
    am = np.array([[1, 1, 0], [1, 0, 0]])
    assert np.array_equal(M.from_hf(am), am == 1)
    assert np.array_equal(M.from_hf(torch.from_numpy(am).float()), am == 1)
    assert np.array_equal(M.from_hf(am.astype(bool)), am == 1)
    with pytest.raises(ValueError, match="mask: expected only 0"):
        M.from_hf(np.array([[0.0, -1e9]]))
    with pytest.raises(TypeError, match="mask"):
        M.from_hf(np.array(["1"]))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_hf_mask_in_our_mha_equals_torch(dtype, rng):
    """A Hugging Face attention_mask -> key_mask in our MHA == torch MHA with ~mask as padding."""
    E, H = 8, 2
    tmha = torch.nn.MultiheadAttention(E, H, batch_first=True).to(torch.float64 if dtype == np.float64 else
                                                                   torch.float32).eval()
    ours = tcnn.MultiheadAttention(E, H, dtype=dtype)
    ours.load_state_dict(module_state_to_numpy(tmha))
    x = randn(rng, (3, 6, E), dtype)
    am = M.padding_mask([6, 1, 4]).astype(np.int64)
    with torch.no_grad():
        ref, _ = tmha(to_torch(x), to_torch(x), to_torch(x), key_padding_mask=torch.from_numpy(am == 0),
                      need_weights=False)
    out, _ = ours(x, key_mask=M.from_hf(am))
    assert_close(out, ref, dtype)


# --------------------------------------------------------------------------------------------------
# memory: the converters on broadcast views, nn.Transformer.generate_square_subsequent_mask
# --------------------------------------------------------------------------------------------------


def _traced_peak(f, *args):
    """``f(*args)`` and the peak bytes numpy allocated meanwhile (numpy reports to tracemalloc)."""
    tracemalloc.start()
    try:
        out = f(*args)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


HUGE = (10**6, 10**6)  # a broadcast view of it holds one value; any full-size array is > 900 GB


@pytest.mark.parametrize("convert, mask", [
    (M.to_additive, np.broadcast_to(True, HUGE)),
    (lambda m: M.to_additive(m, np.float64), np.broadcast_to(True, HUGE)),
    (M.from_torch_mha, np.broadcast_to(True, HUGE)),
    (M.from_torch_mha, np.broadcast_to(np.float32(0), HUGE)),
    (M.from_torch_mha, torch.zeros(1, dtype=torch.bool).expand(*HUGE)),
    (M.from_additive, np.broadcast_to(np.float32(0), HUGE)),
    (M.from_hf, np.broadcast_to(np.int64(1), HUGE)),
    (M.from_hf, np.broadcast_to(np.float32(1), HUGE)),
    (M.from_hf, np.broadcast_to(True, HUGE)),
], ids=["to_additive", "to_additive-f64", "from_torch_mha-bool", "from_torch_mha-float", "from_torch_mha-torch",
        "from_additive", "from_hf-int", "from_hf-float", "from_hf-bool"])
def test_converters_refuse_a_huge_broadcast_view_before_allocating(convert, mask):
    """A broadcast view of a huge shape: a ValueError naming mask, before any allocation (numpy
    raised MemoryError from the first full-size temporary)."""
    with pytest.raises(ValueError, match=r"^mask \(.*\): an array of shape \(1000000, 1000000\) needs \d+ bytes, "
                                         r"more than this machine's memory"):
        convert(mask)


def _torch_to_additive(m, dtype):
    return torch.zeros(m.shape, dtype=TORCH_DTYPE[np.dtype(dtype)]).masked_fill(~m, float("-inf"))


# (our converter, the row broadcast to (1000, 1000), torch's conversion, bytes per mask entry the
# converter allocates at its peak: its result, plus one bool array for from_hf's check)
_ROW = np.arange(1000)
PEAK_CASES = {
    "to_additive": (M.to_additive, _ROW % 3 > 0, lambda t: _torch_to_additive(t, np.float32), 4),
    "to_additive-f64": (lambda m: M.to_additive(m, np.float64), _ROW % 3 > 0,
                        lambda t: _torch_to_additive(t, np.float64), 8),
    "from_torch_mha-bool": (M.from_torch_mha, _ROW % 3 > 0, lambda t: ~t, 1),
    "from_torch_mha-float": (M.from_torch_mha, np.where(_ROW % 3 > 0, 0, -np.inf).astype(np.float32), lambda t: t, 4),
    "from_additive": (M.from_additive, np.array([0.0, -np.inf, -1e9, -3.5], np.float32)[_ROW % 4],
                      lambda t: t > -1e4, 1),
    "from_hf": (M.from_hf, (_ROW % 3 > 0).astype(np.int64), lambda t: t == 1, 2),
    "from_hf-bool": (M.from_hf, _ROW % 3 > 0, lambda t: t.clone(), 1),
}


@pytest.mark.parametrize("case", list(PEAK_CASES))
def test_converters_memory_check_counts_their_real_peak(case, monkeypatch):
    """The check counts every full-size array a converter makes, and it makes no other: numpy's
    traced peak stays within the count (from_additive's NaN / +inf check made 3 bool arrays of the
    mask's size, from_hf's made 3), and a machine of one byte less refuses the mask."""
    convert, row, torch_convert, per_entry = PEAK_CASES[case]
    mask = np.broadcast_to(row, (1000, 1000))
    need = mask.size * per_entry
    out, peak = _traced_peak(convert, mask)
    np.testing.assert_array_equal(out, torch_convert(torch.from_numpy(mask.copy())).numpy())
    assert peak <= 1.1 * need, f"peak {peak} bytes, {peak / need:.2f} x the {need} the check counts"
    monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: need - 1)
    with pytest.raises(ValueError, match=rf"^mask \(.*\): an array of shape \(1000, 1000\) needs {need} bytes"):
        convert(mask)
    monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: need)
    np.testing.assert_array_equal(convert(mask), out)


def test_from_hf_names_the_smallest_bad_values_without_copying_them():
    """The 5 smallest distinct values other than 0 and 1, as np.unique(mask[bad])[:5] gives them,
    read in blocks: with nearly every entry bad, no copy of the mask's size is made for the message."""
    mask = np.random.default_rng(0).integers(2, 10**6, (600, 1000)).astype(np.float32)
    mask[-1, -1] = -7.0  # the smallest, in the last block
    mask[0, :4] = [0.0, 1.0, np.nan, 0.5]
    bad = (mask != 0) & (mask != 1)
    want = np.unique(mask[bad])[:5].tolist()
    assert want[:2] == [-7.0, 0.5]
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"^mask: expected only 0 \(padding\) and 1 \(real token\)") as info:
            M.from_hf(mask)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.args[0].endswith(f"got values such as {want}")
    assert peak <= 2 * mask.size + 2**21, f"peak {peak} bytes for a mask of {mask.size} entries"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("sz", [0, 1, 2, 5, 64])
def test_generate_square_subsequent_mask_equals_torch(sz, dtype):
    ours = tcnn.Transformer.generate_square_subsequent_mask(sz, dtype)
    ref = torch.nn.Transformer.generate_square_subsequent_mask(sz, dtype=TORCH_DTYPE[np.dtype(dtype)]).numpy()
    assert ours.dtype == np.dtype(dtype) and ours.shape == (sz, sz) and ours.flags.c_contiguous
    np.testing.assert_array_equal(ours, ref)
    assert np.array_equal(np.signbit(ours), np.signbit(ref))  # +0 below the diagonal, as torch's


def test_generate_square_subsequent_mask_allocates_only_what_is_checked(monkeypatch):
    """The check counts sz² values; the mask was built as np.full + np.triu's bool mask + the result
    (2.25 x that, float32). Now the result is the only allocation, and the check is exact."""
    sz = 1000
    out, peak = _traced_peak(tcnn.Transformer.generate_square_subsequent_mask, sz)
    np.testing.assert_array_equal(out, torch.nn.Transformer.generate_square_subsequent_mask(sz).numpy())
    assert peak <= 1.1 * out.nbytes, f"peak {peak} bytes for a {out.nbytes}-byte mask"
    monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: out.nbytes - 1)
    with pytest.raises(ValueError, match=rf"^sz: an array of shape \(1000, 1000\) needs {out.nbytes} bytes"):
        tcnn.Transformer.generate_square_subsequent_mask(sz)
    monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: out.nbytes)
    np.testing.assert_array_equal(tcnn.Transformer.generate_square_subsequent_mask(sz), out)


@pytest.mark.parametrize("L, S, alignment", [
    (1, 10**6, "top_left"), (10**6, 1, "top_left"), (4, 250_000, "bottom_right"), (250_000, 4, "top_left"),
    (1000, 1000, "top_left"), (1000, 3000, "bottom_right"),
])
def test_causal_mask_allocates_only_what_is_checked(L, S, alignment, monkeypatch):
    """The check counted the (L, S) mask only, but np.tri builds it from two int64 index vectors of
    L and S values: 5 x the mask at L = 1 (and causal_mask(1, 2**32) was numpy's MemoryError for
    32 GiB). Now the check counts them too: numpy's traced peak is at most what it counts, and a
    machine of one byte less refuses it, naming L and S."""
    d = 0 if alignment == "top_left" else S - L
    need = L * S + 8 * (L + S)
    out, peak = _traced_peak(M.causal_mask, L, S, alignment)
    np.testing.assert_array_equal(out, torch.tril(torch.ones(L, S, dtype=torch.bool), diagonal=d).numpy())
    assert peak <= 1.1 * need, f"peak {peak} bytes, {peak / need:.2f} x the {need} the check counts"
    monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: need - 1)
    with pytest.raises(ValueError, match=rf"^L, S: the \({L}, {S}\) mask and np.tri's int64 index vectors of L "
                                         rf"and S values: an array of shape \(.*\) needs {need} bytes"):
        M.causal_mask(L, S, alignment)
    monkeypatch.setattr(tcv, "physical_memory_bytes", lambda: need)
    np.testing.assert_array_equal(M.causal_mask(L, S, alignment), out)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_float_token_masks_are_refused_in_their_own_words(rng, dtype):
    """A float query_mask's TypeError spoke of torch's additive key_padding_mask, which has nothing
    to do with queries: it now names query_mask's own ambiguity; a float key_mask's still points at
    key_padding_mask. The bool and 0/1 integer forms give torch's values (its bool attn_mask)."""
    q = randn(rng, (1, 2, 3, 4), dtype)
    with pytest.raises(TypeError) as raised:
        tcf.scaled_dot_product_attention(q, q, q, query_mask=np.ones(3, dtype))
    message = str(raised.value)
    assert message == (f"query_mask: expected bool or integer 0/1 (True/1 = a real token), got {np.dtype(dtype)} — "
                       f"a float query_mask could be additive (0 = keep) or 1/0 (1 = keep); pass a bool mask")
    with pytest.raises(TypeError, match=rf"^key_mask: expected bool or integer 0/1 .*got {np.dtype(dtype)} — a float "
                                        r"key mask looks like torch's additive key_padding_mask \(0 = keep\)"):
        tcf.scaled_dot_product_attention(q, q, q, key_mask=np.ones(3, dtype))
    keep = np.array([True, False, True])
    qt = to_torch(q)
    expected_q = F.scaled_dot_product_attention(qt, qt, qt, attn_mask=to_torch(keep[:, None])).numpy()
    expected_q[..., ~keep, :] = 0  # a masked query row gives zeros here (torch: NaN)
    expected_k = F.scaled_dot_product_attention(qt, qt, qt, attn_mask=to_torch(keep[None, :]))
    for mask in (keep, keep.astype(np.int64)):
        assert_close(tcf.scaled_dot_product_attention(q, q, q, query_mask=mask), expected_q, dtype)
        assert_close(tcf.scaled_dot_product_attention(q, q, q, key_mask=mask), expected_k, dtype)


def test_attn_mask_with_is_causal_as_the_docstring_says_of_torch(rng):
    """The docstring of scaled_dot_product_attention says where torch 2.13's CPU SDPA combines
    attn_mask and is_causal: only 4-D inputs with Ev == E (its CPU flash kernel), by logical AND,
    as here; it raises for Ev != E, for 3-D inputs and with the math backend forced. Checked here,
    so that the docstring is revisited if torch changes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k = randn(rng, (2, 3, 5, 8), np.float64), randn(rng, (2, 3, 6, 8), np.float64)
    mask = rng.random((5, 6)) > 0.3
    mask[:, 0] = True
    expected = F.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(k), attn_mask=to_torch(mask),
                                              is_causal=True)
    ours = tcf.scaled_dot_product_attention(q, k, k, mask, is_causal=True)
    assert_close(ours, expected, np.float64)
    assert_close(ours, tcf.scaled_dot_product_attention(q, k, k, mask & M.causal_mask(5, 6)), np.float64)
    refused = "Explicit attn_mask should not be set when is_causal=True"
    v6 = to_torch(randn(rng, (2, 3, 6, 6), np.float64))
    with pytest.raises(RuntimeError, match=refused):  # Ev != E
        F.scaled_dot_product_attention(to_torch(q), to_torch(k), v6, attn_mask=to_torch(mask), is_causal=True)
    with pytest.raises(RuntimeError, match=refused):  # 3-D
        F.scaled_dot_product_attention(to_torch(q[0]), to_torch(k[0]), to_torch(k[0]), attn_mask=to_torch(mask),
                                       is_causal=True)
    with sdpa_kernel(SDPBackend.MATH), pytest.raises(RuntimeError, match=refused):
        F.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(k), attn_mask=to_torch(mask), is_causal=True)
    # ours combines them in every case
    out = tcf.scaled_dot_product_attention(q, k, v6.numpy(), mask, is_causal=True)
    assert_close(out, tcf.scaled_dot_product_attention(q, k, v6.numpy(), mask & M.causal_mask(5, 6)), np.float64)
