"""A Ctrl-C (SIGINT) in the middle of the Python API: state that must change together changes
together. Python raises the KeyboardInterrupt at the first bytecode after a C call returns, so a
Ctrl-C during an optimizer's C++ update, a weight copy or a file rename landed between the change
and its bookkeeping. Here a real SIGINT is sent from a trace function at a chosen source line (the
line after the C call), in the main thread, where Python runs its handler."""
from __future__ import annotations

import inspect
import os
import shutil
import signal
import sys
import threading

import numpy as np
import pytest
import transformer_core as tc
from transformer_core.optim import Adam
from transformer_core.parameter import Parameter


def _line_of(module, text: str) -> int:
    """The line number of the only line of ``module``'s source that contains ``text``."""
    lines = [i for i, line in enumerate(inspect.getsource(module).splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def _sigint_at(module, text: str, nth: int = 1) -> None:
    """Sends SIGINT to this process when ``module``'s line containing ``text`` is about to run for
    the ``nth`` time (a sys.settrace hook, removed when it fires). Python's handler raises the
    KeyboardInterrupt there, before that line: where a real Ctrl-C during the C call on the line
    before it would be raised."""
    filename, line, seen = inspect.getsourcefile(module), _line_of(module, text), [0]

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line:
            seen[0] += 1
            if seen[0] == nth:
                sys.settrace(None)
                os.kill(os.getpid(), signal.SIGINT)
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename == filename else None)


@pytest.fixture(autouse=True)
def _no_trace_left():
    yield
    sys.settrace(None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupted_adam_step_keeps_the_step_count_with_the_weights():
    """The weights and moments had step t while the step count said t - 1 (on a first step the
    whole state was lost): the next steps followed neither trajectory. Now the interrupt is raised
    after the step, whole; the run continues as the uninterrupted one."""
    import transformer_core.optim as optim

    def run(interrupt: bool):
        p = Parameter(np.ones(3, np.float32), name="w")
        opt = Adam([p], lr=0.1)
        for i in range(3):
            p.grad = np.array([1.0, -2.0, 3.0], np.float32)
            if interrupt and i in (0, 1):  # a parameter's first step, and a later one
                _sigint_at(optim, 'state["step"] += 1')
                with pytest.raises(KeyboardInterrupt):
                    opt.step()
                assert opt.state["w"]["step"] == i + 1
                continue
            opt.step()
        return p.data.copy(), opt.state["w"]["step"]

    (ref, ref_step), (got, got_step) = run(False), run(True)
    np.testing.assert_array_equal(got, ref)
    assert got_step == ref_step == 3


def test_an_interrupted_load_state_dict_loads_every_weight():
    """Interrupted after its first weight, the module was half loaded (and a pending backward ran on
    the mix): now every weight is loaded, then the interrupt is raised."""
    import transformer_core.module as module

    tc.manual_seed(0)
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16)
    tc.manual_seed(1)
    other = tc.nn.TransformerEncoderLayer(8, 2, 16).state_dict()
    _sigint_at(module, "slot.impl.set_parameter(slot.core_name, arr)", nth=2)
    with pytest.raises(KeyboardInterrupt):
        layer.load_state_dict(other)
    for name, value in layer.state_dict().items():
        np.testing.assert_array_equal(value, other[name], err_msg=name)


def test_an_interrupted_forward_releases_its_cache():
    """Interrupted as the hold ended (the release of the holders' lock is a C call), before the try
    that releases it, the cache stayed held by this thread: every other thread's call on it was
    refused ("in use by another call")."""
    import transformer_core.kv_cache as kv_cache

    model = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=20, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    cache = model.new_cache(1, 16)
    source = inspect.getsource(kv_cache)
    # the line after the holders' lock: the hold's return (before), or the next statement of the caller now
    _sigint_at(kv_cache, "        return outermost" if "        return outermost" in source else "self._holder = me")
    with pytest.raises(KeyboardInterrupt):
        model(np.array([[1, 2, 3]]), past_key_values=cache, use_cache=True)
    errors = []

    def other_thread():
        try:
            model(np.array([[1, 2, 3]]), past_key_values=cache, use_cache=True)
        except ValueError as e:
            errors.append(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert errors == [] and cache.length == 3


@pytest.mark.parametrize("where", ["if final not in changed:",  # after a new file's rename
                                   "written.append((temporary, final))",  # after a temporary's creation
                                   "if linked:"])  # after a backup's link
def test_an_interrupted_save_leaves_the_previous_checkpoint_whole(tmp_path, where):
    """Interrupted right after a rename, the rollback did not know that file had changed: it deleted
    the previous file's backup and left a mix of two saves that load_checkpoint refused; interrupted
    right after creating a temporary or a backup link, that file stayed behind. Now the folder is
    the previous checkpoint, whole, and nothing else."""
    import transformer_core.checkpoints as checkpoints
    from transformer_core.optim import SGD
    from transformer_core.training import load_checkpoint, save_checkpoint

    tc.manual_seed(0)
    model = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=50, n_embd=8, n_layer=1, n_head=2, n_positions=16))
    opt = SGD(model.named_parameters(), lr=0.1, momentum=0.9)
    ids = np.arange(6)[None]

    def train_step():
        model.train()
        model.loss(ids, ids)
        model.backward()
        opt.step()

    train_step()
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, model, opt)
    saved = {k: v.copy() for k, v in model.state_dict().items()}
    files = sorted(os.listdir(folder))
    train_step()
    _sigint_at(checkpoints, where, nth=2 if where.startswith("if final") else 1)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(folder, model, opt)
    assert sorted(os.listdir(folder)) == files
    loaded = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=50, n_embd=8, n_layer=1, n_head=2, n_positions=16))
    load_checkpoint(folder, loaded, SGD(loaded.named_parameters(), lr=0.1, momentum=0.9))
    for name, value in loaded.state_dict().items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    shutil.rmtree(folder)


def test_deferred_interrupts_is_a_no_op_off_the_main_thread_and_with_sigint_ignored():
    """Off the main thread (no SIGINT handler runs there) and with SIGINT ignored, the body runs as
    it is and the handler is left alone."""
    from transformer_core.module import deferred_interrupts

    seen = []

    def body():
        with deferred_interrupts():
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        body()
        assert seen[-1] is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
