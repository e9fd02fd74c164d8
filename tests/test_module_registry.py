"""The modules under a module, as torch's registry has them: a child replaced since (its own
Parameters), a module at two places (one set of parameters, both state-dict names; a backward
through it refused before any gradient), a module assigned to an attribute (registered, in
assignment order; cycles listed once), copies of all of these (deepcopy, pickle, quantize) computing
as the original, a stack's pickle without its template layer, and copies of a model's Parameter."""
from __future__ import annotations

import copy
import gc
import pickle
import threading
import weakref

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import module_state_to_numpy, to_torch, torch_modules_as_ours, traced_refusal
from transformer_core import module as tc_module
from transformer_core.module import Module
from transformer_core.parameter import Parameter

F64 = np.float64


def _encoder(num_layers: int = 2, norm: bool = True):
    return tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64), num_layers,
                                    tc.nn.LayerNorm(8, dtype=F64) if norm else None)


def _torch_layer(**kwargs):
    return torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, **kwargs).double()


def _torch_twin(enc):
    """A torch TransformerEncoder (batch-first, float64, eval) of ``enc``'s layers count and norm; its
    weights are loaded by the caller."""
    return torch.nn.TransformerEncoder(_torch_layer(), len(enc.layers),
                                       None if enc.norm is None else torch.nn.LayerNorm(8).double(),
                                       enable_nested_tensor=False).double().eval()


def _load_into_torch(te, enc) -> None:
    te.load_state_dict({k: to_torch(v) for k, v in enc.state_dict().items()})


def _names(pairs) -> list:
    return [name for name, _ in pairs]


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 5, 8))


def _sgd_step_of_ones(enc, te, lr: float) -> None:
    """One SGD step of ``lr`` over ``enc.named_parameters()`` and ``te.parameters()``, every gradient 1."""
    opt = tc.optim.SGD(enc.named_parameters(), lr=lr)
    topt = torch.optim.SGD(te.parameters(), lr=lr)
    for _, p in enc.named_parameters():
        p.grad = np.ones(p.shape, F64)
    for p in te.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    topt.step()


def _assert_state_matches_torch(enc, te) -> None:
    ours, theirs = enc.state_dict(), module_state_to_numpy(te)
    assert list(ours) == list(theirs)
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-15, atol=0, err_msg=name)


# ---- 1. named_parameters after a child was replaced ------------------------------------------------
def test_named_parameters_follow_a_replaced_child():
    """named_parameters() kept its first answer while the children changed: after ``enc.norm =
    LayerNorm(8)`` an SGD step over it moved the detached old norm (the model's norm stayed at 2.0).
    As torch's: the new child's Parameters, the same objects for the weights that did not move, and
    a step that gives torch's weights."""
    enc = _encoder()
    te = _torch_twin(enc)
    before = dict(enc.named_parameters())  # an earlier optimizer's, a parameter count printed
    enc.norm = tc.nn.LayerNorm(8, dtype=F64)
    enc.norm.load_state_dict({"weight": np.full(8, 2.0), "bias": np.zeros(8)})
    enc.layers[1] = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)
    te.norm = torch.nn.LayerNorm(8).double()
    te.layers[1] = _torch_layer()
    _load_into_torch(te, enc)
    after = dict(enc.named_parameters())
    assert _names(enc.named_parameters()) == _names(te.named_parameters())
    np.testing.assert_array_equal(after["norm.weight"].data, np.full(8, 2.0))
    assert after["layers.0.linear1.weight"] is before["layers.0.linear1.weight"]  # an optimizer's stay valid
    assert after["norm.weight"] is not before["norm.weight"]
    assert after["layers.1.linear1.weight"] is not before["layers.1.linear1.weight"]
    _sgd_step_of_ones(enc, te, lr=0.5)
    _assert_state_matches_torch(enc, te)
    np.testing.assert_array_equal(enc.norm.state_dict()["weight"], np.full(8, 1.5))
    x = _x()
    with torch.no_grad():
        np.testing.assert_allclose(enc(x), te(to_torch(x)).numpy(), rtol=1e-10, atol=1e-12)


# ---- 2. a module at two places --------------------------------------------------------------------------
def test_a_module_at_two_places_is_stepped_once_as_torchs():
    """``enc.layers[1] = enc.layers[0]`` (torch's weight sharing) was listed twice by
    named_parameters: an optimizer stepped it twice (SGD moved it by 0.2, torch's by 0.1). As torch's:
    named_parameters lists it once (its first names), state_dict keeps both names."""
    enc = _encoder()
    te = _torch_twin(enc)
    enc.layers[1] = enc.layers[0]
    te.layers[1] = te.layers[0]
    _load_into_torch(te, enc)
    assert list(enc.state_dict()) == list(te.state_dict()) and len(enc.state_dict()) == 26
    assert _names(enc.named_parameters()) == _names(te.named_parameters())
    assert len(enc.parameters()) == 14
    w0 = enc.state_dict()["layers.0.linear1.bias"]
    _sgd_step_of_ones(enc, te, lr=0.1)
    _assert_state_matches_torch(enc, te)
    np.testing.assert_allclose(w0 - enc.state_dict()["layers.1.linear1.bias"], 0.1, rtol=1e-12)
    x = _x()
    with torch.no_grad():
        np.testing.assert_allclose(enc(x), te(to_torch(x)).numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["encoder", "transformer"])
