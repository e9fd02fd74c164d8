"""transformer_core.lr_scheduler vs torch.optim.lr_scheduler and transformers' warmup schedules.

The learning rate at every step must equal torch's (the same Python float arithmetic: compared
exactly), with several param groups, past the end of the schedule, and when driving an optimizer.
"""
from __future__ import annotations

import copy
import itertools
import math
import pickle

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file
from transformer_core import lr_scheduler as S
from transformer_core import optim
from transformer_core.parameter import Parameter

LRS = [1e-3, 0.1]

# many tests step a scheduler alone: its warning about the order (tested below) is not their subject
pytestmark = pytest.mark.filterwarnings(r"ignore:.*step\(\) was called before optimizer\.step\(\)")


def both_optimizers():
    ours = optim.AdamW([{"params": [Parameter(np.zeros(2), name="a")], "lr": LRS[0]},
                        {"params": [Parameter(np.zeros(3), name="b")], "lr": LRS[1]}])
    theirs = torch.optim.AdamW([{"params": [torch.zeros(2, requires_grad=True)], "lr": LRS[0]},
                                {"params": [torch.zeros(3, requires_grad=True)], "lr": LRS[1]}], foreach=False)
    return ours, theirs


def compare(ours_sched, ours_opt, torch_sched, torch_opt, steps):
    assert ours_sched.get_last_lr() == torch_sched.get_last_lr(), "after construction"
    for t in range(steps):
        ours_opt.step()
        torch_opt.step()  # no gradients: nothing changes, but torch wants it before scheduler.step()
        ours_sched.step()
        torch_sched.step()
        assert ours_sched.get_last_lr() == torch_sched.get_last_lr(), f"step {t + 1}"
        assert [g["lr"] for g in ours_opt.param_groups] == [g["lr"] for g in torch_opt.param_groups]


def test_lambda_lr():
    ours_opt, torch_opt = both_optimizers()
    fns = [lambda t: 0.95 ** t, lambda t: 1.0 / (1 + t)]
    compare(S.LambdaLR(ours_opt, fns), ours_opt, torch.optim.lr_scheduler.LambdaLR(torch_opt, fns), torch_opt, 30)
    ours_opt, torch_opt = both_optimizers()
    compare(S.LambdaLR(ours_opt, fns[0]), ours_opt, torch.optim.lr_scheduler.LambdaLR(torch_opt, fns[0]), torch_opt,
            10)


@pytest.mark.parametrize("warmup,total", [(10, 100), (0, 30), (5, 5), (30, 20)])
def test_linear_schedule_with_warmup(warmup, total):
    ours_opt, torch_opt = both_optimizers()
    compare(S.get_linear_schedule_with_warmup(ours_opt, warmup, total), ours_opt,
            transformers.get_linear_schedule_with_warmup(torch_opt, warmup, total), torch_opt, total + 10)


@pytest.mark.parametrize("warmup,total,cycles", [(10, 100, 0.5), (0, 40, 0.5), (7, 50, 2.0), (3, 3, 0.5)])
def test_cosine_schedule_with_warmup(warmup, total, cycles):
    ours_opt, torch_opt = both_optimizers()
    compare(S.get_cosine_schedule_with_warmup(ours_opt, warmup, total, num_cycles=cycles), ours_opt,
            transformers.get_cosine_schedule_with_warmup(torch_opt, warmup, total, num_cycles=cycles), torch_opt,
            total + 10)


@pytest.mark.parametrize("start,end,total", [(1 / 3, 1.0, 5), (1.0, 0.0, 20), (0.1, 0.7, 1)])
def test_linear_lr(start, end, total):
    ours_opt, torch_opt = both_optimizers()
    compare(S.LinearLR(ours_opt, start, end, total), ours_opt,
            torch.optim.lr_scheduler.LinearLR(torch_opt, start, end, total), torch_opt, total + 8)


@pytest.mark.parametrize("total", [4, 5, 7, 10])
def test_linear_decay_to_zero_ends_at_zero(total):
    """From start_factor 1/3 to 0, torch's recursive ratio rounds to -1.5e-17 on the last step and
    writes lr = -1.5e-18 (a negative lr our optimizers refuse: the step raised). Ours writes 0 there
    and torch's rate at every other step, exactly."""
    ours_opt, torch_opt = both_optimizers()
    ours = S.LinearLR(ours_opt, 1 / 3, 0.0, total)
    theirs = torch.optim.lr_scheduler.LinearLR(torch_opt, 1 / 3, 0.0, total)
    for t in range(total + 3):
        ours_opt.step()
        torch_opt.step()
        ours.step()
        theirs.step()
        want = [max(0.0, lr) for lr in theirs.get_last_lr()]
        assert ours.get_last_lr() == want, f"step {t + 1}"
    assert min(theirs.get_last_lr()) < 0  # what the test is about: torch's last rates are below 0
    assert ours.get_last_lr() == [0.0, 0.0]


@pytest.mark.parametrize("T_max,eta_min", [(10, 0.0), (7, 1e-4), (1, 0.0)])
def test_cosine_annealing_lr(T_max, eta_min):
    ours_opt, torch_opt = both_optimizers()
    compare(S.CosineAnnealingLR(ours_opt, T_max, eta_min), ours_opt,
            torch.optim.lr_scheduler.CosineAnnealingLR(torch_opt, T_max, eta_min), torch_opt, 3 * T_max + 2)


WHOLE_FLOAT_SCHEDULES = [
    (lambda L, o: L.CosineAnnealingLR(o, T_max=7.0, eta_min=1e-4), 23),
    (lambda L, o: L.CosineAnnealingLR(o, T_max=np.float64(5.0)), 17),
    (lambda L, o: L.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4.0), 9),
    (lambda L, o: L.SequentialLR(o, [L.LinearLR(o, 0.1, 1.0, total_iters=4.0), L.CosineAnnealingLR(o, T_max=6.0)],
                                 milestones=[4.0]), 14),
    (lambda L, o: L.get_linear_schedule_with_warmup(o, 5.0, 20.0), 25),
    (lambda L, o: L.get_cosine_schedule_with_warmup(o, 3.0, np.float32(12.0)), 16),
]


@pytest.mark.parametrize("make,steps", WHOLE_FLOAT_SCHEDULES,
                         ids=["cosine", "cosine_np", "linear", "sequential", "hf_linear", "hf_cosine"])
def test_whole_float_step_counts_match_torch(make, steps):
    """T_max, total_iters, milestones and the warmup schedules' step counts given as whole floats
    (``epochs * len(loader) / accum``), which torch and transformers take: the same learning rates
    as theirs, exactly, and the settings held as ints. (They were a TypeError.)"""
    ours_opt, torch_opt = both_optimizers()
    torch_ns = type("L", (), {**vars(torch.optim.lr_scheduler), "get_linear_schedule_with_warmup":
                              staticmethod(transformers.get_linear_schedule_with_warmup),
                              "get_cosine_schedule_with_warmup":
                              staticmethod(transformers.get_cosine_schedule_with_warmup)})
    ours = make(S, ours_opt)
    compare(ours, ours_opt, make(torch_ns, torch_opt), torch_opt, steps)
    inner = ours._schedulers if isinstance(ours, S.SequentialLR) else [ours]
    for s in inner:
        for key in s._INT_HYPER:
            assert type(getattr(s, key)) is int, key
    if isinstance(ours, S.SequentialLR):
        assert ours._milestones == [4] and type(ours._milestones[0]) is int


