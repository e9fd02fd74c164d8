"""One object used from several Python threads, and processes forked from a threaded one.

The core releases the GIL while it computes (cpp/bindings/common.hpp), so another Python thread can
change what a running call reads: quantize the layer in place, grow the same KV cache. Those calls
now wait for each other or are refused; a forked child computes on one thread. Each race runs in a
subprocess, so a crash of the code before these fixes fails the test instead of ending pytest.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from transformer_core.llama import LlamaConfig, LlamaForCausalLM


def _run(script: str, timeout: float = 120) -> str:
    """Runs `script` in a fresh interpreter; its stdout, or a failure with its stderr."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the script did not end within {timeout} s (a hang)")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


def test_quantize_in_place_waits_for_a_forward_in_another_thread():
    # quantize(inplace=True) freed the float32 weight a forward in another thread was reading:
    # a segfault in 3 of 5 runs, or an output neither the float one nor the int8 one.
    out = _run("""
        import threading
        import numpy as np
        from transformer_core import nn
        from transformer_core.quantization import quantize
        rng = np.random.default_rng(0)
        d = 1024
        x = rng.standard_normal((64, d)).astype(np.float32)
        w = (rng.standard_normal((d, d)) / 32).astype(np.float32)
        torn = 0
        for trial in range(8):
            layer = nn.Linear(d, d, bias=False)
            layer.load_state_dict({"weight": w})
            layer.eval()
            float_out, int8_out = layer.forward(x), quantize(layer).forward(x)
            outs, go = [], threading.Event()
            def run():
                go.wait()
                for _ in range(4):
                    outs.append(layer.forward(x))
            t = threading.Thread(target=run)
            t.start()
            go.set()
            quantize(layer, inplace=True)
            t.join()
            torn += sum(not (np.array_equal(o, float_out) or np.array_equal(o, int8_out)) for o in outs)
            assert np.array_equal(layer.forward(x), int8_out)
        print("torn", torn)
    """)
    assert out.split() == ["torn", "0"]


def test_quantize_in_place_is_not_held_up_by_calls_that_keep_coming():
    # Two threads calling a model without pause kept the weights' lock shared for ever: quantizing
    # another layer could wait as long as the calls came (20 s and more).
    out = _run("""
        import threading, time
        import numpy as np
        from transformer_core import nn
        from transformer_core.quantization import quantize
        busy = nn.Linear(1024, 1024)
        busy.eval()
        x = np.ones((2048, 1024), np.float32)
        stop = False
        def loop():
            while not stop:
                busy.forward(x)
        threads = [threading.Thread(target=loop) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        waits = []
        for _ in range(5):
            small = nn.Linear(8, 8)
            start = time.perf_counter()
            quantize(small, inplace=True)
            waits.append(time.perf_counter() - start)
        stop = True
        for t in threads:
            t.join()
        print(max(waits) < 1.0)  # one forward of busy takes about 30 ms
    """)
    assert out.split() == ["True"]


def _tiny_llama():
    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(config)
    model.eval()
    return model


def test_a_kv_cache_in_use_by_a_call_is_refused_to_other_threads():
    # Another thread's reserve / crop / forward on the cache a running forward extends used to
    # reallocate it under that forward's reads ("double free or corruption", positions lost).
    model = _tiny_llama()
    ids = np.random.default_rng(0).integers(0, 256, (1, 1024))
    expected = model.forward(ids).logits
    cache = model.new_cache(1)
    result, refused = {}, []
    worker = threading.Thread(target=lambda: result.setdefault("out", model.forward(ids, past_key_values=cache)))
    worker.start()
    while worker.is_alive():
        try:
            cache.crop(cache.length)  # changes nothing, but is refused while the forward holds the cache
        except ValueError as error:
            refused.append(str(error))
    worker.join()
    assert refused, "the running forward never held the cache"
    assert refused[0] == ("KVCache: in use by another call (a cache holds one sequence of calls at a time; give "
                          "each thread its own)")
    np.testing.assert_array_equal(result["out"].logits, expected)
    assert cache.length == 1024
    cache.crop(1000)  # idle again: the calls the cache allows work as before
    assert cache.length == 1000