def test_backward_through_a_module_at_two_places_is_refused_before_any_gradient(kind):
    """Its backward added the gradients of the last layers, then raised: "a refused backward adds
    none" did not hold. Now refused before anything is added, naming both places; the training
    state is dropped (a second try raises too)."""
    rng = np.random.default_rng(1)
    if kind == "encoder":
        model = _encoder()
        model.layers[1] = model.layers[0]
        places = "'layers.0' and 'layers.1'"

        def run():
            model(rng.standard_normal((2, 5, 8)))
            return lambda: model.backward(np.ones((2, 5, 8)))
    else:
        model = tc.nn.Transformer(8, 2, 1, 2, 16, dtype=F64)
        model.decoder.layers[1] = model.decoder.layers[0]
        places = "'decoder.layers.0' and 'decoder.layers.1'"

        def run():
            model(rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 3, 8)))
            return lambda: model.backward(np.ones((2, 3, 8)))
    model.train()
    backward = run()
    with pytest.raises(tc.NoTrainingStateError, match=f"same module is at {places}") as err:
        backward()
    assert "no gradient was added" in str(err.value)
    assert model.gradients() == {}
    with pytest.raises(tc.NoTrainingStateError, match="no training forward"):
        backward()
    assert model.gradients() == {}


# ---- 3. copies of replaced children ---------------------------------------------------------------------
def _copy(module, how: str):
    if how == "deepcopy":
        return copy.deepcopy(module)
    if how == "pickle":
        return pickle.loads(pickle.dumps(module))
    return tc.quantize(module)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "quantize"])
def test_copies_of_replaced_children_compute_as_the_original(how):
    """deepcopy and pickle rebuilt every child from the root's arguments: a layer replaced by one of
    another configuration (gelu, norm_first, eps 1e-2) or a norm of eps 0.5 came back as the
    constructor's, computing otherwise (0.495 off) with no error. The copy now computes bit for bit
    as the original (which computes as torch's with the same replacements); quantize's copy as the
    original quantized in place."""
    dtype = np.float32 if how == "quantize" else F64

    def replaced():
        enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=dtype), 2,
                                       tc.nn.LayerNorm(8, dtype=dtype))
        enc.layers[1] = tc.nn.TransformerEncoderLayer(8, 2, 16, activation="gelu", norm_first=True,
                                                      layer_norm_eps=1e-2, dtype=dtype)
        enc.norm = tc.nn.LayerNorm(8, eps=0.5, dtype=dtype)
        enc.load_state_dict(state)
        return enc

    state = {k: np.random.default_rng(2).standard_normal(v.shape) for k, v in _encoder().state_dict().items()}
    enc = replaced()
    te = _torch_twin(enc)
    te.layers[1] = _torch_layer(activation="gelu", norm_first=True, layer_norm_eps=1e-2)
    te.norm = torch.nn.LayerNorm(8, eps=0.5).double()
    te.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    x = _x().astype(dtype)
    expected = enc(x)
    with torch.no_grad():
        np.testing.assert_allclose(expected, te(to_torch(x).double()).numpy(),
                                   rtol=1e-5 if how == "quantize" else 1e-10, atol=1e-5 if how == "quantize" else 1e-12)
    dup = _copy(enc, how)
    assert dup.layers[1].norm_first and dup.layers[1].activation == "gelu" and dup.norm.eps == 0.5
    if how == "quantize":
        np.testing.assert_array_equal(dup(x), tc.quantize(replaced(), inplace=True)(x))
        return
    np.testing.assert_array_equal(dup(x), expected)
    np.testing.assert_array_equal(_copy(dup, how)(x), expected)  # a copy of the copy too
    assert dup.layers[0] is not enc.layers[0] and dup.layers[1] is not enc.layers[1]


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "quantize"])
def test_copies_do_not_follow_the_template_layer_changed_after_the_stack_was_built(how):
    """The stack kept the layer it was built from by reference: ``layer.norm_first = True`` after
    building it made a later deepcopy build norm-first layers (1.38 off). The stack keeps what it
    takes to build that layer as it was (a recipe), not the layer. The settings the C++ layer is
    built from are fixed now (assigning one is refused); what may still change is not followed."""
    dtype = np.float32 if how == "quantize" else F64
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=dtype)
    enc = tc.nn.TransformerEncoder(layer, 2)
    x = _x().astype(dtype)
    expected = tc.quantize(enc)(x) if how == "quantize" else enc(x)
    with pytest.raises(AttributeError, match="norm_first is fixed when the layer is built"):
        layer.norm_first = True
    layer.dropout = 0.5  # what the template may still change: no copy follows it
    dup = _copy(enc, how)
    np.testing.assert_array_equal(dup(x), expected)
    assert dup.layers[0].dropout == 0.0


@pytest.mark.parametrize("kind", ["encoder", "transformer"])
def test_a_stacks_pickle_holds_its_own_weights_only(kind):
    """A stack's pickle also held the layer it was built from (twice the weights of a one-layer
    stack), and could not be made once that layer was quantized (a TypeError naming it). It holds
    the stack's own weights, and unpickles into a stack computing as the original."""
    layer = tc.nn.TransformerEncoderLayer(64, 2, 256)
    model = tc.nn.TransformerEncoder(layer, 1) if kind == "encoder" else tc.nn.Transformer(64, 2, 1, 1, 256)
    weights = sum(v.nbytes for v in model.state_dict().values())
    blob = pickle.dumps(model)
    assert weights < len(blob) < 1.05 * weights
    tc.quantize(layer, inplace=True)  # the template quantized: none of the stack's business
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((2, 5, 64)).astype(np.float32)] * (1 if kind == "encoder" else 2)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(model))(*args), model(*args))