@pytest.mark.parametrize("make,argument", [
    (lambda o, x: S.CosineAnnealingLR(o, T_max=x), "T_max"),
    (lambda o, x: S.LinearLR(o, total_iters=x), "total_iters"),
    (lambda o, x: S.SequentialLR(o, [S.LinearLR(o), S.CosineAnnealingLR(o, 5)], milestones=[x]), r"milestones\[0\]"),
    (lambda o, x: S.get_linear_schedule_with_warmup(o, x, 20), "num_warmup_steps"),
    (lambda o, x: S.get_cosine_schedule_with_warmup(o, 2, x), "num_training_steps"),
], ids=["T_max", "total_iters", "milestones", "num_warmup_steps", "num_training_steps"])
def test_fractional_step_counts_are_refused(make, argument):
    """A float that is no whole number of steps (100.5, NaN, inf) is a ValueError naming the
    argument, a bool or str still a TypeError."""
    opt, _ = both_optimizers()
    for value, shown in [(4.5, "float 4.5"), (np.float64(2.25), "float64 2.25"), (math.nan, "float nan"),
                         (math.inf, "float inf")]:
        with pytest.raises(ValueError, match=rf"^{argument}: expected an int, or a float holding a whole number "
                                             rf"\(such as 100.0\), got {shown}$"):
            make(opt, value)
    for value in (True, "4"):
        with pytest.raises(TypeError, match=rf"^{argument}: expected an int, got "):
            make(opt, value)
    with pytest.raises(ValueError, match=rf"^{argument}: expected an int in \["):
        make(opt, -3.0)


def test_schedule_drives_adamw_like_torch(rng):
    """AdamW with linear warmup and decay, 20 steps: the weights equal torch's to 1e-12."""
    values = [rng.standard_normal(s) for s in [(4, 3), (5,)]]
    ours = [Parameter(v.copy(), name=f"p{i}") for i, v in enumerate(values)]
    theirs = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    ours_opt = optim.AdamW(ours, lr=0.05, weight_decay=0.1)
    torch_opt = torch.optim.AdamW(theirs, lr=0.05, weight_decay=0.1, foreach=False)
    ours_sched = S.get_linear_schedule_with_warmup(ours_opt, 5, 20)
    torch_sched = transformers.get_linear_schedule_with_warmup(torch_opt, 5, 20)
    for _ in range(20):
        for p, q in zip(ours, theirs):
            g = rng.standard_normal(p.shape)
            p.grad, q.grad = g.copy(), torch.tensor(g)
        ours_opt.step()
        torch_opt.step()
        ours_sched.step()
        torch_sched.step()
        for p, q in zip(ours, theirs):
            np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [
    lambda o: S.get_cosine_schedule_with_warmup(o, 4, 30),
    lambda o: S.LinearLR(o, 0.25, 1.0, 6),
    lambda o: S.CosineAnnealingLR(o, 9, 1e-5),
], ids=["cosine_warmup", "linear", "cosine_annealing"])
@pytest.mark.parametrize("optimizer_first", [True, False], ids=["optimizer_first", "scheduler_first"])
def test_state_dict_round_trip(tmp_path, make, optimizer_first):
    """Save optimizer + scheduler after 7 steps, restore into fresh ones (built first, as torch's,
    then loaded in either order): the same lr from then on."""
    opt, _ = both_optimizers()
    sched = make(opt)
    for _ in range(7):
        opt.step()
        sched.step()
    save_file(opt.state_dict(), str(tmp_path / "opt.safetensors"))
    save_file(sched.state_dict(), str(tmp_path / "sched.safetensors"))
    opt2, _ = both_optimizers()
    sched2 = make(opt2)  # construction steps once; the loaded states replace that
    loads = [lambda: opt2.load_state_dict(load_file(str(tmp_path / "opt.safetensors"))),
             lambda: sched2.load_state_dict(load_file(str(tmp_path / "sched.safetensors")))]
    for load in loads if optimizer_first else loads[::-1]:
        load()
    assert sched2.get_last_lr() == sched.get_last_lr()
    for g, h in zip(opt.param_groups, opt2.param_groups):
        assert h["lr"] == g["lr"] and h["initial_lr"] == g["initial_lr"]
    for _ in range(25):
        opt.step()
        sched.step()
        opt2.step()
        sched2.step()
        assert sched.get_last_lr() == sched2.get_last_lr()


def test_resume_with_last_epoch():
    opt, _ = both_optimizers()
    with pytest.raises(ValueError, match="initial_lr"):
        S.LinearLR(opt, last_epoch=3)
    S.LinearLR(opt)
    S.LinearLR(opt, last_epoch=3)  # initial_lr is there now


def test_bad_arguments():
    opt, _ = both_optimizers()
    with pytest.raises(TypeError, match="optimizer"):
        S.LambdaLR(object(), lambda t: 1.0)
    with pytest.raises(ValueError, match="lr_lambda"):
        S.LambdaLR(opt, [lambda t: 1.0])
    with pytest.raises(TypeError, match="lr_lambda"):
        S.LambdaLR(opt, 0.5)
    with pytest.raises(ValueError, match="start_factor"):
        S.LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="T_max"):
        S.CosineAnnealingLR(opt, 0)
    with pytest.raises(ValueError, match="num_warmup_steps"):
        S.get_linear_schedule_with_warmup(opt, -1, 10)
    with pytest.raises(ValueError, match=r"^num_training_steps: expected an int, or a float holding a whole number"):
        S.get_cosine_schedule_with_warmup(opt, 1, 10.5)
    with pytest.raises(TypeError, match=r"^num_training_steps: expected an int, got str '10'"):
        S.get_cosine_schedule_with_warmup(opt, 1, "10")
    sched = S.LinearLR(opt)
    with pytest.raises(ValueError, match="missing keys"):
        sched.load_state_dict({"last_epoch": np.array(1)})


LOAD_CASES = [
    (lambda o: S.CosineAnnealingLR(o, 5), "T_max", np.array(0.0), r"T_max: expected an int in \[1, 2\*\*63 - 1\], got 0"),
    (lambda o: S.CosineAnnealingLR(o, 5), "T_max", np.array(2.5), r"T_max: expected a whole number, got 2.5"),
    (lambda o: S.CosineAnnealingLR(o, 5), "eta_min", np.array(np.nan), r"eta_min: expected a finite number"),
    (lambda o: S.LinearLR(o, 0.5, 1.0, 4), "total_iters", np.array(0.0), r"total_iters: expected an int in \[1, "),
    (lambda o: S.LinearLR(o, 0.5, 1.0, 4), "total_iters", np.array(3.5), r"total_iters: expected a whole number"),
    (lambda o: S.LinearLR(o, 0.5, 1.0, 4), "start_factor", np.array(0.0), r"start_factor: expected a value in \(0, 1\]"),
    (lambda o: S.LinearLR(o, 0.5, 1.0, 4), "end_factor", np.array(1.5), r"end_factor: expected a value in \[0, 1\]"),
    (lambda o: S.LinearLR(o, 0.5, 1.0, 4), "start_factor", np.array([0.5, 0.5]), r"start_factor: expected a number"),
    (lambda o: S.LinearLR(o), "last_epoch", np.array(1.5), r"last_epoch: expected a whole number, got 1.5"),
    (lambda o: S.LinearLR(o), "last_epoch", np.array(-2), r"last_epoch: expected an int >= -1, got -2"),
    (lambda o: S.LinearLR(o), "step_count", np.array(-1), r"step_count: expected an int >= 0, got -1"),
    # counters past int64 (what state_dict saves them as): they were taken, and state_dict then raised
    (lambda o: S.CosineAnnealingLR(o, 5), "last_epoch", np.array(1e30),
     r"last_epoch: expected an int <= 9223372036854775807 \(an int64 count\), got 1000000000000000019884624838656$"),
    (lambda o: S.LinearLR(o), "step_count", np.array(2**63, dtype=np.uint64),
     r"step_count: expected an int <= 9223372036854775807 \(an int64 count\), got 9223372036854775808$"),
    (lambda o: S.LinearLR(o), "last_epoch", np.array(np.inf), r"last_epoch: expected a whole number, got inf"),
    (lambda o: S.LinearLR(o), "base_lrs", np.array([0.1, np.nan]), r"base_lrs\[1\]: expected a finite number >= 0.0"),
    (lambda o: S.LinearLR(o), "last_lr", np.array([-0.1, 0.1]), r"last_lr\[0\]: expected a finite number >= 0.0"),
]


def _assert_unchanged(sched, sd, opt, groups):
    """A refused load changed nothing: the scheduler's state and the optimizer's groups."""
    after = sched.state_dict()
    assert all(np.array_equal(after[k], sd[k]) for k in sd)
    assert [dict(g) for g in opt.param_groups] == groups


