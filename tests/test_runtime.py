"""The threading runtime: one OpenMP pool shared with OpenBLAS, visible to threadpoolctl."""

import os
import subprocess
import sys

import numpy as np
import pytest
import transformer_core as tc
from threadpoolctl import threadpool_info, threadpool_limits


def test_set_and_get_num_threads():
    old = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        assert tc.get_num_threads() == 1
        tc.set_num_threads(3)
        assert tc.get_num_threads() == 3
    finally:
        tc.set_num_threads(old)


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (1.5, TypeError), ("2", TypeError)])
def test_set_num_threads_bad_input(bad, exc):
    with pytest.raises(exc, match=r"^n: expected an int"):
        tc.set_num_threads(bad)


def test_omp_num_threads_sets_the_default():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", "import transformer_core as tc; print(tc.get_num_threads())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_threadpoolctl_sees_and_limits_our_openmp():
    apis = {(i["user_api"], os.path.basename(i["filepath"])) for i in threadpool_info()}
    assert any(api == "openmp" and "gomp" in name for api, name in apis), apis
    # the OpenBLAS we link is the OpenMP build (it shares libgomp), not the pthread one
    assert "USE_OPENMP" in tc._core.blas_config()
    old = tc.get_num_threads()
    with threadpool_limits(limits=1, user_api="openmp"):
        assert tc.get_num_threads() == 1
    assert tc.get_num_threads() == old


def test_results_do_not_depend_on_threadpool_limits():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 65, 16)).astype(np.float32)
    full = tc.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    with threadpool_limits(limits=1, user_api="openmp"):
        single = tc.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    np.testing.assert_array_equal(full, single)
