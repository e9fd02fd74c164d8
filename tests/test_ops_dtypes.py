"""The dtypes of the ops at the Python boundary (functional, backward, _validation, nn layers; no
models: this file runs under the sanitizer's reduced core too), vs torch computed in the test.

* Mixed float32/float64 arguments compute in float64, whichever argument is the float64 one (the
  inputs, weights, biases, query/key/value, gate/up, output gradients): results and gradients equal
  torch's float64 on the same values to 1e-10, and have dtype float64. Masks follow the op's dtype.
* ``np.longdouble`` computes in float64.
* Narrowing float64 to float32 refuses finite values beyond float32's range (ValueError naming the
  argument); a given inf or NaN stays one.
* ndarray subclasses (``np.matrix``) read as plain arrays; masked arrays are refused.
* torch bfloat16 expanded views are widened value by value, never copied to their full size.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from transformer_core import backward as B
from transformer_core import functional as F
from transformer_core import nn

F64 = 1e-10


def t64(a) -> torch.Tensor:
    """The values of ``a`` (any real dtype) as a float64 torch tensor, exactly."""
    return torch.from_numpy(np.array(a, dtype=np.float64, copy=True))


def leaf64(a) -> torch.Tensor:
    return t64(a).requires_grad_(True)


def check64(ours, ref, what=""):
    """``ours`` is float64 and equals torch's float64 ``ref`` to 1e-10."""
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert isinstance(ours, np.ndarray) and ours.dtype == np.float64, f"{what}: dtype {np.asarray(ours).dtype}"
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    np.testing.assert_allclose(ours, ref, rtol=0, atol=F64, err_msg=what)


def cast(arrays: dict, wide: str) -> dict:
    """``arrays`` as float32, but the one named ``wide`` as float64."""
    return {k: (v.astype(np.float64) if k == wide else v.astype(np.float32)) for k, v in arrays.items()}


@pytest.fixture
def rng():
    return np.random.default_rng(38)


# --------------------------------------------------------------------------------------------------
# 1. Mixed float32/float64 arguments: float64 wins, whichever argument it is
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wide", ["x", "weight", "bias"])
def test_linear_mixed_dtypes_compute_in_float64(rng, wide):
    a = cast({"x": rng.standard_normal((3, 5, 7)), "weight": rng.standard_normal((4, 7)),
              "bias": rng.standard_normal(4)}, wide)
    ref = TF.linear(t64(a["x"]), t64(a["weight"]), t64(a["bias"]))
    check64(F.linear(a["x"], a["weight"], a["bias"]), ref, f"linear, {wide} float64")


def test_linear_integer_or_torch_input_with_float64_weight(rng):
    w = rng.standard_normal((4, 7))
    x = np.arange(14).reshape(2, 7)
    check64(F.linear(x, w), TF.linear(t64(x), t64(w)), "linear(int x, float64 weight)")
    x32 = rng.standard_normal((2, 7)).astype(np.float32)
    check64(F.linear(torch.from_numpy(x32), torch.from_numpy(w)), TF.linear(t64(x32), t64(w)),
            "linear(torch float32 x, torch float64 weight)")


@pytest.mark.parametrize("wide", ["x", "weight", "bias"])
def test_layer_norm_and_rms_norm_mixed_dtypes(rng, wide):
    a = cast({"x": rng.standard_normal((3, 6)), "weight": rng.standard_normal(6),
              "bias": rng.standard_normal(6)}, wide)
    ref = TF.layer_norm(t64(a["x"]), (6,), t64(a["weight"]), t64(a["bias"]), 1e-5)
    check64(F.layer_norm(a["x"], a["weight"], a["bias"]), ref, f"layer_norm, {wide} float64")
    if wide != "bias":
        x, w = t64(a["x"]), t64(a["weight"])
        ref = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
        check64(F.rms_norm(a["x"], a["weight"], eps=1e-6), ref, f"rms_norm, {wide} float64")


