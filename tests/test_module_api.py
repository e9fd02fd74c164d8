"""torch's idioms on a module and its Parameters: a weight read as an attribute (``lin.weight``) and
never silently replaced by assignment; a Parameter assigned to a module's attribute refused (it
would be registered nowhere); membership of a model's Parameters across levels (torch's freezing
idiom); a Parameter's repr, indexing, ``requires_grad`` and ``numel``; a stack whose layer was
replaced by another module; a copy's children in the original's order; and ``repr(module)``.
Each is compared with torch's behaviour on the same module where torch's is the model."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import module_state_to_numpy, to_torch
from transformer_core.module import Module, NoTrainingStateError
from transformer_core.parameter import Parameter

F64 = np.float64


class _Net(Module):
    """Two Linears, as torch's tutorials' two-layer net."""

    def __init__(self):
        self.fc1 = tc.nn.Linear(4, 8, dtype=F64)
        self.fc2 = tc.nn.Linear(8, 2, dtype=F64)

    def forward(self, x):
        return self.fc2(self.fc1(x))


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8).double()
        self.fc2 = torch.nn.Linear(8, 2).double()

    def forward(self, x):
        return self.fc2(self.fc1(x))


def _twins():
    """``(ours, torch's)`` two-layer nets holding the same weights."""
    ours, theirs = _Net(), _TorchNet()
    theirs.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()})
    return ours, theirs


def _x(shape=(3, 4), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


# ---- 1. a weight as an attribute -------------------------------------------------------------------------
def test_a_weight_reads_as_its_parameter_and_writes_reach_the_forward_as_torchs():
    """``lin.weight`` raised AttributeError; torch's is the weight's Parameter. Now it is the very
    Parameter of ``named_parameters()``, and values copied into its data give torch's outputs."""
    lin, tlin = tc.nn.Linear(3, 2, dtype=F64), torch.nn.Linear(3, 2).double()
    assert lin.weight is dict(lin.named_parameters())["weight"]
    assert lin.bias is dict(lin.named_parameters())["bias"]
    assert lin.weight.shape == tuple(tlin.weight.shape) and lin.bias.shape == tuple(tlin.bias.shape)
    with torch.no_grad():
        lin.weight.data[...] = tlin.weight.numpy()  # torch's idiom: lin.weight.data.copy_(...)
        lin.bias.data[...] = tlin.bias.numpy()
        x = _x((5, 3))
        np.testing.assert_allclose(lin(x), tlin(to_torch(x)).numpy(), rtol=1e-13, atol=1e-14)
    mha = tc.nn.MultiheadAttention(8, 2, dtype=F64)
    assert mha.in_proj_weight is dict(mha.named_parameters())["in_proj_weight"]
    assert mha.in_proj_weight.shape == tuple(torch.nn.MultiheadAttention(8, 2).in_proj_weight.shape)
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)  # one C++ object: no module linear1 in it
    with pytest.raises(AttributeError, match=r"no attribute 'linear1'.*'linear1\.weight', 'linear1\.bias'.*"
                                             r"named_parameters\(\)"):
        layer.linear1
    with pytest.raises(AttributeError, match=r"'Linear' object has no attribute 'nothing'$"):
        lin.nothing
    assert tc.nn.LayerNorm(8, elementwise_affine=False).weight is None  # as torch's: no weight, None

    class WithProperty(Module):
        @property
        def scale(self):
            raise AttributeError("scale: set it first")

    with pytest.raises(AttributeError, match=r"^scale: set it first$"):  # a property's own error, not hidden
        WithProperty().scale


