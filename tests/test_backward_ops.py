"""transformer_core.backward vs torch.autograd, computed in the test.

Every gradient of every op, for every input: fp64 to 1e-10 absolute, fp32 to 1e-4 relative (1e-5
absolute on the scale of the values). Shapes include odd sizes, seq 1, L != S, batch == seq and the
edges of the kernels' tiles (linear backward: 256 rows x 512 columns; attention backward: 64 x 64 blocks).
Bitwise equality of 1 and 2 threads for the linear, embedding and attention backward.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import transformer_core as tc
from conftest import DTYPE_IDS, FLOAT_DTYPES, atol, randn, to_torch
from transformer_core import backward as B
from transformer_core import functional as FT
from transformer_core._runtime import variant

TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def check(ours, ref, dtype, what=""):
    """fp64: 1e-10 absolute; fp32: 1e-4 relative, 1e-5 absolute on the scale of the reference."""
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    ours = np.asarray(ours)
    assert ours.dtype == np.dtype(dtype), f"{what}: dtype {ours.dtype} != {np.dtype(dtype)}"
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    if np.dtype(dtype) == np.float64:
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-10, err_msg=what)
    else:
        scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5 * scale, err_msg=what)


def leaf(a):
    return to_torch(a).requires_grad_(True)


@pytest.fixture
def threads():
    """Restores the thread count after a test that changes it."""
    n = tc.get_num_threads()
    yield
    tc.set_num_threads(n)


# --------------------------------------------------------------------------------------------------
# Linear
# --------------------------------------------------------------------------------------------------

LINEAR_SHAPES = [  # (x shape, out_features)
    ((7, 9), 5),
    ((1, 3), 4),          # one row
    ((2, 5, 7), 6),       # 3-D input
    ((257, 513), 257),    # tile edges: 256 rows + 1, 512 columns + 1, 256 weight rows + 1
    ((256, 512), 255),    # exactly one tile (and one weight row less)
    ((130, 17), 129),
    ((3, 1), 1),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("xshape,out", LINEAR_SHAPES, ids=[f"{s}->{o}" for s, o in LINEAR_SHAPES])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear_backward(rng, dtype, xshape, out, bias):
    x = randn(rng, xshape, dtype)
    w = randn(rng, (out, xshape[-1]), dtype, 0.3)
    b = randn(rng, (out,), dtype)
    gy = randn(rng, xshape[:-1] + (out,), dtype)
    xt, wt, bt = leaf(x), leaf(w), leaf(b)
    TF.linear(xt, wt, bt if bias else None).backward(to_torch(gy))
    gx, gw, gb = B.linear_backward(x, w, gy, bias=bias)
    check(gx, xt.grad, dtype, "grad_x")
    check(gw, wt.grad, dtype, "grad_weight")
    if bias:
        check(gb, bt.grad, dtype, "grad_bias")
    else:
        assert gb is None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("xshape,out", [((7, 9), 5), ((257, 513), 257)], ids=["small", "tiles"])
def test_linear_backward_conv1d_layout(rng, dtype, xshape, out):
    """weight_layout="in_out": Hugging Face's Conv1D (GPT-2), y = x W + b with W (in, out)."""
    x = randn(rng, xshape, dtype)
    w = randn(rng, (xshape[-1], out), dtype, 0.3)
    b = randn(rng, (out,), dtype)
    gy = randn(rng, xshape[:-1] + (out,), dtype)
    xt, wt, bt = leaf(x), leaf(w), leaf(b)
    (xt @ wt + bt).backward(to_torch(gy))
    gx, gw, gb = B.linear_backward(x, w, gy, weight_layout="in_out")
    check(gx, xt.grad, dtype, "grad_x")
    check(gw, wt.grad, dtype, "grad_weight")
    check(gb, bt.grad, dtype, "grad_bias")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_linear_backward_accumulates(rng, dtype):
    """grad_weight= / grad_bias=: the new gradient is added in place (two micro-batches = one batch)."""
    x = randn(rng, (70, 33), dtype)
    w = randn(rng, (20, 33), dtype, 0.3)
    gy = randn(rng, (70, 20), dtype)
    gw = np.zeros((20, 33), dtype)
    gb = np.zeros(20, dtype)
    for part in (slice(0, 40), slice(40, 70)):
        _, rw, rb = B.linear_backward(x[part], w, gy[part], grad_weight=gw, grad_bias=gb, need_grad_input=False)
        assert rw is gw and rb is gb
    _, fw, fb = B.linear_backward(x, w, gy)
    check(gw, fw, dtype, "accumulated grad_weight")
    check(gb, fb, dtype, "accumulated grad_bias")
    # only grad_weight given: grad_bias starts at zeros, grad_weight accumulates onto its contents
    start = randn(rng, (20, 33), dtype)
    acc = start.copy()
    _, _, gb2 = B.linear_backward(x, w, gy, grad_weight=acc)
    check(acc, start + fw, dtype, "grad_weight += ")
    check(gb2, fb, dtype, "fresh grad_bias")


def test_linear_backward_no_grad_input_and_zero_rows(rng):
    x = randn(rng, (5, 4))
    w = randn(rng, (3, 4))
    gx, gw, gb = B.linear_backward(x, w, randn(rng, (5, 3)), need_grad_input=False)
    assert gx is None and gw.shape == (3, 4) and gb.shape == (3,)
    gx, gw, gb = B.linear_backward(np.zeros((0, 4), np.float32), w, np.zeros((0, 3), np.float32))
    assert gx.shape == (0, 4)
    assert np.array_equal(gw, np.zeros((3, 4), np.float32)) and np.array_equal(gb, np.zeros(3, np.float32))


def test_linear_backward_threads_bitwise(rng, threads):
    x = randn(rng, (600, 700))
    w = randn(rng, (300, 700))
    gy = randn(rng, (600, 300))
    results = []
    for n in (1, 2):
        tc.set_num_threads(n)
        results.append(B.linear_backward(x, w, gy))
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_linear_backward_bad_input(rng):
    x = randn(rng, (5, 4))
    w = randn(rng, (3, 4))
    gy = randn(rng, (5, 3))
    with pytest.raises(ValueError, match="weight"):
        B.linear_backward(x, randn(rng, (3, 5)), gy)
    with pytest.raises(ValueError, match="grad_output"):
        B.linear_backward(x, w, randn(rng, (5, 4)))
    with pytest.raises(TypeError, match="grad_weight"):
        B.linear_backward(x, w, gy, grad_weight=np.zeros((3, 4), np.float64))
    with pytest.raises(ValueError, match="grad_weight"):
        B.linear_backward(x, w, gy, grad_weight=np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="grad_weight"):
        B.linear_backward(x, w, gy, grad_weight=np.zeros((4, 3), np.float32).T)
    with pytest.raises(ValueError, match="grad_bias"):
        B.linear_backward(x, w, gy, bias=False, grad_bias=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="weight_layout"):
        B.linear_backward(x, w, gy, weight_layout="io")
    with pytest.raises(TypeError, match="^x: expected a real numeric array"):
        B.linear_backward(np.array([["a"]]), w, gy)


# --------------------------------------------------------------------------------------------------
# Accumulation buffers apart from the inputs
# --------------------------------------------------------------------------------------------------

def _overlapping_buffer_calls(x, w, v, g, gw, ids):
    """``{case: (call, buffer argument, the argument it overlaps)}``: every backward that takes
    accumulation buffers, given as a buffer (a view of) an array its kernel reads while it adds into
    the buffer, or its other buffer. ``x``, ``g``: (300, 128); ``w``, ``gw``: (128, 128); ``v``:
    (128,); ``ids``: (128,) in [0, 128)."""
    t = torch.from_numpy
    return {
        # the reported case: grad_x = grad_y · W read W while other tiles added dW into it
        "linear_grad_weight_is_weight": (lambda: B.linear_backward(x, w, g, grad_weight=w), "grad_weight", "weight"),
        "linear_in_out_grad_weight_is_weight": (
            lambda: B.linear_backward(x, w, g, weight_layout="in_out", grad_weight=w), "grad_weight", "weight"),
        "linear_no_grad_input_grad_weight_in_x": (
            lambda: B.linear_backward(x, w, g, need_grad_input=False, grad_weight=x[:128]), "grad_weight", "x"),
        "linear_grad_bias_in_grad_output": (
            lambda: B.linear_backward(x, w, g, grad_bias=g[5]), "grad_bias", "grad_output"),
        "linear_grad_bias_in_grad_weight": (
            lambda: B.linear_backward(x, w, g, grad_weight=gw, grad_bias=gw[3]), "grad_bias", "grad_weight"),
        "linear_torch_tensors_and_a_numpy_view": (  # torch.from_numpy shares w's memory
            lambda: B.linear_backward(t(x), t(w), t(g), grad_weight=w), "grad_weight", "weight"),
        "layer_norm_grad_weight_is_weight": (
            lambda: B.layer_norm_backward(x, v, g, grad_weight=v), "grad_weight", "weight"),
        "layer_norm_grad_bias_in_x": (lambda: B.layer_norm_backward(x, v, g, grad_bias=x[7]), "grad_bias", "x"),
        "layer_norm_grad_bias_is_grad_weight": (
            lambda: B.layer_norm_backward(x, v, g, grad_weight=gw[0], grad_bias=gw[0]), "grad_bias", "grad_weight"),
        "rms_norm_grad_weight_is_weight": (
            lambda: B.rms_norm_backward(x, v, g, grad_weight=v), "grad_weight", "weight"),
        "rms_norm_grad_weight_in_grad_output": (
            lambda: B.rms_norm_backward(x, v, g, grad_weight=g[1]), "grad_weight", "grad_output"),
        "embedding_grad_weight_in_grad_output": (
            lambda: B.embedding_backward(ids, g[:128], 128, grad_weight=g[:128]), "grad_weight", "grad_output"),
    }