# ---- 4. modules assigned to attributes -----------------------------------------------------------------------
def test_a_module_assigned_to_an_attribute_is_registered_as_torchs():
    """``enc.head = nn.Linear(8, 3)`` was not registered: state_dict, named_parameters, train(),
    zero_grad and strict loads of torch's state_dict left it out. As torch's: a child after the
    built-in ones, in assignment order; deleting the attribute or setting it to None removes it."""
    enc = _encoder()
    te = _torch_twin(enc)
    enc.head = tc.nn.Linear(8, 3, dtype=F64)
    enc.extra = tc.nn.LayerNorm(8, dtype=F64)
    enc.first = enc.layers[0]  # a reference to a built-in child: no second child (a plain attribute)
    te.head = torch.nn.Linear(8, 3).double()
    te.extra = torch.nn.LayerNorm(8).double()
    assert list(enc.state_dict()) == list(te.state_dict()) and list(enc.state_dict())[-4:] == [
        "head.weight", "head.bias", "extra.weight", "extra.bias"]
    assert enc.load_state_dict(module_state_to_numpy(te)) == ([], [])  # strict
    assert _names(enc.named_parameters()) == _names(te.named_parameters())
    _assert_state_matches_torch(enc, te)
    # deleted, then assigned again: it goes last, as torch's
    for m, head in ((enc, tc.nn.Linear(8, 3, dtype=F64)), (te, torch.nn.Linear(8, 3).double())):
        del m.head
        m.head = head
    assert list(enc.state_dict()) == list(te.state_dict()) and list(enc.state_dict())[-2:] == ["head.weight",
                                                                                                 "head.bias"]
    assert enc.load_state_dict(module_state_to_numpy(te)) == ([], [])
    # train() / eval() and zero_grad reach it
    enc.train()
    assert enc.head.training and enc.extra.training
    enc.head(_x())
    enc.head.backward(np.ones((2, 5, 3)))
    assert set(enc.gradients()) == {"head.weight", "head.bias"}
    enc.zero_grad()
    assert enc.gradients() == {} and dict(enc.named_parameters())["head.weight"].grad is None
    enc.eval()
    assert not enc.head.training and not enc.extra.training
    # None (as torch) or any other value removes it
    enc.extra, te.extra = None, None
    enc.head = "gone"
    del te.head
    assert list(enc.state_dict()) == list(te.state_dict())
    assert _names(enc.named_parameters()) == _names(te.named_parameters())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_carry_a_registered_head_as_torchs(how):
    """The copy's state_dict holds the head (as torch's copy's), with the original's values; the
    head is the copy's own; the copy's layers compute as the original's."""
    enc = _encoder()
    te = _torch_twin(enc)
    enc.head = tc.nn.Linear(8, 3, dtype=F64)
    te.head = torch.nn.Linear(8, 3).double()
    enc.load_state_dict(module_state_to_numpy(te))
    dup, tdup = _copy(enc, how), _copy(te, how)
    assert list(dup.state_dict()) == list(tdup.state_dict())
    for name, value in enc.state_dict().items():
        np.testing.assert_array_equal(dup.state_dict()[name], value, err_msg=name)
    assert dup.head is not enc.head
    x = _x()
    np.testing.assert_array_equal(dup.head(dup(x)), enc.head(enc(x)))
    dup.head.load_state_dict({"weight": np.zeros((3, 8)), "bias": np.zeros(3)})
    np.testing.assert_array_equal(enc.head.state_dict()["weight"], te.head.weight.detach().numpy())


def test_a_module_attached_under_itself_is_listed_once():
    """``enc.head = head``, ``head.backbone = enc`` (a cycle): each module is listed once, as torch's
    named_parameters (its named_modules' memo), and nothing recurses without end: state_dict,
    train(), eval(), zero_grad, copies."""
    enc = _encoder()
    te = _torch_twin(enc)
    enc.head = tc.nn.Linear(8, 3, dtype=F64)
    te.head = torch.nn.Linear(8, 3).double()
    enc.head.backbone = enc
    te.head.backbone = te  # registered: torch's state_dict would recurse; its named_parameters do not
    assert _names(enc.named_parameters()) == _names(te.named_parameters())
    assert _names(enc.head.named_parameters()) == _names(te.head.named_parameters())
    assert list(enc.state_dict()) == _names(te.named_parameters())
    assert list(enc.head.state_dict())[:3] == ["weight", "bias", "backbone.layers.0.self_attn.in_proj_weight"]
    enc.train()
    assert enc.head.training
    enc.eval()
    enc.zero_grad()
    for how in ("deepcopy", "pickle"):
        dup = _copy(enc, how)
        assert dup.head.backbone is dup and dup.head is not enc.head
        x = _x()
        np.testing.assert_array_equal(dup.head(dup(x)), enc.head(enc(x)))


