"""transformer_core.optim (AdamW, Adam, SGD, clip_grad_norm_) and Parameter vs torch.optim / torch.nn.utils.

A fixed sequence of gradients drives both libraries for 20 steps on several parameters: the weights
(and the optimizer states) must agree to 1e-12 in float64 at every step, and to 1e-5 relative in
float32. State dicts round-trip through safetensors.
"""
from __future__ import annotations

import copy
import math
import pickle
import re

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformer_core import optim
from transformer_core.parameter import Parameter

SHAPES = [(3, 4), (7,), (1,), (2, 3, 5)]
STEPS = 20


def make_params(rng, dtype, shapes=SHAPES):
    values = [rng.standard_normal(s).astype(dtype) for s in shapes]
    ours = [Parameter(v.copy(), name=f"layer{i}.weight") for i, v in enumerate(values)]
    theirs = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    return ours, theirs


def grad_sequence(rng, dtype, shapes=SHAPES, steps=STEPS):
    return [[(rng.standard_normal(s) * (1 + t % 3)).astype(dtype) for s in shapes] for t in range(steps)]


def run_both(ours_opt, ours, torch_opt, theirs, grads, *, skip=None, check_every_step=True, tol=1e-12):
    """Steps both optimizers through `grads`; parameter j of step t gets no gradient when
    (t, j) is in `skip` (both libraries skip it)."""
    skip = skip or set()
    for t, gs in enumerate(grads):
        for j, (p, q, g) in enumerate(zip(ours, theirs, gs)):
            if (t, j) in skip:
                p.grad, q.grad = None, None
            else:
                p.grad = g.copy()
                q.grad = torch.tensor(g.copy())
        ours_opt.step()
        torch_opt.step()
        if check_every_step or t == len(grads) - 1:
            for p, q in zip(ours, theirs):
                np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=tol, atol=tol, err_msg=f"step {t}")


ADAM_CONFIGS = [
    dict(lr=1e-2),
    dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    dict(lr=1e-2, amsgrad=True, weight_decay=0.05),
    dict(lr=1e-2, maximize=True),
    dict(lr=0.5, betas=(0.3, 0.5), weight_decay=0.0),   # lerp weight 1 - β1 >= 0.5: torch's other branch
]


@pytest.mark.parametrize("config", ADAM_CONFIGS, ids=[str(c) for c in ADAM_CONFIGS])
@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_adam_matches_torch_fp64(rng, config, kind):
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64)
    ours_opt = getattr(optim, kind)(ours, **config)
    torch_opt = getattr(torch.optim, kind)(theirs, foreach=False, **config)
    run_both(ours_opt, ours, torch_opt, theirs, grads, skip={(3, 1), (4, 1), (10, 2)})
    for p, q in zip(ours, theirs):
        st, tst = ours_opt.state[p.name], torch_opt.state[q]
        assert st["step"] == int(tst["step"])
        np.testing.assert_allclose(st["exp_avg"], tst["exp_avg"].numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(st["exp_avg_sq"], tst["exp_avg_sq"].numpy(), rtol=1e-12, atol=1e-14)
        if config.get("amsgrad"):
            np.testing.assert_allclose(st["max_exp_avg_sq"], tst["max_exp_avg_sq"].numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_adam_matches_torch_fp32(rng, kind):
    ours, theirs = make_params(rng, np.float32)
    grads = grad_sequence(rng, np.float32)
    cfg = dict(lr=1e-2, weight_decay=0.05)
    run_both(getattr(optim, kind)(ours, **cfg), ours, getattr(torch.optim, kind)(theirs, foreach=False, **cfg),
             theirs, grads, tol=1e-5)


SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
    dict(lr=0.05, momentum=0.5, maximize=True),
]


@pytest.mark.parametrize("config", SGD_CONFIGS, ids=[str(c) for c in SGD_CONFIGS])
def test_sgd_matches_torch(rng, config):
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64)
    ours_opt = optim.SGD(ours, **config)
    torch_opt = torch.optim.SGD(theirs, foreach=False, **config)
    run_both(ours_opt, ours, torch_opt, theirs, grads, skip={(0, 2), (5, 0)})
    if config.get("momentum"):
        for p, q in zip(ours, theirs):
            np.testing.assert_allclose(ours_opt.state[p.name]["momentum_buffer"],
                                       torch_opt.state[q]["momentum_buffer"].numpy(), rtol=1e-12, atol=1e-14)


def test_param_groups_match_torch(rng):
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64)
    ours_opt = optim.AdamW([{"params": ours[:2]}, {"params": ours[2:], "lr": 1e-1, "weight_decay": 0.0}], lr=1e-2)
    torch_opt = torch.optim.AdamW([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 1e-1, "weight_decay": 0.0}],
                                  lr=1e-2, foreach=False)
    run_both(ours_opt, ours, torch_opt, theirs, grads)
    assert [g["lr"] for g in ours_opt.param_groups] == [1e-2, 1e-1]


@pytest.mark.parametrize("empty_first", [False, True], ids=["empty_last", "empty_first"])
def test_empty_param_group_matches_torch(rng, tmp_path, empty_first):
    """HF's decay / no-decay grouping of a model without biases or norms gives an empty group,
    which torch accepts (it was a ValueError here): it steps nothing, the others step as torch's,
    and the state dict round-trips (through safetensors) with the group structure, the continuation
    equal to torch's after its own load_state_dict."""
    def groups(params, lr):
        g = [{"params": params, "weight_decay": 0.1}, {"params": [], "weight_decay": 0.0, "lr": lr}]
        return g[::-1] if empty_first else g

    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=12)
    ours_opt = optim.AdamW(groups(ours, 0.5), lr=1e-2)
    torch_opt = torch.optim.AdamW(groups(theirs, 0.5), lr=1e-2, foreach=False)
    run_both(ours_opt, ours, torch_opt, theirs, grads[:6])
    empty = 0 if empty_first else 1
    assert [len(g["params"]) for g in ours_opt.param_groups] == [len(g["params"]) for g in torch_opt.param_groups]
    assert ours_opt.param_groups[empty]["params"] == [] and ours_opt.param_groups[empty]["lr"] == 0.5
    sd = ours_opt.state_dict()
    assert {int(v) for k, v in sd.items() if k.startswith("params.")} == {1 - empty}
    assert sd[f"param_groups.{empty}.lr"] == 0.5 and sd[f"param_groups.{empty}.weight_decay"] == 0.0
    save_file(sd, str(tmp_path / "opt.safetensors"))
    ours2 = [Parameter(p.data.copy(), name=p.name) for p in ours]
    theirs2 = [torch.tensor(q.detach().numpy().copy(), requires_grad=True) for q in theirs]
    ours_opt2 = optim.AdamW(groups(ours2, 0.9), lr=0.3)  # other lrs: the loaded ones must win
    torch_opt2 = torch.optim.AdamW(groups(theirs2, 0.9), lr=0.3, foreach=False)
    ours_opt2.load_state_dict(load_file(str(tmp_path / "opt.safetensors")))
    torch_opt2.load_state_dict(torch_opt.state_dict())
    assert [g["lr"] for g in ours_opt2.param_groups] == [g["lr"] for g in torch_opt2.param_groups]
    run_both(ours_opt2, ours2, torch_opt2, theirs2, grads[6:])
    # the structure must match: without the empty group, or with it elsewhere, the load is refused
    with pytest.raises(ValueError, match=r"expected hyperparameters of 1 param groups, got groups \[0, 1\]"):
        optim.AdamW([Parameter(p.data.copy(), name=p.name) for p in ours], lr=0.3).load_state_dict(sd)
    elsewhere = groups([Parameter(p.data.copy(), name=p.name) for p in ours], 0.9)[::-1]
    with pytest.raises(ValueError, match="parameters in another param group than saved"):
        optim.AdamW(elsewhere, lr=0.3).load_state_dict(sd)


def test_empty_param_group_added_later_and_all_empty():
    """add_param_group takes an empty group, as torch's; an optimizer with no parameter in any group
    is refused (torch accepts it: it would step nothing)."""
    p, q = Parameter(np.ones(3), name="w"), torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    ours, theirs = optim.SGD([p], lr=0.1), torch.optim.SGD([q], lr=0.1)
    ours.add_param_group({"params": [], "lr": 0.5})
    theirs.add_param_group({"params": [], "lr": 0.5})
    assert [(len(g["params"]), g["lr"]) for g in ours.param_groups] == \
        [(len(g["params"]), g["lr"]) for g in theirs.param_groups]
    p.grad, q.grad = np.full(3, 2.0), torch.full((3,), 2.0, dtype=torch.float64)
    ours.step()
    theirs.step()
    np.testing.assert_array_equal(p.data, q.detach().numpy())
    torch.optim.SGD([{"params": []}], lr=0.1)  # torch accepts it
    with pytest.raises(ValueError, match=r"^params: expected at least one parameter, got 2 param groups without "):
        optim.SGD([{"params": []}, {"params": ()}], lr=0.1)
    with pytest.raises(ValueError, match=r"^params: expected at least one parameter, got an empty list"):
        optim.SGD([], lr=0.1)


def test_single_parameter_as_group_params_matches_torch(rng):
    """``{"params": p}`` (a bare Parameter) is wrapped in a list, as torch's add_param_group does;
    a bare Parameter as the optimizer's ``params`` stays a TypeError, as in torch."""
    ours, theirs = make_params(rng, np.float64, shapes=[(3, 2), (4,)])
    grads = grad_sequence(rng, np.float64, shapes=[(3, 2), (4,)], steps=5)
    ours_opt = optim.SGD([{"params": ours[0]}, {"params": ours[1], "lr": 0.3}], lr=0.1, momentum=0.9)
    torch_opt = torch.optim.SGD([{"params": theirs[0]}, {"params": theirs[1], "lr": 0.3}], lr=0.1, momentum=0.9,
                                foreach=False)
    assert [g["params"] for g in ours_opt.param_groups] == [[ours[0]], [ours[1]]]
    run_both(ours_opt, ours, torch_opt, theirs, grads)
    with pytest.raises(TypeError, match="single Parameter"):
        optim.SGD(ours[0])
    with pytest.raises(TypeError):
        torch.optim.SGD(theirs[0])


@pytest.mark.parametrize("dampening", [-0.5, 1.5])
def test_sgd_dampening_outside_0_1_matches_torch(rng, dampening):
    """torch takes any dampening (it was a ValueError below 0 here): the same weights and buffers."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=8)
    ours_opt = optim.SGD(ours, lr=0.05, momentum=0.9, dampening=dampening, weight_decay=0.01)
    torch_opt = torch.optim.SGD(theirs, lr=0.05, momentum=0.9, dampening=dampening, weight_decay=0.01, foreach=False)
    run_both(ours_opt, ours, torch_opt, theirs, grads)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(ours_opt.state[p.name]["momentum_buffer"],
                                   torch_opt.state[q]["momentum_buffer"].numpy(), rtol=1e-12, atol=1e-14)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match=r"^dampening: expected a finite number, got "):
            optim.SGD(ours, momentum=0.9, dampening=bad)


@pytest.mark.parametrize("betas", [np.array([0.8, 0.98]), [0.8, 0.98], (np.float64(0.8), np.float32(0.98)),
                                   np.array([0.8, 0.98], dtype=np.float32)],
                         ids=["ndarray", "list", "numpy_scalars", "ndarray_f32"])
def test_betas_as_array_or_sequence_matches_torch(rng, betas):
    """betas as a numpy array of shape (2,) (it was a TypeError, "expected a pair"), a list, or a
    pair of numpy scalars, as torch takes them: stored as a tuple of two Python floats, the steps
    equal torch's given the same values."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=8)
    ours_opt = optim.AdamW(ours, lr=1e-2, betas=betas)
    torch_opt = torch.optim.AdamW(theirs, lr=1e-2, betas=tuple(float(b) for b in betas), foreach=False)
    want = tuple(float(b) for b in np.asarray(betas))
    assert ours_opt.param_groups[0]["betas"] == want and all(type(b) is float for b in ours_opt.defaults["betas"])
    run_both(ours_opt, ours, torch_opt, theirs, grads)
    torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], betas=np.array([0.8, 0.98]))  # torch takes an array