@pytest.mark.parametrize("make,key,value,match", LOAD_CASES, ids=[f"{k}={v}" for _, k, v, _ in LOAD_CASES])
def test_load_state_dict_checks_every_value_and_changes_nothing(make, key, value, match):
    """A saved setting the constructor would refuse (T_max = 0 would divide by zero at the next step;
    T_max = 2.5 would be truncated), a fractional or out-of-range counter, a non-finite or negative
    learning rate: ValueError naming the key, the scheduler and the optimizer's groups unchanged."""
    opt, _ = both_optimizers()
    sched = make(opt)
    for _ in range(2):
        sched.step()
    sd = sched.state_dict()
    lrs = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match=f"load_state_dict: {match}"):
        sched.load_state_dict({**sd, key: value})
    _assert_unchanged(sched, sd, opt, lrs)
    sched.step()  # still usable
    with pytest.raises(TypeError, match="state_dict: expected a mapping"):
        sched.load_state_dict([("T_max", 1)])


MAX_COUNT = 2**63 - 1  # int64's largest: state_dict saves the counters as int64 scalars


@pytest.mark.parametrize("make", [
    lambda o, e: S.LinearLR(o, last_epoch=e),
    lambda o, e: S.CosineAnnealingLR(o, 5, last_epoch=e),
    lambda o, e: S.LambdaLR(o, lambda t: 0.5, last_epoch=e),
    lambda o, e: S.get_linear_schedule_with_warmup(o, 2, 10, last_epoch=e),
], ids=["LinearLR", "CosineAnnealingLR", "LambdaLR", "linear_warmup"])
def test_counters_are_bounded_to_int64(make):
    """The constructor takes a last_epoch up to 2**63 - 2 (its initial step adds one); its
    state_dict saves last_epoch 2**63 - 1 exactly, and loads back exactly (it was read through a
    float: 2**63); step() past it is a ValueError naming last_epoch that changes nothing. 2**63 - 1
    was taken by the constructor, and state_dict() then raised OverflowError."""
    opt, _ = both_optimizers()
    S.LinearLR(opt)  # puts initial_lr into the groups, to resume from
    with pytest.raises(ValueError, match=r"^last_epoch: expected an int in \[-1, 9223372036854775806\], "
                                         r"got 9223372036854775807$"):
        make(opt, MAX_COUNT)
    sched = make(opt, MAX_COUNT - 1)
    assert sched.last_epoch == MAX_COUNT
    sd = sched.state_dict()
    assert sd["last_epoch"].dtype == np.int64 and int(sd["last_epoch"]) == MAX_COUNT
    groups = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match=rf"^step: {type(sched).__name__}'s last_epoch is {MAX_COUNT}, the largest "
                                         r"a state dict holds \(int64, 9223372036854775807\): the schedule cannot "
                                         r"advance further; nothing was changed$"):
        sched.step()
    _assert_unchanged(sched, sd, opt, groups)
    again = make(opt, -1)
    again.load_state_dict(sd)
    assert again.last_epoch == MAX_COUNT and type(again.last_epoch) is int
    assert all(np.array_equal(again.state_dict()[k], sd[k]) for k in sd)


def test_step_count_at_the_int64_bound_is_refused_by_step():
    """A step count loaded at 2**63 - 1 (last_epoch below it): step() is a ValueError naming
    step_count, nothing changed."""
    opt, _ = both_optimizers()
    sched = S.LinearLR(opt)
    sd = {**sched.state_dict(), "step_count": np.array(MAX_COUNT, dtype=np.int64)}
    sched.load_state_dict(sd)
    assert sched._step_count == MAX_COUNT
    groups = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match=r"^step: LinearLR's step_count is 9223372036854775807, the largest a state "
                                         r"dict holds"):
        sched.step()
    _assert_unchanged(sched, sd, opt, groups)


def test_sequential_lr_last_epoch_is_bounded_to_int64():
    """SequentialLR: a constructor's last_epoch up to 2**63 - 2 (it counts one more), a loaded one up
    to 2**63 - 1; step() past it is a ValueError naming last_epoch, changing nothing."""
    opt, _ = both_optimizers()
    warmup, cosine = S.LinearLR(opt, 0.5, total_iters=2), S.CosineAnnealingLR(opt, 5)
    with pytest.raises(ValueError, match=r"^last_epoch: expected an int in \[-1, 9223372036854775806\]"):
        S.SequentialLR(opt, [warmup, cosine], [2], last_epoch=MAX_COUNT)
    seq = S.SequentialLR(opt, [warmup, cosine], [2])
    seq.step()
    sd = {**seq.state_dict(), "last_epoch": np.array(MAX_COUNT, dtype=np.int64)}
    seq.load_state_dict(sd)
    assert seq.last_epoch == MAX_COUNT and int(seq.state_dict()["last_epoch"]) == MAX_COUNT
    groups = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match=r"^step: SequentialLR's last_epoch is 9223372036854775807"):
        seq.step()
    _assert_unchanged(seq, sd, opt, groups)


def test_load_state_dict_int_settings_saved_as_float():
    """int settings are saved as float64: a whole value loads as an int."""
    opt, _ = both_optimizers()
    sched = S.CosineAnnealingLR(opt, 5)
    sd = {**sched.state_dict(), "T_max": np.array(7.0)}
    sched.load_state_dict(sd)
    assert sched.T_max == 7 and type(sched.T_max) is int


def _scheduler_state(sched, opt):
    """What a refused scheduler step must leave as it was."""
    return (sched.last_epoch, sched._step_count, sched.get_last_lr(), [dict(g, params=None) for g in opt.param_groups])


@pytest.mark.parametrize("factor,error,match", [
    (-0.5, ValueError, r"expected a finite number >= 0\.0, got -0\.05 "),
    (float("nan"), ValueError, r"expected a finite number >= 0\.0, got nan "),
    (float("inf"), ValueError, r"expected a finite number >= 0\.0, got inf "),
    (np.array([1.0, 2.0]), TypeError, r"expected a number, got ndarray \(2,\) float64 "),
    (0.5 + 0j, TypeError, r"expected a number, got complex \(0\.05\+0j\) "),
], ids=["negative", "nan", "inf", "array", "complex"])
def test_lambda_lr_bad_factor_is_refused_by_the_scheduler_step(rng, factor, error, match):
    """A LambdaLR whose function gives a learning rate that is not a finite number >= 0 (torch
    writes it into the group, and then ascends, writes NaN, or fails in the optimizer's step): the
    scheduler's step raises, naming lr_lambda, the epoch, the group and the value, and nothing
    changes (counters, get_last_lr, the groups); the optimizer goes on at the last lr, as torch's
    at that lr, and the next step is refused again."""
    values = [rng.standard_normal(s) for s in [(4, 3), (5,)]]
    ours = [Parameter(v.copy(), name=f"p{i}") for i, v in enumerate(values)]
    theirs = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    ours_opt = optim.SGD(ours, lr=0.1, momentum=0.9)
    torch_opt = torch.optim.SGD(theirs, lr=0.1, momentum=0.9, foreach=False)
    sched = S.LambdaLR(ours_opt, lambda t: factor if t == 1 else 1.0)
    before = _scheduler_state(sched, ours_opt)
    prefix = r"^lr_lambda \(epoch 1\): param_groups\[0\]: lr = initial_lr \(0\.1\) \* lr_lambda\(1\): "
    with pytest.raises(error, match=prefix + match + r"\(the optimizers take a finite learning rate >= 0\); "
                                                      r"nothing was changed$"):
        sched.step()
    assert _scheduler_state(sched, ours_opt) == before
    assert before[:3] == (0, 1, [0.1])
    for p, q in zip(ours, theirs):
        g = rng.standard_normal(p.shape)
        p.grad, q.grad = g.copy(), torch.tensor(g)
    ours_opt.step()
    torch_opt.step()
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ours_opt.state[p.name]["momentum_buffer"],
                                   torch_opt.state[q]["momentum_buffer"].numpy(), rtol=1e-12, atol=1e-14)
    with pytest.raises(error, match=prefix + match):
        sched.step()
    assert _scheduler_state(sched, ours_opt) == before