OVERLAP_CASES = list(_overlapping_buffer_calls(*[None] * 6))


@pytest.mark.parametrize("case", OVERLAP_CASES)
def test_accumulation_buffer_sharing_memory_with_an_input_is_refused(rng, case):
    """An accumulation buffer (grad_weight=, grad_bias=) that shares memory with an input the kernel
    reads while it adds into the buffer, or with the other buffer, is a ValueError naming both
    (``linear_backward(x, W, g, grad_weight=W)`` gave a grad_x off by hundreds, silently); nothing
    is written."""
    x, g = randn(rng, (300, 128), np.float64), randn(rng, (300, 128), np.float64)
    w, v = randn(rng, (128, 128), np.float64), randn(rng, (128,), np.float64)
    gw, ids = np.zeros((128, 128)), rng.integers(0, 128, size=128)
    arrays = (x, w, v, g, gw, ids)
    kept = [a.copy() for a in arrays]
    call, buffer, other = _overlapping_buffer_calls(*arrays)[case]
    with pytest.raises(ValueError, match=rf"^{buffer}: must not share memory with {other} \(the op reads or "
                                         rf"updates {other} in parallel tasks while it adds into {buffer}: "):
        call()
    assert all(np.array_equal(a, b) for a, b in zip(arrays, kept))


def test_accumulation_buffers_in_one_arena_apart_from_the_inputs_are_torchs(rng):
    """Buffers that are disjoint views of one array (a flat gradient arena), and inputs that are
    disjoint views of another, are taken: the accumulated gradients are torch's."""
    rows, n_in, n_out = 300, 40, 30
    inputs = randn(rng, (rows * n_in + n_out * n_in + rows * n_out,), np.float64)  # x, weight, grad_output
    x = inputs[:rows * n_in].reshape(rows, n_in)
    w = inputs[rows * n_in:rows * n_in + n_out * n_in].reshape(n_out, n_in)
    g = inputs[rows * n_in + n_out * n_in:].reshape(rows, n_out)
    arena = randn(rng, (n_out * n_in + n_out,), np.float64)  # grad_weight, then grad_bias: what they held
    start = arena.copy()
    gw, gb = arena[:n_out * n_in].reshape(n_out, n_in), arena[n_out * n_in:]
    gx, rw, rb = B.linear_backward(x, w, g, grad_weight=gw, grad_bias=gb)
    assert rw is gw and rb is gb
    xt, wt, bt = leaf(x), leaf(w), leaf(np.zeros(n_out))
    TF.linear(xt, wt, bt).backward(to_torch(g))
    check(gx, xt.grad, np.float64, "grad_x")
    check(gw, start[:n_out * n_in].reshape(n_out, n_in) + wt.grad.numpy(), np.float64, "grad_weight +=")
    check(gb, start[n_out * n_in:] + bt.grad.numpy(), np.float64, "grad_bias +=")
    # interleaved in one buffer without touching (their memory bounds overlap): apart, taken
    both = randn(rng, (rows, n_in + n_out), np.float64)
    x2, gb2 = both[:, :n_in], both[7, n_in:]  # x's columns and, inside x's bounds, a bias gradient's
    kept = gb2.copy()
    B.linear_backward(np.ascontiguousarray(x2), w, g, grad_bias=gb2)  # x given as a copy: the reference
    expected = gb2.copy()
    gb2[:] = kept
    B.linear_backward(x2, w, g, grad_bias=gb2)
    np.testing.assert_array_equal(gb2, expected)


# --------------------------------------------------------------------------------------------------
# LayerNorm, RMSNorm
# --------------------------------------------------------------------------------------------------

NORM_SHAPES = [(3, 7), (1, 1, 64), (2, 5, 65), (4, 130), (7, 7, 7)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=[str(s) for s in NORM_SHAPES])
@pytest.mark.parametrize("affine", ["weight_bias", "weight", "none"])
def test_layer_norm_backward(rng, dtype, shape, affine):
    e = shape[-1]
    x = randn(rng, shape, dtype) * 2 + 0.5
    w = 1 + randn(rng, (e,), dtype, 0.3)
    b = randn(rng, (e,), dtype)
    gy = randn(rng, shape, dtype)
    xt, wt, bt = leaf(x), leaf(w), leaf(b)
    TF.layer_norm(xt, (e,), wt if affine != "none" else None, bt if affine == "weight_bias" else None,
                  eps=1e-5).backward(to_torch(gy))
    gx, gw, gb = B.layer_norm_backward(x, w if affine != "none" else None, gy, 1e-5, bias=affine == "weight_bias")
    check(gx, xt.grad, dtype, "grad_x")
    if affine == "none":
        assert gw is None and gb is None
    else:
        check(gw, wt.grad, dtype, "grad_weight")
        if affine == "weight_bias":
            check(gb, bt.grad, dtype, "grad_bias")
        else:
            assert gb is None


# grad_weight and grad_bias: each row's terms go into its chunk's partial sums (chunks of 32 rows,
# or of rows / 256 past 8192 rows), a register of 4 doubles (AVX2) or 8 (AVX-512) at a time, the
# last columns one by one; then the chunks are added in order. Widths at the registers' edges, row
# counts at the chunks'.
PARAM_GRAD_WIDTHS = [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 65]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 6, 31, 32, 33, 65, 8192, 8193, 9001])
@pytest.mark.parametrize("e", PARAM_GRAD_WIDTHS)
def test_norm_parameter_gradients_at_register_edges(rng, dtype, rows, e):
    x = randn(rng, (rows, e), dtype) * 2 + 0.5
    w = 1 + randn(rng, (e,), dtype, 0.3)
    b = randn(rng, (e,), dtype)
    gy = randn(rng, (rows, e), dtype)
    xt, wt, bt = leaf(x), leaf(w), leaf(b)
    TF.layer_norm(xt, (e,), wt, bt, eps=1e-5).backward(to_torch(gy))
    _, gw, gb = B.layer_norm_backward(x, w, gy, 1e-5)
    if e == 1:  # x̂ = 0 exactly: torch's grad_weight is its rounding (~1e-5), ours 0
        np.testing.assert_array_equal(gw, np.zeros(1, dtype))
    else:
        check(gw, wt.grad, dtype, "layer_norm grad_weight")
    check(gb, bt.grad, dtype, "layer_norm grad_bias")
    xt, wt = leaf(x), leaf(w)
    TF.rms_norm(xt, (e,), wt, eps=1e-6).backward(to_torch(gy))
    _, gw = B.rms_norm_backward(x, w, gy, eps=1e-6)
    check(gw, wt.grad, dtype, "rms_norm grad_weight")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_norm_backward_threads_bitwise(rng, dtype, threads):
    """The chunks of rows are cut by the shape alone: the same bits on 1, 2 and 3 threads (1000 rows
    of 70: 32 chunks, enough for 3 threads; 9001 rows: 251 chunks of 36 rows)."""
    for rows in (1000, 9001):
        x = randn(rng, (rows, 70), dtype) * 2 + 0.5
        w = 1 + randn(rng, (70,), dtype, 0.3)
        gy = randn(rng, (rows, 70), dtype)
        results = []
        for n in (1, 2, 3):
            tc.set_num_threads(n)
            results.append(B.layer_norm_backward(x, w, gy) + B.rms_norm_backward(x, w, gy, eps=1e-6))
        for other in results[1:]:
            for a, b in zip(results[0], other):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_layer_norm_backward_accumulates(rng, dtype):
    x = randn(rng, (6, 9), dtype)
    w = 1 + randn(rng, (9,), dtype, 0.3)
    gy = randn(rng, (6, 9), dtype)
    _, fw, fb = B.layer_norm_backward(x, w, gy)
    gw, gb = np.ones(9, dtype), np.zeros(9, dtype)
    B.layer_norm_backward(x, w, gy, grad_weight=gw, grad_bias=gb)
    check(gw, 1 + fw, dtype, "grad_weight +=")
    check(gb, fb, dtype, "grad_bias +=")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=[str(s) for s in NORM_SHAPES])