@pytest.mark.parametrize("betas,shown", [
    (np.array([0.9, 0.99, 0.999]), r"ndarray \(3,\) float64"),
    (np.array([[0.9, 0.99]]), r"ndarray \(1, 2\) float64"),
    ((0.9, 0.99, 0.999), r"tuple \(0.9, 0.99, 0.999\)"),
    ("ab", "str 'ab'"),
    (0.9, "float 0.9"),
    ({0.9: 1, 0.99: 2}, r"dict \{0.9: 1, 0.99: 2\}"),
])
def test_betas_refused_says_what_is_accepted(betas, shown):
    p = [Parameter(np.zeros(3), name="w")]
    with pytest.raises(TypeError, match=r"^betas: expected a pair \(beta1, beta2\): a tuple, list or other sequence "
                                        rf"of 2 numbers, or a numpy array of shape \(2,\); got {shown}$"):
        optim.Adam(p, betas=betas)
    with pytest.raises(TypeError, match=r"^betas\[0\]: expected a number, got bool True"):  # a (2,) array, not of numbers
        optim.Adam(p, betas=np.array([0.9, 0.99]).astype(bool))


@pytest.mark.parametrize("kind,options", [
    ("Adam", dict(foreach=True)), ("Adam", dict(fused=True, capturable=False, differentiable=False)),
    ("AdamW", dict(foreach=False, fused=None)), ("AdamW", dict(fused=True)),
    ("SGD", dict(foreach=True, differentiable=False)), ("SGD", dict(fused=True)),
])
def test_torch_implementation_options_accepted_and_ignored(rng, kind, options):
    """foreach / fused (and capturable / differentiable False) as torch code passes them: accepted,
    the step the same as torch's with the same options (ours is one C++ pass either way)."""
    config = dict(lr=1e-2, momentum=0.9) if kind == "SGD" else dict(lr=1e-2, weight_decay=0.05)
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=6)
    ours_opt = getattr(optim, kind)(ours, **config, **options)
    torch_opt = getattr(torch.optim, kind)(theirs, **config, **options)
    assert not set(options) & set(ours_opt.defaults)  # not stored: the state dict holds only hyperparameters
    run_both(ours_opt, ours, torch_opt, theirs, grads, tol=1e-12)


def test_torch_implementation_options_refused():
    p = [Parameter(np.zeros(3), name="w")]
    t = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ValueError, match=r"^foreach, fused: expected at most one of them True"):
        optim.AdamW(p, foreach=True, fused=True)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        torch.optim.AdamW(t, foreach=True, fused=True)
    with pytest.raises(ValueError, match=r"^capturable: expected False, got True \(not supported: "):
        optim.Adam(p, capturable=True)
    with pytest.raises(ValueError, match=r"^differentiable: expected False, got True \(not supported: "):
        optim.SGD(p, differentiable=True)
    with pytest.raises(TypeError, match=r"^fused: expected a bool or None, got str 'yes'"):
        optim.SGD(p, fused="yes")
    with pytest.raises(TypeError, match=r"^capturable: expected a bool, got int 0"):
        optim.AdamW(p, capturable=0)
    with pytest.raises(TypeError, match="capturable"):  # torch's SGD has no capturable either
        optim.SGD(p, capturable=False)
    with pytest.raises(TypeError, match="capturable"):
        torch.optim.SGD(t, capturable=False)


def test_named_pairs_and_unnamed(rng):
    a, b = Parameter(np.zeros(3)), Parameter(np.zeros(2), name="ignored")
    opt = optim.SGD([("enc.w", a), ("enc.b", b)], lr=0.1)
    assert [n for n, _ in opt.named_parameters()] == ["enc.w", "enc.b"]
    opt = optim.SGD([Parameter(np.zeros(3)), Parameter(np.zeros(3))], lr=0.1)
    assert [n for n, _ in opt.named_parameters()] == ["0", "1"]
    opt = optim.SGD({"x": a, "y": b}, lr=0.1)
    assert opt.name_of(b) == "y"


def test_updates_in_place(rng):
    """data is updated in place: a view handed out before the step sees the new values."""
    buffer = np.zeros(10)
    p = Parameter(buffer[2:8], name="w")
    view = buffer[2:8]
    p.grad = np.ones(6)
    optim.SGD([p], lr=0.5).step()
    assert np.array_equal(view, np.full(6, -0.5)) and np.array_equal(buffer[:2], [0, 0])


def test_zero_grad(rng):
    ps = [Parameter(np.zeros(3), name="a", grad=np.ones(3)), Parameter(np.zeros(2), name="b", grad=np.ones(2))]
    opt = optim.Adam(ps)
    opt.zero_grad(set_to_none=False)
    assert all(np.array_equal(p.grad, np.zeros_like(p.data)) for p in ps)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)
    with pytest.raises(TypeError, match="set_to_none: expected a bool"):
        opt.zero_grad(set_to_none=0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_gradient_raises_and_changes_nothing(rng, bad):
    ours, _ = make_params(rng, np.float64)
    opt = optim.AdamW(ours, lr=1e-2)
    for p in ours:
        p.grad = np.ones_like(p.data)
    opt.step()
    before = {n: v.copy() for n, v in opt.state_dict().items()}
    data = [p.data.copy() for p in ours]
    ours[2].grad[0] = bad
    with pytest.raises(optim.NonFiniteGradientError, match="layer2.weight") as info:
        opt.step()
    assert isinstance(info.value, ValueError) and info.value.names == ["layer2.weight"]
    assert all(np.array_equal(p.data, d) for p, d in zip(ours, data))
    after = opt.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    ours[2].grad[0] = 1.0  # the training loop skips the batch and goes on
    opt.step()
    assert opt.state["layer0.weight"]["step"] == 2


def snapshot(opt, params):
    """Everything a step may change: the weights, the state dict (state and step counts, the groups'
    hyperparameters) and the state's own entries."""
    return ([p.data.copy() for p in params], opt.state_dict(), {n: dict(st) for n, st in opt.state.items()})


def assert_unchanged(opt, params, before):
    data, sd, state = before
    assert all(np.array_equal(p.data, d) for p, d in zip(params, data))
    after = opt.state_dict()
    assert sorted(after) == sorted(sd) and all(np.array_equal(after[k], sd[k], equal_nan=True) for k in sd)
    assert sorted(opt.state) == sorted(state)
    for name, st in state.items():
        assert sorted(opt.state[name]) == sorted(st), name
        assert all(opt.state[name][k] is v for k, v in st.items() if isinstance(v, np.ndarray)), name


BAD_GROUP_VALUES = [
    ("lr", -1.0, ValueError, r"step: param_groups\[1\]: lr: expected a finite number >= 0.0, got -1.0"),
    ("lr", math.nan, ValueError, r"step: param_groups\[1\]: lr: .*got nan"),
    ("weight_decay", math.inf, ValueError, r"param_groups\[1\]: weight_decay"),
    ("lr", "0.1", TypeError, r"param_groups\[1\]: lr: expected a number"),
]
KINDS = [("Adam", dict(lr=0.1, weight_decay=0.1)), ("AdamW", dict(lr=0.1, amsgrad=True)),
         ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.1))]


@pytest.mark.parametrize("key,value,error,match", BAD_GROUP_VALUES, ids=[f"{k}={v!r}" for k, v, _, _ in BAD_GROUP_VALUES])
@pytest.mark.parametrize("kind,config", KINDS, ids=[k for k, _ in KINDS])
def test_step_checks_every_group_first_and_a_failed_step_changes_nothing(rng, kind, config, key, value, error, match):
    """A bad hyperparameter written into the second group (after construction, e.g. by a scheduler)
    is refused before ANY update: group 0's weights, every state entry and step count stay as they
    were (no half-made momentum buffer, no advanced step), the closure is not run, and the next valid
    step is exactly torch's first step."""
    ours, theirs = make_params(rng, np.float64)
    ours_opt = getattr(optim, kind)([{"params": ours[:2]}, {"params": ours[2:]}], **config)
    torch_opt = getattr(torch.optim, kind)([{"params": theirs[:2]}, {"params": theirs[2:]}], foreach=False, **config)
    for p, q in zip(ours, theirs):
        g = rng.standard_normal(p.shape)
        p.grad, q.grad = g.copy(), torch.tensor(g)
    ours_opt.param_groups[1][key] = value
    before = snapshot(ours_opt, ours)
    calls = []
    with pytest.raises(error, match=match):
        ours_opt.step(lambda: calls.append(1))
    assert calls == [] and ours_opt.state == {}
    assert_unchanged(ours_opt, ours, before)
    ours_opt.param_groups[1][key] = ours_opt.defaults[key]
    ours_opt.step()
    torch_opt.step()
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-12, atol=1e-14)
        st, tst = ours_opt.state[p.name], torch_opt.state[q]
        for field, value in tst.items():
            if field == "step":
                assert st["step"] == int(value) == 1
            else:
                np.testing.assert_allclose(st[field], value.numpy(), rtol=1e-12, atol=1e-14, err_msg=field)