# ---- 6. copies of a model's Parameter ---------------------------------------------------------------------
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_models_parameter_copies_as_a_plain_independent_parameter(how):
    """deepcopy / pickle of ``Linear(3, 2).named_parameters()[0][1]`` raised "cannot pickle
    '..._core.Linear_f32' object". As torch's: an independent Parameter of the same values (plain:
    its data is no view of the model); its gradient copied too (torch's drops it). copy.copy still
    shares the model's buffers (as torch's shares the data)."""
    lin = tc.nn.Linear(3, 2, dtype=F64).train()
    lin(np.ones((4, 3)))
    lin.backward(np.ones((4, 2)))
    weight = dict(lin.named_parameters())["weight"]
    ref = torch.nn.Parameter(torch.from_numpy(weight.data.copy()))
    twin = copy.deepcopy(ref) if how == "deepcopy" else pickle.loads(pickle.dumps(ref))
    dup = copy.deepcopy(weight) if how == "deepcopy" else pickle.loads(pickle.dumps(weight))
    assert type(dup) is Parameter and dup.name == "weight"
    np.testing.assert_array_equal(dup.data, twin.detach().numpy())
    np.testing.assert_array_equal(dup.grad, np.full((2, 3), 4.0))
    assert not np.shares_memory(dup.data, weight.data) and not np.shares_memory(dup.grad, weight.grad)
    before, grads = lin.state_dict(), lin.gradients()
    dup.data[...] = 5.0
    dup.grad[...] = 7.0
    np.testing.assert_array_equal(lin.state_dict()["weight"], before["weight"])
    np.testing.assert_array_equal(lin.gradients()["weight"], grads["weight"])
    lin.zero_grad()
    assert (copy.deepcopy(weight) if how == "deepcopy" else pickle.loads(pickle.dumps(weight))).grad is None
    shallow = copy.copy(weight)
    assert np.shares_memory(shallow.data, weight.data)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_plain_parameter_pickles_in_every_protocol(protocol):
    """Protocols 0 and 1 refused a Parameter ("a class that defines __slots__ without defining
    __getstate__ cannot be pickled"); every protocol gives an equal, independent one."""
    p = Parameter(np.arange(3.0), "w", grad=np.ones(3))
    q = pickle.loads(pickle.dumps(p, protocol=protocol))
    assert type(q) is Parameter and q.name == "w"
    np.testing.assert_array_equal(q.data, p.data)
    np.testing.assert_array_equal(q.grad, p.grad)
    assert not np.shares_memory(q.data, p.data)


# ---- 7. review of the copy/pickle rewrite ------------------------------------------------------------------
def _tiny_llama():
    cfg = tc.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    return tc.LlamaForCausalLM(cfg, dtype=F64)


def test_a_module_assigned_over_the_models_own_weights_is_refused():
    """``llama.lm_head = nn.Linear(16, 40)`` was accepted: state_dict, load_state_dict and the
    optimizers then reached the new Linear under ``lm_head.weight`` while the forward (the C++ model)
    kept using its own head, so loading a zero head changed nothing. Refused, naming the attribute;
    the model is unchanged."""
    m = _tiny_llama()
    ids = np.array([[1, 2, 3]])
    before, sd = np.asarray(m(ids).logits), m.state_dict()
    with pytest.raises(ValueError, match=r"LlamaForCausalLM\.lm_head: .*own weights already use the name 'lm_head' "
                                         r"\(lm_head\.weight\).*forward would not use"):
        m.lm_head = tc.nn.Linear(16, 40, bias=False, dtype=F64)
    assert "lm_head" not in vars(m)
    assert all(np.array_equal(v, sd[k]) for k, v in m.state_dict().items()) and m.state_dict().keys() == sd.keys()
    zero = dict(sd, **{"lm_head.weight": np.zeros_like(sd["lm_head.weight"])})
    m.load_state_dict(zero)  # the real head: the logits are now all zero
    np.testing.assert_array_equal(np.asarray(m(ids).logits), np.zeros_like(before))
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer\.self_attn: .*'self_attn'"):
        layer.self_attn = tc.nn.MultiheadAttention(8, 2, dtype=F64)
    layer.extra = tc.nn.Linear(8, 8, dtype=F64)  # a free name is still registered, as torch's
    assert [k for k in layer.state_dict() if k.startswith("extra.")] == ["extra.weight", "extra.bias"]
    # the guard under it: a name taken twice (the attribute set around __setattr__) is never silently hidden
    vars(m)["lm_head"] = tc.nn.Linear(16, 40, bias=False, dtype=F64)
    with pytest.raises(ValueError, match=r"two different weights are named 'lm_head\.weight'"):
        m.state_dict()


class _Tied(Module):
    """Two heads sharing one Linear as built (a tied pair); the user may untie them."""

    def __init__(self, dtype=F64):
        self.dtype = dtype
        self.a = tc.nn.Linear(4, 4, dtype=dtype)
        self.b = self.a

    def forward(self, x):
        return self.a(x) + self.b(x)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "quantize"])