def test_a_call_of_another_thread_between_the_checks_and_the_core_call_is_refused():
    # The checks of the cache's length (the mask's width) run in Python before the C++ call holds
    # the cache: another thread's step in between made the C++ read a mask past its buffer.
    model = _tiny_llama()
    rng = np.random.default_rng(1)
    first, step, other = rng.integers(0, 256, (2, 4)), rng.integers(0, 256, (2, 1)), rng.integers(0, 256, (2, 3))
    mask = np.ones((2, 5), bool)
    mask[0, 0] = False
    serial = model.new_cache(2)
    model.forward(first, past_key_values=serial)
    expected = model.forward(step, attention_mask=mask, past_key_values=serial).logits

    cache = model.new_cache(2)
    model.forward(first, past_key_values=cache)
    core, refused = model._impl, []

    class Window:  # the core model, with another thread's step where a thread switch can put it
        def __getattr__(self, name):
            return getattr(core, name)

        def forward(self, *args):
            def other_step():
                try:
                    model.forward(other, past_key_values=cache)
                except ValueError as error:
                    refused.append(str(error))
            thread = threading.Thread(target=other_step)
            thread.start()
            thread.join()
            return core.forward(*args)

    object.__setattr__(model, "_impl", Window())
    try:
        got = model.forward(step, attention_mask=mask, past_key_values=cache).logits
    finally:
        object.__setattr__(model, "_impl", core)
    assert refused == ["past_key_values: this KVCache is in use by another call (a cache holds one sequence of "
                       "calls at a time; give each thread its own)"]
    np.testing.assert_array_equal(got, expected)
    assert cache.length == 5


def test_a_step_run_while_the_arguments_are_converted_is_refused():
    # The same thread may step the cache between the checks of the mask and the C++ call (an
    # argument converted through __array__, a signal handler): the C++ read the mask with the new,
    # longer length, past its buffer, and returned logits.
    model = _tiny_llama()
    rng = np.random.default_rng(2)
    cache = model.new_cache(2)
    model.forward(rng.integers(0, 256, (2, 4)), past_key_values=cache)

    class Positions:  # converted after the mask's width (past + L = 5) is checked
        shape = (2, 1)

        def __array__(self, dtype=None, copy=None):
            model.forward(rng.integers(0, 256, (2, 3)), past_key_values=cache)  # past 4 -> 7
            return np.array([[4], [4]], dtype=dtype or np.int64)

    mask = np.ones((2, 5), bool)
    mask[0, 0] = False  # a padded row: the mask reaches the C++ model (one of all True does not)
    with pytest.raises(ValueError, match=r"^past_key_values: its length changed after attention_mask was checked"):
        model.forward(rng.integers(0, 256, (2, 1)), attention_mask=mask, position_ids=Positions(),
                      past_key_values=cache)
    assert cache.length == 7


def test_a_child_forked_during_calls_quantizes_and_uses_the_cache_it_copied():
    # Forked while another thread was in a module call (holding the weights' lock shared) and in a
    # step on a cache: the child's copies of both were held by a thread it does not have, and its
    # first quantize waited forever.
    out = _run("""
        import os, threading, time
        import numpy as np
        import transformer_core as tc
        from transformer_core import nn
        from transformer_core.llama import LlamaConfig, LlamaForCausalLM
        from transformer_core.quantization import quantize
        busy = nn.Linear(1024, 1024)
        busy.eval()
        x = np.ones((4096, 1024), np.float32)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=65536))
        model.eval()
        cache = model.new_cache(1)
        ids = np.arange(16384).reshape(1, -1) % 64
        stop = False
        def loop():
            while not stop:
                busy.forward(x)
        def steps():
            while not stop:
                cache.crop(0)
                model.forward(ids, past_key_values=cache)
        threads = [threading.Thread(target=loop), threading.Thread(target=steps)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        pid = os.fork()
        if pid == 0:
            small = nn.Linear(16, 16)
            quantize(small, inplace=True)
            model.forward(ids[:, :3], past_key_values=cache)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        stop = True
        for t in threads:
            t.join()
        print(os.waitstatus_to_exitcode(status))
    """, timeout=90)
    assert out.split() == ["0"]


def test_forked_child_computes_on_one_thread_and_refuses_more():
    # libgomp cannot start the parent's team again in a forked child: its first parallel region
    # waited forever (multiprocessing's default start method on Linux).
    out = _run("""
        import multiprocessing as mp
        import numpy as np
        import transformer_core as tc
        from transformer_core import nn
        x = np.random.default_rng(0).standard_normal((2, 30, 64)).astype(np.float32)
        layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        layer.eval()
        tc.set_num_threads(2)
        expected = layer.forward(x)  # runs parallel regions of 2 threads
        def child(queue):
            same = np.array_equal(layer.forward(x), expected)
            try:
                tc.set_num_threads(2)
                refused = ""
            except ValueError as error:
                refused = str(error)
            queue.put((same, tc.get_num_threads(), refused))
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            queue = ctx.Queue()
            p = ctx.Process(target=child, args=(queue,))
            p.start()
            same, threads, refused = queue.get(timeout=60)
            p.join(10)
            print(same, threads, refused.startswith("n: this process was forked after its parent's OpenMP threads"))
            print(tc.get_num_threads())
    """)
    assert out.split() == ["True", "1", "True", "2"]