@pytest.mark.parametrize("kind,config", KINDS, ids=[k for k, _ in KINDS])
def test_failed_step_after_steps_keeps_state_and_counts(rng, kind, config):
    """The same after 3 good steps: a NaN lr in group 1 leaves moments, buffers and step counts as
    they were; fixing it, the run goes on as torch's (which never saw the bad step)."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=6)
    ours_opt = getattr(optim, kind)([{"params": ours[:2]}, {"params": ours[2:]}], **config)
    torch_opt = getattr(torch.optim, kind)([{"params": theirs[:2]}, {"params": theirs[2:]}], foreach=False, **config)
    run_both(ours_opt, ours, torch_opt, theirs, grads[:3])
    ours_opt.param_groups[1]["lr"] = math.nan
    before = snapshot(ours_opt, ours)
    with pytest.raises(ValueError, match=r"param_groups\[1\]: lr"):
        ours_opt.step()
    assert_unchanged(ours_opt, ours, before)
    ours_opt.param_groups[1]["lr"] = config["lr"]
    run_both(ours_opt, ours, torch_opt, theirs, grads[3:])
    if kind != "SGD":
        assert all(ours_opt.state[p.name]["step"] == 6 for p in ours)


def test_adam_eps_must_be_positive():
    """eps = 0 is refused (stricter than torch): a gradient element that is zero at every step would
    give 0 / 0 = NaN weights; at construction and when written into a group before a step."""
    p = Parameter(np.ones(3), name="w")
    for kind in ("Adam", "AdamW"):
        with pytest.raises(ValueError, match=r"eps: expected a finite number > 0.0, got 0.0"):
            getattr(optim, kind)([p], eps=0.0)
    opt = optim.Adam([p], lr=0.1)
    opt.param_groups[0]["eps"] = 0.0
    p.grad = np.array([1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match=r"step: param_groups\[0\]: eps"):
        opt.step()
    assert np.array_equal(p.data, np.ones(3)) and opt.state == {}
    opt.param_groups[0]["eps"] = 1e-8
    opt.step()
    assert np.all(np.isfinite(p.data)) and p.data[1] == 1.0


@pytest.mark.parametrize("kind,flag", [("Adam", "amsgrad"), ("AdamW", "maximize"), ("Adam", "decoupled_weight_decay"),
                                       ("SGD", "nesterov"), ("SGD", "maximize")])
@pytest.mark.parametrize("value", ["no", "False", 1, None], ids=["no", "False", "1", "None"])
def test_flags_must_be_bools(kind, flag, value):
    """A flag given a string or a number is refused (bool("no") would be True): at construction, and
    when written into a group before a step (nothing changes)."""
    p = Parameter(np.ones(2), name="w")
    kwargs = {"momentum": 0.9} if kind == "SGD" else {}
    if not (kind == "AdamW" and flag == "decoupled_weight_decay"):
        with pytest.raises(TypeError, match=f"{flag}: expected a bool, got"):
            getattr(optim, kind)([p], **kwargs, **{flag: value})
    opt = getattr(optim, kind)([p], lr=0.1, **kwargs)
    opt.param_groups[0][flag] = value
    p.grad = np.ones(2)
    with pytest.raises(TypeError, match=rf"step: param_groups\[0\]: {flag}: expected a bool"):
        opt.step()
    assert np.array_equal(p.data, np.ones(2)) and opt.state == {}
    opt.param_groups[0][flag] = np.bool_(False)  # numpy's bools are bools
    opt.step()
    assert opt.param_groups[0][flag] is np.bool_(False) and not np.array_equal(p.data, np.ones(2))


def test_load_state_dict_checks_step_and_flags(rng):
    """A step that is not a whole number >= 0, a group index that is not one, a flag other than 0/1
    or a hyperparameter the constructor refuses: ValueError naming the key, nothing loaded. A whole
    float step (torch saves steps as float tensors) loads as an int."""
    ours, _ = make_params(rng, np.float64)
    opt = optim.Adam(ours, lr=0.1)
    for p in ours:
        p.grad = np.ones_like(p.data)
    opt.step()
    sd = opt.state_dict()
    opt.step()
    before = snapshot(opt, ours)
    cases = [
        ("state.layer1.weight.step", np.array(-1), r"state.layer1.weight.step: expected a whole number >= 0"),
        ("state.layer1.weight.step", np.array(2.7), r"state.layer1.weight.step: expected a whole number >= 0"),
        ("state.layer1.weight.step", np.array([1, 2]), r"state.layer1.weight.step"),
        ("state.layer1.weight.step", np.array(np.nan), r"state.layer1.weight.step"),
        ("params.layer2.weight.group", np.array(0.5), r"params.layer2.weight.group: expected a whole number"),
        ("param_groups.0.amsgrad", np.array(0.5), r"param_groups.0.amsgrad: expected a flag 0 or 1"),
        ("param_groups.0.maximize", np.array(2.0), r"param_groups.0.maximize: expected a flag 0 or 1"),
        ("param_groups.0.eps", np.array(0.0), r"param_groups\.0\.eps: expected a finite number > 0.0"),
        ("param_groups.0.lr", np.array(-0.1), r"param_groups\.0\.lr: expected a finite number >= 0.0, got -0.1"),
    ]
    for key, value, match in cases:
        with pytest.raises(ValueError, match=match):
            opt.load_state_dict({**sd, key: value})
        assert_unchanged(opt, ours, before)
    opt.load_state_dict({**sd, "state.layer1.weight.step": np.array(1.0, dtype=np.float32)})
    assert opt.state["layer1.weight"]["step"] == 1 and type(opt.state["layer1.weight"]["step"]) is int


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_load_state_dict_refuses_nonfinite_or_negative_moments(rng, dtype):
    """A moment holding NaN or -inf, a first moment holding +inf (also once cast: 1e300 is inf in
    float32), or a negative second moment (whose square root the update takes), would turn the
    weights into NaN at the next step: ValueError naming the entry, nothing loaded. Zeros and a
    negative first moment load (as torch, which then steps to finite weights). (+inf in a second
    moment loads: test_adam_second_moments_overflowed_to_inf_round_trip_as_torch.)"""
    ours, theirs = make_params(rng, dtype)
    opt = optim.Adam(ours, lr=0.1, amsgrad=True)
    for p in ours:
        p.grad = np.ones_like(p.data)
    opt.step()
    sd = opt.state_dict()
    before = snapshot(opt, ours)
    shape = ours[0].data.shape  # (3, 4)

    def with_value(field, index, value):
        arr = sd[f"state.layer0.weight.{field}"].copy()
        arr.flat[index] = value
        return {**sd, f"state.layer0.weight.{field}": arr}

    cases = [
        (with_value("exp_avg_sq", 0, np.nan),
         r"state\.layer0\.weight\.exp_avg_sq: expected finite values or \+inf, got 1 NaN or -inf \(of 12\)"),
        (with_value("exp_avg_sq", 0, -np.inf),
         r"state\.layer0\.weight\.exp_avg_sq: expected finite values or \+inf, got 1 NaN or -inf \(of 12\)"),
        (with_value("exp_avg_sq", 1, -1.0), r"state\.layer0\.weight\.exp_avg_sq: expected values >= 0 .*got 1 "
                                            r"negative \(min -1\.0\)"),
        (with_value("max_exp_avg_sq", 2, -1e-30), r"state\.layer0\.weight\.max_exp_avg_sq: expected values >= 0"),
        (with_value("max_exp_avg_sq", 2, -np.inf),
         r"state\.layer0\.weight\.max_exp_avg_sq: expected finite values or \+inf, got 1 NaN or -inf"),
        (with_value("exp_avg", 3, -np.inf), r"state\.layer0\.weight\.exp_avg: expected finite values"),
        (with_value("exp_avg", 3, np.inf), r"state\.layer0\.weight\.exp_avg: expected finite values, got 1 NaN or inf"),
        (with_value("exp_avg", 3, np.nan), r"state\.layer0\.weight\.exp_avg: expected finite values"),
        # NaN and a negative value in one second moment
        ({**sd, "state.layer1.weight.exp_avg_sq": np.array([np.nan, -1.0, 1.0, 0, 0, 0, 0], dtype)},
         r"state\.layer1\.weight\.exp_avg_sq: expected finite values or \+inf, got 1 NaN or -inf"),
    ]
    if dtype == np.float32:  # finite in float64, inf once cast to the parameter's float32
        cases.append(({**sd, "state.layer0.weight.exp_avg": np.full(shape, 1e300)},
                      r"state\.layer0\.weight\.exp_avg: expected finite values, got 12 NaN or inf"))
    for state, match in cases:
        with pytest.raises(ValueError, match=match):
            opt.load_state_dict(state)
        assert_unchanged(opt, ours, before)
    # SGD's momentum buffer: finite, any sign
    sgd = optim.SGD(ours, lr=0.1, momentum=0.9)
    sgd.step()
    sgd_sd = sgd.state_dict()
    bad = sgd_sd["state.layer2.weight.momentum_buffer"].copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match=r"state\.layer2\.weight\.momentum_buffer: expected finite values"):
        sgd.load_state_dict({**sgd_sd, "state.layer2.weight.momentum_buffer": bad})
    bad[0] = -5.0
    sgd.load_state_dict({**sgd_sd, "state.layer2.weight.momentum_buffer": bad})
    # zeros and negative first moments load, and the next step matches torch's from the same state
    good = with_value("exp_avg", 3, -2.0)
    good["state.layer0.weight.exp_avg_sq"] = np.zeros(shape, dtype)
    good["state.layer0.weight.max_exp_avg_sq"] = np.zeros(shape, dtype)
    opt.load_state_dict(good)
    t_opt = torch.optim.Adam(theirs, lr=0.1, amsgrad=True)
    for p, q in zip(ours, theirs):
        with torch.no_grad():
            q.copy_(torch.from_numpy(p.data))
        q.grad = torch.ones_like(q)
        t_opt.state[q] = {"step": torch.tensor(1.0, dtype=torch.float32),
                          **{f: torch.from_numpy(good[f"state.{p.name}.{f}"].copy())
                             for f in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")}}
    opt.step()
    t_opt.step()
    for p, q in zip(ours, theirs):
        assert np.isfinite(p.data).all()
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=0, atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("kind,config", [("AdamW", dict(lr=1e-2, amsgrad=True)), ("SGD", dict(lr=0.1, momentum=0.9)),
                                         ("Adam", dict(lr=1e-2, weight_decay=0.1))])
def test_state_dict_round_trip_through_safetensors(rng, tmp_path, kind, config):
    """5 steps, save, load into a fresh optimizer over copies of the weights, 5 more steps == 10 steps."""
    ours, _ = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=10)
    opt = getattr(optim, kind)([{"params": ours[:3]}, {"params": ours[3:], "lr": 0.05}], **config)
    for t in range(5):
        for p, g in zip(ours, grads[t]):
            p.grad = g.copy()
        opt.step()
    save_file(opt.state_dict(), str(tmp_path / "opt.safetensors"))
    clones = [Parameter(p.data.copy(), name=p.name) for p in ours]
    opt2 = getattr(optim, kind)([{"params": clones[:3]}, {"params": clones[3:]}], lr=123.0)
    opt2.load_state_dict(load_file(str(tmp_path / "opt.safetensors")))
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] and opt2.param_groups[1]["lr"] == 0.05
    for t in range(5, 10):
        for p, q, g in zip(ours, clones, grads[t]):
            p.grad, q.grad = g.copy(), g.copy()
        opt.step()
        opt2.step()
    for p, q in zip(ours, clones):
        assert np.array_equal(p.data, q.data)


def test_load_state_dict_names_mismatch(rng):
    ours, _ = make_params(rng, np.float64)
    opt = optim.AdamW(ours)
    for p in ours:
        p.grad = np.ones_like(p.data)
    opt.step()
    sd = opt.state_dict()
    other = [Parameter(p.data.copy(), name=p.name.replace("layer3", "block3")) for p in ours]
    with pytest.raises(ValueError, match=r"unknown parameter names \['layer3.weight'\].*missing parameter names "
                                         r"\['block3.weight'\]"):
        optim.AdamW(other).load_state_dict(sd)
    with pytest.raises(ValueError, match="missing parameter names"):
        optim.AdamW(ours + [Parameter(np.zeros(2), name="extra")]).load_state_dict(sd)
    bad = dict(sd)
    bad["state.layer0.weight.exp_avg"] = np.zeros((4, 3))
    with pytest.raises(ValueError, match="state.layer0.weight.exp_avg"):
        optim.AdamW(ours).load_state_dict(bad)
    bad = dict(sd)
    del bad["state.layer1.weight.exp_avg_sq"]
    with pytest.raises(ValueError, match="layer1.weight"):
        optim.AdamW(ours).load_state_dict(bad)
    with pytest.raises(ValueError, match="unexpected key"):
        optim.AdamW(ours).load_state_dict({**sd, "momentum": np.zeros(1)})


def test_bad_hyperparameters_and_params():
    p = [Parameter(np.zeros(3), name="w")]
    with pytest.raises(ValueError, match="lr"):
        optim.AdamW(p, lr=-1.0)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        optim.Adam(p, betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="betas"):
        optim.Adam(p, betas=0.9)
    with pytest.raises(ValueError, match="eps"):
        optim.Adam(p, eps=-1e-8)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(p, nesterov=True)
    with pytest.raises(ValueError, match="weight_decay"):
        optim.SGD(p, weight_decay=-0.1)
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([])
    with pytest.raises(ValueError, match="twice"):
        optim.SGD(p + p)
    with pytest.raises(ValueError, match="two parameters are named"):
        optim.SGD([("a", p[0]), ("a", Parameter(np.zeros(1)))])
    with pytest.raises(TypeError, match=r"params\[0\]"):
        optim.SGD([np.zeros(3)])
    with pytest.raises(TypeError, match="single Parameter"):
        optim.SGD(p[0])
    with pytest.raises(ValueError, match="unknown hyperparameters"):
        optim.SGD([{"params": p, "betas": (0.9, 0.9)}])


def test_parameter_validation():
    with pytest.raises(TypeError, match="data"):
        Parameter([1.0, 2.0])
    with pytest.raises(TypeError, match="data"):
        Parameter(np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        Parameter(np.zeros((3, 4)).T)
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        Parameter(ro)
    p = Parameter(np.zeros(3), name="w")
    with pytest.raises(ValueError, match="grad"):
        p.grad = np.zeros(4)
    with pytest.raises(TypeError, match="grad"):
        p.grad = np.zeros(3, np.float32)
    with pytest.raises(AttributeError):
        p.data = np.zeros(3)
    p.grad = np.ones(3)
    p.zero_grad(set_to_none=False)
    assert np.array_equal(p.grad, np.zeros(3))


# --------------------------------------------------------------------------------------------------
# copies, amsgrad switched off, failed add_param_group / step / load_state_dict change nothing
# --------------------------------------------------------------------------------------------------

def set_grads(ours, theirs, gs):
    for p, q, g in zip(ours, theirs, gs):
        p.grad, q.grad = g.copy(), torch.tensor(g.copy())


COPY_KINDS = [("Adam", dict(lr=1e-2, amsgrad=True, weight_decay=0.1)), ("AdamW", dict(lr=1e-2)),
              ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True))]


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("kind,config", COPY_KINDS, ids=[k for k, _ in COPY_KINDS])
def test_copied_optimizer_goes_on_like_the_original(rng, kind, config, how):
    """copy.deepcopy / pickle of an optimizer after 3 steps (its Parameters copied with it): the copy
    keys its state by the same names, and 3 more steps of the copy, of the original and of torch's
    (never copied) give the same weights and state."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=6)
    opt = getattr(optim, kind)([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.02}], **config)
    t_opt = getattr(torch.optim, kind)([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.02}], foreach=False,
                                       **config)
    run_both(opt, ours, t_opt, theirs, grads[:3])
    dup = copy.deepcopy(opt) if how == "deepcopy" else pickle.loads(pickle.dumps(opt))
    dup_params = [p for g in dup.param_groups for p in g["params"]]
    assert [n for n, _ in dup.named_parameters()] == [p.name for p in ours]
    assert all(p is not q and np.array_equal(p.data, q.data) for p, q in zip(ours, dup_params))
    _step_alongside(grads[3:], ours, theirs, dup_params, (dup, opt, t_opt))
    for p, q, r in zip(ours, dup_params, theirs):
        np.testing.assert_allclose(p.data, r.detach().numpy(), rtol=1e-12, atol=1e-12)
        assert np.array_equal(q.data, p.data)
    sd, dup_sd = opt.state_dict(), dup.state_dict()
    assert sorted(sd) == sorted(dup_sd) and all(np.array_equal(sd[k], dup_sd[k]) for k in sd)
    for p, r in zip(ours, theirs):
        for field, value in t_opt.state[r].items():
            if field == "step":
                assert dup.state[p.name]["step"] == int(value) == 6
            else:
                np.testing.assert_allclose(dup.state[p.name][field], value.numpy(), rtol=1e-12, atol=1e-14)