@pytest.mark.parametrize("factor,error,match", [
    ("1", TypeError, r"expected a function returning a real number \(the factor of initial_lr\), got str '1'"),
    (None, TypeError, r"expected a function returning a real number \(the factor of initial_lr\), got NoneType"),
    (-1.0, ValueError, r"lr = initial_lr \(0\.1\) \* lr_lambda\(0\): expected a finite number >= 0\.0, got -0\.1 "),
], ids=["str", "None", "negative"])
def test_lambda_lr_bad_factor_at_construction_changes_nothing(factor, error, match):
    """The constructor's initial step (epoch 0) refuses a bad factor as a step does: the groups keep
    their lr and get no initial_lr, and the error names lr_lambda and epoch 0 (torch: a str or None
    fails inside its multiplication, naming nothing; a negative lr is written)."""
    opt = optim.SGD([{"params": [Parameter(np.zeros(2), name="a")], "lr": 0.1},
                     {"params": [Parameter(np.zeros(3), name="b")], "lr": 0.2}])
    groups = [dict(g) for g in opt.param_groups]
    # the second group's factor is fine: neither group is written
    with pytest.raises(error, match=r"^lr_lambda \(epoch 0\): param_groups\[0\]: " + match):
        S.LambdaLR(opt, [lambda t: factor, lambda t: 1.0])
    assert opt.param_groups == groups and all("initial_lr" not in g for g in opt.param_groups)


@pytest.mark.parametrize("factor", [np.float64(0.5), np.float32(0.5), np.array(0.5), np.array(2, np.int64),
                                    torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64), 2, True, 0,
                                    __import__("fractions").Fraction(1, 3)],
                         ids=["np.float64", "np.float32", "np 0-d", "np 0-d int", "torch 0-d", "torch 0-d f64",
                              "int", "bool", "zero", "Fraction"])
def test_lambda_lr_takes_the_numbers_torch_takes(factor):
    """A factor that torch's LambdaLR takes and its optimizer can step with (a numpy number, a 0-d
    numpy array or torch tensor, an int, a bool, a Fraction) gives torch's learning rate, written
    as a Python float; the optimizer steps as torch's."""
    ours = [Parameter(np.zeros(2), name="a"), Parameter(np.zeros(3), name="b")]
    theirs = [torch.zeros(2, dtype=torch.float64, requires_grad=True),
              torch.zeros(3, dtype=torch.float64, requires_grad=True)]
    ours_opt = optim.SGD([{"params": [ours[0]], "lr": LRS[0]}, {"params": [ours[1]], "lr": LRS[1]}])
    torch_opt = torch.optim.SGD([{"params": [theirs[0]], "lr": LRS[0]}, {"params": [theirs[1]], "lr": LRS[1]}],
                                foreach=False)
    ours_sched = S.LambdaLR(ours_opt, lambda t: factor)
    torch_sched = torch.optim.lr_scheduler.LambdaLR(torch_opt, lambda t: factor)
    expected = [float(g["lr"]) for g in torch_opt.param_groups]
    assert [g["lr"] for g in ours_opt.param_groups] == expected == ours_sched.get_last_lr()
    assert all(type(g["lr"]) is float for g in ours_opt.param_groups)
    for step in range(2):
        for p, q in zip(ours, theirs):
            p.grad, q.grad = np.ones(p.shape), torch.ones(q.shape, dtype=torch.float64)
        ours_opt.step()
        torch_opt.step()
        ours_sched.step()
        torch_sched.step()
        assert ours_sched.get_last_lr() == [float(x) for x in torch_sched.get_last_lr()]
        for p, q in zip(ours, theirs):
            np.testing.assert_array_equal(p.data, q.detach().numpy(), err_msg=f"step {step}")


def test_a_rate_computed_from_a_group_lr_written_by_hand_is_refused_by_the_step():
    """The recursive schedulers compute the new lr from the group's current one: a NaN written there
    by hand is refused by the step (naming the scheduler's class, the epoch and the group), which
    changes nothing; a SequentialLR's step, through its scheduler's, too."""
    opt, _ = both_optimizers()
    sched = S.CosineAnnealingLR(opt, 5)
    sched.step()
    opt.param_groups[1]["lr"] = float("nan")
    before = _scheduler_state(sched, opt)
    with pytest.raises(ValueError, match=r"^CosineAnnealingLR \(epoch 2\): param_groups\[1\]: lr: expected a "
                                         r"finite number >= 0\.0, got nan"):
        sched.step()
    after = _scheduler_state(sched, opt)
    assert after[:3] == before[:3] and np.isnan(after[3][1]["lr"]) and after[3][0] == before[3][0]
    opt, _ = both_optimizers()
    warmup = S.LambdaLR(opt, lambda t: 1.0 - t / 2)   # no max(0, ·): negative from epoch 3
    seq = S.SequentialLR(opt, [warmup, S.CosineAnnealingLR(opt, 4)], milestones=[5])
    seq.step()
    seq.step()
    state = (seq.last_epoch, seq.get_last_lr(), _scheduler_state(warmup, opt))
    with pytest.raises(ValueError, match=r"^lr_lambda \(epoch 3\): param_groups\[0\]: lr = initial_lr \(0\.001\) "
                                         r"\* lr_lambda\(3\): expected a finite number >= 0\.0, got -0\.0005"):
        seq.step()
    assert (seq.last_epoch, seq.get_last_lr(), _scheduler_state(warmup, opt)) == state == (2, [0.0, 0.0], state[2])


def schedule_both(kind):
    """An SGD with momentum over two groups and a schedule of ``kind``, ours and torch's."""
    rng = np.random.default_rng(11)
    values = [rng.standard_normal(s) for s in [(4, 3), (5,)]]
    ours = [Parameter(v.copy(), name=f"p{i}") for i, v in enumerate(values)]
    theirs = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    ours_opt = optim.SGD([{"params": ours[:1]}, {"params": ours[1:], "lr": 0.02}], lr=0.1, momentum=0.9)
    torch_opt = torch.optim.SGD([{"params": theirs[:1]}, {"params": theirs[1:], "lr": 0.02}], lr=0.1, momentum=0.9,
                                foreach=False)
    if kind == "cosine_annealing":
        return ours_opt, S.CosineAnnealingLR(ours_opt, 6, 1e-3), torch_opt, \
            torch.optim.lr_scheduler.CosineAnnealingLR(torch_opt, 6, 1e-3)
    if kind == "linear":
        return ours_opt, S.LinearLR(ours_opt, 0.2, 1.0, 8), torch_opt, \
            torch.optim.lr_scheduler.LinearLR(torch_opt, 0.2, 1.0, 8)
    return ours_opt, S.get_linear_schedule_with_warmup(ours_opt, 3, 12), torch_opt, \
        transformers.get_linear_schedule_with_warmup(torch_opt, 3, 12)


def params_of(opt):
    return [p for g in opt.param_groups for p in g["params"]]


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("kind", ["cosine_annealing", "linear", "linear_warmup"])
def test_copied_scheduler_goes_on_like_the_original(kind, how):
    """A scheduler copied with its optimizer (copy.deepcopy, pickle) after 4 steps: the copy, the
    original and torch's (never copied) give the same learning rates and weights for 8 more steps."""
    ours_opt, sched, torch_opt, torch_sched = schedule_both(kind)
    rng = np.random.default_rng(3)
    grads = [[rng.standard_normal(p.shape) for p in params_of(ours_opt)] for _ in range(12)]

    def step(t, runs):
        for opt, sch in runs:
            for p, g in zip(params_of(opt), grads[t]):
                p.grad = g.copy() if isinstance(p, Parameter) else torch.tensor(g)
            opt.step()
            sch.step()

    for t in range(4):
        step(t, [(ours_opt, sched), (torch_opt, torch_sched)])
    dup = copy.deepcopy(sched) if how == "deepcopy" else pickle.loads(pickle.dumps(sched))
    dup_opt = dup.optimizer
    assert dup_opt is not ours_opt and all(p is not q for p, q in zip(params_of(dup_opt), params_of(ours_opt)))
    for t in range(4, 12):
        step(t, [(ours_opt, sched), (dup_opt, dup), (torch_opt, torch_sched)])
        assert dup.get_last_lr() == sched.get_last_lr() == torch_sched.get_last_lr(), f"step {t + 1}"
        assert [g["lr"] for g in dup_opt.param_groups] == [g["lr"] for g in torch_opt.param_groups]
    for p, q, r in zip(params_of(ours_opt), params_of(dup_opt), params_of(torch_opt)):
        np.testing.assert_allclose(p.data, r.detach().numpy(), rtol=1e-12, atol=1e-12)
        assert np.array_equal(p.data, q.data)