def test_copies_keep_apart_the_children_the_user_untied(how):
    """After ``m.b = Linear(...)`` (untied), copies gave both places the rebuilt parent's one Linear
    (tied again: a's weights at b, another output). Each place keeps its own weights."""
    dtype = np.float32 if how == "quantize" else F64  # the int8 kernels take float32 models
    m = _Tied(dtype)
    m.b = tc.nn.Linear(4, 4, dtype=dtype)
    m.b.load_state_dict({k: v + 1.0 for k, v in m.b.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 4))
    wa, wb = m.a.state_dict(), m.b.state_dict()
    expected = x @ (wa["weight"] + wb["weight"]).T + wa["bias"] + wb["bias"]
    d = {"deepcopy": copy.deepcopy, "pickle": lambda v: pickle.loads(pickle.dumps(v)), "quantize": tc.quantize}[how](m)
    assert d.a is not d.b and d.a is not m.a and d.b is not m.b
    if how == "quantize":  # int8 weights: within their rounding (max|w| / 254 per weight)
        assert d.weight_formats() == {"a.weight": "int8", "a.bias": "float32", "b.weight": "int8", "b.bias": "float32"}
        np.testing.assert_allclose(d(x), expected, atol=0.05)
        return
    for mine, theirs in ((d.a, wa), (d.b, wb)):
        assert all(np.array_equal(v, theirs[k]) for k, v in mine.state_dict().items())
    np.testing.assert_allclose(d(x), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(d(x), m(x))
    tied = copy.deepcopy(_Tied())  # a tie the user kept stays one module
    assert tied.a is tied.b


def test_a_failed_pickle_leaves_nothing_behind():
    """A pickle refused half-way (an attribute of ``layers[1]`` cannot be pickled) left its
    registrations behind: the encoder stayed alive, a later pickle of ``layers[0]`` alone carried the
    whole encoder, and a later pickle of ``(A, enc)`` (A once ``enc.layers[0]``, replaced since)
    unpickled an encoder with A's weights at layers.0. The refusal names the attribute's path."""
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    enc = _encoder()
    a = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)
    enc.layers[0] = a
    enc.layers[1].bad = threading.Lock()
    with pytest.raises(TypeError, match=r"^TransformerEncoder: cannot be pickled, attribute layers\.1\.bad cannot"):
        pickle.dumps(enc)
    assert tc_module._pickled_children() == {}
    del enc.layers[1].bad
    alone = len(pickle.dumps(enc.layers[1]))
    assert alone < len(pickle.dumps(enc)) / 2  # the layer only, not the encoder around it
    b = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)
    b.load_state_dict({k: v + 0.1 for k, v in b.state_dict().items()})
    enc.layers[0] = b
    a2, e2 = pickle.loads(pickle.dumps((a, enc)))
    np.testing.assert_array_equal(e2(x), enc(x))
    assert a2 is not e2.layers[0]
    assert all(np.array_equal(v, a.state_dict()[k]) for k, v in a2.state_dict().items())
    gone = weakref.ref(enc)
    del enc, e2, a2
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("model_first", [True, False])
def test_deepcopy_of_a_model_with_its_parameters(model_first):
    """``copy.deepcopy((model, model.named_parameters()))`` gave parameters detached from the copied
    model. As torch's: they are the copy's parameters (views of its weights, a write reaches it,
    layout attributes kept). Copied before their model, each is a plain independent Parameter."""
    m = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=4), dtype=F64)
    sd = m.state_dict()
    if model_first:
        m2, ps2 = copy.deepcopy((m, m.named_parameters()))
    else:
        ps2, m2 = copy.deepcopy((m.named_parameters(), m))
    assert [n for n, _ in ps2] == [n for n, _ in m.named_parameters()]
    name, p = next((n, p) for n, p in ps2 if getattr(p, "transposed", False) or not model_first)
    p.data[...] = 9.0
    assert all(np.array_equal(v, sd[k]) for k, v in m.state_dict().items())  # the original untouched
    if model_first:
        assert p.transposed and np.all(m2.state_dict()[name] == 9.0)
        assert all(np.shares_memory(q.data, q2.data) for (_, q), (_, q2) in zip(ps2, m2.named_parameters()))
    else:
        assert type(p) is Parameter
        assert all(np.array_equal(v, sd[k]) for k, v in m2.state_dict().items())


def _old_pickle(cls, payload) -> bytes:
    """A pickle as the previous version wrote a module: ``_restore_module(cls, payload)``, the
    payload without a format (a composite's payload held every weight under it)."""

    class Old:
        def __reduce__(self):
            return tc_module._restore_module, (cls, payload)

    return pickle.dumps(Old())


def test_a_pickle_of_the_previous_version_is_named_as_such():
    """Unpickling a composite of the previous version said "it was changed after it was built",
    blaming the user. It says the pickle comes from another version; a leaf's still loads."""
    enc = _encoder()
    old = {"init_args": enc._init_args, "weights": {n: s.impl.get_parameter(s.core_name)
                                                    for n, s in enc._slots().items()}, "grads": {}}
    with pytest.raises(TypeError, match=r"TransformerEncoder: cannot be unpickled, the pickle comes from another "
                                        r"version of transformer_core.*state_dict\(\)"):
        pickle.loads(_old_pickle(type(enc), old))
    lin = tc.nn.Linear(3, 2, dtype=F64)
    leaf = {"init_args": lin._init_args, "weights": {n: s.impl.get_parameter(s.core_name)
                                                    for n, s in lin._slots().items()}, "grads": {}}
    back = pickle.loads(_old_pickle(type(lin), leaf))
    assert all(np.array_equal(v, lin.state_dict()[k]) for k, v in back.state_dict().items())


# ---- 7. load_state_dict checks shapes before converting ---------------------------------------------------
def _refusal_peak(fn, error=ValueError):
    """``fn()``'s error (it must raise ``error``) and the peak bytes traced while it ran."""
    return traced_refusal(fn, error)