def _step_alongside(grads, ours, theirs, others, optimizers):
    """Steps every optimizer once per gradient set, ``others`` (a copy's parameters) getting the
    same gradients as ``ours`` and torch's ``theirs``."""
    for gs in grads:
        set_grads(ours, theirs, gs)
        for q, g in zip(others, gs):
            q.grad = g.copy()
        for o in optimizers:
            o.step()


def test_adam_state_round_trips_after_amsgrad_is_switched_off(rng):
    """amsgrad on for 2 steps, then off (as torch, max_exp_avg_sq stays in the state): the state dict
    loads back into the optimizer itself and into a fresh one with amsgrad=False, keeping
    max_exp_avg_sq; switched on again, all three step as torch's (which round-trips its own)."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=5)
    opt = optim.Adam(ours, lr=1e-2, amsgrad=True)
    t_opt = torch.optim.Adam(theirs, lr=1e-2, amsgrad=True, foreach=False)
    run_both(opt, ours, t_opt, theirs, grads[:2])
    opt.param_groups[0]["amsgrad"] = t_opt.param_groups[0]["amsgrad"] = False
    run_both(opt, ours, t_opt, theirs, grads[2:3])
    sd = opt.state_dict()
    assert "state.layer0.weight.max_exp_avg_sq" in sd and sd["param_groups.0.amsgrad"] == 0
    opt.load_state_dict(sd)
    t_opt.load_state_dict(t_opt.state_dict())
    clones = [Parameter(p.data.copy(), name=p.name) for p in ours]
    fresh = optim.Adam(clones, lr=5.0)
    fresh.load_state_dict(sd)
    assert fresh.param_groups[0]["amsgrad"] is False
    for o, params in ((opt, ours), (fresh, clones)):
        for p, q in zip(params, theirs):
            np.testing.assert_allclose(o.state[p.name]["max_exp_avg_sq"], t_opt.state[q]["max_exp_avg_sq"].numpy(),
                                       rtol=1e-12, atol=1e-14)
    for o in (opt, fresh, t_opt):
        o.param_groups[0]["amsgrad"] = True  # the kept running max is used again
    _step_alongside(grads[3:], ours, theirs, clones, (opt, fresh, t_opt))
    for p, q, r in zip(ours, clones, theirs):
        np.testing.assert_allclose(p.data, r.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(q.data, r.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_failed_add_param_group_changes_nothing(rng):
    """A group with a parameter given twice, or two parameters of one name, is refused before any
    name is registered: the optimizer is unchanged and the same parameter can then be added in a
    valid group; the run then follows torch's."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=3)
    opt = optim.Adam(ours[:2], lr=1e-2)
    t_opt = torch.optim.Adam(theirs[:2], lr=1e-2, foreach=False)
    names = [n for n, _ in opt.named_parameters()]
    with pytest.raises(ValueError, match=r"params: parameter 'layer0.weight' is given twice"):
        opt.add_param_group({"params": [ours[2], ours[0]]})
    with pytest.raises(ValueError, match=r"params: parameter 'layer2.weight' is given twice"):
        opt.add_param_group({"params": [ours[2], ours[3], ours[2]]})
    with pytest.raises(ValueError, match=r"params: two parameters are named 'layer2.weight'"):
        opt.add_param_group({"params": [ours[2], ("layer2.weight", ours[3])]})
    assert len(opt.param_groups) == 1 and [n for n, _ in opt.named_parameters()] == names
    assert sorted(opt.state_dict()) == sorted(optim.Adam(ours[:2], lr=1e-2).state_dict())
    opt.add_param_group({"params": ours[2:], "lr": 0.05})
    t_opt.add_param_group({"params": theirs[2:], "lr": 0.05})
    assert [n for n, _ in opt.named_parameters()] == [p.name for p in ours]
    run_both(opt, ours, t_opt, theirs, grads)


@pytest.mark.parametrize("kind,config", KINDS, ids=[k for k, _ in KINDS])
def test_step_refuses_a_read_only_parameter_before_updating_any(rng, kind, config):
    """A parameter array made read-only after construction (here the last one) is refused by name
    before any parameter moves: no weight, moment or step count changes; made writeable again, the
    run follows torch's (which never saw the refused step)."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=4)
    opt = getattr(optim, kind)(ours, **config)
    t_opt = getattr(torch.optim, kind)(theirs, foreach=False, **config)
    run_both(opt, ours, t_opt, theirs, grads[:2])
    set_grads(ours, theirs, grads[2])
    ours[3].data.flags.writeable = False
    before = snapshot(opt, ours)
    with pytest.raises(ValueError, match=r"step: layer3\.weight: expected a writeable parameter array"):
        opt.step()
    assert_unchanged(opt, ours, before)
    ours[3].data.flags.writeable = True
    run_both(opt, ours, t_opt, theirs, grads[2:])


def test_step_counts_out_of_the_int64_range_are_refused(rng):
    """A step count the C++ update cannot take (it counts step + 1 in int64): load_state_dict refuses
    it naming the key, and step() refuses one written into the state before updating anything. The
    largest count that fits loads and steps as torch's."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=2)
    opt = optim.Adam(ours, lr=1e-2)
    t_opt = torch.optim.Adam(theirs, lr=1e-2, foreach=False)
    run_both(opt, ours, t_opt, theirs, grads[:1])
    sd = opt.state_dict()
    before = snapshot(opt, ours)
    for bad in (np.array(1e30), np.array(2**63 - 1, np.int64), np.array(2.0**63), np.array(np.inf)):
        with pytest.raises(ValueError, match=r"load_state_dict: state\.layer1\.weight\.step: expected a whole "
                                             r"number >= 0 and <= 9223372036854775806"):
            opt.load_state_dict({**sd, "state.layer1.weight.step": bad})
        assert_unchanged(opt, ours, before)
    with pytest.raises(TypeError, match=r"state\.layer1\.weight\.step: expected a whole number .*got a <U1 array"):
        opt.load_state_dict({**sd, "state.layer1.weight.step": np.array("1")})
    assert_unchanged(opt, ours, before)
    set_grads(ours, theirs, grads[1])
    for bad, error in ((2**63 - 1, ValueError), (-1, ValueError), (1.0, TypeError)):
        opt.state["layer1.weight"]["step"] = bad
        with pytest.raises(error, match=r"step: state\.layer1\.weight\.step: expected an int"):
            opt.step()
        opt.state["layer1.weight"]["step"] = 1
        assert_unchanged(opt, ours, before)
    top = 2**63 - 2
    opt.load_state_dict({**sd, "state.layer1.weight.step": np.array(top, np.int64)})
    t_opt.state[theirs[1]]["step"] = torch.tensor(float(top))
    opt.step()
    t_opt.step()
    assert opt.state["layer1.weight"]["step"] == top + 1
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-12, atol=1e-12)


BAD_LOADED_VALUES = [
    ("param_groups.1.lr", None, TypeError, r"param_groups\.1\.lr: expected a real number .*got a object array"),
    ("param_groups.1.lr", np.array("0.1"), TypeError, r"param_groups\.1\.lr: expected a real number .*got a <U3"),
    ("param_groups.1.lr", np.array(True), TypeError, r"param_groups\.1\.lr: expected a real number .*got a bool"),
    ("param_groups.1.lr", np.array([[0.1]]), ValueError, r"param_groups\.1\.lr: expected an array of shape \(\), "
                                                         r"got \(1, 1\)"),
    ("param_groups.0.betas", np.array([0.9, 0.9, 0.9]), ValueError, r"param_groups\.0\.betas: expected an array of "
                                                                    r"shape \(2,\), got \(3,\)"),
    ("param_groups.0.betas", np.array([0.9, 1.0]), ValueError, r"param_groups\.0\.betas\[1\]: expected a finite"),
    ("param_groups.0.amsgrad", np.array("1"), TypeError, r"param_groups\.0\.amsgrad: expected a flag 0 or 1, got a <U1"),
    ("state.layer1.weight.exp_avg", np.array(["a"] * 7), TypeError,
     r"state\.layer1\.weight\.exp_avg: expected an array of real numbers .*got a <U1 array"),
    ("state.layer1.weight.exp_avg", np.array([None] * 7), TypeError,
     r"state\.layer1\.weight\.exp_avg: expected an array of real numbers .*got a object array"),
    ("state.layer1.weight.exp_avg", np.ones(7, np.complex128), TypeError,
     r"state\.layer1\.weight\.exp_avg: expected an array of real numbers .*got a complex128 array"),
    ("state.layer1.weight.exp_avg_sq", np.ones(7, bool), TypeError,
     r"state\.layer1\.weight\.exp_avg_sq: expected an array of real numbers .*got a bool array"),
    ("state.layer1.weight.exp_avg", [[1.0], [1.0, 2.0]], TypeError, r"state\.layer1\.weight\.exp_avg: expected an "
                                                                    r"array of numbers, got list"),
    ("params.layer1.weight.group", None, TypeError, r"params\.layer1\.weight\.group: expected a whole number"),
]


@pytest.mark.parametrize("key,value,error,match", BAD_LOADED_VALUES, ids=[f"{k}={v!r}"[:60] for k, v, _, _ in
                                                                           BAD_LOADED_VALUES])
