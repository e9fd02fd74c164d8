"""The functional ops' fast paths give what their general paths give, bit for bit: an F-contiguous
input of an element-wise op computed as its transpose (the result keeps its memory order), softmax
over the last dim without moveaxis, a C-contiguous array of the compute dtype taken as is, a 2-D
rotary table passed to the kernel as is, the tables' broadcast check without numpy's."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import transformer_core as tc
from transformer_core import _validation
from transformer_core._runtime import dtype_suffix
from transformer_core.positional import _table_shape

F = tc.functional

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, "tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


# ------------------------------------------------------------------ element-wise ops, F-order input
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (2, 3, 4), (33, 17), (1024, 1024), (2, 1, 7)])
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_activation_of_f_order_input_equals_c_order_and_keeps_its_order(rng, op, shape, dtype):
    c = (rng.standard_normal(shape) * 4).astype(dtype)
    f = np.asfortranarray(c)
    assert f.flags.f_contiguous and not f.flags.c_contiguous
    before = f.copy(order="K")
    y_c, y_f = ACTIVATIONS[op](c), ACTIVATIONS[op](f)
    assert np.array_equal(y_f, y_c, equal_nan=True)  # each element's value, bit for bit
    assert y_f.dtype == y_c.dtype == dtype and y_f.shape == shape
    assert y_f.flags.f_contiguous and not y_f.flags.c_contiguous  # the input's memory order kept
    assert y_c.flags.c_contiguous
    assert not np.shares_memory(y_f, f)  # a new array
    assert np.array_equal(f, before)  # the input untouched


@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_activation_of_a_transposed_view_is_its_transpose(rng, op):
    a = rng.standard_normal((6, 10)).astype(np.float32)
    y = ACTIVATIONS[op](a.T)  # a.T: F-contiguous
    assert np.array_equal(y, ACTIVATIONS[op](a).T)
    assert y.flags.f_contiguous


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.dtype(">f4")], ids=["f16", "i32", "f32be"])
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_activation_of_f_order_input_to_convert_is_c_order(rng, op, dtype):
    """An F-contiguous input that must be converted anyway (to float32) takes the general path: a
    C-contiguous float32 result, the values of the C-order input's."""
    c = (rng.standard_normal((4, 6)) * 3).astype(dtype)
    y = ACTIVATIONS[op](np.asfortranarray(c))
    assert y.dtype == np.float32 and y.flags.c_contiguous
    assert np.array_equal(y, ACTIVATIONS[op](c))


@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_activation_strided_and_special_values(op):
    x = np.array([[0.0, -0.0, np.inf, -np.inf], [np.nan, 1e-40, -3.5, 7.0]], np.float32)
    for given in (np.asfortranarray(x), x[:, ::2], np.broadcast_to(x[:1], (3, 4))):
        assert np.array_equal(ACTIVATIONS[op](given), ACTIVATIONS[op](np.ascontiguousarray(given)), equal_nan=True)


def test_activation_f_order_empty_and_bad_input_messages():
    with pytest.raises(ValueError, match=r"^x: expected a non-empty array, got shape \(2, 0\)$"):
        F.gelu(np.zeros((2, 0), np.float32, order="F"))
    with pytest.raises(TypeError, match=r"^x: expected a real numeric array, got dtype bool"):
        F.relu(np.zeros((2, 3), bool, order="F"))


# -------------------------------------------------------------------------- softmax, dim last
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=["f32", "f64", "f16"])
@pytest.mark.parametrize("shape", [(8,), (1, 1, 8), (3, 5), (2, 3, 4)])
def test_softmax_dim_last_equals_the_moved_axis_path(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 5).astype(dtype)
    for dim in (-1, len(shape) - 1):
        y = F.softmax(x, dim)
        assert y.shape == shape and y.flags.c_contiguous
        # the same rows through the other dims' kernel (softmax_columns): the last dim moved first,
        # softmax along dim 0; the same up to rounding (its exponential and sums run down columns)
        moved = np.moveaxis(F.softmax(np.ascontiguousarray(np.moveaxis(x, -1, 0)), 0), 0, -1)
        tol = 1e-14 if y.dtype == np.float64 else 1e-6
        np.testing.assert_allclose(y, moved, rtol=tol, atol=tol)
    assert np.array_equal(F.softmax(np.asfortranarray(x)), F.softmax(x))