@pytest.mark.parametrize("name, value", [("weight", "parameter"), ("weight", "array"), ("bias", None)])
def test_assigning_to_a_weights_name_is_refused_not_ignored(name, value):
    """``lin.weight = Parameter(...)``, ``lin.weight = array``, ``lin.bias = None`` were accepted and
    then ignored: the forward, state_dict and the optimizers kept the C++ weights (torch's would use
    the new value). Refused, naming the attribute and how to set a weight; nothing changes."""
    lin = tc.nn.Linear(3, 2, dtype=F64)
    x = _x((2, 3))
    before, state = lin(x), lin.state_dict()
    zeros = np.zeros(lin.parameter_shapes()[name])
    given = {"parameter": Parameter(zeros), "array": zeros, None: None}[value]
    with pytest.raises(ValueError, match=rf"Linear\.{name}: cannot assign .*weights already use the name '{name}'.*"
                                         rf"m\.{name}\.data\[\.\.\.\] = x.*load_state_dict"):
        setattr(lin, name, given)
    assert name not in vars(lin)
    np.testing.assert_array_equal(lin(x), before)
    assert all(np.array_equal(v, state[k]) for k, v in lin.state_dict().items())
    assert dict(lin.named_parameters())[name] is getattr(lin, name)
    # the way the message gives reaches the forward, as torch's assignment would
    tlin = torch.nn.Linear(3, 2).double()
    tlin.load_state_dict({k: to_torch(v) for k, v in state.items()})
    with torch.no_grad():
        if value is None:
            tlin.bias = None
            getattr(lin, name).data[...] = 0
        else:
            setattr(tlin, name, torch.nn.Parameter(to_torch(zeros)))
            getattr(lin, name).data[...] = zeros
        np.testing.assert_allclose(lin(x), tlin(to_torch(x)).numpy(), rtol=1e-13, atol=1e-14)


def test_assigning_over_a_layers_inner_weights_is_refused():
    """``layer.linear1 = None`` (where ``linear1.weight`` is the layer's own) was accepted and ignored."""
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer\.linear1: cannot assign None here: .*"
                                         r"\(linear1\.weight, linear1\.bias\)"):
        layer.linear1 = None
    assert "linear1" not in vars(layer) and "linear1.weight" in layer.state_dict()


# ---- 2. a Parameter as an attribute --------------------------------------------------------------------------
class _WithToken(Module):
    def __init__(self, token):
        self.fc = tc.nn.Linear(4, 4, dtype=F64)
        self.cls_token = token

    def forward(self, x):
        return self.fc(x)


def test_a_parameter_assigned_to_an_attribute_is_refused_and_the_advised_layer_trains_as_torchs():
    """``self.cls_token = Parameter(...)`` was set and registered nowhere (not in named_parameters,
    state_dict, zero_grad, the optimizers; torch's registers it). Refused with a TypeError that
    says what to do; the layer it advises (``nn.Embedding(1, d)``) is registered everywhere and
    steps as torch's Parameter does."""
    with pytest.raises(TypeError, match=r"_WithToken\.cls_token: cannot assign a Parameter to a module's attribute.*"
                                        r"nn\.Embedding\(1, d\)"):
        _WithToken(Parameter(np.zeros((1, 4))))
    m = _WithToken(tc.nn.Embedding(1, 4, dtype=F64))
    t = torch.nn.Module()
    t.fc = torch.nn.Linear(4, 4).double()
    t.cls_token = torch.nn.Parameter(torch.zeros(1, 4, dtype=torch.float64))
    t.load_state_dict({"fc.weight": to_torch(m.state_dict()["fc.weight"]), "fc.bias": to_torch(m.state_dict()["fc.bias"]),
                       "cls_token": to_torch(m.state_dict()["cls_token.weight"])})
    assert [n for n, _ in m.named_parameters()] == ["fc.weight", "fc.bias", "cls_token.weight"]
    grad = _x((1, 4), seed=3)
    m.cls_token.weight.grad = grad  # the gradient the user's backward computes
    t.cls_token.grad = to_torch(grad)
    tc.optim.SGD(m.named_parameters(), lr=0.5).step()
    torch.optim.SGD(t.parameters(), lr=0.5).step()
    np.testing.assert_allclose(m.state_dict()["cls_token.weight"], t.cls_token.detach().numpy(), rtol=1e-15)
    m.zero_grad()
    assert m.cls_token.weight.grad is None