def test_load_state_dict_names_the_key_of_a_bad_value(rng, key, value, error, match):
    """None, strings, bools, complex numbers, ragged lists, wrong shapes: TypeError / ValueError naming
    the key with what was expected and what was given (never a raw conversion error, nor "NaN or
    inf" for a None array), nothing loaded; the next step is torch's."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=3)
    config = dict(lr=1e-2, amsgrad=True)
    opt = optim.Adam([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.02}], **config)
    t_opt = torch.optim.Adam([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.02}], foreach=False, **config)
    run_both(opt, ours, t_opt, theirs, grads[:2])
    sd = opt.state_dict()
    before = snapshot(opt, ours)
    with pytest.raises(error, match=f"load_state_dict: {match}"):
        opt.load_state_dict({**sd, key: value})
    assert_unchanged(opt, ours, before)
    opt.load_state_dict(sd)
    run_both(opt, ours, t_opt, theirs, grads[2:])


# --------------------------------------------------------------------------------------------------
# clip_grad_norm_
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0, 0.5])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(rng, dtype, norm_type, max_norm):
    ours, theirs = make_params(rng, dtype)
    for p, q in zip(ours, theirs):
        g = rng.standard_normal(p.shape).astype(dtype)
        p.grad, q.grad = g.copy(), torch.tensor(g.copy())
    ours[1].grad = None  # skipped by both
    theirs[1].grad = None
    total = optim.clip_grad_norm_(ours, max_norm, norm_type)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type, foreach=False)
    tol = 1e-12 if dtype == np.float64 else 1e-6
    assert math.isclose(total, float(total_t), rel_tol=tol)
    for p, q in zip(ours, theirs):
        if p.grad is None:
            assert q.grad is None
            continue
        np.testing.assert_allclose(p.grad, q.grad.numpy(), rtol=tol, atol=0)
    if max_norm < 1:
        assert math.isclose(optim.clip_grad_norm_(ours, 1e6, norm_type), max_norm, rel_tol=1e-5)


def test_clip_grad_norm_edges(rng):
    p = Parameter(np.zeros(3), name="w")
    assert optim.clip_grad_norm_([p], 1.0) == 0.0
    assert optim.clip_grad_norm_(p, 1.0) == 0.0
    p.grad = np.array([3.0, 4.0, 0.0])
    assert optim.clip_grad_norm_([("w", p)], 1.0, "inf") == 4.0
    p.grad = np.array([np.nan, 1.0, 0.0])
    with pytest.raises(optim.NonFiniteGradientError, match="w"):
        optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert math.isnan(optim.clip_grad_norm_([p], 1.0))
    with pytest.raises(ValueError, match="norm_type"):
        optim.clip_grad_norm_([p], 1.0, norm_type=math.nan)
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_grad_norm_([p], -1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_type", [0, 0.0, -1.0, -2.0, -0.5, -math.inf, "-inf"])
@pytest.mark.parametrize("max_norm", [0.5, 2.5, math.inf])
@pytest.mark.parametrize("zeros", [False, True], ids=["nonzero", "with_zeros"])
def test_clip_grad_norm_nonpositive_norm_types_match_torch(rng, dtype, norm_type, max_norm, zeros):
    """norm_type 0 (torch counts the non-zero elements of each gradient, then the non-zero per-gradient
    counts), negative p ((Σ|x|^p)^(1/p): 0 as soon as one element is 0) and -inf (the min |x|), with
    max_norm finite or inf: the returned norm and the clipped gradients are torch's."""
    ours, theirs = make_params(rng, dtype)
    for p, q in zip(ours, theirs):
        g = (rng.standard_normal(p.shape) + 3.0).astype(dtype)  # no zero unless put there
        p.grad, q.grad = g.copy(), torch.tensor(g.copy())
    if zeros:
        for k in (0, 3):
            ours[k].grad[...] = 0  # one gradient all zero: not counted by norm 0
            theirs[k].grad.zero_()
        ours[1].grad[2] = 0
        theirs[1].grad[2] = 0
    ours[2].grad, theirs[2].grad = None, None
    total = optim.clip_grad_norm_(ours, max_norm, norm_type)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, max_norm, float(norm_type), foreach=False)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    assert math.isclose(total, float(total_t), rel_tol=tol, abs_tol=tol), (total, float(total_t))
    for p, q in zip(ours, theirs):
        if p.grad is None:
            assert q.grad is None
            continue
        np.testing.assert_allclose(p.grad, q.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 0.5])
def test_clip_grad_norm_inf_max_norm_measures_and_clips_nothing(rng, dtype, norm_type):
    """max_norm = inf (torch's way to only measure): the norm is returned and no gradient changes; an
    infinite gradient makes the coefficient inf / inf = NaN, which torch writes into the gradients
    too (error_if_nonfinite=True raises instead, changing nothing)."""
    ours, theirs = make_params(rng, dtype)
    for p, q in zip(ours, theirs):
        g = (rng.standard_normal(p.shape) * 100).astype(dtype)
        p.grad, q.grad = g.copy(), torch.tensor(g.copy())
    kept = [p.grad.copy() for p in ours]
    total = optim.clip_grad_norm_(ours, math.inf, norm_type)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, math.inf, norm_type, foreach=False)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    assert total > 1 and math.isclose(total, float(total_t), rel_tol=tol)
    for p, q, g in zip(ours, theirs, kept):
        assert np.array_equal(p.grad, g)
        np.testing.assert_allclose(p.grad, q.grad.numpy(), rtol=0, atol=0)
    ours[1].grad[0] = theirs[1].grad[0] = np.inf
    with pytest.raises(optim.NonFiniteGradientError, match="layer1.weight"):
        optim.clip_grad_norm_(ours, math.inf, norm_type, error_if_nonfinite=True)
    assert np.array_equal(ours[0].grad, kept[0])
    total = optim.clip_grad_norm_(ours, math.inf, norm_type)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, math.inf, norm_type, foreach=False)
    assert math.isinf(total) and math.isinf(float(total_t))
    for p, q in zip(ours, theirs):
        np.testing.assert_array_equal(np.isnan(p.grad), torch.isnan(q.grad).numpy())


def test_clip_grad_norm_bad_arguments_change_nothing(rng):
    """error_if_nonfinite must be a bool (TypeError: "yes" is no flag); a negative or -inf norm of an
    empty gradient is undefined (torch raises too); NaN norm_type / max_norm, negative max_norm:
    ValueError. Nothing is scaled; then the same call as torch's."""
    ours, theirs = make_params(rng, np.float64)
    for p, q in zip(ours, theirs):
        g = rng.standard_normal(p.shape)
        p.grad, q.grad = g.copy(), torch.tensor(g.copy())
    kept = [p.grad.copy() for p in ours]
    empty = Parameter(np.zeros(0), name="empty", grad=np.zeros(0))
    cases = [
        (dict(max_norm=0.5, error_if_nonfinite="yes"), TypeError, r"error_if_nonfinite: expected a bool, got str"),
        (dict(max_norm=0.5, error_if_nonfinite=1), TypeError, r"error_if_nonfinite: expected a bool, got int"),
        (dict(max_norm=0.5, norm_type=math.nan), ValueError, r"norm_type: expected a real number or ±inf, got nan"),
        (dict(max_norm=0.5, norm_type="2"), TypeError, r"norm_type: expected a real number or ±inf, got str"),
        (dict(max_norm=math.nan), ValueError, r"max_norm"),
        (dict(max_norm=-1.0), ValueError, r"max_norm: expected a number >= 0.0, got -1.0"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            optim.clip_grad_norm_(ours, **kwargs)
        assert all(np.array_equal(p.grad, g) for p, g in zip(ours, kept))
    for norm_type in (-1.0, -math.inf):
        with pytest.raises(ValueError, match=r"norm_type: .*empty gradient.*\['empty'\]"):
            optim.clip_grad_norm_(ours + [empty], 0.5, norm_type)
        t_empty = torch.zeros(0, requires_grad=True)
        t_empty.grad = torch.zeros(0)
        with pytest.raises(RuntimeError, match="empty tensor"):
            torch.nn.utils.clip_grad_norm_([t_empty], 0.5, norm_type, foreach=False)
        assert all(np.array_equal(p.grad, g) for p, g in zip(ours, kept))
    assert optim.clip_grad_norm_([empty], 0.5, 0) == float(torch.linalg.vector_norm(torch.zeros(0), 0)) == 0.0
    total = optim.clip_grad_norm_(ours, 0.5, 0, error_if_nonfinite=True)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, 0.5, 0, error_if_nonfinite=True, foreach=False)
    assert total == float(total_t) == 4.0
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.grad, q.grad.numpy(), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# constructor defaults, complete loaded groups, empty names, copies of a model's optimizer,
# clip_grad_norm_'s messages
# --------------------------------------------------------------------------------------------------

DEFAULTS_OVERRIDDEN = [
    ("SGD", dict(lr=-1.0), dict(lr=0.1), ValueError, r"^lr: expected a finite number >= 0.0, got -1.0"),
    ("SGD", dict(lr=0.1, momentum=-0.5), dict(momentum=0.9), ValueError, r"^momentum: "),
    ("SGD", dict(lr=0.1, nesterov=True), dict(momentum=0.9), ValueError, r"^nesterov: needs momentum > 0"),
    ("AdamW", dict(betas=(2.0, 3.0)), dict(betas=(0.9, 0.99)), ValueError, r"^betas\[0\]: "),
    ("Adam", dict(eps=-1.0), dict(eps=1e-8), ValueError, r"^eps: "),
    ("Adam", dict(weight_decay="0.1"), dict(weight_decay=0.0), TypeError, r"^weight_decay: expected a number"),
]


@pytest.mark.parametrize("kind,defaults,group,error,match", DEFAULTS_OVERRIDDEN,
                         ids=[f"{k}-{sorted(d)[-1]}" for k, d, _, _, _ in DEFAULTS_OVERRIDDEN])
def test_constructor_defaults_are_checked_even_when_every_group_overrides_them(kind, defaults, group, error, match):
    """A bad constructor hyperparameter is refused even when the only group overrides it, as torch
    refuses it (a later add_param_group would otherwise inherit it)."""
    with pytest.raises(error):
        getattr(torch.optim, kind)([{"params": [torch.zeros(2, requires_grad=True)], **group}], **defaults)
    with pytest.raises(error, match=match):
        getattr(optim, kind)([{"params": [Parameter(np.zeros(2), name="a")], **group}], **defaults)


@pytest.mark.parametrize("kind,config", [("AdamW", dict(lr=0.1, amsgrad=True)),
                                         ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True))], ids=["AdamW", "SGD"])
def test_load_state_dict_requires_every_hyperparameter_of_every_group(rng, kind, config):
    """A loaded group lacking any hyperparameter (lr, betas, a flag, ...) is refused, the missing
    keys listed, and nothing changes: a group is never half the saved one, half the current one."""
    ours, _ = make_params(rng, np.float64)
    opt = getattr(optim, kind)([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.02}], **config)
    for p in ours:
        p.grad = rng.standard_normal(p.shape)
    opt.step()
    sd = opt.state_dict()
    clones = [Parameter(p.data.copy(), name=p.name) for p in ours]
    other = dict(config, lr=0.7)
    target = getattr(optim, kind)([{"params": clones[:2]}, {"params": clones[2:]}], **other)
    before = target.state_dict()
    keys = sorted(getattr(optim, kind)([Parameter(np.zeros(1), name="x")], **config).defaults)
    assert len(keys) >= 6
    for gi in (0, 1):
        for key in keys:
            partial = {k: v for k, v in sd.items() if k != f"param_groups.{gi}.{key}"}
            with pytest.raises(ValueError, match=rf"load_state_dict: missing hyperparameters "
                                                 rf"\['param_groups\.{gi}\.{key}'\]"):
                target.load_state_dict(partial)
            after = target.state_dict()
            assert sorted(after) == sorted(before) and all(np.array_equal(after[k], before[k]) for k in before)
    dropped = {k: v for k, v in sd.items() if k not in ("param_groups.0.lr", "param_groups.1.weight_decay")}
    with pytest.raises(ValueError, match=r"\['param_groups\.0\.lr', 'param_groups\.1\.weight_decay'\]"):
        target.load_state_dict(dropped)
    target.load_state_dict(sd)  # the whole state loads
    assert [g["lr"] for g in target.param_groups] == [config["lr"], 0.02]


def test_empty_parameter_names_are_refused():
    """An empty name would give state-dict keys (``params..group``) that load_state_dict cannot read
    back: refused when the parameter is added (named by position), nothing registered."""
    p, q = Parameter(np.zeros(2)), Parameter(np.zeros(3), name="b")
    for params in ([("", p)], {"": p}, [Parameter(np.zeros(2), name="")]):
        with pytest.raises(ValueError, match=r"^params\[0\]: expected a non-empty parameter name, got ''"):
            optim.AdamW(params)
    with pytest.raises(ValueError, match=r"^params\[1\]: expected a non-empty"):
        optim.SGD([("a", q), ("", p)], lr=0.1)
    opt = optim.SGD([("a", q)], lr=0.1)
    with pytest.raises(ValueError, match=r"^params\[0\]: expected a non-empty"):
        opt.add_param_group({"params": [("", p)]})
    assert len(opt.param_groups) == 1 and opt.named_parameters() == [("a", q)]
    # the names that are accepted round-trip through the state dict (torch's optimizer: by position)
    opt = optim.AdamW([(".", p), ("a.b.", q)], lr=0.1)
    p.grad, q.grad = np.ones(2), np.ones(3)
    opt.step()
    again = optim.AdamW([(".", Parameter(p.data.copy())), ("a.b.", Parameter(q.data.copy()))])
    again.load_state_dict(opt.state_dict())
    assert again.state["."]["step"] == again.state["a.b."]["step"] == 1


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copying_an_optimizer_over_a_models_parameters_says_why_it_cannot(how):
    """A model's parameters are views of its C++ buffers, which cannot be copied: deepcopy / pickle
    of an optimizer over them raises a TypeError naming such a parameter and the way out (its
    state_dict), not pybind's "cannot pickle '..._core...'"; the optimizer goes on unharmed."""
    import transformer_core as tc

    cfg = tc.GPT2Config(vocab_size=31, n_positions=16, n_embd=8, n_layer=1, n_head=2)
    model = tc.GPT2LMHeadModel(cfg, dtype=np.float64).train()
    opt = optim.AdamW(model.named_parameters(), lr=1e-2)
    ids = np.random.default_rng(0).integers(0, 31, (2, 5))
    model.loss(ids, ids)
    model.backward()
    opt.step()
    first = opt.named_parameters()[0][0]
    with pytest.raises(TypeError, match=rf"cannot copy or pickle AdamW: its parameter '{first}' is a model's.*"
                                        r"state_dict\(\)"):
        copy.deepcopy(opt) if how == "deepcopy" else pickle.dumps(opt)
    sd = opt.state_dict()
    model.loss(ids, ids)
    model.backward()
    opt.step()
    assert all(opt.state[name]["step"] == 2 for name in opt.state) and len(sd) > 0