def test_load_state_dict_refuses_a_misshaped_value_before_converting_it():
    """load_state_dict converted each value (to the module's dtype, C-contiguous) before comparing its
    shape: a broadcast float64 (8000, 8000) value for a (3, 4) weight made a 256 MB float32 copy
    before its "mis-shaped" refusal, and a (10**6, 10**6) one was refused for the memory its copy
    would take, not for its shape. The shapes (and kinds) are now checked on the values as given:
    nothing is copied, the message names the shape, and the module is unchanged."""
    lin = tc.nn.Linear(4, 3)  # float32: a float64 value is converted (copied) when it fits
    before = lin.state_dict()
    bias = np.full(3, 0.25, np.float32)  # right-shaped: loaded only if everything is
    for shape in ((8000, 8000), (10**6, 10**6)):
        huge = np.broadcast_to(np.float64(1.0), shape)
        for strict in (True, False):
            err, peak = _refusal_peak(lambda: lin.load_state_dict({"weight": huge, "bias": bias}, strict=strict))
            assert str(err.value) == (f"Linear.load_state_dict refused (module unchanged): mis-shaped: "
                                      f"['weight: expected (3, 4), got {shape}']")
            assert peak < 2**16, f"the refusal of {shape} allocated {peak} bytes"
    for name, value in before.items():
        np.testing.assert_array_equal(lin.state_dict()[name], value)
    # a torch tensor's shape is read from it (a bfloat16 one is not widened first); its kind first, as before
    with pytest.raises(ValueError, match=r"mis-shaped: \['weight: expected \(3, 4\), got \(5, 5\)'\]$"):
        lin.load_state_dict({"weight": torch.zeros(5, 5, dtype=torch.bfloat16), "bias": bias})
    with pytest.raises(TypeError, match=r"^state_dict\['weight'\]: expected a floating-point tensor, got torch.int64$"):
        lin.load_state_dict({"weight": torch.zeros(5, 5, dtype=torch.int64), "bias": bias})
    # the right-shaped cases keep their messages and conversions
    with pytest.raises(ValueError, match=r"^state_dict\['weight'\]: expected values within float32's range"):
        lin.load_state_dict({"weight": np.full((3, 4), 1e300), "bias": bias})
    with pytest.raises(TypeError, match=r"^state_dict\['weight'\]: expected a floating-point array, got dtype int64$"):
        lin.load_state_dict({"weight": np.zeros((3, 4), np.int64), "bias": bias})
    for name, value in before.items():
        np.testing.assert_array_equal(lin.state_dict()[name], value)
    assert lin.load_state_dict({"weight": np.broadcast_to(np.float64(0.5), (3, 4)), "bias": [1.0, 2.0, 3.0]}) == ([], [])
    np.testing.assert_array_equal(lin.state_dict()["weight"], np.full((3, 4), 0.5, np.float32))
    np.testing.assert_array_equal(lin.state_dict()["bias"], np.array([1, 2, 3], np.float32))


# ---- 8. a module set to None keeps its place -----------------------------------------------------------------
def _reassigned(Parent, Child, steps) -> list:
    """The state-dict names of ``Parent(4, 4)`` after ``steps``: (attribute, "linear" | None | "del"),
    or (None, "copy"): the module replaced by its deep copy."""
    m = Parent(4, 4)
    for name, what in steps:
        if what == "copy":
            m = copy.deepcopy(m)
        elif what == "del":
            delattr(m, name)
        else:
            setattr(m, name, None if what is None else Child(4, 2))
    return list(m.state_dict())


@pytest.mark.parametrize("steps", [
    [("a", "linear"), ("b", "linear"), ("a", None), ("a", "linear")],
    [("a", "linear"), ("b", "linear"), ("a", None), ("a", None), ("a", "linear")],
    [("a", "linear"), ("b", "linear"), ("a", None), ("b", None), ("b", "linear"), ("a", "linear")],
    [("a", "linear"), ("b", "linear"), ("a", "del"), ("a", "linear")],
    [("a", "linear"), ("b", "linear"), ("a", None), ("a", "del"), ("a", "linear")],
    [("c", None), ("a", "linear"), ("b", "linear"), ("c", "linear")],
    [("a", "linear"), ("b", "linear"), ("a", None), (None, "copy"), ("a", "linear")],
], ids=["none-then-module", "none-twice", "both-emptied", "deleted", "none-then-deleted", "plain-none",
        "deepcopied-between"])
def test_a_module_set_to_none_keeps_its_place_as_torchs(steps):
    """``m.a = Linear; m.b = Linear; m.a = None; m.a = Linear`` gave ``[..., b.*, a.*]``, torch's
    ``[..., a.*, b.*]``: torch keeps a child's name in ``_modules`` (as None) when it is set to None, so
    a module assigned there again takes its old place. A name deleted since, or a plain attribute that
    never held a module, goes last, as torch's; a deep copy keeps the place."""
    ours = _reassigned(tc.nn.Linear, tc.nn.Linear, steps)
    theirs = _reassigned(torch.nn.Linear, torch.nn.Linear, steps)
    assert ours == theirs