@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "noweight"])
def test_rms_norm_forward_backward(rng, dtype, shape, weighted):
    e = shape[-1]
    x = randn(rng, shape, dtype) + 0.3
    w = 1 + randn(rng, (e,), dtype, 0.3)
    gy = randn(rng, shape, dtype)
    xt, wt = leaf(x), leaf(w)
    yt = TF.rms_norm(xt, (e,), wt if weighted else None, eps=1e-6)
    yt.backward(to_torch(gy))
    check(FT.rms_norm(x, w if weighted else None, eps=1e-6), yt, dtype, "rms_norm")
    gx, gw = B.rms_norm_backward(x, w if weighted else None, gy, eps=1e-6)
    check(gx, xt.grad, dtype, "grad_x")
    if weighted:
        check(gw, wt.grad, dtype, "grad_weight")
        acc = np.full(e, 2, dtype)
        B.rms_norm_backward(x, w, gy, eps=1e-6, grad_weight=acc)
        check(acc, 2 + wt.grad.numpy(), dtype, "grad_weight +=")
    else:
        assert gw is None


def test_norm_backward_bad_input(rng):
    x = randn(rng, (3, 4))
    with pytest.raises(ValueError, match="weight"):
        B.layer_norm_backward(x, np.ones(5, np.float32), x)
    with pytest.raises(ValueError, match="grad_output"):
        B.layer_norm_backward(x, None, x[:2])
    with pytest.raises(ValueError, match="eps"):
        B.rms_norm_backward(x, None, x, eps=-1.0)
    with pytest.raises(ValueError, match="grad_weight"):
        B.rms_norm_backward(x, None, x, grad_weight=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="grad_weight"):
        B.layer_norm_backward(x, None, x, grad_weight=np.zeros(4, np.float32))


# --------------------------------------------------------------------------------------------------
# Activations and gated units
# --------------------------------------------------------------------------------------------------

ACT_SHAPES = [(1,), (7, 13), (2, 3, 65), (5000,)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", ACT_SHAPES, ids=[str(s) for s in ACT_SHAPES])
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "relu"])
def test_activation_backward(rng, dtype, shape, name):
    x = randn(rng, shape, dtype, 3.0)
    x.reshape(-1)[0] = 0.0  # the kink of ReLU: torch's gradient there is 0
    gy = randn(rng, shape, dtype)
    xt = leaf(x)
    torch_fn = {"gelu": lambda t: TF.gelu(t), "gelu_tanh": lambda t: TF.gelu(t, approximate="tanh"),
                "silu": TF.silu, "relu": TF.relu}[name]
    yt = torch_fn(xt)
    yt.backward(to_torch(gy))
    ours = {"gelu": lambda: B.gelu_backward(x, gy), "gelu_tanh": lambda: B.gelu_backward(x, gy, approximate="tanh"),
            "silu": lambda: B.silu_backward(x, gy), "relu": lambda: B.relu_backward(x, gy)}[name]()
    check(ours, xt.grad, dtype, f"{name} backward")
    if name == "silu":
        check(FT.silu(x), yt, dtype, "silu forward")


#: torch's function of each name of the library's table of activations (``_core.activation_names()``).
_TORCH_ACTIVATIONS = {"silu": TF.silu, "swish": TF.silu, "gelu": TF.gelu, "relu": TF.relu, "tanh": torch.tanh,
                      "gelu_tanh": lambda t: TF.gelu(t, approximate="tanh"),
                      "gelu_new": lambda t: TF.gelu(t, approximate="tanh"),
                      "gelu_pytorch_tanh": lambda t: TF.gelu(t, approximate="tanh")}


def test_glu_is_tested_for_the_whole_activation_table():
    """glu / glu_backward take every name of the core's table (documented so): each is tested below."""
    from transformer_core._runtime import core

    assert sorted(core.activation_names()) == sorted(_TORCH_ACTIVATIONS)
    doc = " ".join(B.glu_backward.__doc__.split())
    assert "a name of the library's table of activations" in doc
    assert all(f'"{name}"' in doc for name in _TORCH_ACTIVATIONS)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("activation", list(_TORCH_ACTIVATIONS))
@pytest.mark.parametrize("shape", [(3, 11), (2, 4, 130)], ids=["2d", "3d"])
def test_glu_forward_backward(rng, dtype, activation, shape):
    gate = randn(rng, shape, dtype, 2.0)
    up = randn(rng, shape, dtype)
    gh = randn(rng, shape, dtype)
    gt, ut = leaf(gate), leaf(up)
    ht = _TORCH_ACTIVATIONS[activation](gt) * ut
    ht.backward(to_torch(gh))
    check(FT.glu(gate, up, activation), ht, dtype, "glu forward")
    dg, du = B.glu_backward(gate, up, gh, activation)
    check(dg, gt.grad, dtype, "grad_gate")
    check(du, ut.grad, dtype, "grad_up")


def test_activation_bad_input(rng):
    x = randn(rng, (3, 4))
    with pytest.raises(ValueError, match="grad_output"):
        B.silu_backward(x, x[:, :2])
    with pytest.raises(ValueError, match="approximate"):
        B.gelu_backward(x, x, approximate="erf")
    with pytest.raises(ValueError, match=r"^activation: expected one of 'relu', .*got 'sigmoid'"):
        B.glu_backward(x, x, x, "sigmoid")
    with pytest.raises(TypeError, match=r"^activation: expected a str, got int"):
        B.glu_backward(x, x, x, 1)
    with pytest.raises(ValueError, match=r"^up: expected the shape of gate"):
        FT.glu(x, x[:1])


# --------------------------------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", [((4, 9), -1), ((3, 5, 7), 1), ((1, 1), -1), ((2, 70), 0)])
def test_softmax_backward(rng, dtype, shape, axis):
    x = randn(rng, shape, dtype, 2.0)
    gy = randn(rng, shape, dtype)
    xt = leaf(x)
    pt = torch.softmax(xt, dim=axis)
    pt.backward(to_torch(gy))
    check(B.softmax_backward(pt.detach().numpy(), gy, dim=axis), xt.grad, dtype, "softmax backward")


def test_softmax_backward_axis_keyword_still_works_with_a_deprecation_warning(rng):
    """``dim`` is torch's name; ``axis=`` (the former one) gives the same gradient with a warning,
    and both at once are refused."""
    p = FT.softmax(randn(rng, (3, 5), np.float64), dim=0)
    g = randn(rng, (3, 5), np.float64)
    with pytest.warns(DeprecationWarning, match=r"axis= is deprecated, use dim= \(torch's name\)"):
        old = B.softmax_backward(p, g, axis=0)
    np.testing.assert_array_equal(old, B.softmax_backward(p, g, dim=0))
    assert not np.array_equal(old, B.softmax_backward(p, g, dim=1))
    with pytest.raises(TypeError, match=r"^axis: the former name of dim; got both"):
        B.softmax_backward(p, g, axis=0, dim=0)


def test_cross_entropy_backward_takes_a_0d_tensor_as_grad_output(rng):
    """A reduced loss's gradient as torch gives it (a 0-d tensor) is a scale, as a 0-d array and a
    float are."""
    logits = randn(rng, (4, 7), np.float32)
    target = np.array([0, 3, 6, 2])
    lt = leaf(logits)
    TF.cross_entropy(lt, torch.from_numpy(target)).backward(torch.tensor(0.5))
    for scale in (torch.tensor(0.5), torch.tensor(0.5, dtype=torch.bfloat16), torch.tensor(0.5, requires_grad=True),
                  np.array(0.5), 0.5):
        grad = B.cross_entropy_backward(logits, target, grad_output=scale)
        check(grad, lt.grad, np.float32, f"cross_entropy backward, grad_output {type(scale).__name__}")
    with pytest.raises(TypeError, match=r"^grad_output: expected a scalar .*, got Tensor"):
        B.cross_entropy_backward(logits, target, grad_output=torch.ones(2))