def test_clip_grad_norm_overflow_of_finite_gradients_says_so():
    """Finite float64 gradients whose 2-norm overflows (1e200 each): the total is inf, as torch's;
    error_if_nonfinite raises saying the norm overflowed (no gradient is non-finite: ``names`` empty),
    and nothing is scaled. A NaN gradient is still named."""
    g = np.array([1e200, 1e200])
    assert float(torch.linalg.vector_norm(torch.from_numpy(g))) == math.inf
    t = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    t.grad = torch.from_numpy(g.copy())
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_([t], 1.0, error_if_nonfinite=True)
    p = Parameter(np.zeros(2), name="w", grad=g.copy())
    with pytest.raises(optim.NonFiniteGradientError, match=r"non-finite \(inf\); every gradient is finite, but "
                                                           r"their norm overflowed") as info:
        optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert info.value.names == [] and np.array_equal(p.grad, g)
    assert optim.clip_grad_norm_([p], 1.0) == math.inf  # without the flag: torch's inf (and its scaling by 0)
    q = Parameter(np.zeros(2), name="v", grad=np.array([1.0, np.nan]))
    with pytest.raises(optim.NonFiniteGradientError, match=r"non-finite gradients in \['v'\]") as info:
        optim.clip_grad_norm_([q], 1.0, error_if_nonfinite=True)
    assert info.value.names == ["v"]


@pytest.mark.parametrize("bad,match", [
    (None, r"^parameters: expected an iterable of Parameters or \(name, Parameter\) pairs, got NoneType"),
    (5, r"^parameters: expected an iterable .*, got int"),
    ("abc", r"^parameters: expected an iterable .*, got str"),
    (np.ones(3), r"^parameters: expected an iterable .*, got ndarray"),
    ([np.ones(3)], r"^parameters\[0\]: expected a Parameter or a \(name, Parameter\) pair, got numpy\.ndarray \(pass transformer_core Parameters"),
    ([("w", Parameter(np.ones(2))), (3, Parameter(np.ones(2)))], r"^parameters\[1\]: expected a \(str name"),
], ids=["None", "int", "str", "ndarray", "list_of_arrays", "int_name"])
def test_clip_grad_norm_names_its_parameters_argument(bad, match):
    with pytest.raises(TypeError, match=match):
        optim.clip_grad_norm_(bad, 1.0)


@pytest.mark.parametrize("norm_type", [10**400, -(10**400)], ids=["10**400", "-10**400"])
def test_clip_grad_norm_norm_type_too_large_for_a_float_is_a_value_error(rng, norm_type):
    """A norm_type no float holds is a ValueError naming it, as max_norm's (it was float()'s
    OverflowError); nothing is scaled. The same call with math.inf (what it tends to) is torch's."""
    ours, theirs = make_params(rng, np.float64)
    for p, q in zip(ours, theirs):
        g = rng.standard_normal(p.shape) * 3
        p.grad, q.grad = g.copy(), torch.tensor(g.copy())
    kept = [p.grad.copy() for p in ours]
    hint = r"math\.inf gives the max norm" if norm_type > 0 else r"-math\.inf gives the min norm"
    with pytest.raises(ValueError, match=r"^norm_type: expected a real number or ±inf, got int of 1329 bits \(too "
                                         rf"large for a float; {hint}\)$"):
        optim.clip_grad_norm_(ours, 0.5, norm_type)
    assert all(np.array_equal(p.grad, g) for p, g in zip(ours, kept))
    limit = math.inf if norm_type > 0 else -math.inf
    total = optim.clip_grad_norm_(ours, 0.5, limit)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, 0.5, limit, foreach=False)
    assert math.isclose(total, float(total_t), rel_tol=1e-12)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.grad, q.grad.numpy(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("make", ["SGD", "AdamW", "clip_grad_norm_", "param_group"])
def test_a_torch_parameter_is_named_with_its_module(make):
    """A torch.nn.Parameter where a Parameter of this library is expected: the message names its
    type with its module (it read "expected a Parameter ..., got Parameter") and says what to pass."""
    given = [Parameter(np.ones(2), name="ok"), torch.nn.Parameter(torch.zeros(3))]
    argument = "parameters" if make == "clip_grad_norm_" else "params"
    message = (rf"^{argument}\[1\]: expected a Parameter or a \(name, Parameter\) pair, got "
               r"torch\.nn\.parameter\.Parameter \(pass transformer_core Parameters: a model's parameters\(\) or "
               r"named_parameters\(\), or transformer_core\.parameter\.Parameter\(array, name=\.\.\.\)\)$")
    def call(params):
        if make == "clip_grad_norm_":
            optim.clip_grad_norm_(params, 1.0)
        elif make == "param_group":
            optim.SGD([{"params": params}], lr=0.1)
        else:
            getattr(optim, make)(params, lr=0.1)

    with pytest.raises(TypeError, match=message):
        call(given)
    # torch's named_parameters(): (name, torch Parameter) pairs, named as pairs (it read "got tuple")
    with pytest.raises(TypeError, match=rf"^{argument}\[0\]: expected a Parameter or a \(name, Parameter\) pair, got "
                                        r"a \(str, torch\.nn\.parameter\.Parameter\) pair \(pass transformer_core "):
        call(torch.nn.Linear(2, 2).named_parameters())


def test_adamw_loads_an_adam_state_dict_as_adamw_like_torch(rng):
    """An Adam's state dict (decoupled_weight_decay saved as 0) loaded into an AdamW keeps AdamW's
    decoupled decay, as torch's AdamW (whose __setstate__ forces it): the run then follows torch's
    AdamW that loaded torch's Adam state dict. A group that asks an AdamW for
    decoupled_weight_decay=False (add_param_group, or written before a step) is refused, unchanged."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=6)
    config = dict(lr=1e-2, weight_decay=0.5)
    src, t_src = optim.Adam(ours, **config), torch.optim.Adam(theirs, foreach=False, **config)
    run_both(src, ours, t_src, theirs, grads[:3])
    sd = src.state_dict()
    assert sd["param_groups.0.decoupled_weight_decay"] == 0
    opt = optim.AdamW(ours, **config)
    t_opt = torch.optim.AdamW(theirs, foreach=False, **config)
    opt.load_state_dict(sd)
    t_opt.load_state_dict(t_src.state_dict())
    assert opt.param_groups[0]["decoupled_weight_decay"] is True is t_opt.param_groups[0]["decoupled_weight_decay"]
    run_both(opt, ours, t_opt, theirs, grads[3:])
    for p, q in zip(ours, theirs):
        assert opt.state[p.name]["step"] == int(t_opt.state[q]["step"]) == 6
    extra = Parameter(np.ones(2), name="extra")
    with pytest.raises(ValueError, match=r"decoupled_weight_decay: AdamW's weight decay is always decoupled"):
        opt.add_param_group({"params": [extra], "decoupled_weight_decay": False})
    assert len(opt.param_groups) == 1 and "extra" not in dict(opt.named_parameters())
    opt.param_groups[0]["decoupled_weight_decay"] = False
    for p, g in zip(ours, grads[0]):
        p.grad = g.copy()
    before = snapshot(opt, ours)
    with pytest.raises(ValueError, match=r"step: param_groups\[0\]: decoupled_weight_decay"):
        opt.step()
    assert_unchanged(opt, ours, before)


DTYPE_CASES = [
    ("Adam", dict(lr=1e-3, eps=1e-50), r"eps: 1e-50 rounds to 0 in float32"),
    ("SGD", dict(lr=1e39), r"lr: 1e\+39 overflows float32"),
    ("SGD", dict(lr=0.1, momentum=1e39), r"momentum: 1e\+39 overflows float32"),
    ("SGD", dict(lr=0.1, momentum=0.5, dampening=1e39), r"1 - dampening: -1e\+39 overflows float32"),
    ("Adam", dict(lr=0.1, weight_decay=1e39), r"weight_decay: 1e\+39 overflows float32"),
    ("Adam", dict(lr=1e38, betas=(0.99, 0.999)), r"lr / \(1 - betas\[0\]\) \(the first step's size\): [\d.e+]+ overflows float32"),
    ("AdamW", dict(lr=1e30, weight_decay=1e10), r"lr \* weight_decay \(the decoupled decay\): 1e\+40 overflows"),
]


@pytest.mark.parametrize("kind,config,match", DTYPE_CASES, ids=[f"{k}-{'-'.join(c)}" for k, c, _ in DTYPE_CASES])
def test_step_refuses_hyperparameters_degenerate_in_the_parameters_dtype(kind, config, match):
    """Hyperparameters that are finite (eps > 0) as Python floats but round to 0 or overflow in
    float32, where the update takes them: torch's float32 steps either write NaN / inf into the
    weights (0 / 0, inf · 0) or raise RuntimeError where the scalar is a checked argument ("cannot be
    converted to type float without overflow"); ours refuses before any update (ValueError naming
    the hyperparameter and the dtype), nothing changes. The same values in float64 stay in range
    there: ours steps as torch's."""
    w0 = np.array([1.0, 0.0, -2.0])
    g = np.array([0.5, 0.0, -0.25])  # the zero element: 0 / 0 (eps) or inf · 0 (overflowed scalars)
    q = torch.tensor(w0.astype(np.float32), requires_grad=True)
    t32 = getattr(torch.optim, kind)([q], foreach=False, **config)
    try:
        for _ in range(2):
            q.grad = torch.tensor(g.astype(np.float32))
            t32.step()
    except RuntimeError as e:
        assert "without overflow" in str(e)
    else:
        assert not np.all(np.isfinite(q.detach().numpy()))  # torch's float32 steps: NaN or inf
    p = Parameter(w0.astype(np.float32), name="w")
    opt = getattr(optim, kind)([p], **config)
    p.grad = g.astype(np.float32)
    with pytest.raises(ValueError, match=r"step: param_groups\[0\]: " + match) as info:
        opt.step()
    assert "(the dtype of parameter 'w'" in str(info.value)
    assert np.array_equal(p.data, w0.astype(np.float32)) and opt.state == {}
    p64, q64 = Parameter(w0.copy(), name="w"), torch.tensor(w0.copy(), requires_grad=True)
    ours, theirs = getattr(optim, kind)([p64], **config), getattr(torch.optim, kind)([q64], foreach=False, **config)
    run_both(ours, [p64], theirs, [q64], [[g], [g * 3]])
    assert np.all(np.isfinite(p64.data))


def test_float64_hyperparameters_that_overflow_only_in_double_arithmetic_are_refused():
    """AdamW's decay lr · weight_decay overflows even float64 (1e200 · 1e200): refused as well."""
    p = Parameter(np.ones(2), name="w")
    opt = optim.AdamW([p], lr=1e200, weight_decay=1e200)
    p.grad = np.ones(2)
    with pytest.raises(ValueError, match=r"lr \* weight_decay \(the decoupled decay\): inf overflows float64"):
        opt.step()
    assert np.array_equal(p.data, np.ones(2)) and opt.state == {}


@pytest.mark.parametrize("field", ["step", "exp_avg", "exp_avg_sq"])
def test_step_refuses_a_state_missing_a_field_before_updating_any(rng, field):
    """A state entry missing a field the update reads (deleted by hand) is refused with a ValueError
    naming it before any parameter is updated (layer0, earlier in the group, keeps its weights and
    step count); put back, the run goes on as torch's."""
    ours, theirs = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=4)
    opt, t_opt = optim.Adam(ours, lr=1e-2), torch.optim.Adam(theirs, lr=1e-2, foreach=False)
    run_both(opt, ours, t_opt, theirs, grads[:2])
    removed = opt.state["layer1.weight"].pop(field)
    set_grads(ours, theirs, grads[2])
    before = snapshot(opt, ours)
    with pytest.raises(ValueError, match=rf"step: state\.layer1\.weight: missing \['{field}'\]"):
        opt.step()
    assert_unchanged(opt, ours, before)
    opt.state["layer1.weight"][field] = removed
    run_both(opt, ours, t_opt, theirs, grads[2:])
    assert all(opt.state[p.name]["step"] == 4 for p in ours)