# ---- 9. torch's module API: the tree, the keyword arguments -------------------------------------------------
def test_named_modules_children_and_apply_walk_the_tree_as_torchs():
    """named_modules, modules, named_children, children and apply did not exist. They walk the
    registered modules as torch's do: the names are torch's for the same modules (less the ModuleList
    and a layer's insides, see the docstring), a module at two places once (remove_duplicate), a memo
    and a prefix as torch's; apply visits children first."""
    enc = _encoder(3)
    te = _torch_twin(enc)
    enc.head, te.head = tc.nn.Linear(8, 3, dtype=F64), torch.nn.Linear(8, 3).double()
    ours = [(n, type(m).__name__) for n, m in enc.named_modules()]
    assert ours == torch_modules_as_ours(te)
    assert ours == [("", "TransformerEncoder"), ("layers.0", "TransformerEncoderLayer"),
                    ("layers.1", "TransformerEncoderLayer"), ("layers.2", "TransformerEncoderLayer"),
                    ("norm", "LayerNorm"), ("head", "Linear")]
    assert [m for _, m in enc.named_modules()] == list(enc.modules())
    assert list(enc.modules())[1] is enc.layers[0] and list(enc.modules())[-1] is enc.head
    assert [(n, m) for n, m in enc.named_children()] == [(f"layers.{i}", enc.layers[i]) for i in range(3)] + [
        ("norm", enc.norm), ("head", enc.head)]
    assert list(enc.children()) == [*enc.layers, enc.norm, enc.head]
    assert list(enc.layers[0].named_children()) == [] and list(enc.head.children()) == []
    # prefix, memo, a module at two places
    assert [n for n, _ in enc.named_modules(prefix="model")][:2] == ["model", "model.layers.0"]
    memo = {enc.norm}
    assert [n for n, _ in enc.named_modules(memo=memo)] == ["", "layers.0", "layers.1", "layers.2", "head"]
    assert memo == {enc.norm, enc, *enc.layers, enc.head}
    enc.layers[1] = enc.layers[0]
    te.layers[1] = te.layers[0]
    assert [n for n, _ in enc.named_modules()] == [n for n, _ in torch_modules_as_ours(te)] == [
        "", "layers.0", "layers.2", "norm", "head"]
    twice = [n for n, _ in enc.named_modules(remove_duplicate=False)]
    assert twice == [n for n, m in te.named_modules(remove_duplicate=False)
                     if n in ("", "norm", "head") or n.count(".") == 1 and n.startswith("layers.")]
    assert twice == ["", "layers.0", "layers.1", "layers.2", "norm", "head"]
    assert [n for n, _ in enc.named_children()] == ["layers.0", "layers.2", "norm", "head"]
    # apply: children first, as torch's (its modules filtered as named_modules)
    seen, tseen = [], []
    assert enc.apply(lambda m: seen.append(m)) is enc
    te.apply(lambda m: tseen.append(m))
    torch_names = {id(m): n for n, m in te.named_modules()}  # each module at its first name
    kept = {n for n, _ in torch_modules_as_ours(te)}
    assert [type(m).__name__ for m in seen] == [type(m).__name__ for m in tseen if torch_names[id(m)] in kept]
    assert seen == [enc.layers[0], enc.layers[2], enc.norm, enc.head, enc]
    # a cycle is not followed
    enc.head.backbone = enc
    assert [n for n, _ in enc.named_modules(remove_duplicate=False)][-1] == "head"
    assert enc.apply(lambda m: None) is enc
    for call, error in [(lambda: enc.named_modules(memo=[]), r"^memo: expected None or a set of modules, got list$"),
                        (lambda: enc.named_modules(prefix=1), r"^prefix: expected a str, got int$"),
                        (lambda: enc.named_modules(remove_duplicate=1), r"^remove_duplicate: "),
                        (lambda: enc.apply(3), r"^fn: expected a callable taking a module, got int$")]:
        with pytest.raises(TypeError, match=error):
            call()