@pytest.mark.parametrize("wide", ["query", "key", "value"])
def test_scaled_dot_product_attention_mixed_dtypes(rng, wide):
    a = cast({"query": rng.standard_normal((2, 3, 5, 8)), "key": rng.standard_normal((2, 3, 7, 8)),
              "value": rng.standard_normal((2, 3, 7, 6))}, wide)
    ref = TF.scaled_dot_product_attention(t64(a["query"]), t64(a["key"]), t64(a["value"]))
    check64(F.scaled_dot_product_attention(a["query"], a["key"], a["value"]), ref, f"sdpa, {wide} float64")


def test_attention_float_mask_follows_the_compute_dtype(rng):
    """A float64 attn_mask does not promote float32 q/k/v (a mask is no data argument): it is
    narrowed, its -1e300 becoming float32's -inf (no warning, no error); with a float64 key the
    float32 mask is widened."""
    q, k = rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 5, 8))
    mask = np.where(rng.random((4, 5)) < 0.3, -1e300, 0.0)
    ref = TF.scaled_dot_product_attention(t64(q), t64(k), t64(k), attn_mask=t64(np.maximum(mask, -np.inf)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out32 = F.scaled_dot_product_attention(q.astype(np.float32), k.astype(np.float32), k.astype(np.float32),
                                               attn_mask=mask)
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, ref.numpy(), rtol=1e-4, atol=1e-5)
    mask32 = np.where(mask < 0, -np.inf, 0.0).astype(np.float32)
    out64 = F.scaled_dot_product_attention(q.astype(np.float32), k, k, attn_mask=mask32)
    check64(out64, TF.scaled_dot_product_attention(t64(q.astype(np.float32)), t64(k), t64(k), attn_mask=t64(mask32)),
            "float32 mask, f64 key")


@pytest.mark.parametrize("wide", ["query", "key", "value"])
def test_varlen_attention_mixed_dtypes(rng, wide):
    cu = np.array([0, 3, 3, 8])
    a = cast({"query": rng.standard_normal((8, 4, 6)), "key": rng.standard_normal((8, 2, 6)),
              "value": rng.standard_normal((8, 2, 5))}, wide)
    out = F.varlen_attention(a["query"], a["key"], a["value"], cu, is_causal=True)
    assert out.dtype == np.float64
    for r0, r1 in zip(cu[:-1], cu[1:]):
        if r1 == r0:
            continue
        q, k, v = (t64(a[n][r0:r1]).transpose(0, 1) for n in ("query", "key", "value"))
        ref = TF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(0, 1)
        check64(out[r0:r1], ref, f"varlen rows {r0}:{r1}, {wide} float64")


@pytest.mark.parametrize("wide", ["gate", "up"])
def test_glu_mixed_dtypes(rng, wide):
    a = cast({"gate": rng.standard_normal((3, 10)), "up": rng.standard_normal((3, 10))}, wide)
    check64(F.glu(a["gate"], a["up"]), TF.silu(t64(a["gate"])) * t64(a["up"]), f"glu, {wide} float64")


@pytest.mark.parametrize("wide", ["x", "weight", "grad_output"])
def test_linear_backward_mixed_dtypes(rng, wide):
    a = cast({"x": rng.standard_normal((2, 3, 7)), "weight": rng.standard_normal((4, 7)),
              "grad_output": rng.standard_normal((2, 3, 4))}, wide)
    x, w, b = leaf64(a["x"]), leaf64(a["weight"]), leaf64(np.zeros(4))
    TF.linear(x, w, b).backward(t64(a["grad_output"]))
    gx, gw, gb = B.linear_backward(a["x"], a["weight"], a["grad_output"])
    for ours, ref, what in ((gx, x.grad, "grad_x"), (gw, w.grad, "grad_weight"), (gb, b.grad, "grad_bias")):
        check64(ours, ref, f"linear_backward {what}, {wide} float64")


def test_linear_backward_buffer_of_the_narrow_dtype_is_refused(rng):
    x, w = rng.standard_normal((3, 7)).astype(np.float32), rng.standard_normal((4, 7))
    with pytest.raises(TypeError, match=r"^grad_weight: expected dtype float64"):
        B.linear_backward(x, w, np.ones((3, 4), np.float32), grad_weight=np.zeros((4, 7), np.float32))


@pytest.mark.parametrize("wide", ["x", "weight", "grad_output"])
def test_norm_backward_mixed_dtypes(rng, wide):
    a = cast({"x": rng.standard_normal((3, 6)), "weight": rng.standard_normal(6),
              "grad_output": rng.standard_normal((3, 6))}, wide)
    x, w, b = leaf64(a["x"]), leaf64(a["weight"]), leaf64(np.zeros(6))
    TF.layer_norm(x, (6,), w, b, 1e-5).backward(t64(a["grad_output"]))
    gx, gw, gb = B.layer_norm_backward(a["x"], a["weight"], a["grad_output"])
    for ours, ref, what in ((gx, x.grad, "grad_x"), (gw, w.grad, "grad_weight"), (gb, b.grad, "grad_bias")):
        check64(ours, ref, f"layer_norm_backward {what}, {wide} float64")
    x, w = leaf64(a["x"]), leaf64(a["weight"])
    (x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w).backward(t64(a["grad_output"]))
    gx, gw = B.rms_norm_backward(a["x"], a["weight"], a["grad_output"], eps=1e-6)
    check64(gx, x.grad, f"rms_norm_backward grad_x, {wide} float64")
    check64(gw, w.grad, f"rms_norm_backward grad_weight, {wide} float64")


@pytest.mark.parametrize("wide", ["x", "grad_output"])
@pytest.mark.parametrize("op", ["gelu", "silu", "relu"])
def test_activation_backward_mixed_dtypes(rng, op, wide):
    a = cast({"x": rng.standard_normal((4, 5)), "grad_output": rng.standard_normal((4, 5))}, wide)
    x = leaf64(a["x"])
    getattr(TF, op)(x).backward(t64(a["grad_output"]))
    check64(getattr(B, f"{op}_backward")(a["x"], a["grad_output"]), x.grad, f"{op}_backward, {wide} float64")


@pytest.mark.parametrize("wide", ["gate", "up", "grad_output"])
def test_glu_backward_mixed_dtypes(rng, wide):
    a = cast({"gate": rng.standard_normal((3, 8)), "up": rng.standard_normal((3, 8)),
              "grad_output": rng.standard_normal((3, 8))}, wide)
    g, u = leaf64(a["gate"]), leaf64(a["up"])
    (TF.silu(g) * u).backward(t64(a["grad_output"]))
    dg, du = B.glu_backward(a["gate"], a["up"], a["grad_output"])
    check64(dg, g.grad, f"glu_backward grad_gate, {wide} float64")
    check64(du, u.grad, f"glu_backward grad_up, {wide} float64")


@pytest.mark.parametrize("wide", ["output", "grad_output"])
def test_softmax_backward_mixed_dtypes(rng, wide):
    x = leaf64(rng.standard_normal((3, 6)).astype(np.float32))
    p = torch.softmax(x, -1)
    a = cast({"output": p.detach().numpy(), "grad_output": rng.standard_normal((3, 6))}, wide)
    # the reference: the backward of softmax at the given output values, exactly as the formula
    p_given, g_given = t64(a["output"]), t64(a["grad_output"])
    ref = p_given * (g_given - (p_given * g_given).sum(-1, keepdim=True))
    check64(B.softmax_backward(a["output"], a["grad_output"]), ref, f"softmax_backward, {wide} float64")


def test_cross_entropy_backward_float64_rows_promote_and_a_scalar_does_not(rng):
    logits = rng.standard_normal((4, 5)).astype(np.float32)
    target = np.array([0, 4, 2, 1])
    rows = rng.standard_normal(4)
    x = leaf64(logits)
    TF.cross_entropy(x, torch.from_numpy(target), reduction="none").backward(t64(rows))
    check64(B.cross_entropy_backward(logits, target, rows, reduction="none"), x.grad, "cross_entropy_backward rows")
    loss, grad = B.cross_entropy_with_grad(logits, target, reduction="none", grad_output=rows)
    check64(loss, TF.cross_entropy(t64(logits), torch.from_numpy(target), reduction="none"), "loss")
    check64(grad, x.grad, "cross_entropy_with_grad rows")
    # a scalar grad_output is a scale, of no dtype: float32 logits stay float32
    assert B.cross_entropy_backward(logits, target, np.float64(2.0)).dtype == np.float32
    assert B.cross_entropy_backward(logits, target, 2.0, reduction="none").dtype == np.float32


def _attention_backward_formula(q, k, v, out, grad_out, lse):
    """FlashAttention-2's backward (Dao 2023, alg. 2) in torch float64 on the given values (the
    given ``out`` and ``lse``, not recomputed ones)."""
    q, k, v, out, go, lse = (t64(a) for a in (q, k, v, out, grad_out, lse))
    scale = 1.0 / np.sqrt(q.shape[-1])
    p = torch.exp(torch.clamp(scale * q @ k.transpose(-1, -2) - lse[..., None], max=0.0))
    delta = (go * out).sum(-1, keepdim=True)
    ds = p * (go @ v.transpose(-1, -2) - delta)
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ go


@pytest.mark.parametrize("wide", ["query", "value", "out", "grad_out", "lse"])
def test_attention_backward_mixed_dtypes(rng, wide):
    q, k, v = (rng.standard_normal(s) for s in ((2, 2, 5, 8), (2, 2, 6, 8), (2, 2, 6, 4)))
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    a = cast({"query": q, "key": k, "value": v, "out": out, "grad_out": rng.standard_normal(out.shape),
              "lse": lse}, wide)
    names = ("query", "key", "value", "out", "grad_out", "lse")
    grads = B.scaled_dot_product_attention_backward(*(a[n] for n in names))
    refs = _attention_backward_formula(*(a[n] for n in names))
    for ours, ref, what in zip(grads, refs, ("grad_query", "grad_key", "grad_value")):
        check64(ours, ref, f"sdpa backward {what}, {wide} float64")


def test_attention_backward_float64_out_grad_out_lse_exact(rng):
    """float32 q/k/v with the float64 forward's out, lse and a float64 grad_out: torch's float64."""
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 4)))
    out, lse = F.scaled_dot_product_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                              return_lse=True)
    go = rng.standard_normal(out.shape)
    ql, kl, vl = leaf64(q), leaf64(k), leaf64(v)
    TF.scaled_dot_product_attention(ql, kl, vl).backward(t64(go))
    dq, dk, dv = B.scaled_dot_product_attention_backward(q, k, v, out, go, lse)
    for ours, ref, what in ((dq, ql.grad, "grad_query"), (dk, kl.grad, "grad_key"), (dv, vl.grad, "grad_value")):
        check64(ours, ref, f"sdpa backward {what}")