def test_adam_state_saved_after_amsgrad_is_switched_on_loads_and_goes_on_bitwise(rng):
    """amsgrad switched on mid-run: the state has no max_exp_avg_sq yet, which step() creates at
    zeros. The optimizer's state dict saved then loads into an Adam(amsgrad=True), which creates it
    the same way: both runs go on bit for bit alike."""
    ours, _ = make_params(rng, np.float64)
    grads = grad_sequence(rng, np.float64, steps=5)
    opt = optim.Adam(ours, lr=1e-2)
    for gs in grads[:2]:
        for p, g in zip(ours, gs):
            p.grad = g.copy()
        opt.step()
    opt.param_groups[0]["amsgrad"] = True
    sd = opt.state_dict()
    assert not any(k.endswith("max_exp_avg_sq") for k in sd)
    clones = [Parameter(p.data.copy(), name=p.name) for p in ours]
    loaded = optim.Adam(clones, lr=1e-2, amsgrad=True)
    loaded.load_state_dict(sd)
    for gs in grads[2:]:
        for p, q, g in zip(ours, clones, gs):
            p.grad, q.grad = g.copy(), g.copy()
        opt.step()
        loaded.step()
        for p, q in zip(ours, clones):
            assert np.array_equal(p.data, q.data)
    a, b = opt.state_dict(), loaded.state_dict()
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert "state.layer0.weight.max_exp_avg_sq" in a


@pytest.mark.parametrize("params,names", [
    (lambda P: [P("1"), P()], ["1", "2"]),
    (lambda P: [P(), P("0")], ["1", "0"]),
    (lambda P: [P(), P("1"), P()], ["0", "1", "2"]),
    (lambda P: [P("2"), P(), P()], ["2", "1", "3"]),
    (lambda P: [("3", P()), P(), P(), P()], ["3", "1", "2", "4"]),
], ids=["named_1_then_unnamed", "unnamed_then_named_0", "between", "skips_a_taken_number", "pair"])
def test_unnamed_parameters_get_a_free_name(rng, params, names):
    """A Parameter without a name is named by its position, or by the next number no parameter of
    the optimizer has (it clashed with a given name: "two parameters are named '1'"); the optimizer
    then steps as torch's and its state dict loads into one built the same way."""
    values = iter([rng.standard_normal(3) for _ in range(4)])

    def P(name=None):
        return Parameter(next(values), name=name)

    given = params(P)
    ours = [p[1] if isinstance(p, tuple) else p for p in given]
    theirs = [torch.tensor(p.data.copy(), requires_grad=True) for p in ours]
    opt = optim.Adam(given, lr=0.1)
    assert [n for n, _ in opt.named_parameters()] == names
    run_both(opt, ours, torch.optim.Adam(theirs, lr=0.1, foreach=False), theirs,
             grad_sequence(rng, np.float64, [(3,)] * len(ours), steps=3))
    again = params(lambda name=None: Parameter(np.zeros(3), name=name))
    twin = optim.Adam(again, lr=0.1)
    twin.load_state_dict(opt.state_dict())
    assert [n for n, _ in twin.named_parameters()] == names


def test_unnamed_parameter_of_a_later_group_skips_the_names_taken():
    """add_param_group: an unnamed parameter skips the names of the groups before too; one given
    twice is still refused, and a given name that an earlier group's unnamed parameter was given is
    a clash (that name is in the earlier state)."""
    opt = optim.SGD([Parameter(np.zeros(2), name="1")], lr=0.1)
    opt.add_param_group({"params": [Parameter(np.zeros(2))]})
    assert [n for n, _ in opt.named_parameters()] == ["1", "2"]
    p = Parameter(np.zeros(2))
    with pytest.raises(ValueError, match=r"^params\[1\]: the unnamed parameter of params\[0\] is given twice"):
        opt.add_param_group({"params": [p, p]})
    with pytest.raises(ValueError, match=r"^params: two parameters are named '2'"):
        opt.add_param_group({"params": [Parameter(np.zeros(2), name="2")]})
    assert [n for n, _ in opt.named_parameters()] == ["1", "2"]


@pytest.mark.parametrize("foreach", [None, True, False, np.bool_(True)], ids=["None", "True", "False", "np_True"])
def test_clip_grad_norm_takes_torchs_foreach(rng, foreach):
    """torch's ``foreach`` (a bool or None) is accepted and changes nothing: the norm and the
    clipped gradients are torch's (with the same ``foreach``), whatever its value."""
    ours, theirs = make_params(rng, np.float64)
    for p, q in zip(ours, theirs):
        g = rng.standard_normal(p.shape)
        p.grad, q.grad = g.copy(), torch.tensor(g.copy())
    total = optim.clip_grad_norm_(ours, 0.5, foreach=foreach)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, 0.5, foreach=None if foreach is None else bool(foreach))
    assert math.isclose(total, float(total_t), rel_tol=1e-12)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.grad, q.grad.numpy(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("foreach", ["yes", 1, 0, 1.0], ids=["str", "1", "0", "float"])
def test_clip_grad_norm_refuses_a_foreach_that_is_no_bool(rng, foreach):
    p = Parameter(np.ones(3), name="w", grad=np.full(3, 2.0))
    with pytest.raises(TypeError, match=rf"^foreach: expected a bool or None, got {type(foreach).__name__}"):
        optim.clip_grad_norm_([p], 0.5, foreach=foreach)
    np.testing.assert_array_equal(p.grad, np.full(3, 2.0))  # nothing scaled


# ------------------------------------------------------------------------ arrays refused before iterating
@pytest.mark.parametrize("make", [lambda: np.array(1.0), lambda: np.zeros(2 * 10**6, np.float32),
                                  lambda: torch.zeros(2 * 10**6)], ids=["0d", "8MB", "torch_8MB"])
@pytest.mark.parametrize("call", ["SGD", "AdamW", "clip_grad_norm_"])
def test_an_array_for_params_is_refused_before_it_is_iterated(make, call):
    """An array passed where the parameters go (``SGD(p.data)``): a TypeError naming the argument and
    what it takes, raised before the array is iterated. The constructors ran ``list(params)``
    first: a numpy scalar per element (8 MB of float32 grew the memory by 80 MB, for seconds), then
    "params[0]: ... got float32"; a 0-d array gave numpy's bare "iteration over a 0-d array"."""
    import re
    import tracemalloc

    x = make()
    argument = "parameters" if call == "clip_grad_norm_" else "params"
    expected = ("an iterable of Parameters or (name, Parameter) pairs" if call == "clip_grad_norm_"
                else "an iterable of Parameters, (name, Parameter) pairs or param-group dicts")
    kind = f"{type(x).__name__} {tuple(x.shape)} {x.dtype}" + (" 1.0" if x.ndim == 0 else "")  # 0-d: its value
    tracemalloc.start()
    try:
        with pytest.raises(TypeError, match=rf"^{argument}: expected {re.escape(expected)}, got {re.escape(kind)} "
                                            r"\(an array: the optimizers and clip_grad_norm_ take Parameters"):
            if call == "clip_grad_norm_":
                optim.clip_grad_norm_(x, 1.0)
            else:
                getattr(optim, call)(x, lr=0.1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**18, f"peak {peak} bytes: the array was iterated"


# ------------------------------------------------------------------------ two modules' parameters, one optimizer
def _two_linears(rng):
    """Two tc.nn.Linear(3, 2) (both named "weight", "bias") and torch's twins, same values."""
    import transformer_core as tc

    ours, theirs = [], []
    for _ in range(2):
        w, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
        m = tc.nn.Linear(3, 2)
        m.load_state_dict({"weight": w, "bias": b})
        t = torch.nn.Linear(3, 2)
        with torch.no_grad():
            t.weight.copy_(torch.from_numpy(w))
            t.bias.copy_(torch.from_numpy(b))
        ours.append(m)
        theirs.append(t)
    return ours, theirs


def test_two_modules_parameters_share_one_optimizer_as_in_torch(rng):
    """``AdamW(a.parameters() + b.parameters())`` of two Linear layers (torch accepts it) was refused,
    "two parameters are named 'weight'". The first keeps the names it carries, the second's are
    named by position ("2", "3", as unnamed ones); the run is torch's, and the state dict loads
    into an optimizer built the same way."""
    import transformer_core as tc

    (a, b), (ta, tb) = _two_linears(rng)
    opt = optim.AdamW(a.parameters() + b.parameters(), lr=0.1, weight_decay=0.01)
    t_opt = torch.optim.AdamW(list(ta.parameters()) + list(tb.parameters()), lr=0.1, weight_decay=0.01,
                              foreach=False)
    assert [n for n, _ in opt.named_parameters()] == ["weight", "bias", "2", "3"]
    ours, theirs = a.parameters() + b.parameters(), list(ta.parameters()) + list(tb.parameters())
    run_both(opt, ours, t_opt, theirs, grad_sequence(rng, np.float32, [p.shape for p in ours], steps=4), tol=1e-6)
    assert opt.state["2"]["step"] == 4
    np.testing.assert_allclose(opt.state["2"]["exp_avg"], t_opt.state[tb.weight]["exp_avg"].numpy(), rtol=1e-6)
    (c, d), _ = _two_linears(rng)
    twin = optim.AdamW(c.parameters() + d.parameters(), lr=0.1, weight_decay=0.01)
    twin.load_state_dict(opt.state_dict())
    for name in ("weight", "bias", "2", "3"):
        np.testing.assert_array_equal(twin.state[name]["exp_avg_sq"], opt.state[name]["exp_avg_sq"])
    # a name carried by a Parameter given alone yields to an earlier one only: one given in a pair
    # (or a name an unnamed parameter was given) must be unique, and the message says how
    fix = (r"give each module's parameters their own prefix, e.g\. \[\(f\"head\.\{n\}\", p\) for n, p in "
           r"head\.named_parameters\(\)\], or attach the modules to one model \(model\.head = head\) and pass "
           r"model\.named_parameters\(\)$")
    with pytest.raises(ValueError, match=r"^params: two parameters are named 'weight' \(the names key the optimizer's "
                                         r"state: a name given in a \(name, Parameter\) pair, or a dict, must be "
                                         rf"unique\); {fix}"):
        optim.AdamW(a.named_parameters() + b.named_parameters())
    with pytest.raises(ValueError, match=r"^params: two parameters are named 'weight'"):
        optim.AdamW(a.parameters() + [("weight", Parameter(np.zeros(1)))])
    # the way out the message gives
    named = optim.AdamW([(f"a.{n}", p) for n, p in a.named_parameters()]
                        + [(f"b.{n}", p) for n, p in b.named_parameters()])
    assert [n for n, _ in named.named_parameters()] == ["a.weight", "a.bias", "b.weight", "b.bias"]
    # and with tc.nn modules attached to one model, its own names
    model = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(4, 2, 8), 2)
    assert len(optim.AdamW(model.layers[0].parameters() + model.layers[1].parameters()).state_dict()) > 0


def test_two_parameter_objects_over_one_model_weight_are_refused():
    """A model's and its submodule's ``named_parameters()`` are different Parameter objects over the
    same C++ weights, under other names: both in one optimizer, a step updated those weights twice.
    Refused, naming both; so is the same Parameter given twice."""
    import transformer_core as tc

    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(4, 2, 8), 2)
    with pytest.raises(ValueError, match=r"^params\[24\]: parameter 'self_attn\.in_proj_weight' views the same model "
                                         r"weight as parameter 'layers\.0\.self_attn\.in_proj_weight' \(.*\); pass "
                                         r"each weight once$"):
        optim.AdamW(enc.named_parameters() + enc.layers[0].named_parameters())
    opt = optim.AdamW(enc.named_parameters())
    with pytest.raises(ValueError, match=r"^params\[0\]: parameter 'linear1\.weight' views the same model weight as "
                                         r"parameter 'layers\.1\.linear1\.weight'"):
        opt.add_param_group({"params": [("linear1.weight", dict(enc.layers[1].named_parameters())["linear1.weight"])]})
    a, b = tc.nn.Linear(3, 2), tc.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"^params: parameter 'weight' is given twice$"):
        optim.SGD(a.parameters() + b.parameters()[:1] + a.parameters()[:1])
    with pytest.raises(ValueError, match=r"^params: parameter 'weight' is given twice$"):  # the one named by position
        optim.SGD(a.parameters() + b.parameters()[:1] + b.parameters()[:1])