def test_named_parameters_and_state_dict_take_torchs_keyword_arguments():
    """named_parameters(prefix, recurse, remove_duplicate), parameters(recurse), state_dict(destination,
    prefix, keep_vars) and load_state_dict(assign) were refused (unexpected keyword). As torch's, where
    the library's modules allow (recurse=False: a layer's own weights are all of its C++ object's)."""
    enc = _encoder(2)
    te = _torch_twin(enc)
    enc.head, te.head = tc.nn.Linear(8, 3, dtype=F64), torch.nn.Linear(8, 3).double()
    enc.load_state_dict(module_state_to_numpy(te))
    enc.layers[1] = enc.layers[0]
    te.layers[1] = te.layers[0]
    plain = enc.named_parameters()
    for kwargs in ({"prefix": "model"}, {"remove_duplicate": False}, {"prefix": "m", "remove_duplicate": False}):
        ours = enc.named_parameters(**kwargs)
        theirs = list(te.named_parameters(**kwargs))
        assert _names(ours) == _names(theirs), kwargs
        first = dict(zip(map(id, (p for _, p in theirs)), (p for _, p in ours)))  # torch's objects -> ours
        assert all(first[id(tp)] is p for (_, tp), (_, p) in zip(theirs, ours))  # one object per weight, as torch's
        for (_, p), (_, tp) in zip(ours, theirs):
            np.testing.assert_array_equal(p.data, tp.detach().numpy())
    assert [p for _, p in enc.named_parameters(prefix="model")] == [p for _, p in plain]  # the same objects
    assert dict(enc.named_parameters(prefix="model"))["model.head.bias"].name == "head.bias"
    # recurse=False: a stack has no weights of its own, as torch's; a Linear its own; a layer all of its C++ object's
    assert enc.named_parameters(recurse=False) == [] == list(te.named_parameters(recurse=False))
    assert enc.parameters(recurse=False) == []
    assert _names(enc.head.named_parameters(recurse=False)) == _names(te.head.named_parameters(recurse=False))
    assert _names(enc.layers[0].named_parameters(recurse=False)) == _names(te.layers[0].named_parameters())
    assert list(te.layers[0].named_parameters(recurse=False)) == []  # torch's: all in its submodules
    # parameters(): a list (see its docstring); next(iter(...)) is torch's next(...)
    assert isinstance(enc.parameters(), list) and next(iter(enc.parameters())) is plain[0][1]
    assert len(enc.parameters()) == len(list(te.parameters()))
    # state_dict(destination, prefix, keep_vars)
    ours, theirs = enc.state_dict(prefix="enc."), te.state_dict(prefix="enc.")
    assert list(ours) == list(theirs)
    for name, value in theirs.items():
        np.testing.assert_array_equal(ours[name], value.numpy(), err_msg=name)
    destination = {"step": 3}
    assert enc.state_dict(destination=destination) is destination
    assert list(destination) == ["step", *te.state_dict()]
    kept = enc.state_dict(keep_vars=True)
    tkept = te.state_dict(keep_vars=True)
    assert list(kept) == list(tkept) and all(isinstance(p, Parameter) for p in kept.values())
    assert kept["layers.1.linear1.weight"] is kept["layers.0.linear1.weight"] is dict(plain)["layers.0.linear1.weight"]
    kept["head.bias"].data[...] = 7.0  # the module's own buffer, as torch's Parameter is the module's tensor
    np.testing.assert_array_equal(enc.state_dict()["head.bias"], np.full(3, 7.0))
    assert enc.load_state_dict(kept) == ([], [])
    gpt2 = tc.GPT2Model(tc.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=4))
    destination = {}
    with pytest.raises(ValueError, match=r"^keep_vars=True: \d+ weights are held in another layout than the "
                                         r"checkpoint's \(e\.g\. 'h\.0\.attn\.c_attn\.weight'\)"):
        gpt2.state_dict(destination=destination, keep_vars=True)
    assert destination == {}
    for call, error in [(lambda: enc.state_dict(destination=[]), r"^destination: expected None or a mutable mapping"),
                        (lambda: enc.state_dict(prefix=None), r"^prefix: expected a str, got NoneType$"),
                        (lambda: enc.state_dict(keep_vars=1), r"^keep_vars: "),
                        (lambda: enc.named_parameters(prefix=1), r"^prefix: expected a str, got int$"),
                        (lambda: enc.named_parameters(recurse="no"), r"^recurse: "),
                        (lambda: enc.parameters(recurse=None), r"^recurse: "),
                        (lambda: enc.load_state_dict(enc.state_dict(), assign=1), r"^assign: ")]:
        with pytest.raises(TypeError, match=error):
            call()
    # load_state_dict(assign): False copies (torch's default); True (take the caller's tensors) is refused
    state = enc.state_dict()
    assert enc.load_state_dict(state, strict=True, assign=False) == ([], [])
    state["head.bias"][...] = -1.0
    assert not np.array_equal(enc.state_dict()["head.bias"], state["head.bias"])  # copied, not taken
    with pytest.raises(ValueError, match=r"assign=True .* is not supported"):
        enc.load_state_dict(state, assign=True)
    np.testing.assert_array_equal(enc.state_dict()["head.bias"], np.full(3, 7.0))


def test_buffers_are_empty_and_requires_grad_false_is_refused():
    """buffers/named_buffers and requires_grad_ did not exist. The modules have no buffers (empty
    iterators, torch's arguments taken); every weight trains: requires_grad_() returns the module,
    requires_grad_(False) is refused, pointing to a filtered named_parameters for the optimizer."""
    enc = _encoder()
    assert list(enc.buffers()) == [] and list(enc.named_buffers(prefix="m", recurse=False)) == []
    assert next(enc.named_buffers(), "empty") == "empty"
    assert list(_torch_twin(enc).buffers()) == []  # torch's same architecture has none either
    assert enc.requires_grad_() is enc and enc.requires_grad_(True) is enc
    with pytest.raises(ValueError, match=r"^TransformerEncoder\.requires_grad_\(False\): freezing weights is not "
                                         r"supported.*filtered named_parameters"):
        enc.requires_grad_(False)
    for call, error in [(lambda: enc.requires_grad_(1), r"^requires_grad: "),
                        (lambda: enc.buffers(recurse=2), r"^recurse: "),
                        (lambda: enc.named_buffers(prefix=2), r"^prefix: expected a str, got int$")]:
        with pytest.raises(TypeError, match=error):
            call()


def test_own_parameters_beside_a_quantized_child_and_children_set_to_none():
    """named_parameters(recurse=False) built a Parameter for every weight of the tree, so a
    quantized child's refused it, naming "weight" (the module's own, float32); the refusal of the
    whole tree names the child's weight by its place. A built-in child set to None (or a stack's
    norm deleted) crashed every walk of the tree; it is left out, as torch leaves out a None module."""
    lin = tc.nn.Linear(4, 4)
    lin.head = tc.quantize(tc.nn.Linear(4, 2))
    assert [n for n, _ in lin.named_parameters(recurse=False)] == ["weight", "bias"]
    assert len(lin.parameters(recurse=False)) == 2
    with pytest.raises(ValueError, match=r"^head\.weight: the weight is held quantized \(int8\)"):
        lin.named_parameters()
    assert lin.named_parameters(recurse=False)[0][1] is lin.named_parameters(recurse=False)[0][1]

    torch_tr = torch.nn.Transformer(8, 2, 1, 1, 16, batch_first=True)
    tr = tc.nn.Transformer(8, 2, 1, 1, 16)
    torch_tr.encoder, tr.encoder = None, None
    assert list(tr.state_dict()) == list(torch_tr.state_dict())
    assert [n for n, _ in tr.named_modules()] == [n for n, _ in torch_modules_as_ours(torch_tr)]
    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16), 2, norm=tc.nn.LayerNorm(8))
    del enc.norm
    assert list(enc.state_dict())[-1] == "layers.1.norm2.bias"
