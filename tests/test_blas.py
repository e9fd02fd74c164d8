"""The BLAS table (kernels/blas.hpp): OpenBLAS, or MKL where pip's ``mkl`` is installed.

The products that reach the table are float64 ones (float32 runs our own GEMM kernels on a CPU
with AVX2; functional.linear's docstring) of more than 32 rows. Every BLAS available here is tested
the same way on them: float64 linear products and the float64 MiniLM forward against torch's float64
(1e-10), bitwise the same with 1 and 2 threads; float32 alongside, for the kernels it runs. Where
MKL is not installed the list holds OpenBLAS only (each library is held to torch, not to the other).
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import MODEL_DIR, MODEL_NAME, SENTENCES, hf_encode
from transformer_core import _runtime

MKL_PATH = _runtime._mkl_library()
BLASES = ["openblas"] + (["mkl"] if MKL_PATH else [])
# Rows where the linear kernel's tiles change (64-row tiles, 512-column panels; up to 32 rows stream
# the weight, past them float64 goes to BLAS) and MiniLM's widths.
LINEAR_SHAPES = [(1, 7, 384, 384), (3, 65, 384, 1536), (2, 129, 1536, 384), (1, 9, 33, 1152)]
DTYPES = {"f32": (np.float32, 1e-5), "f64": (np.float64, 1e-10)}


@pytest.fixture(params=BLASES)
def blas(request):
    """Routes every product to the library named by the parameter, then restores the import's choice."""
    before = tc.blas_info()
    if request.param == "mkl":
        assert tc._core.use_mkl(MKL_PATH) == ""
    else:
        tc._core.use_openblas()
    assert tc.blas_info().startswith(request.param + ":")
    yield request.param
    if before.startswith("mkl:"):
        assert tc._core.use_mkl(MKL_PATH) == ""
    else:
        tc._core.use_openblas()


def _linear(x, w, b):
    return tc.functional.linear(x, w, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_linear_matches_torch(blas, shape, dtype):
    N, L, E_in, E_out = shape
    dt, tol = DTYPES[dtype]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, L, E_in)).astype(dt)
    w = (rng.standard_normal((E_out, E_in)) / np.sqrt(E_in)).astype(dt)
    b = rng.standard_normal(E_out).astype(dt)
    ref = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(_linear(x, w, b), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_linear_and_attention_identical_with_1_and_2_threads(blas, shape, dtype):
    N, L, E_in, E_out = shape
    dt = DTYPES[dtype][0]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N, L, E_in)).astype(dt)
    w = rng.standard_normal((E_out, E_in)).astype(dt)
    q = rng.standard_normal((N, 4, L, 32)).astype(dt)
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        a = _linear(x, w, None), tc.functional.scaled_dot_product_attention(q, q, q)
        tc.set_num_threads(2)
        b = _linear(x, w, None), tc.functional.scaled_dot_product_attention(q, q, q)
    finally:
        tc.set_num_threads(old)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.fixture(scope="module")
def bert_f64():
    """(ours, transformers') MiniLM in float64: their products reach the BLAS table."""
    from transformers import BertModel

    hf = BertModel.from_pretrained(str(MODEL_DIR), attn_implementation="eager").double().eval()
    return tc.BertModel.from_pretrained(MODEL_NAME, dtype=np.float64), hf


def test_minilm_matches_hf_and_is_thread_count_deterministic(blas, bert_f64, hf_tokenizer):
    ours, hf = bert_f64
    ids, am, tt = hf_encode(hf_tokenizer, SENTENCES[:8])
    with torch.inference_mode():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(am),
                 token_type_ids=torch.from_numpy(tt)).last_hidden_state.numpy()
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        one = ours(ids, attention_mask=am, token_type_ids=tt).last_hidden_state
        tc.set_num_threads(2)
        two = ours(ids, attention_mask=am, token_type_ids=tt).last_hidden_state
    finally:
        tc.set_num_threads(old)
    np.testing.assert_array_equal(one, two)
    valid = am.astype(bool)
    np.testing.assert_allclose(one[valid], ref[valid], atol=1e-10, rtol=0)


