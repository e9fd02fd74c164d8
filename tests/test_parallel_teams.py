"""Parallel regions run on fixed teams (kernels/parallel.hpp): every region on all the library's
threads, also one with fewer tasks than threads, so that libgomp never ends threads between
regions and starts them again; and the team never changes a result."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import transformer_core as tc
import transformer_core.functional as F
from transformer_core import _core

# In a fresh process: 4 threads; a region with many tasks, then regions with 2 to 4 tasks
# (a few-row linear of 192 and 384 outputs, attention over 2 heads, a layer norm of a few
# grains); the process's OS threads counted after each (/proc/self/task).
COUNT_THREADS = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import transformer_core as tc
    import transformer_core.functional as F
    from transformer_core import _core
    _core.set_fixed_teams(sys.argv[1] == "fixed")
    tc.set_num_threads(4)
    rng = np.random.default_rng(0)
    def threads():
        time.sleep(0.1)  # a thread libgomp releases exits soon after, not at once
        return len(os.listdir("/proc/self/task"))
    x = rng.standard_normal((512, 384), dtype=np.float32)
    F.linear(x, rng.standard_normal((1536, 384), dtype=np.float32))
    counts = [threads()]
    F.linear(x[:7], rng.standard_normal((192, 384), dtype=np.float32))  # 2 column chunks
    counts.append(threads())
    q = rng.standard_normal((1, 2, 64, 64), dtype=np.float32)
    F.scaled_dot_product_attention(q, q, q)  # 2 heads
    counts.append(threads())
    F.layer_norm(x[:130], np.ones(384, np.float32), np.zeros(384, np.float32))
    counts.append(threads())
    print(*counts)
""")


def os_threads_after_regions(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", COUNT_THREADS, mode], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "4"})
    assert out.returncode == 0, out.stderr
    return [int(v) for v in out.stdout.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc/self/task")
def test_small_regions_keep_the_whole_team():
    fixed = os_threads_after_regions("fixed")
    assert fixed == [fixed[0]] * len(fixed), f"OS threads after each region: {fixed}; expected no change"
    # the comparison the setting exists for: teams sized to the tasks end threads (libgomp)
    sized = os_threads_after_regions("sized")
    assert sized[0] == fixed[0] and min(sized[1:]) < sized[0], f"sized teams: {sized}, fixed: {fixed}"


def few_task_ops(rng):
    """(name, fn) of ops whose regions have fewer tasks than 3 threads, or about as many."""
    x = rng.standard_normal((7, 384), dtype=np.float32)
    w = rng.standard_normal((192, 384), dtype=np.float32)
    big = rng.standard_normal((200, 96), dtype=np.float32)
    w2 = rng.standard_normal((130, 96), dtype=np.float32)
    q = rng.standard_normal((1, 2, 33, 64), dtype=np.float32)
    kv = rng.standard_normal((1, 2, 300, 64), dtype=np.float32)
    g, b = np.ones(384, np.float32), np.zeros(384, np.float32)
    rows = rng.standard_normal((130, 384), dtype=np.float32)
    return [
        ("few-row linear", lambda: F.linear(x, w)),
        ("linear, ragged tiles", lambda: F.linear(big, w2)),
        ("attention, 2 heads", lambda: F.scaled_dot_product_attention(q, kv, kv)),
        ("causal attention, 2 heads", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)),
        ("layer norm, a few grains", lambda: F.layer_norm(rows, g, b)),
        ("softmax, a few grains", lambda: F.softmax(rows)),
    ]


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_fixed_and_sized_teams_give_the_same_bits(rng, threads):
    old_threads, old_fixed = tc.get_num_threads(), _core.set_fixed_teams(True)
    try:
        tc.set_num_threads(threads)
        for name, fn in few_task_ops(rng):
            _core.set_fixed_teams(True)
            fixed = fn()
            _core.set_fixed_teams(False)
            sized = fn()
            tc.set_num_threads(1)
            one = fn()
            tc.set_num_threads(threads)
            assert np.array_equal(fixed, sized), f"{name}: fixed and sized teams differ"
            assert np.array_equal(fixed, one), f"{name}: {threads} threads and 1 differ"
    finally:
        _core.set_fixed_teams(old_fixed)
        tc.set_num_threads(old_threads)