def test_promotion_keeps_the_size_check_before_the_copy():
    """A float32 broadcast view promoted by a float64 weight: the copy's size is checked first."""
    x = np.broadcast_to(np.float32(1), (2**22, 2**22))
    with pytest.raises(ValueError, match=r"^x: an array of shape \(4194304, 4194304\) needs"):
        F.linear(x, np.ones((2, 2**22)))


# --------------------------------------------------------------------------------------------------
# 2. np.longdouble computes in float64
# --------------------------------------------------------------------------------------------------

def test_longdouble_computes_in_float64(rng):
    x, w = rng.standard_normal((3, 7)), rng.standard_normal((4, 7))
    xl = x.astype(np.longdouble)
    check64(F.softmax(xl), torch.softmax(t64(x), -1), "softmax(longdouble)")
    check64(F.gelu(xl), TF.gelu(t64(x)), "gelu(longdouble)")
    check64(F.layer_norm(xl), TF.layer_norm(t64(x), (7,)), "layer_norm(longdouble)")
    check64(F.linear(xl, w.astype(np.float32)), TF.linear(t64(x), t64(w.astype(np.float32))),
            "linear(longdouble x, float32 weight)")
    gx = B.relu_backward(x.astype(np.float32), xl)
    check64(gx, t64(x) * (t64(x.astype(np.float32)) > 0), "relu_backward(float32 x, longdouble grad)")