def test_step_refuses_a_group_added_after_the_scheduler():
    """A param group added after the scheduler was built has no base lr: step() raises ValueError
    (torch's raises too, from its strict zip) before changing anything: the counters and every
    group's lr stay at torch's values from before the group was added."""
    ours_opt, torch_opt = both_optimizers()
    sched = S.LambdaLR(ours_opt, lambda t: 0.5 ** t)
    torch_sched = torch.optim.lr_scheduler.LambdaLR(torch_opt, lambda t: 0.5 ** t)
    torch_opt.step()  # no gradients: nothing moves, but torch wants it before its scheduler's step
    sched.step()
    torch_sched.step()
    expected = torch_sched.get_last_lr()
    ours_opt.add_param_group({"params": [Parameter(np.zeros(2), name="c")], "lr": 0.3})
    torch_opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "lr": 0.3})
    state = sched.state_dict()
    with pytest.raises(ValueError, match=r"step: the optimizer has 3 param groups, this scheduler has 2 base_lrs"):
        sched.step()
    with pytest.raises(ValueError):
        torch_sched.step()
    after = sched.state_dict()
    assert all(np.array_equal(after[k], state[k]) for k in state)
    assert sched.get_last_lr() == expected and [g["lr"] for g in ours_opt.param_groups] == expected + [0.3]


def test_failed_step_changes_nothing():
    """get_lr raising (a LambdaLR's function) leaves last_epoch, the step count and the groups' lr as
    they were: once the function works again, the schedule is torch's, which never saw the failure.
    A constructor whose first step raises takes back the initial_lr it wrote."""
    ours_opt, torch_opt = both_optimizers()
    fail = {"now": False}

    def f(t):
        if fail["now"]:
            raise RuntimeError("boom")
        return 0.9 ** t

    sched = S.LambdaLR(ours_opt, f)
    torch_sched = torch.optim.lr_scheduler.LambdaLR(torch_opt, lambda t: 0.9 ** t)
    torch_opt.step()  # no gradients: nothing moves, but torch wants it before its scheduler's step
    for _ in range(2):
        sched.step()
        torch_sched.step()
    state, lrs = sched.state_dict(), [g["lr"] for g in ours_opt.param_groups]
    fail["now"] = True
    with pytest.raises(RuntimeError, match="boom"):
        sched.step()
    after = sched.state_dict()
    assert all(np.array_equal(after[k], state[k]) for k in state) and sched.last_epoch == 2
    assert [g["lr"] for g in ours_opt.param_groups] == lrs == torch_sched.get_last_lr()
    fail["now"] = False
    for t in range(5):
        sched.step()
        torch_sched.step()
        assert sched.get_last_lr() == torch_sched.get_last_lr(), f"step {t + 3}"
    fresh, fresh_t = both_optimizers()
    fail["now"] = True
    with pytest.raises(RuntimeError, match="boom"):
        S.LambdaLR(fresh, f)
    assert all("initial_lr" not in g for g in fresh.param_groups)
    fresh_sched = S.LinearLR(fresh, 0.5, 1.0, 3)
    fresh_sched_t = torch.optim.lr_scheduler.LinearLR(fresh_t, 0.5, 1.0, 3)
    compare(fresh_sched, fresh, fresh_sched_t, fresh_t, 5)


def test_cosine_annealing_refuses_a_negative_eta_min():
    """eta_min < 0 would write negative learning rates (which the optimizers and this scheduler's own
    load_state_dict refuse): ValueError naming eta_min at construction (the groups untouched) and
    at load; eta_min = 0 is torch's schedule."""
    ours_opt, torch_opt = both_optimizers()
    with pytest.raises(ValueError, match=r"eta_min: expected a finite number >= 0.0, got -0.05"):
        S.CosineAnnealingLR(ours_opt, 4, eta_min=-0.05)
    assert all("initial_lr" not in g for g in ours_opt.param_groups)
    sched = S.CosineAnnealingLR(ours_opt, 4, eta_min=0.0)
    torch_sched = torch.optim.lr_scheduler.CosineAnnealingLR(torch_opt, 4, eta_min=0.0)
    with pytest.raises(ValueError, match=r"load_state_dict: eta_min: expected a finite number >= 0.0, got -0.05"):
        sched.load_state_dict({**sched.state_dict(), "eta_min": np.array(-0.05)})
    assert sched.eta_min == 0.0
    compare(sched, ours_opt, torch_sched, torch_opt, 10)


TYPE_CASES = [
    ("last_lr", np.array(["a", "b"]), r"last_lr: expected a number \(an int or float array\), got a <U1 array"),
    ("base_lrs", None, r"base_lrs: expected a number .*got a object array"),
    ("base_lrs", np.array([0.1, 0.2], np.complex128), r"base_lrs: expected a number .*got a complex128 array"),
    ("last_epoch", np.array(True), r"last_epoch: expected a number .*got a bool array"),
    ("step_count", np.array("3"), r"step_count: expected a number .*got a <U1 array"),
    ("T_max", None, r"T_max: expected a number .*got a object array"),
    ("eta_min", [[0.0], [0.0, 1.0]], r"eta_min: expected an array of numbers, got list"),
]


@pytest.mark.parametrize("key,value,match", TYPE_CASES, ids=[f"{k}={v!r}"[:40] for k, v, _ in TYPE_CASES])
def test_load_state_dict_names_the_key_of_a_value_of_no_numbers(key, value, match):
    """None, strings, bools, complex numbers, ragged lists: TypeError naming the key with what was
    expected and what was given (never a raw conversion error), the scheduler and the groups
    unchanged; the schedule then goes on as torch's."""
    ours_opt, torch_opt = both_optimizers()
    sched = S.CosineAnnealingLR(ours_opt, 5, 1e-4)
    torch_sched = torch.optim.lr_scheduler.CosineAnnealingLR(torch_opt, 5, 1e-4)
    compare(sched, ours_opt, torch_sched, torch_opt, 2)
    sd = sched.state_dict()
    groups = [dict(g) for g in ours_opt.param_groups]
    with pytest.raises(TypeError, match=f"load_state_dict: {match}"):
        sched.load_state_dict({**sd, key: value})
    _assert_unchanged(sched, sd, ours_opt, groups)
    compare(sched, ours_opt, torch_sched, torch_opt, 8)


CHAINS = {
    "linear+cosine": (lambda S_, o: [S_.LinearLR(o, 0.1, 1.0, 4), S_.CosineAnnealingLR(o, 6, 0.001)]),
    "cosine+linear": (lambda S_, o: [S_.CosineAnnealingLR(o, 5, 1e-4), S_.LinearLR(o, 0.5, 0.9, 7)]),
    "linear+lambda+cosine": (lambda S_, o: [S_.LinearLR(o, 0.25, 1.0, 3), S_.LambdaLR(o, _decay),
                                            S_.CosineAnnealingLR(o, 8, 0.0)]),
}


def _decay(t):
    return 0.9 ** t


def _chain(lib, name):
    """(optimizer, its chained schedulers) of ``lib`` (ours: S, or torch's lr_scheduler)."""
    if lib is S:
        opt, _ = both_optimizers()
    else:
        _, opt = both_optimizers()
    return opt, CHAINS[name](lib, opt)


