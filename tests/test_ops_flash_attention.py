"""The tiled (flash) attention kernel at its tile edges, its split-KV path and its determinism.

Every case runs the bound op on both paths ("flash" and "reference") and compares them with an
oracle computed here in torch (float64): the output with ``torch.nn.functional.
scaled_dot_product_attention`` and the log-sum-exp with ``torch.logsumexp`` of the masked scaled
scores. fp32 to 1e-5, fp64 to 1e-10 (absolute), and flash against reference to the same tolerance.
Rows that see no key must be exact zeros with lse = -inf (torch's SDPA gives NaN or a mean there).

The op is called through the ``_core`` binding so that its key-padding mask (``key_mask``, which
the flash kernel fuses with the row max) is reached as well as the bool and float masks.

Tile sizes (kernels/flash_attention.hpp): Br = 128 query rows, Bc = 256 keys (2048 for one query
row), causal diagonal blocks in groups of 32 rows; fewer than 32 (n, h, query block) tasks and
S >= 1024 split the keys into chunks merged at the end (``flash_attention_plan`` tells).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import transformer_core as tc
from conftest import DTYPE_IDS, FLOAT_DTYPES, atol, randn, rtol, to_torch
from transformer_core._runtime import core, variant

EDGES = [1, 127, 128, 129, 255, 256, 257, 2047, 2048, 2049]
# (L, S, D): one query row against every edge (D = 64, the decoding case), the Br / Bc edges, and a
# few long ones on either side (small D, so that the run stays short); then second query blocks
# whose row groups (24 rows off the causal diagonal, 32 on it) end in 1-4 rows: 26 = 24 + 2 and
# 51 = 24 + 24 + 3 (the short group joins the one before), 28 = 24 + 4 (it does not), 33 = 32 + 1.
EDGE_CASES = ([(1, s, 64) for s in EDGES]
              + [(127, 129, 16), (128, 128, 16), (129, 127, 16), (255, 256, 16), (256, 257, 16),
                 (257, 255, 16), (129, 1, 16), (2049, 1, 8), (2047, 129, 8), (129, 2048, 8),
                 (255, 2049, 64)]
              + [(154, 160, 16), (179, 300, 64), (156, 156, 16), (161, 161, 16)])
MASK_KINDS = ["none", "causal_top_left", "causal_bottom_right", "bool", "float", "key_mask"]
N, H, HKV = 1, 2, 1  # two query heads sharing one key/value head (GQA)


def make_inputs(rng, L, S, D, dtype, n=N, h=H, hkv=HKV, dv=None):
    dv = max(1, D // 2) if dv is None else dv  # Dv != D
    return (randn(rng, (n, h, L, D), dtype), randn(rng, (n, hkv, S, D), dtype),
            randn(rng, (n, hkv, S, dv), dtype))


def make_masks(rng, kind, n, h, L, S, dtype):
    """Arguments of the binding for one mask kind, plus ``allowed`` (n, h, L, S) bool and the float
    mask for the oracle. Some rows of the bool / float / key_mask kinds see no key at all."""
    m = dict(bool_mask=None, float_mask=None, key_mask=None, is_causal=False, causal_offset=0)
    allowed = np.ones((n, h, L, S), bool)
    fmask = None
    if kind.startswith("causal"):
        off = 0 if kind == "causal_top_left" else S - L
        m.update(is_causal=True, causal_offset=off)
        allowed &= np.arange(S)[None, :] <= np.arange(L)[:, None] + off
    elif kind == "bool":
        bm = rng.random((n, 1, L, S)) < 0.7
        bm[..., L // 2, :] = False  # a fully masked row
        m["bool_mask"] = np.broadcast_to(bm, (n, h, L, S))
        allowed &= bm
    elif kind == "float":
        fmask = randn(rng, (1, h, L, S), dtype, scale=2.0)
        fmask[rng.random(fmask.shape) < 0.3] = -np.inf
        fmask[..., L - 1, :] = -np.inf  # a fully masked row
        m["float_mask"] = np.broadcast_to(fmask, (n, h, L, S))
        allowed &= np.isfinite(fmask)
    elif kind == "key_mask":  # the key-padding mask alone, with bottom-right causal
        km = rng.random((n, S)) < 0.6
        km[:, : min(S, 300)] = False  # the first keys (a whole block, most of a chunk) masked
        m.update(key_mask=km, is_causal=True, causal_offset=S - L)
        allowed &= km[:, None, None, :]
        allowed &= np.arange(S)[None, :] <= np.arange(L)[:, None] + S - L
    return m, allowed, fmask


def oracle(q, k, v, allowed, fmask, scale):
    """float64 torch: (out, lse, visible rows) with zeros / -inf on rows that see no key."""
    qt, kt, vt = (to_torch(x).double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr = kt.repeat_interleave(group, 1)  # GQA: the key head of each query head
    scores = (qt @ kr.transpose(-2, -1)) * scale
    bias = torch.zeros(scores.shape, dtype=torch.float64)
    if fmask is not None:
        bias = bias + to_torch(fmask).double()
    bias = bias.masked_fill(~to_torch(allowed), float("-inf"))
    lse = torch.logsumexp(scores + bias, dim=-1)
    visible = torch.from_numpy(allowed).any(-1)
    out = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias, scale=scale, enable_gqa=True)
    out = out.masked_fill(~visible[..., None], 0.0)
    return out.numpy(), lse.numpy(), visible.numpy()


def run(q, k, v, masks, scale, path):
    """(out, lse) from the binding."""
    return variant("scaled_dot_product_attention", q.dtype)(
        q, k, v, masks["bool_mask"], masks["float_mask"], masks["key_mask"], masks["is_causal"],
        masks["causal_offset"], scale, False, path, return_lse=True)


def check(q, k, v, kind, rng, what):
    dtype = q.dtype
    n, h, L, D = q.shape
    S = k.shape[2]
    scale = 1.0 / np.sqrt(D)
    masks, allowed, fmask = make_masks(rng, kind, n, h, L, S, dtype)
    ref_out, ref_lse, visible = oracle(q, k, v, allowed, fmask, scale)
    results = {path: run(q, k, v, masks, scale, path) for path in ("flash", "reference")}
    a, r = atol(dtype), rtol(dtype)
    for path, (out, lse) in results.items():
        w = f"{what} {kind} {path}"
        assert out.dtype == lse.dtype == dtype and lse.shape == (n, h, L), w
        np.testing.assert_allclose(out, ref_out, atol=a, rtol=r, err_msg=w + ": output vs torch")
        assert np.all(out[~visible] == 0), w + ": rows that see no key must be zeros"
        assert np.all(lse[~visible] == -np.inf), w + ": lse of rows that see no key must be -inf"
        np.testing.assert_allclose(lse[visible], ref_lse[visible], atol=a, rtol=r, err_msg=w + ": lse")
    (fo, fl), (ro, rl) = results["flash"], results["reference"]
    np.testing.assert_allclose(fo, ro, atol=a, rtol=r, err_msg=f"{what} {kind}: flash vs reference")
    np.testing.assert_allclose(fl, rl, atol=a, rtol=r, err_msg=f"{what} {kind}: flash vs reference lse")
    return visible


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("L,S,D", EDGE_CASES, ids=[f"L{L}-S{S}-D{D}" for L, S, D in EDGE_CASES])
def test_flash_tile_edges(rng, L, S, D, dtype):
    plan = core.flash_attention_plan(batch=N, num_heads=H, q_len=L, kv_len=S, head_dim=D,
                                     v_head_dim=D // 2)
    assert plan["block_rows"] == min(128, L)
    assert plan["block_keys"] == min(2048 if L == 1 else 256, S)
    q, k, v = make_inputs(rng, L, S, D, dtype)
    for kind in MASK_KINDS:
        visible = check(q, k, v, kind, rng, f"L={L} S={S} D={D} plan={plan}")
        if kind in ("bool", "float"):
            assert not visible.all()  # the fully masked rows are there


SPLIT_CASES = [(1, 1024), (1, 2047), (1, 2049), (1, 4100), (5, 2048), (130, 1100)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("L,S", SPLIT_CASES, ids=[f"L{L}-S{S}" for L, S in SPLIT_CASES])
def test_flash_split_kv(rng, L, S, dtype):
    """Few (n, h, query block) tasks and long keys: the keys are split into chunks whose partial
    results are merged (the plan says so), including chunks where a row sees no key (causal
    top-left, the key mask's masked prefix) and a batch element with no key at all."""
    D, n = 64, 2
    plan = core.flash_attention_plan(batch=n, num_heads=H, q_len=L, kv_len=S, head_dim=D, v_head_dim=D)
    assert not plan["serial"] and plan["kv_chunks"] > 1, plan
    assert plan["kv_chunk_len"] % 64 == 0 and plan["kv_chunk_len"] >= 512
    assert (plan["kv_chunks"] - 1) * plan["kv_chunk_len"] < S <= plan["kv_chunks"] * plan["kv_chunk_len"]
    assert plan["tasks"] == n * H * plan["query_blocks"] * plan["kv_chunks"]
    q, k, v = make_inputs(rng, L, S, D, dtype, n=n, dv=D)
    for kind in MASK_KINDS:
        check(q, k, v, kind, rng, f"split L={L} S={S} plan={plan}")
    # batch element 1 has no real key: zeros and lse = -inf, batch element 0 as usual
    km = np.ones((n, S), bool)
    km[1] = False
    masks = dict(bool_mask=None, float_mask=None, key_mask=km, is_causal=False, causal_offset=0)
    out, lse = run(q, k, v, masks, 0.125, "flash")
    assert np.all(out[1] == 0) and np.all(lse[1] == -np.inf)
    ref_out, ref_lse = run(q[:1], k[:1], v[:1], dict(masks, key_mask=None), 0.125, "reference")
    np.testing.assert_allclose(out[:1], ref_out, atol=atol(dtype), rtol=rtol(dtype))
    np.testing.assert_allclose(lse[:1], ref_lse, atol=atol(dtype), rtol=rtol(dtype))


def test_flash_plan_no_split_when_tasks_suffice():
    # 32 or more (n, h, query block) tasks: no split; tiny problems: serial; S = 0: nothing to tile
    assert core.flash_attention_plan(1, 32, 1, 4096, 64, 64)["kv_chunks"] == 1
    assert core.flash_attention_plan(1, 31, 1, 4096, 64, 64)["kv_chunks"] == 2
    assert core.flash_attention_plan(1, 12, 1, 1023, 64, 64)["kv_chunks"] == 1  # S < 2 · 512
    assert core.flash_attention_plan(1, 1, 1, 100, 8, 8)["serial"]
    # small problems: tiles on the stack; their tasks shared out above 2**15 flops, unless only one
    small = core.flash_attention_plan(1, 12, 9, 9, 32, 32)  # 124,416 flops, 12 tasks
    assert small["small"] and not small["serial"] and small["tasks"] == 12, small
    assert core.flash_attention_plan(1, 2, 9, 9, 32, 32)["serial"]  # 20,736 flops
    assert core.flash_attention_plan(1, 1, 40, 40, 8, 8)["serial"]  # 51,200 flops, one task
    assert not core.flash_attention_plan(1, 12, 64, 64, 32, 32)["small"]  # 6.3 Mflops
    assert core.flash_attention_plan(1, 1, 5, 0, 8, 8)["tasks"] == 0
    with pytest.raises(ValueError, match="kv_len|S="):
        core.flash_attention_plan(1, 1, 1, -1, 8, 8)


def _with_threads(n, fn):
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(n)
        assert tc.get_num_threads() == n
        return fn()
    finally:
        tc.set_num_threads(old)


THREAD_CASES = [
    # (N, H, Hkv, L, S, D, mask kind): multi-block causal with a key mask, the split-KV decoding
    # shape of the bench (S = 4100: a short last chunk), split with a few query rows
    (2, 3, 3, 257, 300, 16, "key_mask"),
    (1, 12, 12, 1, 4100, 64, "none"),
    (1, 2, 1, 5, 4100, 64, "causal_bottom_right"),
    # 9 query blocks: tasks of 4, 4 and 1 blocks sharing each packed key block (flash_blocks_shared)
    (1, 4, 2, 1100, 1100, 64, "causal_top_left"),
    # a small problem (tiles on the stack) with its 12 tasks shared out: one sentence of MiniLM
    (1, 12, 12, 9, 9, 32, "key_mask"),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("threads", [2, 16])
@pytest.mark.parametrize("case", THREAD_CASES, ids=["blocks", "split-decode", "split-rows", "shared-keys", "small"])
def test_flash_bitwise_equal_across_thread_counts(rng, case, threads, dtype):
    """The plan depends on the shape alone, so 1, 2 and 16 threads give the same bits (16 threads
    also on a 2-core machine: OpenMP oversubscribes)."""
    n, h, hkv, L, S, D, kind = case
    q, k, v = make_inputs(rng, L, S, D, dtype, n=n, h=h, hkv=hkv, dv=D)
    masks, _, _ = make_masks(rng, kind, n, h, L, S, dtype)
    for path in ("flash", "reference"):
        out1, lse1 = _with_threads(1, lambda: run(q, k, v, masks, 0.125, path))  # noqa: B023
        outn, lsen = _with_threads(threads, lambda: run(q, k, v, masks, 0.125, path))  # noqa: B023
        np.testing.assert_array_equal(out1, outn, err_msg=f"{path}: 1 vs {threads} threads")
        np.testing.assert_array_equal(lse1, lsen, err_msg=f"{path}: lse, 1 vs {threads} threads")


# (L, S, is_causal, varlen): one query row (one key block of 2048), two query blocks against two
# key blocks (the running max and its rescaling), the causal diagonal, a split-KV merge (S > 1024
# with few tasks), and the short path of packed sequences (len <= 128, one column per query).
EXP_CASES = [(1, 300, False, False), (130, 300, False, False), (130, 300, True, False),
             (3, 2049, False, False), (9, 9, False, True), (100, 100, True, True)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("L,S,is_causal,varlen", EXP_CASES,
                         ids=[f"L{L}-S{S}{'-causal' if c else ''}{'-varlen' if v else ''}" for L, S, c, v in EXP_CASES])
def test_flash_softmax_to_an_ulp_per_unit_of_exponent(rng, L, S, is_causal, varlen, dtype):
    """The probabilities themselves, against exact arithmetic. With v = the identity (D_v = S) an
    output row is its softmax row; q and k hold small integers, so that the products q·kᵀ are exact
    and the only roundings left are the softmax's. The kernel takes p = 2^(s · scale · log₂e − m)
    with the exponent in one FMA and 2^f by a degree-6 polynomial: the error of p / max p is about
    one ulp (eps = 2^-24 or 2^-53) per unit of its exponent or less, and the test allows two,
    |p / max p - ref| <= 2 eps · (2 + d) · ref with d = -log₂ ref (measured: up to 1.2 ulp per unit;
    scaling the scores first, as the kernel did before, made it up to 11). The reference is computed
    in long double (64-bit mantissa on x86). Scores span about 80 units of log₂."""
    D, scale = 16, 0.3
    q = rng.integers(-4, 5, (1, 1, L, D)).astype(dtype)
    k = rng.integers(-4, 5, (1, 1, S, D)).astype(dtype)
    v = np.eye(S, dtype=dtype)[None, None]
    if varlen:  # one sequence of L = S tokens, (T, H, E) layout
        tq, tk, tv = (x[0].transpose(1, 0, 2).copy() for x in (q, k, v))
        out = tc.functional.varlen_attention(tq, tk, tv, np.array([0, L]), is_causal=is_causal, scale=scale,
                                             path="flash")[:, 0]
    else:
        masks = dict(bool_mask=None, float_mask=None, key_mask=None, is_causal=is_causal, causal_offset=0)
        out = run(q, k, v, masks, scale, "flash")[0][0, 0]
    s = (q[0, 0].astype(np.longdouble) @ k[0, 0].astype(np.longdouble).T) * np.longdouble(scale)
    if is_causal:
        s[np.arange(S)[None, :] > np.arange(L)[:, None]] = -np.inf
    ref = np.exp(s - s.max(-1, keepdims=True))  # p / max p, exactly enough
    ours = out.astype(np.longdouble)
    ours /= ours.max(-1, keepdims=True)
    seen = ref > 1e-30  # the rest underflow (in float) or are masked; they must be tiny or zero
    assert np.all(ours[~seen] <= 1e-30)
    eps = np.finfo(dtype).eps / 2
    bound = 2 * eps * (2 - np.log2(ref[seen])) * ref[seen]
    err = np.abs(ours[seen] - ref[seen])
    assert np.all(err <= bound), f"worst error / bound {float(np.max(err / bound)):.2f}"
    assert float(np.max(-np.log2(ref[seen]))) > 30  # the exponents do span a wide range


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_flash_no_keys(rng, dtype):
    """S = 0: zeros and lse = -inf on both paths."""
    q = randn(rng, (2, 3, 4, 8), dtype)
    k = np.zeros((2, 3, 1, 8), dtype)[:, :, :0]  # a slice: numpy gives an empty array 0 strides
    v = np.zeros((2, 3, 1, 5), dtype)[:, :, :0]
    masks = dict(bool_mask=None, float_mask=None, key_mask=None, is_causal=False, causal_offset=0)
    for path in ("flash", "reference"):
        out, lse = run(q, k, v, masks, 0.5, path)
        assert out.shape == (2, 3, 4, 5) and np.all(out == 0)
        assert lse.shape == (2, 3, 4) and np.all(lse == -np.inf)


# ---------------------------------------------------------------- scores of huge magnitude
# A float mask of -1e10 (or -1e30, finfo.min: Hugging Face's masks) or a huge scale puts the row max,
# in units of log₂, beyond 2^digits: there its rounding error exceeds 1, and the kernel keeps the
# exact product as a pair (Accumulator's m_lo in kernels/flash_attention.hpp). Before, a block whose
# every key was masked so left an overflowed state: NaN rows (left padding) or zeros.
HUGE_MASK_VALUES = [-1e9, -1e10, -1e20, -1e30, "min"]
# (L, S, masked keys): all keys; the first 1000 of 1024 (whole key blocks); one query row against a
# split of 4096 keys, 4000 masked (whole chunks); two query blocks; exactly the first key block.
HUGE_MASK_CASES = [(4, 8, 8), (4, 1024, 1000), (1, 4096, 4000), (130, 1024, 1000), (3, 300, 256)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("value", HUGE_MASK_VALUES, ids=[str(v) for v in HUGE_MASK_VALUES])
@pytest.mark.parametrize("L,S,masked", HUGE_MASK_CASES, ids=[f"L{L}-S{S}-m{m}" for L, S, m in HUGE_MASK_CASES])
def test_flash_huge_float_mask_values_match_torch(rng, dtype, value, L, S, masked):
    """Left padding by a finite float mask of any size, on every path, against torch's SDPA in the
    same dtype. Rows whose every key is masked get torch's answer too: the scores, all near the
    mask value, are finite, so their softmax is not empty. Where the mask's spacing is finer than
    the scores' own size (fp64 and -1e9), the scores keep their differences only to that spacing,
    and the tolerance grows with it."""
    value = float(np.finfo(dtype).min) if value == "min" else value
    q, k, v = make_inputs(rng, L, S, 16, dtype, dv=8)
    mask = np.zeros((L, S), dtype)
    mask[:, :masked] = value
    ref = TF.scaled_dot_product_attention(to_torch(q), to_torch(k).repeat_interleave(H // HKV, 1),
                                          to_torch(v).repeat_interleave(H // HKV, 1),
                                          attn_mask=to_torch(mask)).numpy()
    assert np.isfinite(ref).all()
    with np.errstate(over="ignore"):  # finfo.min's spacing is inf
        spacing = float(np.spacing(np.abs(np.asarray(value, dtype))))
    tol = atol(dtype) if masked < S or spacing >= 1 else atol(dtype) + 16 * spacing * float(np.abs(v).max())
    for path in ("auto", "flash", "reference"):
        out = tc.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, path=path)
        np.testing.assert_allclose(out, ref, atol=tol, rtol=rtol(dtype), err_msg=f"{path} value={value}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_flash_huge_scale_matches_torch(rng, dtype, scale):
    """A huge scale: every row's softmax is its argmax's one-hot, as torch's, on both paths, padded
    (one and several key blocks, a split) and packed end to end (the short path included)."""
    for L, S in [(5, 300), (1, 4096), (130, 600)]:
        q, k, v = make_inputs(rng, L, S, 16, dtype, dv=8)
        ref = TF.scaled_dot_product_attention(to_torch(q), to_torch(k).repeat_interleave(H // HKV, 1),
                                              to_torch(v).repeat_interleave(H // HKV, 1), scale=scale).numpy()
        for path in ("flash", "reference"):
            out = tc.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True, path=path)
            np.testing.assert_allclose(out, ref, atol=atol(dtype), rtol=rtol(dtype), err_msg=f"{path} L={L} S={S}")
    cu = np.array([0, 3, 3, 40, 200, 500])
    q, k, v = (randn(rng, (500, h, d), dtype) for h, d in ((4, 16), (2, 16), (2, 8)))
    for path in ("flash", "reference"):
        out = tc.functional.varlen_attention(q, k, v, cu, scale=scale, path=path)
        np.testing.assert_allclose(out, varlen_oracle(q, k, v, cu, False, scale), atol=atol(dtype), rtol=0,
                                   err_msg=path)


# ---------------------------------------------------------------- sequences packed end to end
# Lengths at every edge of the kernels: the few-row products (1 to 3 rows), the micro-kernel's 12
# rows and 32-column panels, the short path's registers of queries (8 or 16 lanes) and its last
# length (128 = Br), Bc = 256, and an empty sequence.
VARLEN_LENGTHS = [1, 2, 3, 4, 0, 12, 13, 15, 16, 17, 31, 32, 33, 64, 65, 127, 128, 129, 255, 256, 257, 300]


def varlen_oracle(q, k, v, cu, is_causal, scale):
    """Each sequence alone through torch's SDPA, in float64 (query heads share key/value heads)."""
    g = q.shape[1] // k.shape[1]
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    for a, b in zip(cu[:-1], cu[1:]):
        if a == b:
            continue
        tq, tk, tv = (to_torch(x[a:b].astype(np.float64)).transpose(0, 1) for x in (q, k, v))
        ref = TF.scaled_dot_product_attention(tq, tk.repeat_interleave(g, 0), tv.repeat_interleave(g, 0),
                                              is_causal=is_causal, scale=scale)
        out[a:b] = ref.transpose(0, 1).numpy()
    return out


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("path", ["flash", "reference"])
def test_varlen_attention_matches_torch_per_sequence(rng, dtype, is_causal, path):
    """Every sequence of the packed batch equals torch's SDPA on that sequence alone; q, k, v are
    column blocks of one packed qkv array (as the encoder layer gives them), with GQA and Ev != E."""
    cu = np.concatenate([[0], np.cumsum(VARLEN_LENGTHS)])
    T, H, Hkv, E, Ev = int(cu[-1]), 4, 2, 16, 8
    qkv = randn(rng, (T, H * E + Hkv * E + Hkv * Ev), dtype)
    q = qkv[:, :H * E].reshape(T, H, E)
    k = qkv[:, H * E:(H + Hkv) * E].reshape(T, Hkv, E)
    v = qkv[:, (H + Hkv) * E:].reshape(T, Hkv, Ev)
    out = tc.functional.varlen_attention(q, k, v, cu, is_causal=is_causal, scale=0.3, path=path)
    assert out.dtype == dtype and out.shape == (T, H, Ev)
    np.testing.assert_allclose(out, varlen_oracle(q, k, v, cu, is_causal, 0.3), atol=atol(dtype), rtol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_varlen_attention_equals_padded_attention_with_key_mask(rng, dtype):
    """The padded batch with a key-padding mask gives the same real rows as the packed sequences."""
    lengths = [5, 1, 140, 0, 33]
    N, L, H, E = len(lengths), max(lengths), 3, 8
    cu = np.concatenate([[0], np.cumsum(lengths)])
    q, k, v = (randn(rng, (int(cu[-1]), H, E), dtype) for _ in range(3))
    padded = [np.zeros((N, H, L, E), dtype) for _ in range(3)]
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        for x, p in zip((q, k, v), padded):
            p[n, :, :b - a] = x[a:b].transpose(1, 0, 2)
    key_mask = np.arange(L)[None, :] < np.array(lengths)[:, None]
    ref = tc.functional.scaled_dot_product_attention(*padded, key_mask=key_mask[:, None, :])
    out = tc.functional.varlen_attention(q, k, v, cu)
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        np.testing.assert_allclose(out[a:b], ref[n, :, :b - a].transpose(1, 0, 2), atol=atol(dtype), rtol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_varlen_attention_rows_independent_of_the_batch_and_threads(rng, dtype):
    """A sequence's rows are the same bits next to short or long (> Br, > Bc) sequences, and on
    1, 2 or 16 threads."""
    H, E = 4, 32
    seqs = {n: randn(rng, (n, H, 3 * E), dtype) for n in (7, 30, 129, 300)}

    def rows_of(target, others, threads):
        parts = [seqs[n] for n in others[:1]] + [seqs[target]] + [seqs[n] for n in others[1:]]
        x = np.concatenate(parts)
        cu = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
        out = _with_threads(threads, lambda: tc.functional.varlen_attention(
            x[..., :E], x[..., E:2 * E], x[..., 2 * E:], cu))
        return out[cu[1]:cu[2]]

    for target in (7, 30, 129):
        base = rows_of(target, [7], 1)
        for others, threads in (([300, 30], 1), ([129], 2), ([300, 7, 129], 16)):
            np.testing.assert_array_equal(rows_of(target, others, threads), base,
                                          err_msg=f"length {target} next to {others}, {threads} threads")


@pytest.mark.parametrize("path", ["flash", "reference"])
def test_varlen_attention_nan_stays_in_its_sequence(rng, path):
    """A NaN in one key makes every row of its sequence NaN (as torch) and no row of the others."""
    lengths = [20, 9, 140]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    q, k, v = (randn(rng, (int(cu[-1]), 2, 8), np.float32) for _ in range(3))
    for n in range(len(lengths)):
        bad = k.copy()
        bad[cu[n] + 3, 1, 5] = np.nan
        out = tc.functional.varlen_attention(q, bad, v, cu, path=path)
        for m, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
            assert np.all(np.isnan(out[a:b, 1])) if m == n else np.all(np.isfinite(out[a:b])), (n, m)
        assert np.all(np.isfinite(out[cu[n]:cu[n + 1], 0]))


@pytest.mark.parametrize("cu,err,match", [
    ([1, 5], ValueError, "0 first"),
    ([0, 3, 2, 5], ValueError, "non-decreasing"),
    ([0, 4], ValueError, "5 \\(the tokens\\) last"),
    ([[0, 5]], ValueError, "1-D"),
    ([0], ValueError, "N >= 1"),
    (np.array([0.0, 5.0]), TypeError, "integers"),
])
def test_varlen_attention_bad_cu_seqlens(rng, cu, err, match):
    q = randn(rng, (5, 2, 4))
    with pytest.raises(err, match=f"cu_seqlens: .*{match}"):
        tc.functional.varlen_attention(q, q, q, cu)


def test_varlen_attention_cu_seqlens_errors_stay_short_and_checked(rng):
    """The message names the offending offsets, never the whole array (10**7 offsets made a 30 MB
    message), and a broadcast view of 2**40 offsets is refused before its comparison's temporaries
    (it was a bare MemoryError)."""
    q = randn(rng, (6, 2, 8))
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected 0 first and 6 \(the tokens\) last, got 0 and 0$"):
        tc.functional.varlen_attention(q, q, q, np.zeros(10**7, np.int64))
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected non-decreasing offsets, got cu_seqlens\[3\] = 2 "
                                         r"after cu_seqlens\[2\] = 4$"):
        tc.functional.varlen_attention(q, q, q, [0, 1, 4, 2, 6])
    huge = np.lib.stride_tricks.as_strided(np.array([0]), (2**40,), (0,))
    with pytest.raises(ValueError, match="cu_seqlens: an array of shape .* more than this machine's memory"):
        tc.functional.varlen_attention(q, q, q, huge)
    # empty sequences stay allowed
    out = tc.functional.varlen_attention(q, q, q, [0, 0, 6, 6])
    np.testing.assert_array_equal(out, tc.functional.varlen_attention(q, q, q, [0, 6]))


def test_varlen_attention_bad_shapes(rng):
    q = randn(rng, (5, 2, 4))
    with pytest.raises(ValueError, match="key, value: expected 5 tokens"):
        tc.functional.varlen_attention(q, q[:4], q, [0, 5])
    with pytest.raises(ValueError, match="key: expected last dim 4"):
        tc.functional.varlen_attention(q, randn(rng, (5, 2, 3)), q, [0, 5])
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        tc.functional.varlen_attention(randn(rng, (5, 3, 4)), q, q, [0, 5])
    with pytest.raises(ValueError, match="query: .*3"):
        tc.functional.varlen_attention(q[None], q, q, [0, 5])
    with pytest.raises(TypeError, match="is_causal"):
        tc.functional.varlen_attention(q, q, q, [0, 5], is_causal=1)