def test_longdouble_beyond_float64_is_refused():
    big = np.array([1.0, np.longdouble("1e400")], dtype=np.longdouble)
    with pytest.raises(ValueError, match=r"^x: expected values within float64's range"):
        F.relu(big)


# --------------------------------------------------------------------------------------------------
# 3. The result dtype of narrow inputs (the docstrings' rule)
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_narrow_inputs_give_float32(dtype):
    x = np.arange(-4, 4).reshape(2, 4).astype(dtype)
    ref = t64(x)
    for name, ours, theirs in (("softmax", F.softmax(x), torch.softmax(ref, -1)), ("gelu", F.gelu(x), TF.gelu(ref)),
                               ("silu", F.silu(x), TF.silu(ref)), ("relu", F.relu(x), TF.relu(ref)),
                               ("layer_norm", F.layer_norm(x), TF.layer_norm(ref, (4,))),
                               ("relu_backward", B.relu_backward(x, x), ref * (ref > 0))):
        assert ours.dtype == np.float32, name
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


# --------------------------------------------------------------------------------------------------
# 4. float64 narrowed to float32: finite values beyond float32's range are refused
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("as_list", [False, True])
def test_load_state_dict_refuses_values_beyond_float32(as_list):
    layer = nn.Linear(2, 2)
    before = layer.state_dict()
    w = np.array([[1e39, 0.0], [0.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ValueError, not numpy's RuntimeWarning
        with pytest.raises(ValueError, match=r"^state_dict\['weight'\]: expected values within float32's range "
                                             r".*got 1e\+39 at index \(0, 0\)"):
            layer.load_state_dict({"weight": w.tolist() if as_list else w, "bias": np.zeros(2)})
    for name, value in layer.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_narrowing_keeps_given_inf_nan_and_values_near_the_limit():
    layer = nn.Linear(2, 2)
    w = np.array([[np.inf, -np.nan], [3e38, -3.4e38]])  # the sum overflows: each value still checked
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer.load_state_dict({"weight": w, "bias": np.array([3.4028235e38, -np.inf])})
    stored = layer.state_dict()
    np.testing.assert_array_equal(stored["weight"], w.astype(np.float32))
    np.testing.assert_array_equal(stored["bias"], np.array([3.4028235e38, -np.inf], np.float32))


def test_float32_layer_refuses_float64_input_beyond_float32():
    layer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"^x: expected values within float32's range .*got -5e\+40 at index \(1, 0\)"):
        layer(np.array([[1.0, 2.0], [-5e40, 0.0]]))
    y = layer(np.array([[np.inf, 0.0]]))  # a given inf passes, as before
    assert y.dtype == np.float32 and not np.isfinite(y).all()


# --------------------------------------------------------------------------------------------------
# 5. ndarray subclasses read as plain arrays; masked arrays refused
# --------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's own
def test_matrix_masks_read_as_plain_arrays(rng):
    q = rng.standard_normal((2, 3, 3, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    km = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], bool)
    qm = np.array([[1, 0, 1], [1, 1, 0]], bool)
    for name, m in (("key_mask", km), ("query_mask", qm)):
        plain = F.scaled_dot_product_attention(q, k, k, **{name: m})
        ours = F.scaled_dot_product_attention(q, k, k, **{name: np.matrix(m)})
        np.testing.assert_array_equal(ours, plain, err_msg=name)
    # the reference: torch with the padding mask as a boolean attn_mask
    ref = TF.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k),
                                          attn_mask=torch.from_numpy(km)[:, None, None, :])
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, k, key_mask=np.matrix(km)), ref.numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_matrix_data_arguments_read_as_plain_arrays(rng):
    x, w = rng.standard_normal((3, 5)), rng.standard_normal((4, 5))
    check64(F.linear(np.matrix(x), np.matrix(w)), TF.linear(t64(x), t64(w)), "linear(np.matrix)")
    assert type(F.softmax(np.matrix(x))) is np.ndarray