@pytest.mark.parametrize("name", list(CHAINS))
def test_chained_schedulers_resume_in_any_load_order_like_torch(name):
    """Schedulers chained on one optimizer (each step() in turn, torch's chaining), saved after 3
    steps and loaded into fresh ones (built first) in every order of the optimizer's and the
    schedulers' loads: the groups' lr and get_last_lr() of the next 6 steps equal torch's
    uninterrupted run exactly, whatever the order (a scheduler's load leaves the groups' lr to the
    optimizer's state: a chain's first scheduler holds only its own step of the chain)."""
    torch_lib = torch.optim.lr_scheduler

    def steps(opt, scheds, n):
        """n chained steps; the groups' lr and each scheduler's last lr after each."""
        lrs = []
        for _ in range(n):
            opt.step()
            for s in scheds:
                s.step()
            lrs.append(([g["lr"] for g in opt.param_groups], [s.get_last_lr() for s in scheds]))
        return lrs

    runs = {}
    for lib in (S, torch_lib):
        opt, scheds = _chain(lib, name)
        steps(opt, scheds, 3)
        saved = [opt.state_dict()] + [s.state_dict() for s in scheds]
        runs[lib] = saved, steps(opt, scheds, 6)
    assert runs[S][1] == runs[torch_lib][1], "uninterrupted"
    for order in itertools.permutations(range(len(runs[S][0]))):  # the optimizer is 0, the schedulers 1, 2, ...
        for lib in (S, torch_lib):
            saved = runs[lib][0]
            opt, scheds = _chain(lib, name)
            objects = [opt] + scheds
            for i in order:
                objects[i].load_state_dict(copy.deepcopy(saved[i]))
            assert steps(opt, scheds, 6) == runs[torch_lib][1], f"{'ours' if lib is S else 'torch'}: load order {order}"


def test_scheduler_load_leaves_the_groups_lr_to_the_optimizer():
    """As torch's: load_state_dict restores the counters, base_lrs (the groups' initial_lr) and
    get_last_lr(), not the groups' lr (the optimizer's state carries it)."""
    for lib in (S, torch.optim.lr_scheduler):
        ours = lib is S
        opt = both_optimizers()[0 if ours else 1]
        sched = lib.LinearLR(opt, 0.2, 1.0, 5)
        for _ in range(3):
            opt.step()
            sched.step()
        sd = sched.state_dict()
        fresh = both_optimizers()[0 if ours else 1]
        sched2 = lib.LinearLR(fresh, 0.2, 1.0, 5)
        before = [g["lr"] for g in fresh.param_groups]
        sched2.load_state_dict(sd)
        assert [g["lr"] for g in fresh.param_groups] == before == [0.2 * lr for lr in LRS]
        assert sched2.get_last_lr() == sched.get_last_lr() and sched2.last_epoch == 3
        assert [g["initial_lr"] for g in fresh.param_groups] == LRS


@pytest.mark.parametrize("optimizer", [None, object(), "adam"], ids=["None", "object", "str"])
@pytest.mark.parametrize("as_list", [True, False], ids=["list", "function"])
def test_lambda_lr_checks_the_optimizer_first(optimizer, as_list):
    """Not an optimizer (torch raises AttributeError: no param_groups): a TypeError naming
    ``optimizer``, whatever lr_lambda is, not a complaint about the number of functions."""
    with pytest.raises(AttributeError, match="param_groups"):
        torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda t: 1.0])
    lr_lambda = [lambda t: 1.0] if as_list else (lambda t: 1.0)
    with pytest.raises(TypeError, match=rf"optimizer: expected an optimizer with param_groups, got {type(optimizer).__name__}"):
        S.LambdaLR(optimizer, lr_lambda)


# --------------------------------------------------------------------------------------------------
# SequentialLR
# --------------------------------------------------------------------------------------------------

SEQUENCES = {
    # name: (schedulers of lib on optimizer o, milestones)
    "warmup+cosine": (lambda L, o: [L.LinearLR(o, 0.1, 1.0, 5), L.CosineAnnealingLR(o, 12, 1e-4)], [5]),
    "warmup+cosine+linear": (lambda L, o: [L.LinearLR(o, 0.1, 1.0, 4), L.CosineAnnealingLR(o, 7, 1e-4),
                                           L.LinearLR(o, 1.0, 0.5, 3)], [4, 11]),
    "milestone_0": (lambda L, o: [L.LinearLR(o, 0.1, 1.0, 4), L.CosineAnnealingLR(o, 7)], [0]),
    "early_milestones": (lambda L, o: [L.LinearLR(o, 0.1, 1.0, 4), L.CosineAnnealingLR(o, 7, 1e-4),
                                       L.LinearLR(o, 1.0, 0.5, 3)], [1, 2]),
    "lambda+cosine": (lambda L, o: [L.LambdaLR(o, _decay), L.CosineAnnealingLR(o, 6, 1e-3)], [3]),
    "cosine+lambda": (lambda L, o: [L.CosineAnnealingLR(o, 6, 1e-3), L.LambdaLR(o, _decay)], [8]),
    "one_scheduler": (lambda L, o: [L.CosineAnnealingLR(o, 6, 1e-3)], []),
}


def _sequence(lib, name, last_epoch=-1):
    """(optimizer, SequentialLR) of ``lib`` (ours: S, or torch's lr_scheduler) for SEQUENCES[name]."""
    opt = both_optimizers()[0 if lib is S else 1]
    make, milestones = SEQUENCES[name]
    return opt, lib.SequentialLR(opt, make(lib, opt), milestones, last_epoch)


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_sequential_lr_matches_torch(name):
    """SequentialLR of LinearLR, CosineAnnealingLR and LambdaLR schedules, with one or several
    milestones (0 included: the second scheduler from the start): the groups' lr and get_last_lr()
    of 40 steps, past every milestone and the ends of the schedules, equal torch's exactly."""
    ours_opt, ours = _sequence(S, name)
    torch_opt, theirs = _sequence(torch.optim.lr_scheduler, name)
    compare(ours, ours_opt, theirs, torch_opt, 40)


def test_sequential_lr_with_last_epoch_matches_torch():
    """``last_epoch`` other than -1: as torch, it shifts the sequence's step count only."""
    ours_opt, ours = _sequence(S, "warmup+cosine+linear", last_epoch=2)
    torch_opt, theirs = _sequence(torch.optim.lr_scheduler, "warmup+cosine+linear", last_epoch=2)
    assert ours.last_epoch == theirs.last_epoch == 3
    compare(ours, ours_opt, theirs, torch_opt, 25)


@pytest.mark.parametrize("stop", [0, 3, 4, 5, 10, 11, 12, 20])
@pytest.mark.parametrize("optimizer_first", [True, False], ids=["optimizer_first", "scheduler_first"])
def test_sequential_lr_resumes_mid_run_like_torch(tmp_path, stop, optimizer_first):
    """A SequentialLR (LinearLR warmup, CosineAnnealingLR, LinearLR; milestones 4 and 11) saved
    after ``stop`` steps (before, at and after each milestone) through safetensors and loaded into a
    fresh one (built first, as torch's; loaded before or after the optimizer): every lr from then on
    equals torch's uninterrupted run exactly. The state nests the schedulers' counters as torch's
    does (its ``_schedulers`` list)."""
    torch_opt, theirs = _sequence(torch.optim.lr_scheduler, "warmup+cosine+linear")
    reference = []
    for _ in range(30):
        torch_opt.step()
        theirs.step()
        reference.append(([g["lr"] for g in torch_opt.param_groups], theirs.get_last_lr()))
    torch_opt, theirs = _sequence(torch.optim.lr_scheduler, "warmup+cosine+linear")
    opt, sched = _sequence(S, "warmup+cosine+linear")
    got = []
    for _ in range(stop):
        opt.step()
        sched.step()
        torch_opt.step()
        theirs.step()
        got.append(([g["lr"] for g in opt.param_groups], sched.get_last_lr()))
    sd, torch_sd = sched.state_dict(), theirs.state_dict()
    assert int(sd["last_epoch"]) == torch_sd["last_epoch"] == stop
    assert sd["milestones"].tolist() == torch_sd["_milestones"] == [4, 11]
    assert sd["last_lr"].tolist() == torch_sd["_last_lr"]
    for i, inner in enumerate(torch_sd["_schedulers"]):
        assert int(sd[f"schedulers.{i}.last_epoch"]) == inner["last_epoch"], i
        assert int(sd[f"schedulers.{i}.step_count"]) == inner["_step_count"], i
        assert sd[f"schedulers.{i}.last_lr"].tolist() == inner["_last_lr"], i
    save_file(sd, str(tmp_path / "sched.safetensors"))
    save_file(opt.state_dict(), str(tmp_path / "opt.safetensors"))
    opt2, sched2 = _sequence(S, "warmup+cosine+linear")
    loads = [lambda: opt2.load_state_dict(load_file(str(tmp_path / "opt.safetensors"))),
             lambda: sched2.load_state_dict(load_file(str(tmp_path / "sched.safetensors")))]
    for load in loads if optimizer_first else loads[::-1]:
        load()
    assert sched2.get_last_lr() == sched.get_last_lr()
    for _ in range(30 - stop):
        opt2.step()
        sched2.step()
        got.append(([g["lr"] for g in opt2.param_groups], sched2.get_last_lr()))
    assert got == reference