def _blas_info_with(env_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TC_BLAS=env_value)
    return subprocess.run([sys.executable, "-W", "always", "-c", "import transformer_core as tc; print(tc.blas_info())"],
                          env=env, capture_output=True, text=True, check=True)


def test_tc_blas_openblas_forces_openblas():
    assert _blas_info_with("openblas").stdout.startswith("openblas: OpenBLAS")


def test_tc_blas_auto_is_openblas():
    assert _blas_info_with("auto").stdout.startswith("openblas: OpenBLAS")


def test_tc_blas_mkl_loads_mkl_or_warns():
    out = _blas_info_with("mkl")
    if MKL_PATH:
        assert out.stdout.startswith("mkl: Intel(R)"), out
    else:
        assert "TC_BLAS=mkl: pip's mkl package is not installed; using OpenBLAS" in out.stderr
        assert out.stdout.startswith("openblas:")


def test_torch_imported_after_us_keeps_both_thread_counts():
    # One libgomp serves both (torch's wheel ships one with the same soname): importing torch after
    # transformer_core must leave the OpenMP thread count alone (with MKL loaded it would not:
    # torch would bind to MKL's sequential layer and set one thread; hence MKL is opt-in).
    code = ("import transformer_core as tc; n = tc.get_num_threads(); import torch; "
            "print(n, tc.get_num_threads(), torch.get_num_threads())")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    env.pop("TC_BLAS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "2", "2"], out


@pytest.mark.parametrize("given, expected", [(None, "1000"), ("7", "7")])
def test_import_shortens_libgomps_spin_unless_the_user_set_it(given, expected):
    # libgomp reads GOMP_SPINCOUNT once, when it loads (with _core): the package sets 1,000 turns
    # before that (beside another program's busy thread on 2 cores, 100,000 made a small model's
    # training step 4-5x and a decode step 2.5-4.5x slower: bench/README.md, "A busy neighbour")
    # and keeps a value the user set.
    env = dict(os.environ)
    env.pop("GOMP_SPINCOUNT", None)
    if given is not None:
        env["GOMP_SPINCOUNT"] = given
    code = ("import os; before = 'libgomp' in open('/proc/self/maps').read(); import transformer_core; "
            "print(before, os.environ.get('GOMP_SPINCOUNT'), 'libgomp' in open('/proc/self/maps').read())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", expected, "True"], out  # libgomp came with the import


def test_tc_blas_bad_value_warns_and_uses_auto():
    out = _blas_info_with("cublas")
    assert "TC_BLAS: expected 'auto', 'mkl' or 'openblas', got 'cublas'" in out.stderr
    assert out.stdout.startswith(("mkl:", "openblas:"))


def test_use_mkl_with_a_wrong_path_says_why_and_keeps_the_table():
    before = tc.blas_info()
    why = tc._core.use_mkl("/nonexistent/libmkl_rt.so.2")
    # before MKL is loaded dlopen fails; once it is, only the same library may be chosen again
    assert why.startswith("dlopen failed") or why.startswith("MKL is already loaded from "), why
    assert tc.blas_info() == before


def _zeros_virtual(shape, dtype):
    """Zeros of any size that take memory only for the pages written (an anonymous private mapping,
    not reserved): products past 2**31 rows without 8 GiB of RAM."""
    import mmap

    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    return np.frombuffer(mmap.mmap(-1, size, flags=flags), dtype=dtype).reshape(shape)


def test_weight_gradient_over_more_than_2_31_rows_counts_every_row():
    # The weight gradient xᵀ · grad_output of a one-column layer goes to BLAS, whose sizes are 32-bit
    # ints: 2**31 + 5 rows were passed as a negative size (OpenBLAS printed "illegal value" and the
    # gradient stayed 0). kernels::gemm now runs the inner dimension in blocks of 2**30.
    rows = 2**31 + 5
    x, grad = _zeros_virtual((rows, 1), np.float32), _zeros_virtual((rows, 1), np.float32)
    x[0, 0], grad[0, 0] = 1, 1
    x[rows - 1, 0], grad[rows - 1, 0] = 3, 1
    _, grad_weight, _ = tc.backward.linear_backward(
        x, np.ones((1, 1), np.float32), grad, bias=False, need_grad_input=False)
    np.testing.assert_array_equal(grad_weight, [[4.0]])