def test_masked_arrays_are_refused(rng):
    q = rng.standard_normal((1, 3, 8)).astype(np.float32)
    km = np.ma.array([True, True, False], mask=[False, True, False])
    with pytest.raises(TypeError, match=r"^key_mask: expected an array, got a numpy masked array"):
        F.scaled_dot_product_attention(q, q, q, key_mask=km)
    with pytest.raises(TypeError, match=r"^x: expected an array, got a numpy masked array"):
        F.relu(np.ma.array([1.0, -1.0], mask=[True, False]))


# --------------------------------------------------------------------------------------------------
# 6. torch bfloat16 expanded views
# --------------------------------------------------------------------------------------------------

def test_bfloat16_expanded_view_is_size_checked_without_its_copy():
    huge = torch.ones(1, dtype=torch.bfloat16).expand(2**20, 2**20)  # 4 TiB as float32
    with pytest.raises(ValueError, match=r"^x: an array of shape \(1048576, 1048576\) needs 4398046511104 bytes"):
        F.relu(huge)


def test_bfloat16_expanded_view_values():
    t = torch.tensor([[1.5], [-2.25]], dtype=torch.bfloat16).expand(2, 3)
    np.testing.assert_array_equal(F.relu(t), torch.relu(t.float()).numpy())
    w = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)
    check64(F.linear(t, w), TF.linear(t.double(), w), "linear(bfloat16 expanded x, float64 weight)")
    inner = torch.tensor([1.0, -3.0, 0.125, 7.0], dtype=torch.bfloat16)[None, :, None].expand(2, 4, 3)
    np.testing.assert_allclose(F.softmax(inner, dim=1), torch.softmax(inner.float(), 1).numpy(), rtol=1e-6, atol=0)