# ------------------------------------------------------------------------ clip_grad_norm_'s names and empty gradients
def test_clip_grad_norm_names_parameters_by_the_name_given():
    """The non-finite and the empty-gradient errors name a ``(name, Parameter)`` pair by its name,
    else the Parameter's own name, else its position: they named pairs by position ("['1']"), and a
    model's parameter given under a prefix by its bare own name."""
    enc = Parameter(np.zeros(2), grad=np.ones(2))
    head = Parameter(np.zeros(2), name="weight", grad=np.array([1.0, np.nan]))
    alone = Parameter(np.zeros(2), grad=np.array([np.inf, 0.0]))
    with pytest.raises(optim.NonFiniteGradientError, match=r"non-finite gradients in \['head\.weight', '2'\]$") as info:
        optim.clip_grad_norm_([("enc.w", enc), ("head.weight", head), alone], 1.0, error_if_nonfinite=True)
    assert info.value.names == ["head.weight", "2"]
    with pytest.raises(optim.NonFiniteGradientError) as info:
        optim.clip_grad_norm_([enc, head], 1.0, error_if_nonfinite=True)
    assert info.value.names == ["weight"]
    empty = Parameter(np.zeros(0), name="bias", grad=np.zeros(0))
    with pytest.raises(ValueError, match=r"got empty gradients in \['head\.bias', '1'\]$"):
        optim.clip_grad_norm_([("head.bias", empty), Parameter(np.zeros(0), grad=np.zeros(0))], 1.0, -1.0)
    with pytest.raises(ValueError, match=r"got empty gradients in \['bias'\]$"):
        optim.clip_grad_norm_(empty, 1.0, -math.inf)
    np.testing.assert_array_equal(enc.grad, np.ones(2))  # nothing scaled


@pytest.mark.parametrize("shapes", [[(0,)], [(0,), (3,)], [(3,), (0,)]], ids=["empty", "empty_first", "empty_last"])
@pytest.mark.parametrize("norm_type", [math.inf, "inf", -math.inf, -1.0, -0.5, 2.0, 1.0, 3.0, 0.5, 0.0],
                         ids=["inf", "str_inf", "-inf", "-1", "-0.5", "2", "1", "3", "0.5", "0"])
def test_clip_grad_norm_of_empty_gradients_is_torchs(shapes, norm_type):
    """With an empty gradient (a parameter of size 0) among the gradients, torch 2.x computes the
    norms of order >= 0 as if it were absent, and refuses ±inf and negative orders (no identity:
    "cannot compute the inf norm on an empty tensor"), whatever ``foreach``. The inf norm returned
    0.0 (or the other gradients' max) here; now it is refused with the other undefined ones, as a
    ValueError naming the empty gradients, and nothing is scaled."""
    grads = [np.arange(1.0, 1.0 + math.prod(s)).reshape(s) * 2 for s in shapes]
    ours = [Parameter(np.zeros(s), name=f"p{i}", grad=g.copy()) for i, (s, g) in enumerate(zip(shapes, grads))]
    results = []
    for foreach in (None, True, False):
        theirs = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes]
        for t, g in zip(theirs, grads):
            t.grad = torch.from_numpy(g.copy())
        try:
            total = float(torch.nn.utils.clip_grad_norm_(theirs, 1.0, float(norm_type), foreach=foreach))
            results.append((total, [t.grad.numpy() for t in theirs]))
        except RuntimeError as e:
            assert "on an empty tensor" in str(e)
            results.append(None)
    if results[0] is None:
        assert results == [None, None, None]
        empty = [p.name for p in ours if p.grad.size == 0]
        with pytest.raises(ValueError, match=rf"^norm_type: the {float(norm_type)} norm of an empty gradient is "
                                             rf"undefined \(no identity: torch raises too\), got empty gradients in "
                                             rf"\[{', '.join(repr(n) for n in empty)}\]$"):
            optim.clip_grad_norm_(ours, 1.0, norm_type)
        for p, g in zip(ours, grads):
            np.testing.assert_array_equal(p.grad, g)
        return
    total = optim.clip_grad_norm_(ours, 1.0, norm_type)
    for expected, clipped in results:
        assert math.isclose(total, expected, rel_tol=1e-12, abs_tol=0.0)
        for p, g in zip(ours, clipped):
            np.testing.assert_allclose(p.grad, g, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("kind,config", [("Adam", dict(lr=1e-2)), ("AdamW", dict(lr=1e-2, amsgrad=True)),
                                         ("Adam", dict(lr=1e-2, betas=(0.5, 0.9), weight_decay=0.1, amsgrad=True))])
def test_adam_second_moments_overflowed_to_inf_round_trip_as_torch(rng, tmp_path, kind, config):
    """A float32 gradient of 1e22 makes (1 - β2) g² overflow: the step writes +inf into exp_avg_sq
    (and max_exp_avg_sq), as torch's, and the weights stay finite. That state loads (through
    safetensors, into a fresh optimizer; it was refused as "not finite"), and the steps after it
    match torch's uninterrupted ones; Adam does not move the inf element (m / inf = 0; AdamW's
    decoupled decay still shrinks it)."""
    ours, theirs = make_params(rng, np.float32)
    opt = getattr(optim, kind)(ours, **config)
    t_opt = getattr(torch.optim, kind)(theirs, foreach=False, **config)
    grads = grad_sequence(rng, np.float32, steps=4)
    grads[0][1][2] = 1e22  # layer1.weight, element 2
    run_both(opt, ours, t_opt, theirs, grads[:1], tol=1e-6)
    state = opt.state_dict()
    assert np.isposinf(state["state.layer1.weight.exp_avg_sq"][2])
    assert np.isposinf(t_opt.state[theirs[1]]["exp_avg_sq"][2].item())
    if config.get("amsgrad"):
        assert np.isposinf(state["state.layer1.weight.max_exp_avg_sq"][2])
    assert all(np.isfinite(p.data).all() for p in ours)
    save_file(state, str(tmp_path / "opt.safetensors"))
    clones = [Parameter(p.data.copy(), name=p.name) for p in ours]
    resumed = getattr(optim, kind)(clones, lr=1.0)
    resumed.load_state_dict(load_file(str(tmp_path / "opt.safetensors")))
    loaded = resumed.state_dict()
    assert sorted(loaded) == sorted(state) and all(np.array_equal(loaded[k], state[k]) for k in state)
    moved = clones[1].data[2]
    run_both(resumed, clones, t_opt, theirs, grads[1:], tol=1e-6)
    if kind == "Adam":
        assert clones[1].data[2] == moved
    for p, q in zip(clones, theirs):
        for field, value in resumed.state[p.name].items():
            if field != "step":
                np.testing.assert_allclose(value, t_opt.state[q][field].numpy(), rtol=1e-5, atol=1e-7, err_msg=field)


def test_adam_inf_second_moment_with_beta2_zero_is_refused():
    """With betas[1] = 0 the next step computes 0 · inf = NaN from an exp_avg_sq of +inf (torch's
    weights become NaN): such a state is refused, saying why, and nothing is loaded; an infinite
    max_exp_avg_sq, which a step only compares, still loads."""
    p = Parameter(np.zeros(2, np.float32), name="w")
    opt = optim.Adam([p], lr=0.1, betas=(0.9, 0.0), amsgrad=True)
    p.grad = np.array([1e22, 1.0], np.float32)
    opt.step()
    sd = opt.state_dict()
    assert np.isposinf(sd["state.w.exp_avg_sq"][0]) and np.isposinf(sd["state.w.max_exp_avg_sq"][0])
    before = snapshot(opt, [p])
    with pytest.raises(ValueError, match=r"^load_state_dict: state\.w\.exp_avg_sq: expected finite values, got 1 NaN "
                                         r"or inf \(of 2\) \(\+inf, a second moment's overflow, loads only where the "
                                         r"group's betas\[1\] > 0: .*0 · inf is NaN\); nothing was loaded$"):
        opt.load_state_dict(sd)
    assert_unchanged(opt, [p], before)
    finite = {**sd, "state.w.exp_avg_sq": np.array([4.0, 1.0], np.float32)}
    opt.load_state_dict(finite)
    assert np.isposinf(opt.state["w"]["max_exp_avg_sq"][0])
    # what the refusal avoids: torch's next step from that state writes NaN
    t = torch.zeros(2, requires_grad=True)
    t_opt = torch.optim.Adam([t], lr=0.1, betas=(0.9, 0.0), foreach=False)
    t.grad = torch.tensor([1e22, 1.0])
    t_opt.step()
    t.grad = torch.ones(2)
    t_opt.step()
    assert torch.isnan(t.detach()[0])


@pytest.mark.parametrize("form", ["top", "group", "added"])
@pytest.mark.parametrize("collection", [set, frozenset])
def test_a_set_of_parameters_is_refused(form, collection):
    """A set's order changes between runs, and with it the names by position that key the state (a
    resumed optimizer loaded another parameter's moments): refused with a TypeError naming params
    and saying why, as torch's add_param_group refuses a set (stricter: torch takes a set at the
    top level and a frozenset anywhere); a refused group adds nothing."""
    a, b, c = (Parameter(np.full(2, float(i))) for i in range(3))
    match = (r"^params: optimizer parameters need to be organized in ordered collections, got a "
             + collection.__name__ + r": the ordering of parameters in a set changes between runs .*use a list instead$")
    with pytest.raises(TypeError, match=r"optimizer parameters need to be organized in ordered collections"):
        torch.optim.SGD([{"params": {torch.zeros(2, requires_grad=True)}}], lr=0.1)
    if form == "added":
        opt = optim.SGD([c], lr=0.1)
        with pytest.raises(TypeError, match=match):
            opt.add_param_group({"params": collection({a, b}), "lr": 0.2})
        assert len(opt.param_groups) == 1 and opt.named_parameters() == [("0", c)]
        opt.add_param_group({"params": [a, b], "lr": 0.2})
        assert opt.named_parameters() == [("0", c), ("1", a), ("2", b)]
        return
    with pytest.raises(TypeError, match=match):
        optim.Adam(collection({a, b}) if form == "top" else [{"params": collection({a, b})}], lr=0.1)
    assert optim.Adam([a, b], lr=0.1).named_parameters() == [("0", a), ("1", b)]


@pytest.mark.parametrize("closure,shown", [(3, "int 3"), ("loss", "str 'loss'"), ([1.0], "list [1.0]")])
def test_step_closure_must_be_callable(rng, closure, shown):
    """step(closure=...) takes a callable or None: anything else is a TypeError naming closure, raised
    before anything changes (torch's "'int' object is not callable" names nothing); a callable's
    loss is returned, as torch's."""
    ours, _ = make_params(rng, np.float64)
    opt = optim.AdamW(ours, lr=0.1)
    for p in ours:
        p.grad = np.ones_like(p.data)
    opt.step()
    before = snapshot(opt, ours)
    with pytest.raises(TypeError, match=r"^closure: expected a callable returning the loss, or None, got "
                                        + re.escape(shown) + "$"):
        opt.step(closure=closure)
    assert_unchanged(opt, ours, before)
    assert opt.step(closure=lambda: 2.5) == 2.5
    assert opt.state["layer0.weight"]["step"] == 2


def test_clipping_an_inf_gradient_gives_torchs_nan_without_numpy_warnings():
    """clip_grad_norm_ of an inf gradient with max_norm=inf: the total norm inf and the gradient NaN,
    as torch's (inf / inf), with no numpy RuntimeWarning from inside the package (moved here from
    tests/test_ops_functional.py: the sanitizer's reduced core has no optimizers)."""
    import warnings

    from transformer_core.parameter import Parameter

    p = Parameter(np.zeros(2, np.float32), name="w")
    p.grad = np.array([np.inf, 1.0], np.float32)
    t = torch.zeros(2, requires_grad=True)
    t.grad = torch.tensor([np.inf, 1.0])
    want = torch.nn.utils.clip_grad_norm_([t], max_norm=np.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert optim.clip_grad_norm_([p], max_norm=np.inf) == np.inf == want.item()
    assert np.isnan(p.grad).all() and torch.isnan(t.grad).all()