# ---- 3. one weight at two levels ---------------------------------------------------------------------------
def test_torchs_freezing_idiom_works_across_levels():
    """``frozen = set(n.fc1.parameters())`` held other objects than ``n.parameters()``'s, so
    ``[p for p in n.parameters() if p not in frozen]`` kept fc1 too and froze nothing. The
    Parameters over one weight now compare equal and hash alike: the idiom trains fc2 only, and a
    step gives torch's weights."""
    n, t = _twins()
    frozen = set(n.fc1.parameters())
    trained = [p for p in n.parameters() if p not in frozen]
    names = {p: name for name, p in n.named_parameters()}
    tfrozen = set(t.fc1.parameters())
    tnames = {id(p): name for name, p in t.named_parameters()}
    assert [names[p] for p in trained] == [tnames[id(p)] for p in t.parameters() if p not in tfrozen]
    assert [names[p] for p in trained] == ["fc2.weight", "fc2.bias"]
    child, parent = n.fc1.weight, dict(n.named_parameters())["fc1.weight"]
    assert child is not parent and child == parent and hash(child) == hash(parent)
    assert child.name == "weight" and parent.name == "fc1.weight"  # each level's name (the optimizers' keys)
    assert child != n.fc2.weight and child != Parameter(child.data)  # another weight; a plain Parameter
    x = _x()
    n.train()
    t.train()
    y = n(x)
    n.fc1.backward(n.fc2.backward(np.ones_like(y)))
    t(to_torch(x)).sum().backward()
    tc.optim.SGD(trained, lr=0.1).step()
    torch.optim.SGD([p for p in t.parameters() if p not in tfrozen], lr=0.1).step()
    for name, value in module_state_to_numpy(t).items():
        np.testing.assert_allclose(n.state_dict()[name], value, rtol=1e-13, atol=1e-15, err_msg=name)


def test_the_optimizers_still_refuse_one_weight_given_at_two_levels():
    n = _Net()
    with pytest.raises(ValueError, match=r"views the same model weight"):
        tc.optim.SGD(n.parameters() + n.fc1.parameters(), lr=0.1)
    opt = tc.optim.SGD(n.fc2.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"views the same model weight"):
        opt.add_param_group({"params": [dict(n.named_parameters())["fc2.bias"]]})


# ---- 4. a model's Parameter's repr -----------------------------------------------------------------------
def test_a_model_parameters_repr_says_it_holds_a_gradient():
    """The repr of a model's Parameter said ``grad=None`` while its ``grad`` held the gradient."""
    lin = tc.nn.Linear(3, 2, dtype=F64).train()
    y = lin(_x((1, 3)))
    lin.backward(np.ones_like(y))
    w = lin.named_parameters()[0][1]
    assert w.grad is not None
    assert repr(w) == "Parameter(name='weight', shape=(2, 3), dtype=float64, grad=array)"
    lin.zero_grad()
    assert repr(w) == "Parameter(name='weight', shape=(2, 3), dtype=float64, grad=None)"


# ---- 5. copies keep the original's order -----------------------------------------------------------------
_COPIES = {"deepcopy": copy.deepcopy, "pickle": lambda m: pickle.loads(pickle.dumps(m))}


@pytest.mark.parametrize("how", list(_COPIES))
def test_a_copy_keeps_the_children_in_the_originals_order_as_torchs(how):
    """After ``del n.fc1; n.fc1 = Linear(...)`` the original's state_dict has ``fc2.*`` first (as
    torch's); its deepcopy and pickle had ``fc1.*`` first again (the constructor's order)."""
    n, t = _Net(), _TorchNet()
    del n.fc1
    n.fc1 = tc.nn.Linear(4, 8, dtype=F64)
    del t.fc1
    t.fc1 = torch.nn.Linear(4, 8).double()
    c, tcopy = _COPIES[how](n), _COPIES[how](t)
    assert list(c.state_dict()) == list(n.state_dict()) == list(tcopy.state_dict()) == list(t.state_dict())
    assert [name for name, _ in c.named_children()] == ["fc2", "fc1"]
    x = _x()
    np.testing.assert_array_equal(c(x), n(x))


@pytest.mark.parametrize("how", list(_COPIES))
def test_a_copy_has_no_child_the_original_deleted_as_torchs(how):
    """``del n.fc1`` (a child the constructor set): the copy had it again, rebuilt by the constructor
    with weights never given; torch's copy has no ``fc1``."""
    n, t = _Net(), _TorchNet()
    del n.fc1
    del t.fc1
    c, tcopy = _COPIES[how](n), _COPIES[how](t)
    assert list(c.state_dict()) == list(tcopy.state_dict()) == ["fc2.weight", "fc2.bias"]
    assert hasattr(c, "fc1") is hasattr(tcopy, "fc1") is False