# --------------------------------------------------------------------------------------------------
# 7. dtype=None: torch's default dtype (float32), as torch's dtype=None
# --------------------------------------------------------------------------------------------------

def test_dtype_none_is_torchs_default_float32(rng):
    """dtype=None was a TypeError in every ``dtype=`` argument; torch reads it as its default dtype."""
    import transformer_core as tc
    from transformer_core import masks, positional
    from transformer_core._validation import resolve_dtype

    assert torch.get_default_dtype() == torch.float32 and resolve_dtype(None) is np.float32
    x = rng.standard_normal((2, 2)).astype(np.float32)
    for ours, ref in ((nn.Linear(2, 3, dtype=None), torch.nn.Linear(2, 3, dtype=None)),
                      (nn.Embedding(5, 3, None), torch.nn.Embedding(5, 3, None)),
                      (nn.LayerNorm(2, dtype=None), torch.nn.LayerNorm(2, dtype=None))):
        assert ours.dtype == np.float32 and ours.weight.dtype == np.float32 == ref.weight.detach().numpy().dtype
        ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
        arg = np.array([[1, 4, 0]]) if isinstance(ours, nn.Embedding) else x
        out, want = ours(arg), ref(torch.from_numpy(arg)).detach().numpy()
        assert out.dtype == want.dtype == np.float32
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=type(ours).__name__)
    mask = nn.Transformer.generate_square_subsequent_mask(3, dtype=None)
    want = torch.nn.Transformer.generate_square_subsequent_mask(3, dtype=None).numpy()
    assert mask.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(mask, want)
    np.testing.assert_array_equal(masks.to_additive(np.tril(np.ones((3, 3), bool)), dtype=None), want)
    np.testing.assert_array_equal(positional.sinusoidal_positional_encoding(6, 4, dtype=None),
                                  positional.sinusoidal_positional_encoding(6, 4, dtype=np.float32))
    cos, sin = positional.rotary_cos_sin(5, 4, dtype=None)
    assert cos.dtype == sin.dtype == np.float32

    # a float32 layer takes a cache and tables made with dtype=None (another dtype is refused), and
    # gives the float32 ones' output
    cache, rotary = tc.KVCache(1, 1, 2, 4, dtype=None), positional.RotaryEmbedding(4, 16, dtype=None)
    assert cache.dtype == rotary.dtype == np.float32
    mha = nn.MultiheadAttention(8, 2, dtype=None)
    assert mha.dtype == np.float32
    q = rng.standard_normal((1, 3, 8)).astype(np.float32)
    out, _ = mha(q, past_key_values=cache, rotary=rotary, need_weights=False)
    want, _ = mha(q, past_key_values=tc.KVCache(1, 1, 2, 4, dtype=np.float32),
                  rotary=positional.RotaryEmbedding(4, 16, dtype=np.float32), need_weights=False)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, want)