@pytest.mark.parametrize("call", ["cross_entropy_backward", "cross_entropy_with_grad"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_grad_output_too_large_for_a_float_is_a_value_error(rng, call, reduction):
    """A scalar grad_output no float holds (10**400, of any reduction) is a ValueError naming it
    (it was float()'s OverflowError); ±inf and NaN are scales as torch's backward takes them: the
    gradient is torch's, inf and NaN included."""
    logits = randn(rng, (4, 7), np.float32)
    target = np.array([0, 3, 6, 2])
    fn = getattr(B, call)
    for huge in (10**400, -(10**400)):
        with pytest.raises(ValueError, match=r"^grad_output: expected a float, got int of 1329 bits \(too large "
                                             r"for a float\)$"):
            fn(logits, target, grad_output=huge, reduction=reduction)
    for scale in (math.inf, -math.inf, math.nan, np.float32(math.inf)):
        lt = leaf(logits)
        loss = TF.cross_entropy(lt, torch.from_numpy(target), reduction=reduction)
        loss.backward(torch.full_like(loss, float(scale)))
        grad = B.cross_entropy_backward(logits, target, grad_output=scale, reduction=reduction)
        if call == "cross_entropy_with_grad":
            grad = B.cross_entropy_with_grad(logits, target, grad_output=scale, reduction=reduction)[1]
        assert grad.dtype == np.float32
        ref = lt.grad.numpy()
        np.testing.assert_array_equal(np.isnan(grad), np.isnan(ref), err_msg=f"NaNs, grad_output {scale}")
        np.testing.assert_array_equal(np.isinf(grad), np.isinf(ref), err_msg=f"infs, grad_output {scale}")
        np.testing.assert_array_equal(np.sign(grad[~np.isnan(grad)]), np.sign(ref[~np.isnan(ref)]))
        assert np.isinf(ref).any() or np.isnan(ref).all()  # the case is not vacuous


def test_softmax_backward_masked_rows(rng):
    """Masked entries (p = 0) get 0; a fully masked row (ours: p = 0 everywhere) gets zeros, not NaN."""
    x = randn(rng, (3, 6), np.float64)
    x[0, :2] = -np.inf
    x[2, :] = -np.inf
    p = tc.functional.softmax(x)
    gy = randn(rng, (3, 6), np.float64)
    dx = B.softmax_backward(p, gy)
    xt = leaf(x[:2])
    torch.softmax(xt, -1).backward(to_torch(gy[:2]))
    check(dx[:2], xt.grad, np.float64, "rows with visible entries")
    assert np.array_equal(dx[2], np.zeros(6)) and np.all(dx[0, :2] == 0)


# --------------------------------------------------------------------------------------------------
# Embedding
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("ids_shape,V,H", [((2, 7), 11, 5), ((1,), 3, 1), ((4, 33), 50, 130), ((300,), 7, 64)])
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_backward(rng, dtype, ids_shape, V, H, padding_idx):
    ids = rng.integers(0, V, size=ids_shape)
    ids.reshape(-1)[0] = 2 % V  # make sure the padding row appears
    W = randn(rng, (V, H), dtype)
    gy = randn(rng, ids_shape + (H,), dtype)
    Wt = leaf(W)
    TF.embedding(torch.from_numpy(ids), Wt, padding_idx=padding_idx).backward(to_torch(gy))
    check(B.embedding_backward(ids, gy, V, padding_idx=padding_idx), Wt.grad, dtype, "grad_weight")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_embedding_backward_accumulates(rng, dtype):
    """Tied embeddings: the lookup's gradient adds onto the output projection's."""
    ids = rng.integers(0, 9, size=(3, 4))
    gy = randn(rng, (3, 4, 6), dtype)
    start = randn(rng, (9, 6), dtype)
    acc = start.copy()
    out = B.embedding_backward(ids, gy, 9, grad_weight=acc)
    assert out is acc
    check(acc, start + B.embedding_backward(ids, gy, 9), dtype, "grad_weight +=")


@pytest.mark.parametrize("ids_dtype", [np.float64, np.float32, np.float16])
def test_embedding_backward_takes_whole_number_float_ids(rng, ids_dtype):
    """Float ids of whole numbers were a TypeError here, while nn.Embedding.forward and the models
    take them (as_ids): the same gradient as their int64 ids, and as torch's with int ids."""
    V, H = 11, 5
    ids = rng.integers(0, V, size=(3, 7))
    gy = randn(rng, (3, 7, H), np.float64)
    Wt = leaf(randn(rng, (V, H), np.float64))
    TF.embedding(torch.from_numpy(ids), Wt, padding_idx=2).backward(to_torch(gy))
    ours = B.embedding_backward(ids.astype(ids_dtype), gy, V, padding_idx=2)
    assert np.array_equal(ours, B.embedding_backward(ids, gy, V, padding_idx=2))
    check(ours, Wt.grad, np.float64, "grad_weight, float ids")
    check(B.embedding_backward(np.zeros((0, 4), ids_dtype), np.zeros((0, 4, H)), V), np.zeros((V, H)), np.float64,
          "no float ids")
    fractional = ids.astype(ids_dtype)
    fractional[1, 3] += ids_dtype(0.5)
    with pytest.raises(TypeError, match=r"^ids: expected integer token ids, got dtype \w+ with non-integral values$"):
        B.embedding_backward(fractional, gy, V)
    with pytest.raises(TypeError, match=r"^ids: expected integer token ids, got dtype \w+ with non-finite values$"):
        B.embedding_backward(np.where(ids == ids[0, 0], np.nan, ids).astype(ids_dtype), gy, V)
    with pytest.raises(ValueError, match=r"^ids: expected values in \[0, 11\), got 11 at index \(0, 0\)$"):
        B.embedding_backward(np.full((3, 7), 11.0, ids_dtype), gy, V)


def test_embedding_backward_threads_bitwise(rng, threads):
    ids = rng.integers(0, 100, size=(4000,))
    gy = randn(rng, (4000, 256))
    tc.set_num_threads(1)
    a = B.embedding_backward(ids, gy, 100)
    tc.set_num_threads(2)
    b = B.embedding_backward(ids, gy, 100)
    assert np.array_equal(a, b)


def test_embedding_backward_bad_input(rng):
    gy = randn(rng, (2, 3, 4))
    ids = np.zeros((2, 3), np.int64)
    with pytest.raises(ValueError, match="ids"):
        B.embedding_backward(ids + 5, gy, 5)
    with pytest.raises(ValueError, match="ids"):
        B.embedding_backward(ids - 1, gy, 5)
    with pytest.raises(TypeError, match="ids"):
        B.embedding_backward(ids.astype(bool), gy, 5)
    with pytest.raises(ValueError, match="grad_output"):
        B.embedding_backward(ids, gy[:1], 5)
    with pytest.raises(ValueError, match="padding_idx"):
        B.embedding_backward(ids, gy, 5, padding_idx=5)
    with pytest.raises(ValueError, match="num_embeddings"):
        B.embedding_backward(ids, gy, 0)


# --------------------------------------------------------------------------------------------------
# Rotary
# --------------------------------------------------------------------------------------------------

def torch_rotary(x, cos, sin, layout):
    if layout == "half":
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin
    h = x.shape[-1] // 2
    c, s = cos[..., :h], sin[..., :h]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 3, 7, 8), (1, 2, 65, 64)], ids=["one", "small", "long"])
def test_rotary_backward(rng, dtype, layout, shape):
    L, D = shape[-2:]
    cos, sin = tc.positional.rotary_cos_sin(L, D, dtype=dtype)
    x = randn(rng, shape, dtype)
    gy = randn(rng, shape, dtype)
    xt = leaf(x)
    yt = torch_rotary(xt, to_torch(cos), to_torch(sin), layout)
    check(tc.positional.apply_rotary(x, cos, sin, layout), yt, dtype, "forward (sanity)")
    yt.backward(to_torch(gy))
    check(B.rotary_backward(gy, cos, sin, layout), xt.grad, dtype, "grad_x")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("shape", [(2, 3, 3, 8), (2, 5, 3, 8)], ids=["L_eq_H", "L_ne_H"])
def test_rotary_backward_with_hf_tables_and_the_head_axis_at_2(rng, dtype, layout, shape):
    """x (N, L, H, D) with Hugging Face's (N, L, D) tables, the head axis at unsqueeze_dim=2: the
    backward takes the forward's unsqueeze_dim (it always put the axis at 1: wrong gradients when
    L == H, a refusal otherwise)."""
    N, L, H, D = shape
    cos2, sin2 = tc.positional.rotary_cos_sin(L + 3, D, dtype=dtype)
    pos = rng.integers(0, L + 3, size=(N, L))
    cos, sin = cos2[pos], sin2[pos]  # (N, L, D): per-row positions
    x = randn(rng, shape, dtype)
    gy = randn(rng, shape, dtype)
    xt = leaf(x)
    yt = torch_rotary(xt, to_torch(cos).unsqueeze(2), to_torch(sin).unsqueeze(2), layout)
    check(tc.positional.apply_rotary(x, cos, sin, layout, unsqueeze_dim=2), yt, dtype, "forward (sanity)")
    yt.backward(to_torch(gy))
    check(B.rotary_backward(gy, cos, sin, layout, unsqueeze_dim=2), xt.grad, dtype, "grad_x")
    with pytest.raises(TypeError, match="^unsqueeze_dim: expected an int"):
        B.rotary_backward(gy, cos, sin, layout, unsqueeze_dim=2.0)


def test_rotary_backward_is_rotation_by_minus_theta(rng):
    cos, sin = tc.positional.rotary_cos_sin(5, 6, dtype=np.float64)
    g = randn(rng, (2, 5, 6), np.float64)
    check(B.rotary_backward(g, cos, sin), tc.positional.apply_rotary(g, cos, -sin), np.float64, "R(-θ)")


# --------------------------------------------------------------------------------------------------
# Dropout
# --------------------------------------------------------------------------------------------------