# ---- 6. torch's idioms on a Parameter, and a stack's layers ----------------------------------------------------
def test_indexing_a_parameter_says_to_index_its_data():
    """``p[...] = 1`` and ``p[0]`` (torch's, on a Parameter) raised TypeErrors that did not say what
    to do; they now name ``p.data[...]``, which does what torch's does."""
    lin, tlin = tc.nn.Linear(3, 2, dtype=F64), torch.nn.Linear(3, 2).double()
    w, tw = lin.weight, tlin.weight
    with pytest.raises(TypeError, match=r"Parameter 'weight' does not support item assignment: .*p\.data\[\.\.\.\] = x"):
        w[...] = 1
    with pytest.raises(TypeError, match=r"Parameter 'weight' is not indexable: .*p\.data\[0\]"):
        w[0]
    with pytest.raises(TypeError, match=r"p\.data\[1:, 0\]"):
        w[1:, 0]
    with torch.no_grad():
        tw[...] = 1
        w.data[...] = 1
        np.testing.assert_array_equal(w.data[0], tw[0].numpy())
    np.testing.assert_array_equal(lin.state_dict()["weight"], np.ones((2, 3)))
    np.testing.assert_array_equal(np.asarray(w), np.ones((2, 3)))  # still array-like for numpy


def test_requires_grad_reads_true_and_refuses_false_with_guidance():
    """``p.requires_grad`` raised AttributeError; ``p.requires_grad = False`` too. It reads True (as
    torch's default: every weight trains here); True is accepted, False refused as
    ``Module.requires_grad_(False)`` is, saying to leave the parameter out of the optimizer."""
    w = tc.nn.Linear(3, 2).weight
    assert w.requires_grad is torch.nn.Linear(3, 2).weight.requires_grad is True
    w.requires_grad = True
    assert w.requires_grad_(True) is w
    for freeze in (lambda: setattr(w, "requires_grad", False), lambda: w.requires_grad_(False)):
        with pytest.raises(ValueError, match=r"Parameter 'weight'.*freezing a parameter is not supported.*give the "
                                             r"optimizer only the parameters to train"):
            freeze()
    with pytest.raises(TypeError, match=r"requires_grad: expected a bool"):
        w.requires_grad = 0
    assert w.requires_grad is True


def test_numel_is_torchs_and_size_is_numpys():
    """torch's ``size()`` is the shape, numpy's ``size`` (a Parameter's) the count: ``numel()`` is
    added under torch's name."""
    w, tw = tc.nn.Linear(3, 2).weight, torch.nn.Linear(3, 2).weight
    assert w.numel() == tw.numel() == 6 == w.size
    assert w.shape == tuple(tw.size())
    assert "numel" in (Parameter.__doc__ or "") and "torch's" in Parameter.__doc__


@pytest.mark.parametrize("stack", ["encoder", "decoder", "transformer"])
def test_a_layer_replaced_by_another_module_is_refused_naming_it(stack):
    """``enc.layers[0] = nn.Linear(8, 8); enc(x)`` raised ``AttributeError: '_forward'`` from inside
    the stack; now a TypeError naming ``layers[0]`` before any layer runs (a training forward keeps
    nothing: the backward then has nothing to differentiate)."""
    x, memory = _x((1, 3, 8)), _x((1, 4, 8), seed=1)
    if stack == "encoder":
        m = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64), 2)
        m.layers[1] = tc.nn.Linear(8, 8, dtype=F64)
        run, where = (lambda: m(x)), r"layers\[1\]: expected a transformer_core\.nn\.TransformerEncoderLayer"
    elif stack == "decoder":
        m = tc.nn.TransformerDecoder(tc.nn.TransformerDecoderLayer(8, 2, 16, dtype=F64), 2)
        m.layers[0] = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)
        run, where = (lambda: m(x, memory)), r"layers\[0\]: expected a transformer_core\.nn\.TransformerDecoderLayer"
    else:
        m = tc.nn.Transformer(8, 2, 1, 1, 16, dtype=F64)
        m.encoder.layers[0] = tc.nn.Linear(8, 8, dtype=F64)
        run, where = (lambda: m(x, memory)), r"encoder\.layers\[0\]: expected a transformer_core\.nn\.TransformerEnc"
    m.train()
    with pytest.raises(TypeError, match=where + r".*got .*(Linear|TransformerEncoderLayer)"):
        run()
    with pytest.raises(NoTrainingStateError):
        m.backward(np.ones((1, 3, 8)))