# ------------------------------------------------------------------ conversions of arrays as is
def test_to_numpy_and_contiguous_take_a_plain_array_as_is():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert _validation.to_numpy(x, "x") is x
    assert _validation._contiguous(x, np.float32, "x") is x  # nothing to convert
    assert np.shares_memory(_validation.as_float(x, "x"), x)
    zero_d = np.array(2.5, np.float64)
    assert _validation._contiguous(zero_d, np.float64, "x").shape == ()  # 0-d stays 0-d
    for other, dtype in ((x.T, np.float32), (x[:, ::2], np.float32), (x, np.float64),
                         (x.astype(">f4"), np.float32), (np.array(3, np.int32), np.float32)):
        y = _validation._contiguous(other, dtype, "x")
        assert y.flags.c_contiguous and y.dtype == dtype and y.dtype.isnative and y.shape == other.shape
        assert np.array_equal(y, other)


def test_dtype_suffix_of_types_and_dtypes():
    for dt, sfx in ((np.float32, "_f32"), (np.float64, "_f64"), (np.dtype(np.float32), "_f32"),
                    (np.dtype(np.float64), "_f64"), ("float64", "_f64"), ("float32", "_f32")):
        assert dtype_suffix(dt) == sfx


# ------------------------------------------------------------------------------------ rotary
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("half_table", [False, True], ids=["W=D", "W=D/2"])
@pytest.mark.parametrize("x_shape", [(1, 1, 1, 8), (2, 3, 5, 8), (5, 8), (2, 5, 4)])
def test_rotary_2d_table_equals_the_broadcast_table_path(rng, x_shape, half_table, layout):
    """A 2-D (L, W) table (passed to the kernel as is when it reads it so) gives what the same
    table of x's rank (1, ..., 1, L, W) gives (the general path)."""
    L, D = x_shape[-2], x_shape[-1]
    W = D // 2 if half_table else D
    x = rng.standard_normal(x_shape).astype(np.float32)
    cos, sin = (rng.standard_normal((L, W)).astype(np.float32) for _ in range(2))
    full = (1,) * (len(x_shape) - 2) + (L, W)
    y = tc.positional.apply_rotary(x, cos, sin, layout)
    general = tc.positional.apply_rotary(x, cos.reshape(full), sin.reshape(full), layout)
    broadcast = tc.positional.apply_rotary(x, np.broadcast_to(cos, (L, W)), np.broadcast_to(sin, (L, W)).T.T,
                                           layout)
    assert np.array_equal(y, general) and np.array_equal(y, broadcast)
    q, k = tc.positional.apply_rotary_pos_emb(x, x.astype(np.float64), cos, sin, layout=layout)
    assert np.array_equal(q, y) and k.dtype == np.float64


def test_rotary_table_broadcast_check_matches_numpy():
    """_table_shape's check of a table's leading dims against x's is np.broadcast_shapes's."""
    dims = [1, 2, 3]
    for x_rank in (2, 3, 4):
        for x_lead in itertools.product(dims, repeat=x_rank - 1):
            x_shape = x_lead + (4,)
            for rank in (2, x_rank):
                for lead in itertools.product(dims, repeat=rank - 1):
                    try:
                        expected = np.broadcast_shapes(lead, x_lead) == x_lead
                    except ValueError:
                        expected = False
                    if expected:
                        assert _table_shape(lead + (4,), "cos", x_shape, 4) == lead + (4,)
                    else:
                        with pytest.raises(ValueError, match="does not broadcast to"):
                            _table_shape(lead + (4,), "cos", x_shape, 4)