def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 (Salmon et al. 2011) in numpy, independent of the C++ kernel:
    counter (n, 4) uint32 -> (n, 4) uint32."""
    M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    c = counter.astype(np.uint64)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = M0 * c[:, 0], M1 * c[:, 2]
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & mask, p1 >> np.uint64(32), p1 & mask
        c = np.stack([hi1 ^ c[:, 1] ^ k0, lo1, hi0 ^ c[:, 3] ^ k1, lo0], axis=1)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return c.astype(np.uint32)


def test_philox_known_answers():
    """Random123's known-answer vectors for Philox4x32-10 (checks the numpy reference)."""
    kat = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, expected in kat:
        assert tuple(philox4x32_10(np.array([ctr], np.uint32), key)[0]) == expected


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_dropout_mask_is_philox(rng, dtype):
    """keep_i = Philox(counter = i / 4, key = seed)[i mod 4] >= ceil(p · 2³²); kept values x / (1 - p)."""
    n, p, seed = 1001, 0.3, 0x123456789ABCDEF0
    x = randn(rng, (n,), dtype) + 5.0  # no zeros
    y = FT.dropout(x, p, seed)
    blocks = np.arange((n + 3) // 4, dtype=np.uint64)
    counter = np.stack([blocks & np.uint64(0xFFFFFFFF), blocks >> np.uint64(32), 0 * blocks, 0 * blocks], 1)
    bits = philox4x32_10(counter.astype(np.uint32), (seed & 0xFFFFFFFF, seed >> 32)).reshape(-1)[:n]
    keep = bits.astype(np.uint64) >= np.uint64(math.ceil(p * 2**32))
    assert np.array_equal(y != 0, keep)
    scale = dtype(1) / dtype(1 - p)
    assert np.array_equal(y[keep], x[keep] * scale)


def test_dropout_statistics_and_backward(rng):
    x = randn(rng, (200, 500), np.float64) + 10.0
    for p in (0.1, 0.5, 0.9):
        y = FT.dropout(x, p, seed=7)
        kept = np.count_nonzero(y) / y.size
        sigma = math.sqrt(p * (1 - p) / y.size)
        assert abs(kept - (1 - p)) < 5 * sigma, (p, kept)
        assert abs(y.mean() / x.mean() - 1.0) < 0.02  # inverted dropout keeps the mean
        gy = randn(rng, x.shape, np.float64)
        gx = B.dropout_backward(gy, p, seed=7)
        keep = y != 0
        np.testing.assert_array_equal(gx[~keep], 0.0)
        np.testing.assert_allclose(gx[keep], gy[keep] / (1 - p), rtol=1e-15)
        # as torch's autograd on the same mask: d(x · mask / (1 - p))/dx
        xt = leaf(x)
        (xt * to_torch(keep.astype(np.float64)) / (1 - p)).backward(to_torch(gy))
        check(gx, xt.grad, np.float64, "dropout backward")
    # another seed, another mask; the same seed, the same mask in float32 and float64
    assert not np.array_equal(FT.dropout(x, 0.5, 1) != 0, FT.dropout(x, 0.5, 2) != 0)
    assert np.array_equal(FT.dropout(x, 0.5, 3) != 0, FT.dropout(x.astype(np.float32), 0.5, 3) != 0)


def test_dropout_backward_of_non_finite_gradients_as_torch(rng):
    """A dropped NaN or ±inf gradient is NaN, as torch's autograd gives (the product with the scaled
    mask), with p = 1 too; kept ones are scaled as the others."""
    gy = randn(rng, (4, 50), np.float64)
    gy[:, ::7] = np.nan
    gy[:, 3::7] = np.inf
    for p in (0.5, 1.0):
        keep = FT.dropout(np.ones_like(gy), p, seed=11) != 0
        gx = B.dropout_backward(gy, p, seed=11)
        xt = leaf(np.ones_like(gy))
        (xt * to_torch(keep.astype(np.float64)) / (1 - p if p < 1 else 1.0)).backward(to_torch(gy))
        with np.errstate(invalid="ignore"):  # inf · 0
            want = xt.grad.numpy() if p < 1 else gy * 0.0
        np.testing.assert_array_equal(np.isnan(gx), np.isnan(want), err_msg=f"p={p}")
        np.testing.assert_array_equal(gx[~np.isnan(gx)], want[~np.isnan(want)], err_msg=f"p={p}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_dropout_backward_takes_the_forwards_seed_rule(rng, dtype):
    """The backward takes the (p, seed) its forward takes: seed=None (or no seed) where no mask is
    drawn, p=0, where it is the identity, as torch's autograd of F.dropout(x, 0.0) (it raised
    "expected an int, got NoneType" and "missing 1 required positional argument"). With p > 0 a
    None seed is a ValueError naming seed: the mask is regenerated from the forward's seed. A seed
    of another type says that None is valid too."""
    x, gy = randn(rng, (4, 6), dtype), randn(rng, (4, 6), dtype)
    gy[0, :2] = [np.nan, np.inf]
    y = FT.dropout(x, 0.0, None)
    xt = leaf(x)
    TF.dropout(xt, 0.0).backward(to_torch(gy))
    for gx in (B.dropout_backward(gy, 0.0, None), B.dropout_backward(gy, 0.0), B.dropout_backward(gy, p=0.0)):
        assert gx.dtype == y.dtype and gx.shape == y.shape
        np.testing.assert_array_equal(gx, xt.grad.numpy())
    np.testing.assert_array_equal(B.dropout_backward(gy, 0.0), B.dropout_backward(gy, 0.0, 123))
    for p in (0.3, 1.0):
        with pytest.raises(ValueError, match=rf"^seed: the backward of a dropout with p > 0 \(p={p}\) regenerates "
                                             r"the forward's mask from its seed: .* got None$"):
            B.dropout_backward(gy, p)
    for bad, what in (("a", "str 'a'"), (1.0, "float 1.0"), (True, "bool True")):
        with pytest.raises(TypeError, match=rf"^seed: expected an int or None, got {what}$"):
            B.dropout_backward(gy, 0.0, bad)


def test_dropout_edges_and_threads(rng, threads):
    x = randn(rng, (3, 5)) + 4
    assert np.array_equal(FT.dropout(x, 0.0, 1), x)
    assert np.array_equal(FT.dropout(x, 1.0, 1), np.zeros_like(x))
    assert np.array_equal(B.dropout_backward(x, 1.0, 1), np.zeros_like(x))
    assert np.array_equal(FT.dropout(x, 0.5, 1, training=False), x)
    big = randn(rng, (300_001,))
    tc.set_num_threads(1)
    a = FT.dropout(big, 0.4, 99)
    tc.set_num_threads(2)
    assert np.array_equal(a, FT.dropout(big, 0.4, 99))
    with pytest.raises(ValueError, match=r"^p: expected a finite number in \[0.0, 1.0\], got 1.5"):
        FT.dropout(x, 1.5, 1)
    with pytest.raises(ValueError, match="seed"):
        FT.dropout(x, 0.5, -1)
    with pytest.raises(TypeError, match="seed"):
        B.dropout_backward(x, 0.5, 1.5)


# --------------------------------------------------------------------------------------------------
# Cross-entropy
# --------------------------------------------------------------------------------------------------

def torch_cross_entropy(logits, target, ignore_index, label_smoothing, reduction):
    """torch's F.cross_entropy with the class dim last (torch wants it at dim 1)."""
    lt = leaf(logits)
    x = lt.reshape(-1, logits.shape[-1])
    loss = TF.cross_entropy(x, torch.from_numpy(target.reshape(-1)), ignore_index=ignore_index,
                            label_smoothing=label_smoothing, reduction=reduction)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return lt, loss


CE_CASES = [((5,), 7), ((2, 9), 11), ((1,), 1), ((3, 4), 130), ((2, 3), 1000)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,V", CE_CASES, ids=[f"{lead}x{V}" for lead, V in CE_CASES])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(rng, dtype, lead, V, label_smoothing, reduction):
    logits = randn(rng, lead + (V,), dtype, 3.0)
    target = rng.integers(0, V, size=lead)
    if target.size > 2:
        target.reshape(-1)[1] = -100  # an ignored row
    lt, loss_t = torch_cross_entropy(logits, target, -100, label_smoothing, reduction)
    grad_output = randn(rng, lead, dtype) if reduction == "none" else 0.7
    loss_t.backward(to_torch(np.asarray(grad_output, dtype)) if reduction == "none" else
                    torch.tensor(grad_output, dtype=TORCH[np.dtype(dtype)]))
    loss = FT.cross_entropy(logits, target, label_smoothing=label_smoothing, reduction=reduction)
    check(np.asarray(loss), loss_t, dtype, "loss")
    grad = B.cross_entropy_backward(logits, target, grad_output, label_smoothing=label_smoothing,
                                    reduction=reduction)
    check(grad, lt.grad, dtype, "grad_logits")
    fused_loss, fused_grad = B.cross_entropy_with_grad(logits, target, label_smoothing=label_smoothing,
                                                       reduction=reduction, grad_output=grad_output)
    assert np.array_equal(np.asarray(fused_loss), np.asarray(loss)) and np.array_equal(fused_grad, grad)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shift", [1e2, 1e4, -1e5])
def test_cross_entropy_gradient_of_shifted_logits(rng, dtype, shift):
    """Logits far from 0 (a shift leaves the softmax unchanged): the gradient keeps fp32's accuracy.
    The exponent was x_j - lse with lse rounded to the dtype first, an error of half an ulp of |lse|
    (5e-5 in p_j at logits of 1e4); it is (x_j - max) - log Σ now."""
    logits = (randn(rng, (6, 50), np.float64, 3.0) + shift).astype(dtype)
    target = rng.integers(0, 50, size=6)
    lt, loss_t = torch_cross_entropy(logits.astype(np.float64), target, -100, 0.1, "mean")
    loss_t.backward()  # the oracle in float64, on the logits as the dtype holds them
    loss, grad = B.cross_entropy_with_grad(logits, target, label_smoothing=0.1)
    np.testing.assert_allclose(grad, lt.grad.numpy(), atol=atol(dtype), rtol=0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("shift", [1e5, 1e7, -1e9])
def test_cross_entropy_loss_of_shifted_logits(rng, shift, label_smoothing):
    """The loss at logits far from 0 keeps float64's 1e-10 against torch: it is (max - x_t) + log Σ.
    lse - x_t with lse = max + log Σ rounded first lost log Σ's low bits to |max| (9e-10 at 1e7)."""
    logits = randn(rng, (5, 40), np.float64, 3.0) + shift
    target = rng.integers(0, 40, size=5)
    for reduction in ("none", "sum"):
        _, loss_t = torch_cross_entropy(logits, target, -100, label_smoothing, reduction)
        loss = FT.cross_entropy(logits, target, label_smoothing=label_smoothing, reduction=reduction)
        np.testing.assert_allclose(loss, loss_t.detach().numpy(), atol=1e-10, rtol=0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy_at_float32_max(label_smoothing):
    """Three equal logits of 3e38 (float32): the loss is log 3, as torch's; it was 0 (log Σ rounded
    away by the max)."""
    logits = np.full((2, 3), 3e38, np.float32)
    target = np.array([1, 0])
    loss = FT.cross_entropy(logits, target, label_smoothing=label_smoothing, reduction="none")
    _, loss_t = torch_cross_entropy(logits, target, -100, label_smoothing, "none")
    np.testing.assert_allclose(loss_t.detach().numpy(), np.log(3.0), rtol=1e-6)
    np.testing.assert_allclose(loss, np.log(3.0), rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_cross_entropy_ignore_index(rng, dtype):
    logits = randn(rng, (4, 6, 10), dtype)
    target = rng.integers(0, 10, size=(4, 6))
    target[:, 4:] = 3  # a custom ignore_index that is also a class
    lt, loss_t = torch_cross_entropy(logits, target, 3, 0.05, "mean")
    loss_t.backward()
    loss, grad = B.cross_entropy_with_grad(logits, target, ignore_index=3, label_smoothing=0.05)
    check(np.asarray(loss), loss_t, dtype, "loss")
    check(grad, lt.grad, dtype, "grad")
    assert np.all(grad[target == 3] == 0)


def test_cross_entropy_all_ignored_and_nan(rng):
    """Every row ignored: loss 0 and zero gradient (torch: NaN). A NaN logit: a NaN loss, returned."""
    logits = randn(rng, (3, 5), np.float64)
    target = np.full(3, -100)
    loss, grad = B.cross_entropy_with_grad(logits, target)
    assert loss == 0.0 and np.array_equal(grad, np.zeros_like(logits))
    assert FT.cross_entropy(logits, target, reduction="sum") == 0.0
    logits[1, 2] = np.nan
    loss = FT.cross_entropy(logits, np.array([0, 1, 2]))
    assert np.isnan(loss)


def test_cross_entropy_bad_input(rng):
    logits = randn(rng, (2, 3, 5))
    ok = np.zeros((2, 3), np.int64)
    with pytest.raises(ValueError, match="target"):
        FT.cross_entropy(logits, ok[:, :2])
    with pytest.raises(ValueError, match=r"target.*5"):
        FT.cross_entropy(logits, ok + 5)
    with pytest.raises(ValueError, match="target"):
        FT.cross_entropy(logits, ok - 2)
    with pytest.raises(TypeError, match="target"):
        FT.cross_entropy(logits, ok.astype(np.float32))
    with pytest.raises(ValueError, match="label_smoothing"):
        FT.cross_entropy(logits, ok, label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction"):
        FT.cross_entropy(logits, ok, reduction="avg")
    with pytest.raises(TypeError, match="ignore_index"):
        FT.cross_entropy(logits, ok, ignore_index=1.0)
    with pytest.raises(ValueError, match="grad_output"):
        B.cross_entropy_backward(logits, ok, np.ones(5, np.float32), reduction="none")
    with pytest.raises(TypeError, match="grad_output"):
        B.cross_entropy_backward(logits, ok, np.ones(6, np.float32))


# --------------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------------

def torch_attention(q, k, v, gout, *, bool_mask=None, float_mask=None, causal_offset=None, scale=None):
    """softmax(scale · Q Kᵀ + mask) V in torch (GQA by repeating K/V heads), its log-sum-exp and the
    gradients of <out, gout>. A row that sees no key gives zeros (our convention; torch's softmax
    would give NaN): its scores are replaced by 0 and its probabilities multiplied by 0, so that no
    NaN reaches the gradients."""
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    sc = 1.0 / math.sqrt(E) if scale is None else scale
    kk, vv = kt, vt
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        kk, vv = kt.repeat_interleave(g, dim=-3), vt.repeat_interleave(g, dim=-3)
    s = (qt @ kk.transpose(-2, -1)) * sc
    if float_mask is not None:
        s = s + to_torch(float_mask)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal_offset is not None:
        allowed = allowed.tril(causal_offset)
    if bool_mask is not None:
        allowed = allowed & to_torch(bool_mask)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s.detach(), dim=-1)
    valid = ~torch.isneginf(s.detach()).all(dim=-1)
    s = s.masked_fill(~valid[..., None], 0.0)
    p = torch.softmax(s, dim=-1) * valid[..., None]
    out = p @ vv
    out.backward(to_torch(gout))
    return out.detach().numpy(), lse.numpy(), qt.grad, kt.grad, vt.grad, valid.numpy()


def run_attention(rng, dtype, N, H, Hkv, L, S, D, Dv, *, mask=None, causal=None, scale=None):
    q = randn(rng, (N, H, L, D), dtype)
    k = randn(rng, (N, Hkv, S, D), dtype)
    v = randn(rng, (N, Hkv, S, Dv), dtype)
    gout = randn(rng, (N, H, L, Dv), dtype)
    bool_mask = float_mask = key_mask = None
    if mask == "bool":
        bool_mask = rng.random((N, 1, L, S)) < 0.7
        bool_mask[0, 0, L // 2, :] = False  # a row that sees nothing
    elif mask == "float":
        float_mask = randn(rng, (1, H, L, S), dtype)
        float_mask[0, -1, 0, :] = -np.inf  # a row that sees nothing
    elif mask == "key_mask":
        key_mask = np.ones((N, S), bool)
        key_mask[0, S // 2:] = False
        if N > 1:
            key_mask[-1] = False  # a fully padded sequence
    offset = None if causal is None else (0 if causal == "top_left" else S - L)
    ref_bool = bool_mask
    if key_mask is not None:
        ref_bool = np.broadcast_to(key_mask[:, None, None, :], (N, H, L, S))
    out, lse, gq, gk, gv, valid = torch_attention(q, k, v, gout, bool_mask=ref_bool, float_mask=float_mask,
                                                  causal_offset=offset, scale=scale)
    attn_mask = bool_mask if bool_mask is not None else float_mask
    dq, dk, dv = B.scaled_dot_product_attention_backward(
        q, k, v, out, gout, lse, attn_mask, key_mask=None if key_mask is None else key_mask[:, None, :],
        is_causal=causal is not None, scale=scale,
        causal_alignment=causal or "top_left", enable_gqa=H != Hkv)
    check(dq, gq, dtype, "grad_query")
    check(dk, gk, dtype, "grad_key")
    check(dv, gv, dtype, "grad_value")
    assert np.all(dq[~valid] == 0), "rows that see no key: zero gradient"
    return dq, dk, dv


# (N, H, H_kv, L, S, D, Dv)
ATTN_SHAPES = [
    (2, 3, 3, 7, 9, 8, 5),        # L != S, Dv != D
    (1, 1, 1, 1, 1, 4, 4),        # seq 1
    (7, 2, 2, 7, 7, 9, 9),        # batch == seq
    (3, 2, 2, 1, 17, 16, 3),      # one query
    (2, 2, 2, 65, 17, 8, 8),      # L > S
    (1, 2, 2, 63, 65, 16, 16),    # tile edges: 64 ± 1
    (1, 1, 1, 64, 64, 8, 8),
    (1, 2, 2, 65, 129, 8, 8),
    (1, 1, 1, 129, 127, 4, 4),
    (1, 1, 1, 128, 128, 5, 3),
    (2, 6, 2, 9, 11, 8, 8),       # GQA
    (2, 4, 1, 66, 70, 8, 4),      # MQA, across a tile edge
    # N · H_kv >= 12: the one-pass schedule (the shapes above with N · H_kv < 12 take two passes)
    (4, 6, 3, 65, 63, 8, 8),      # GQA, tile edges
    (12, 1, 1, 64, 129, 4, 5),
]
ATTN_IDS = ["x".join(map(str, s)) for s in ATTN_SHAPES]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=ATTN_IDS)
def test_attention_backward_unmasked(rng, dtype, shape):
    run_attention(rng, dtype, *shape)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [ATTN_SHAPES[i] for i in (0, 2, 4, 5, 7, 8, 10, 11, 12, 13)],
                         ids=[ATTN_IDS[i] for i in (0, 2, 4, 5, 7, 8, 10, 11, 12, 13)])
@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
def test_attention_backward_causal(rng, dtype, shape, causal):
    run_attention(rng, dtype, *shape, causal=causal)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [ATTN_SHAPES[i] for i in (0, 4, 5, 10, 11, 12)],
                         ids=[ATTN_IDS[i] for i in (0, 4, 5, 10, 11, 12)])
@pytest.mark.parametrize("mask", ["bool", "float", "key_mask"])
def test_attention_backward_masks(rng, dtype, shape, mask):
    run_attention(rng, dtype, *shape, mask=mask)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_attention_backward_mask_and_causal_and_scale(rng, dtype):
    run_attention(rng, dtype, 2, 6, 2, 70, 67, 8, 8, mask="bool", causal="bottom_right", scale=0.3)
    run_attention(rng, dtype, 2, 4, 4, 9, 66, 8, 8, mask="key_mask", causal="top_left")


def test_attention_backward_fully_masked_is_zero(rng):
    q = randn(rng, (1, 2, 5, 4), np.float64)
    k = randn(rng, (1, 2, 6, 4), np.float64)
    v = randn(rng, (1, 2, 6, 3), np.float64)
    dq, dk, dv = B.scaled_dot_product_attention_backward(
        q, k, v, np.zeros((1, 2, 5, 3)), randn(rng, (1, 2, 5, 3), np.float64), np.full((1, 2, 5), -np.inf),
        np.zeros((5, 6), bool))
    for g in (dq, dk, dv):
        assert np.array_equal(g, np.zeros_like(g))


# Finite float masks far below the scores (old BERT's -1e4, -1e9, finfo.min), on query rows where
# they cover every key, or where the scores themselves are large: the lse is too large for its
# rounding to vanish in exp(X - lse), so the backward recomputes those rows' max and sum.
HUGE_ROW_VALUES = [-1e4, -1e9, -1e30, "min"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("value", HUGE_ROW_VALUES, ids=[str(v) for v in HUGE_ROW_VALUES])
@pytest.mark.parametrize("shape", [(1, 2, 2, 70, 130, 4, 8), (4, 6, 3, 65, 63, 4, 5)],
                         ids=["two_passes", "one_pass"])
def test_attention_backward_huge_float_mask_rows(rng, dtype, value, shape):
    """Our forward's lse into our backward, against torch's autograd (which keeps the probabilities)
    in the same dtype. Integer queries and keys and a scale of 1/2 make every score exact, so both
    sides add the mask to the same numbers: a row whose every key carries the mask has the softmax
    of the scores that survive its rounding (uniform once they all round to the mask), and the
    gradients must agree to the usual tolerance. Rows: fully masked (0, 66, 67), partly masked (2),
    one key left (68), large unmasked scores (3: queries times 40, scores in the hundreds)."""
    N, H, Hkv, L, S, D, Dv = shape
    value = float(np.finfo(dtype).min) if value == "min" else value
    q = rng.integers(-3, 4, (N, H, L, D)).astype(dtype)
    q[:, :, 3] *= 40
    k = rng.integers(-3, 4, (N, Hkv, S, D)).astype(dtype)
    v, gout = randn(rng, (N, Hkv, S, Dv), dtype), randn(rng, (N, H, L, Dv), dtype)
    mask = np.zeros((L, S), dtype)
    mask[[0, 2, 66 % L, 67 % L, 68 % L], :] = value
    mask[2, : S // 3] = 0
    mask[68 % L, 5] = 0
    out, lse, gq, gk, gv, valid = torch_attention(q, k, v, gout, float_mask=mask, scale=0.5)
    assert valid.all() and np.isfinite(lse).all()
    ours, our_lse = FT.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5, enable_gqa=H != Hkv,
                                                    return_lse=True)
    check(ours, out, dtype, "out")
    np.testing.assert_allclose(our_lse, lse, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=atol(dtype),
                               err_msg="lse")
    dq, dk, dv = B.scaled_dot_product_attention_backward(q, k, v, ours, gout, our_lse, mask, scale=0.5,
                                                         enable_gqa=H != Hkv)
    check(dq, gq, dtype, "grad_query")
    check(dk, gk, dtype, "grad_key")
    check(dv, gv, dtype, "grad_value")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_attention_backward_3d_and_2d(rng, dtype):
    """Inputs without a head dim, as the forward accepts them."""
    for lead in ((3,), ()):
        q = randn(rng, lead + (7, 8), dtype)
        k = randn(rng, lead + (9, 8), dtype)
        v = randn(rng, lead + (9, 6), dtype)
        gout = randn(rng, lead + (7, 6), dtype)
        out, lse, gq, gk, gv, _ = torch_attention(q, k, v, gout)
        dq, dk, dv = B.scaled_dot_product_attention_backward(q, k, v, out, gout, lse)
        check(dq, gq, dtype, "grad_query")
        check(dk, gk, dtype, "grad_key")
        check(dv, gv, dtype, "grad_value")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_attention_backward_kernel_key_mask(rng, dtype):
    """The kernel's own key_mask (N, S) input (the Python face folds key_mask into the bool mask, as
    the forward does), with a causal mask on top and a fully padded sequence."""
    N, H, L, S, D = 3, 2, 66, 70, 8
    q, gout = randn(rng, (N, H, L, D), dtype), randn(rng, (N, H, L, D), dtype)
    k, v = randn(rng, (N, H, S, D), dtype), randn(rng, (N, H, S, D), dtype)
    key_mask = rng.random((N, S)) < 0.8
    key_mask[1] = False
    out, lse, gq, gk, gv, _ = torch_attention(q, k, v, gout, bool_mask=key_mask[:, None, None, :],
                                              causal_offset=S - L)
    dq, dk, dv = variant("scaled_dot_product_attention_backward", dtype)(
        q, k, v, out.astype(dtype), gout, lse.astype(dtype), None, None, key_mask, True, S - L, 1 / math.sqrt(D))
    check(dq, gq, dtype, "grad_query")
    check(dk, gk, dtype, "grad_key")
    check(dv, gv, dtype, "grad_value")


def test_attention_backward_empty_lengths(rng):
    """S = 0: grad_query is zero. L = 0: grad_key and grad_value are zero (the C++ op; the Python face
    refuses empty arrays, as the forward does)."""
    f = variant("scaled_dot_product_attention_backward", np.float64)
    q = randn(rng, (2, 2, 3, 4), np.float64)
    e = np.zeros((2, 2, 0, 4))
    dq, dk, dv = f(q, e, e, np.zeros((2, 2, 3, 4)), randn(rng, (2, 2, 3, 4), np.float64),
                   np.full((2, 2, 3), -np.inf), None, None, None, False, 0, 0.5)
    assert np.array_equal(dq, np.zeros_like(q)) and dk.shape == (2, 2, 0, 4) and dv.shape == (2, 2, 0, 4)
    k = randn(rng, (2, 1, 5, 4), np.float64)
    dq, dk, dv = f(e, k, k, e, e, np.zeros((2, 2, 0)), None, None, None, True, 5, 0.5)
    assert dq.shape == (2, 2, 0, 4) and np.array_equal(dk, np.zeros_like(k)) and np.array_equal(dv, np.zeros_like(k))


@pytest.mark.parametrize("batch", [2, 6], ids=["two_passes", "one_pass"])
def test_attention_backward_threads_bitwise(rng, threads, batch):
    q = randn(rng, (batch, 6, 150, 32))
    k = randn(rng, (batch, 2, 140, 32))
    v = randn(rng, (batch, 2, 140, 32))
    gout = randn(rng, (batch, 6, 150, 32))
    out, lse, *_ = torch_attention(q, k, v, gout, causal_offset=-10)
    results = []
    for n in (1, 2):
        tc.set_num_threads(n)
        results.append(B.scaled_dot_product_attention_backward(q, k, v, out, gout, lse, is_causal=True,
                                                               causal_alignment="bottom_right", enable_gqa=True))
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_attention_backward_schedules_agree_bitwise(rng):
    """A batch of 12 (N · H_kv = 12: one pass) equals, bit for bit, its two halves of 6 (two passes)."""
    shape_q, shape_kv = (12, 4, 70, 16), (12, 1, 75, 16)
    q, gout = randn(rng, shape_q), randn(rng, shape_q)
    k, v = randn(rng, shape_kv), randn(rng, shape_kv)
    out, lse, *_ = torch_attention(q, k, v, gout, causal_offset=5)
    kw = dict(is_causal=True, causal_alignment="bottom_right", enable_gqa=True)
    whole = B.scaled_dot_product_attention_backward(q, k, v, out, gout, lse, **kw)
    for part in (slice(0, 6), slice(6, 12)):
        half = B.scaled_dot_product_attention_backward(q[part], k[part], v[part], out[part], gout[part], lse[part],
                                                       **kw)
        for a, b in zip(whole, half):
            assert np.array_equal(a[part], b)


def test_attention_backward_bad_input(rng):
    q = randn(rng, (1, 2, 5, 4))
    k = randn(rng, (1, 2, 6, 4))
    v = randn(rng, (1, 2, 6, 3))
    out, gout, lse = randn(rng, (1, 2, 5, 3)), randn(rng, (1, 2, 5, 3)), randn(rng, (1, 2, 5))
    f = B.scaled_dot_product_attention_backward
    with pytest.raises(ValueError, match=r"^out: expected shape"):
        f(q, k, v, out[..., :2], gout, lse)
    with pytest.raises(ValueError, match="grad_out"):
        f(q, k, v, out, gout[:, :1], lse)
    with pytest.raises(ValueError, match="lse"):
        f(q, k, v, out, gout, lse[..., :4])
    with pytest.raises(ValueError, match=r"^key: expected last dim 4"):
        f(q, k[..., :3], v, out, gout, lse)
    with pytest.raises(ValueError, match="attn_mask"):
        f(q, k, v, out, gout, lse, np.ones((5, 5), bool))
    with pytest.raises(ValueError, match="causal_alignment"):
        f(q, k, v, out, gout, lse, is_causal=True, causal_alignment="center")
    with pytest.raises(ValueError, match="enable_gqa"):
        f(randn(rng, (1, 3, 5, 4)), k, v, randn(rng, (1, 3, 5, 3)), randn(rng, (1, 3, 5, 3)), randn(rng, (1, 3, 5)),
          enable_gqa=True)


# --------------------------------------------------------------------------------------------------
# Embedding backward with empty inputs (embedding_dim 0, no ids): torch's gradient, not numpy's error
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("ids_shape, E, padding_idx", [((4, 1), 0, None), ((4, 1), 0, 2), ((0,), 0, None),
                                                       ((2, 0), 0, None), ((0,), 3, None), ((2, 0), 3, 1)])
def test_embedding_backward_empty_matches_torch(ids_shape, E, padding_idx, dtype):
    """An empty grad_output (embedding_dim 0, or no ids) gives torch's gradient: (V, E) zeros,
    e.g. (5, 0) for ids (4, 1) and grad_output (4, 1, 0). Before, embedding_dim 0 raised numpy's
    "cannot reshape array of size 0 into shape (0)"."""
    V = 5
    ids = np.arange(math.prod(ids_shape), dtype=np.int64).reshape(ids_shape) % V
    g = np.zeros(ids_shape + (E,), dtype)
    ids_before, g_before = ids.copy(), g.copy()
    ours = B.embedding_backward(ids, g, V, padding_idx)
    w = torch.zeros(V, E, dtype=TORCH[np.dtype(dtype)], requires_grad=True)
    TF.embedding(torch.from_numpy(ids), w, padding_idx=padding_idx).backward(to_torch(g))
    check(ours, w.grad, dtype, "grad_weight")
    assert ours.flags.c_contiguous
    assert np.array_equal(ids, ids_before) and np.array_equal(g, g_before)  # inputs untouched
    # accumulating into a buffer adds nothing: it comes back as it was
    buf = np.arange(V * E, dtype=dtype).reshape(V, E)
    out = B.embedding_backward(ids, g, V, padding_idx, grad_weight=buf)
    assert out is buf
    np.testing.assert_array_equal(buf, np.arange(V * E, dtype=dtype).reshape(V, E))


def test_embedding_backward_sizes_no_array_can_hold_are_named():
    """A gradient no machine (or no numpy array) can hold names num_embeddings, not the binding's
    "(num_embeddings, H)" nor numpy's "array is too big"; a given buffer is left as it was."""
    ids = np.zeros((4, 1), np.int64)
    with pytest.raises(ValueError, match=r"^num_embeddings: expected at most 2305843009213693951 rows for a float32 "
                                         r"gradient of embedding_dim 0 \(numpy's largest axis\), got "
                                         r"4611686018427387904$"):
        B.embedding_backward(ids, np.zeros((4, 1, 0), np.float32), 2**62)
    with pytest.raises(ValueError, match=r"^num_embeddings: expected at most 1152921504606846975 rows for a float64 "
                                         r"gradient of embedding_dim 0 \(numpy's largest axis\), got "
                                         r"2305843009213693952$"):
        B.embedding_backward(ids, np.zeros((4, 1, 0)), 2**61)
    with pytest.raises(ValueError, match=r"^num_embeddings: an array of shape \(4611686018427387904, 3\) needs "
                                         r"55340232221128654848 bytes, more than this machine's memory "
                                         r"\(\d+ bytes\)$"):
        B.embedding_backward(ids, np.ones((4, 1, 3), np.float32), 2**62)
    buf = np.ones((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"^grad_weight: expected shape \(5, 2\), got \(3, 2\)$"):
        B.embedding_backward(ids, np.ones((4, 1, 2), np.float32), 5, grad_weight=buf)
    np.testing.assert_array_equal(buf, np.ones((3, 2), np.float32))


def test_embedding_backward_checks_a_broadcast_ids_view_before_copying_it():
    """A broadcast view of ids (stride 0) is checked against grad_output's shape, then its int64
    copy against memory, before anything is flattened (``reshape(-1)`` copied 64 GiB, a bare
    MemoryError); a small broadcast view gives what its copy gives."""
    ast = np.lib.stride_tricks.as_strided
    huge = ast(np.array([[1, 2]]), (2**32, 2), (0, 8))
    with pytest.raises(ValueError, match=r"^grad_output: expected shape \(4294967296, 2\) \+ \(embedding_dim,\) to "
                                         r"match ids, got \(2, 2, 5\)$"):
        B.embedding_backward(huge, np.ones((2, 2, 5), np.float32), num_embeddings=4)
    g_huge = np.zeros((2**32, 2, 0), np.float32)  # embedding_dim 0: holds nothing, copies nothing
    with pytest.raises(ValueError, match=r"^ids: an array of shape \(4294967296, 2\) needs .* more than this "
                                         r"machine's memory"):
        B.embedding_backward(ast(np.array([[1, 2]], np.int32), (2**32, 2), (0, 4)), g_huge, num_embeddings=4)
    ids = np.broadcast_to(np.array([[3, 0, 3]]), (4, 3))
    g = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    w = torch.zeros(5, 2, requires_grad=True)
    TF.embedding(torch.from_numpy(np.ascontiguousarray(ids)), w).backward(torch.from_numpy(g))
    np.testing.assert_array_equal(B.embedding_backward(ids, g, 5), w.grad.numpy())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("e", [16384, 16385])
def test_layer_norm_backward_of_rows_past_the_scratch(rng, dtype, e):
    """Rows of up to 16384 values keep g and x̂ in a scratch of doubles for the dx pass; longer ones
    convert again (the scratch would not stay in cache): both sides of the edge against torch."""
    x = randn(rng, (3, e), dtype) * 2 + 0.5
    w = 1 + randn(rng, (e,), dtype, 0.3)
    b = randn(rng, (e,), dtype)
    gy = randn(rng, (3, e), dtype)
    xt, wt, bt = leaf(x), leaf(w), leaf(b)
    TF.layer_norm(xt, (e,), wt, bt, eps=1e-5).backward(to_torch(gy))
    gx, gw, gb = B.layer_norm_backward(x, w, gy, 1e-5)
    check(gx, xt.grad, dtype, "layer_norm grad_input")
    check(gw, wt.grad, dtype, "layer_norm grad_weight")
    check(gb, bt.grad, dtype, "layer_norm grad_bias")
    xt = leaf(x)
    TF.layer_norm(xt, (e,), eps=1e-5).backward(to_torch(gy))
    check(B.layer_norm_backward(x, None, gy, 1e-5)[0], xt.grad, dtype, "layer_norm grad_input, no weight")