# ---- 8. repr ---------------------------------------------------------------------------------------------------
def test_repr_is_torchs_layout():
    """A module had no repr (``<transformer_core.nn.Linear object at 0x...>``). Now torch's layout:
    the class, the arguments it was built with (defaults left out), the children indented, a run of
    equal layers on one line."""
    n, t = _Net(), _TorchNet()
    assert repr(n) == ("_Net(\n"
                       "  (fc1): Linear(in_features=4, out_features=8, dtype=float64)\n"
                       "  (fc2): Linear(in_features=8, out_features=2, dtype=float64)\n"
                       ")")
    assert [line.split(":")[0] for line in repr(n).splitlines()] == [
        line.split(":")[0].replace("_TorchNet", "_Net") for line in repr(t).splitlines()]
    assert str(tc.nn.Linear(3, 2, bias=False)) == "Linear(in_features=3, out_features=2, bias=False)"
    enc = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16), 3, norm=tc.nn.LayerNorm(8))
    assert repr(enc) == (
        "TransformerEncoder(\n"
        "  encoder_layer=TransformerEncoderLayer(...), num_layers=3, norm=LayerNorm(...)\n"
        "  (layers.0-2): 3 x TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)\n"
        "  (norm): LayerNorm(normalized_shape=8)\n"
        ")")
    enc.layers[1] = tc.nn.TransformerEncoderLayer(8, 2, 16, norm_first=True)
    assert repr(enc).splitlines()[2:5] == [
        "  (layers.0): TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)",
        "  (layers.1): TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, norm_first=True)",
        "  (layers.2): TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)"]
    cfg = tc.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    assert repr(tc.LlamaForCausalLM(cfg)) == "LlamaForCausalLM(config=LlamaConfig(...))"

    class Empty(Module):
        def forward(self, x):
            return x

    assert repr(Empty()) == "Empty()"
    head = tc.nn.Linear(8, 2)
    head.backbone = enc
    enc.head = head  # a cycle: printed once
    assert repr(enc).splitlines()[-5:] == ["  (head): Linear(", "    in_features=8, out_features=2",
                                           "    (backbone): TransformerEncoder(...)", "  )", ")"]


# ------------------------------------------------------------------- a read of the attribute lookup
def test_hasattr_and_getattr_default_on_a_quantized_layer_do_not_raise():
    """A quantized Linear: hasattr(q, "weight") is False (no Parameter views an int8 weight) and its
    float bias reads as its Parameter; both raised ValueError, as did every bias of a quantized
    model's layers (the lookup built every weight's Parameter, the quantized one's too)."""
    q = tc.quantize(tc.nn.Linear(4, 4), "int8")
    assert hasattr(q, "weight") is False and getattr(q, "weight", None) is None
    with pytest.raises(AttributeError, match=r"^Linear.weight: .*held quantized \(int8\)"):
        q.weight
    assert q.bias.name == "bias" and q.bias is q.bias
    np.testing.assert_array_equal(q.bias.data, q.state_dict()["bias"])
    s2s = tc.quantize(tc.Seq2SeqTransformer(20, 20, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                            dim_feedforward=16), "int8")
    biased = [m for m in s2s.modules() if isinstance(m, tc.nn.Linear) and m.bias is not None]
    assert len(biased) == 1  # the generator