def test_sequential_lr_arguments_are_checked_and_change_nothing():
    """Bad ``schedulers``, ``milestones`` or ``last_epoch``: a TypeError / ValueError naming the
    argument (torch raises a ValueError too for a wrong number of milestones, a scheduler of another
    optimizer and no scheduler), and the optimizer's groups and the schedulers are left as they were."""
    opt, _ = both_optimizers()
    other, _ = both_optimizers()
    warmup, cosine = S.LinearLR(opt, 0.1, 1.0, 4), S.CosineAnnealingLR(opt, 7)
    nested = S.SequentialLR(opt, [warmup, cosine], [4])
    warmup, cosine = S.LinearLR(opt, 0.1, 1.0, 4), S.CosineAnnealingLR(opt, 7)
    cases = [
        ("schedulers", warmup, [], TypeError, r"^schedulers: expected a list or tuple of LRSchedulers, got LinearLR"),
        ("schedulers", [], [], ValueError, r"^schedulers: expected at least one scheduler"),
        ("schedulers", [warmup, "cosine"], [4], TypeError, r"^schedulers\[1\]: expected a transformer_core"),
        ("schedulers", [warmup, S.CosineAnnealingLR(other, 7)], [4], ValueError,
         r"^schedulers\[1\]: expected a scheduler of `optimizer`"),
        ("schedulers", [warmup, warmup], [4], ValueError, r"^schedulers\[1\]: expected each scheduler once"),
        ("schedulers", [warmup, nested], [4], TypeError, r"^schedulers\[1\]: .* SequentialLR cannot be nested"),
        ("milestones", [warmup, cosine], [], ValueError, r"^milestones: expected len\(schedulers\) - 1 = 1"),
        ("milestones", [warmup, cosine], [4, 8], ValueError, r"^milestones: expected len\(schedulers\) - 1 = 1"),
        ("milestones", [warmup, cosine], 4, TypeError, r"^milestones: expected a list or tuple of ints, got int"),
        ("milestones", [warmup, cosine], ["4"], TypeError, r"^milestones\[0\]: expected an int"),
        ("milestones", [warmup, cosine], [4.5], ValueError,
         r"^milestones\[0\]: expected an int, or a float holding a whole number \(such as 100.0\), got float 4.5$"),
        ("milestones", [warmup, cosine], [-1], ValueError, r"^milestones\[0\]: expected an int in \[0, "),
        ("milestones", [warmup, cosine, S.LinearLR(opt)], [6, 6], ValueError,
         r"^milestones: expected increasing steps, got \[6, 6\]"),
        ("milestones", [warmup, cosine, S.LinearLR(opt)], [6, 2], ValueError, r"^milestones: expected increasing"),
    ]
    groups = [dict(g) for g in opt.param_groups]
    states = [s.state_dict() for s in (warmup, cosine)]
    for argument, schedulers, milestones, error, match in cases:
        with pytest.raises(error, match=match):
            S.SequentialLR(opt, schedulers, milestones)
        assert [dict(g) for g in opt.param_groups] == groups, argument
        for s, sd in zip((warmup, cosine), states):
            assert all(np.array_equal(s.state_dict()[k], v) for k, v in sd.items()), argument
    with pytest.raises(TypeError, match=r"^last_epoch: expected an int"):
        S.SequentialLR(opt, [warmup, cosine], [4], last_epoch="0")
    with pytest.raises(TypeError, match=r"^optimizer: expected an optimizer with param_groups"):
        S.SequentialLR("adam", [warmup, cosine], [4])
    # torch refuses these too
    L, (_, torch_opt), (_, torch_other) = torch.optim.lr_scheduler, both_optimizers(), both_optimizers()
    for schedulers, milestones in [([L.LinearLR(torch_opt)], [3]), ([], []),
                                   ([L.LinearLR(torch_opt), L.LinearLR(torch_other)], [3])]:
        with pytest.raises(ValueError):
            L.SequentialLR(torch_opt, schedulers, milestones)
    # a group added after the schedulers were built has no schedule
    opt.add_param_group({"params": [Parameter(np.zeros(1), name="c")], "lr": 0.5})
    groups = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match=r"^schedulers\[0\]: built for 2 param groups, the optimizer has 3"):
        S.SequentialLR(opt, [warmup, cosine], [4])
    assert [dict(g) for g in opt.param_groups] == groups


def test_sequential_lr_failed_construction_or_step_changes_nothing():
    """A schedule function that raises during the SequentialLR's initial step, or during a later
    step: the error propagates, and the groups, the SequentialLR and its schedulers are as before."""
    calls = []

    def fails_on_second_step(t):  # called once per group: twice by the LambdaLR's own constructor
        calls.append(t)
        if len(calls) == 3:
            raise ZeroDivisionError("schedule")
        return 0.5

    opt, _ = both_optimizers()
    first, second = S.LambdaLR(opt, fails_on_second_step), S.CosineAnnealingLR(opt, 5)
    groups = [dict(g) for g in opt.param_groups]
    states = [s.state_dict() for s in (first, second)]
    with pytest.raises(ZeroDivisionError):
        S.SequentialLR(opt, [first, second], [3])
    assert [dict(g) for g in opt.param_groups] == groups
    for s, sd in zip((first, second), states):
        assert all(np.array_equal(s.state_dict()[k], v) for k, v in sd.items())

    def fails_at_2(t):
        if t == 2:
            raise ZeroDivisionError("schedule")
        return 0.5 ** t

    opt, _ = both_optimizers()
    sched = S.SequentialLR(opt, [S.LambdaLR(opt, fails_at_2), S.CosineAnnealingLR(opt, 5)], [4])
    opt.step()
    sched.step()
    groups, sd = [dict(g) for g in opt.param_groups], sched.state_dict()
    with pytest.raises(ZeroDivisionError):
        sched.step()
    _assert_unchanged(sched, sd, opt, groups)
    assert sched.get_last_lr() == [0.5 * lr for lr in LRS]


LOAD_SEQUENCE_CASES = [
    (lambda sd: sd.pop("milestones"), ValueError, r"missing keys \['milestones'\]"),
    (lambda sd: sd.update({"schedulers.2.last_epoch": np.array(1)}), ValueError,
     r"missing keys \[\], unknown keys \['schedulers\.2\.last_epoch'\]"),
    (lambda sd: sd.update(milestones=np.array([4, 8])), ValueError, r"milestones: expected len\(schedulers\) - 1"),
    (lambda sd: sd.update(milestones=np.array([2.5])), ValueError, r"milestones\[0\]: expected a whole number"),
    (lambda sd: sd.update(last_epoch=np.array(-1)), ValueError, r"last_epoch: expected an int >= 0"),
    (lambda sd: sd.update(last_epoch=np.array(2.0**63)), ValueError,
     r"last_epoch: expected an int <= 9223372036854775807 \(an int64 count\)"),
    (lambda sd: sd.update({"schedulers.0.last_epoch": np.array(1e30)}), ValueError,
     r"schedulers\.0: last_epoch: expected an int <= 9223372036854775807"),
    (lambda sd: sd.update(last_lr=np.array([0.1])), ValueError, r"last_lr: expected 2 learning rates"),
    (lambda sd: sd.pop("schedulers.1.T_max"), ValueError, r"schedulers\.1: missing keys \['T_max'\]"),
    (lambda sd: sd.update({"schedulers.1.T_max": np.array(0.0)}), ValueError, r"schedulers\.1: T_max"),
    (lambda sd: sd.update({"schedulers.1.base_lrs": np.array(["a", "b"])}), TypeError, r"schedulers\.1: base_lrs"),
]


