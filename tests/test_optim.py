"""transformer_core.optim (AdamW, Adam, SGD, clip_grad_norm_) and Parameter vs torch.optim / torch.nn.utils.

A fixed sequence of gradients drives both libraries for 20 steps on several parameters: the weights
(and the optimizer states) must agree to 1e-12 in float64 at every step, and to 1e-5 relative in
float32. State dicts round-trip through safetensors.
"""
from __future__ import annotations

import math

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
        ("param_groups.0.eps", np.array(0.0), r"param_groups.0: eps: expected a finite number > 0.0"),
        ("param_groups.0.lr", np.array(-0.1), r"param_groups.0: lr"),
    ]
    for key, value, match in cases:
        with pytest.raises(ValueError, match=match):
            opt.load_state_dict({**sd, key: value})
        assert_unchanged(opt, ours, before)
    opt.load_state_dict({**sd, "state.layer1.weight.step": np.array(1.0, dtype=np.float32)})
    assert opt.state["layer1.weight"]["step"] == 1 and type(opt.state["layer1.weight"]["step"]) is int


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_load_state_dict_refuses_nonfinite_or_negative_moments(rng, dtype):
    """A moment holding NaN or ±inf (also once cast: 1e300 is inf in float32), or a negative second
    moment (whose square root the update takes), would turn the weights into NaN at the next step:
    ValueError naming the entry, nothing loaded. Zeros and a negative first moment load (as torch,
    which then steps to finite weights)."""
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
        (with_value("exp_avg_sq", 0, np.nan), r"state\.layer0\.weight\.exp_avg_sq: expected finite values, got 1"),
        (with_value("exp_avg_sq", 1, -1.0), r"state\.layer0\.weight\.exp_avg_sq: expected values >= 0 .*got 1 "
                                            r"negative \(min -1\.0\)"),
        (with_value("max_exp_avg_sq", 2, -1e-30), r"state\.layer0\.weight\.max_exp_avg_sq: expected values >= 0"),
        (with_value("max_exp_avg_sq", 2, np.inf), r"state\.layer0\.weight\.max_exp_avg_sq: expected finite"),
        (with_value("exp_avg", 3, -np.inf), r"state\.layer0\.weight\.exp_avg: expected finite values"),
        (with_value("exp_avg", 3, np.nan), r"state\.layer0\.weight\.exp_avg: expected finite values"),
        # NaN and a negative value in one second moment
        ({**sd, "state.layer1.weight.exp_avg_sq": np.array([np.nan, -1.0, 1.0, 0, 0, 0, 0], dtype)},
         r"state\.layer1\.weight\.exp_avg_sq: expected finite values"),
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
        optim.clip_grad_norm_([p], 1.0, norm_type=0)
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_grad_norm_([p], -1.0)