@pytest.mark.parametrize("build,name", [
    (lambda lib: lib.nn.Linear(2, 2, bias=False), "bias"),
    (lambda lib: lib.nn.LayerNorm(4, bias=False), "bias"),
    (lambda lib: lib.nn.LayerNorm(4, elementwise_affine=False), "weight"),
    (lambda lib: lib.nn.LayerNorm(4, elementwise_affine=False), "bias"),
    (lambda lib: lib.nn.MultiheadAttention(8, 2, bias=False), "in_proj_bias"),
    (lambda lib: lib.nn.MultiheadAttention(8, 2), "bias_k"),
    (lambda lib: lib.nn.MultiheadAttention(8, 2), "q_proj_weight"),
    (lambda lib: lib.nn.MultiheadAttention(8, 2, kdim=4, vdim=6), "in_proj_weight"),
], ids=["linear", "layer_norm_bias", "layer_norm_weight", "layer_norm_affine_bias", "mha", "mha_bias_k",
        "mha_q_proj_weight", "mha_kdim_in_proj_weight"])
def test_a_weight_built_without_reads_none_as_torchs(build, name):
    """``if m.bias is not None:`` over a model's modules, torch's idiom: a weight the layer was built
    without is None in torch and was an AttributeError here."""
    theirs = build(torch)
    ours = build(tc) if not isinstance(theirs, torch.nn.MultiheadAttention) else tc.nn.MultiheadAttention(
        8, 2, bias=theirs.in_proj_bias is not None, kdim=theirs.kdim, vdim=theirs.vdim)
    assert getattr(theirs, name) is None
    assert getattr(ours, name) is None
    assert name not in dict(ours.named_parameters())


def test_repr_lists_a_layer_shared_at_two_places_as_torchs():
    """A layer at two places of a stack is listed at both, as torch's repr does (it was listed once
    while num_layers said 2)."""
    ours = tc.nn.TransformerEncoder(tc.nn.TransformerEncoderLayer(8, 2, 16), 2)
    ours.layers[1] = ours.layers[0]
    theirs = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16), 2, enable_nested_tensor=False)
    theirs.layers[1] = theirs.layers[0]
    assert "(0-1): 2 x TransformerEncoderLayer(" in repr(theirs)
    assert "(layers.0-1): 2 x TransformerEncoderLayer(" in repr(ours)


def test_a_parameter_is_not_iterable():
    """__getitem__ (which explains p.data) made a Parameter look iterable: iter, list and `in` said
    "not indexable"; they say "not iterable", as before, while p[0] keeps its advice."""
    p = tc.nn.Linear(2, 2).weight
    for call in (lambda: iter(p), lambda: list(p), lambda: 0 in p, lambda: sum(p)):
        with pytest.raises(TypeError, match=r"^Parameter 'weight' is not iterable: iterate over its values instead, "
                                            r"p\.data"):
            call()
    with pytest.raises(TypeError, match=r"p\.data\[0\]"):
        p[0]


def test_rms_norm_has_no_bias_as_torchs():
    """torch's RMSNorm has no bias at all (hasattr False); LayerNorm's optional-weight rule gave
    ours a None bias."""
    assert not hasattr(torch.nn.RMSNorm(4), "bias")
    assert not hasattr(tc.nn.RMSNorm(4), "bias")
    assert tc.nn.RMSNorm(4, elementwise_affine=False).weight is None
    assert torch.nn.RMSNorm(4, elementwise_affine=False).weight is None


def test_a_subclass_naming_its_weights_from_its_state_is_not_read_from_a_stale_cache():
    """A user's subclass whose _public_name reads an attribute set after the C++ module: the names
    were cached before that attribute was set (p.weight raised StopIteration, and a child could be
    attached over the weights' names). A hook that does not declare itself a function of the core
    name alone is read each time."""

    class Proj(tc.nn.Linear):
        prefix = ""

        def __init__(self, i, o, prefix="proj."):
            super().__init__(i, o)
            self.prefix = prefix

        def _public_name(self, core_name):
            return self.prefix + core_name

    p = Proj(4, 4)
    assert list(p.state_dict()) == ["proj.weight", "proj.bias"]
    assert not hasattr(p, "weight")
    with pytest.raises(AttributeError, match=r"'proj\.weight', 'proj\.bias'"):
        p.proj
    with pytest.raises(ValueError, match=r"^Proj\.proj: cannot assign"):
        p.proj = tc.nn.Linear(2, 2)
    p.prefix = "other."
    assert list(p.state_dict()) == ["other.weight", "other.bias"]