@pytest.mark.parametrize("edit,error,match", LOAD_SEQUENCE_CASES, ids=[m[:30] for _, _, m in LOAD_SEQUENCE_CASES])
def test_sequential_lr_load_state_dict_refused_changes_nothing(edit, error, match):
    """A state the SequentialLR refuses (its own values, or an inner scheduler's: the second one
    refused after the first would have loaded): an error naming the key (``schedulers.{i}``), and
    neither it, its schedulers nor the optimizer's groups change."""
    opt, sched = _sequence(S, "warmup+cosine")
    for _ in range(3):
        opt.step()
        sched.step()
    saved = sched.state_dict()
    other_opt, target = _sequence(S, "warmup+cosine")
    for _ in range(7):  # past the milestone: every counter differs from the saved ones
        other_opt.step()
        target.step()
    before, groups = target.state_dict(), [dict(g) for g in other_opt.param_groups]
    edit(saved)
    with pytest.raises(error, match=f"^load_state_dict: {match}"):
        target.load_state_dict(saved)
    _assert_unchanged(target, before, other_opt, groups)
    assert sorted(target.state_dict()) == sorted(before)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copied_sequential_lr_goes_on_like_the_original(how):
    """A copy (with its optimizer and schedulers, copied together) goes on as the original does."""
    opt, sched = _sequence(S, "warmup+cosine+linear")
    for _ in range(6):
        opt.step()
        sched.step()
    twin = copy.deepcopy(sched) if how == "deepcopy" else pickle.loads(pickle.dumps(sched))
    assert twin.optimizer is not opt and all(s.optimizer is twin.optimizer for s in twin._schedulers)
    for _ in range(10):
        for s in (sched, twin):
            s.optimizer.step()
            s.step()
        assert twin.get_last_lr() == sched.get_last_lr()
        assert [g["lr"] for g in twin.optimizer.param_groups] == [g["lr"] for g in opt.param_groups]


class _Decay:
    """A LambdaLR function that is a callable object with state (torch saves its ``__dict__``)."""

    def __init__(self, rate, warm=True, skip=0):
        self.rate, self.warm, self.skip, self.label = rate, warm, skip, "kept as built"

    def __call__(self, epoch):
        return self.rate ** max(epoch - self.skip, 0) if self.warm else 1.0


@pytest.mark.parametrize("through_file", [False, True])
def test_lambda_lr_restores_a_callable_objects_numbers_like_torch(tmp_path, through_file):
    """torch's LambdaLR saves a callable object's attributes and restores them: a resume built with
    ``_Decay(0.9)`` went on at 0.5's epoch 3 with rate 0.9 (lr 0.06561 where torch gives 0.00625).
    Its number attributes are saved now (``lr_lambdas.{i}.{name}``), and the resumed run is
    torch's; an attribute that is no number (a str) stays as the new object was built."""
    ours_opt, torch_opt = both_optimizers()
    ours = S.LambdaLR(ours_opt, [_Decay(0.5, True, 1), _Decay(0.7)])
    theirs = torch.optim.lr_scheduler.LambdaLR(torch_opt, [_Decay(0.5, True, 1), _Decay(0.7)])
    for _ in range(3):
        ours_opt.step(), torch_opt.step(), ours.step(), theirs.step()
    saved, saved_torch = ours.state_dict(), theirs.state_dict()
    assert {k for k in saved if k.startswith("lr_lambdas.")} == {
        f"lr_lambdas.{i}.{name}" for i in (0, 1) for name in ("rate", "warm", "skip")}
    if through_file:
        save_file(saved, str(tmp_path / "s.safetensors"))
        saved = load_file(str(tmp_path / "s.safetensors"))
    ours_opt2, torch_opt2 = both_optimizers()
    ours_opt2.load_state_dict(ours_opt.state_dict())
    torch_opt2.load_state_dict(torch_opt.state_dict())
    fresh = [_Decay(0.9, False, 4), _Decay(0.2, False)]
    fresh[0].label = "new"
    resumed = S.LambdaLR(ours_opt2, fresh)
    resumed_torch = torch.optim.lr_scheduler.LambdaLR(torch_opt2, [_Decay(0.9, False, 4), _Decay(0.2, False)])
    resumed.load_state_dict(saved)
    resumed_torch.load_state_dict(saved_torch)
    assert (fresh[0].rate, fresh[0].warm, fresh[0].skip, fresh[0].label) == (0.5, True, 1, "new")
    assert type(fresh[0].warm) is bool and type(fresh[0].skip) is int
    compare(resumed, ours_opt2, resumed_torch, torch_opt2, 6)
    for _ in range(6):  # the uninterrupted run ends where the resumed one does
        ours_opt.step(), ours.step()
    assert resumed.get_last_lr() == ours.get_last_lr()


def test_lambda_lr_loads_what_was_saved_as_torchs_dict_update():
    """torch restores a callable object's saved attributes whatever the new one holds
    (``__dict__.update``) and skips a function with nothing saved. So does ours: a state saved
    before the attributes were (or of plain functions) loads and leaves them; a saved float goes
    over an int, a number over None; a key naming no function is refused, nothing changed."""
    opt, _ = both_optimizers()
    saved = S.LambdaLR(opt, _Decay(0.5, True, 2)).state_dict()
    earlier = {k: v for k, v in saved.items() if not k.startswith("lr_lambdas.")}
    kept = _Decay(0.9, False, 4)
    S.LambdaLR(both_optimizers()[0], kept).load_state_dict(earlier)
    assert (kept.rate, kept.warm, kept.skip) == (0.9, False, 4)
    other = _Decay(1, None, 0)  # an int rate, None where a bool was saved
    theirs = _Decay(1, None, 0)
    S.LambdaLR(both_optimizers()[0], other).load_state_dict(saved)
    torch_saved = torch.optim.lr_scheduler.LambdaLR(both_optimizers()[1], _Decay(0.5, True, 2)).state_dict()
    torch.optim.lr_scheduler.LambdaLR(both_optimizers()[1], theirs).load_state_dict(torch_saved)
    for f in (other, theirs):
        assert (f.rate, f.warm, f.skip) == (0.5, True, 2)
        assert type(f.rate) is float and type(f.warm) is bool and type(f.skip) is int
    target = _Decay(0.9)
    for key, value, error, match in [("lr_lambdas.2.rate", np.array(0.5), ValueError, r"unknown key 'lr_lambdas.2.rate'"),
                                     ("lr_lambdas.0.no-name", np.array(0.5), ValueError, "unknown key"),
                                     ("lr_lambdas.0.rate", np.array([0.5, 0.6]), ValueError, "expected one number"),
                                     ("lr_lambdas.0.rate", np.array("x"), TypeError, "expected a bool, int or float")]:
        with pytest.raises(error, match=match):
            S.LambdaLR(both_optimizers()[0], target).load_state_dict({**saved, key: value})
        assert target.rate == 0.9 and target.warm is True


@pytest.mark.parametrize("optimizer_first", [False, True])
def test_step_before_the_optimizers_step_warns_like_torch(optimizer_first):
    """torch warns when ``scheduler.step()`` comes before any ``optimizer.step()`` (the first
    value of the schedule is skipped); ours was silent. Both warn, or neither, as torch."""
    import warnings

    ours_opt, torch_opt = both_optimizers()
    runs = [(ours_opt, S.LinearLR(ours_opt, 0.5, total_iters=3)),
            (torch_opt, torch.optim.lr_scheduler.LinearLR(torch_opt, 0.5, total_iters=3))]
    warned = []
    for opt, sched in runs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                if optimizer_first:
                    opt.step()
                sched.step()
        warned.append([str(w.message) for w in caught if "optimizer.step()" in str(w.message)])
    assert [len(w) for w in warned] == ([0, 0] if optimizer_first else [1, 1])
    if not optimizer_first:
        assert "LinearLR.step() was called before optimizer.step()" in warned[0][0]
