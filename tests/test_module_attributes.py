"""A module's attributes and Parameters against torch's semantics: loading ``named_parameters()``
(and snapshots of them) whose layout is not the checkpoint's; ``p.data -= x``; the sizes and
settings a C++ layer was built with (read-only, so that no forward, copy or stack disagrees with
the layer); a weight the module was built without; non-str keys given to a model's
``load_state_dict``; and MultiheadAttention's separate q/k/v weights checked before any copy.
Each is compared with torch's behaviour (or, where torch has the same semantics trivially, with the
source module itself)."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import to_torch
from transformer_core import nn

F64 = np.float64


def _random_state(module, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v.shape) for k, v in module.state_dict().items()}


def _llama(**kwargs):
    cfg = dict(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2,
               max_position_embeddings=16)
    return tc.LlamaModel(cfg, rope_layout="interleaved", dtype=F64, **kwargs)


def _gpt2():
    return tc.GPT2Model(dict(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2), dtype=F64)


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ---- 1. named_parameters() of another layout than the checkpoint's ----------------------------------------
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama-interleaved", "gpt2"])
def test_loading_another_models_named_parameters_copies_it_as_torchs(build):
    """``dst.load_state_dict(dict(src.named_parameters()))`` loaded the C++ layout as the
    checkpoint's: a Llama of rope_layout="interleaved" got its q/k rows permuted (hidden states 1.39
    off), GPT-2's transposed Conv1D weights were refused as mis-shaped. As torch's: dst equals src."""
    src, dst = build(), build()
    src.load_state_dict(_random_state(src))
    assert any(not p.checkpoint_layout for _, p in src.named_parameters())
    assert repr(dst.load_state_dict(dict(src.named_parameters()))) == "<All keys matched successfully>"
    assert _same_state(dst.state_dict(), src.state_dict())
    ids = np.array([[1, 2, 3, 4]])
    np.testing.assert_array_equal(dst(ids)[0], src(ids)[0])


def test_a_square_transposed_weight_loads_in_the_checkpoints_layout():
    """GPT-2's ``attn.c_proj.weight`` is square: its Parameter (the C++ layout, the transpose of the
    checkpoint's) loaded silently transposed. As torch's, the value loaded is the source's."""
    src, dst = _gpt2(), _gpt2()
    src.load_state_dict(_random_state(src))
    name = "h.0.attn.c_proj.weight"
    p = dict(src.named_parameters())[name]
    assert p.transposed and p.shape[0] == p.shape[1]
    dst.load_state_dict({name: p}, strict=False)
    np.testing.assert_array_equal(dst.state_dict()[name], src.state_dict()[name])


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama-interleaved", "gpt2"])
def test_restoring_a_snapshot_of_named_parameters_changes_nothing(build, how):
    """A deep copy (or pickle) of ``dict(model.named_parameters())`` was a plain Parameter of the C++
    layout that no longer said so: restoring it permuted Llama's q/k rows. As torch's, restoring a
    snapshot gives back the weights it was taken of; its Parameters keep the originals' values and
    layout."""
    model = build()
    model.load_state_dict(_random_state(model))
    before = model.state_dict()
    params = dict(model.named_parameters())
    snap = copy.deepcopy(params) if how == "deepcopy" else pickle.loads(pickle.dumps(params))
    for name, p in params.items():
        np.testing.assert_array_equal(snap[name].data, p.data)
        assert getattr(snap[name], "transposed", False) == p.transposed
    model.load_state_dict(_random_state(model, seed=1))  # trained on since
    model.load_state_dict(snap)
    assert _same_state(model.state_dict(), before)
    other = build()  # and into another model, as torch's
    other.load_state_dict(snap)
    assert _same_state(other.state_dict(), before)


# ---- 2. p.data -= x ----------------------------------------------------------------------------------------
def test_an_in_place_operator_on_data_updates_the_weight_as_torchs():
    """``lin.weight.data -= 0.5`` (torch's manual SGD idiom) updated the weight, then raised
    AttributeError saying the data cannot be rebound. As torch's: the weight is updated, no error;
    rebinding ``data`` to another array is still refused."""
    lin, tlin = nn.Linear(3, 2, dtype=F64), torch.nn.Linear(3, 2).double()
    tlin.load_state_dict({k: to_torch(v) for k, v in lin.state_dict().items()})
    grad = np.random.default_rng(0).standard_normal((2, 3))
    lin.weight.data -= 0.1 * grad
    lin.bias.data *= 2.0
    tlin.weight.data -= 0.1 * to_torch(grad)
    tlin.bias.data *= 2.0
    np.testing.assert_array_equal(lin.state_dict()["weight"], tlin.weight.detach().numpy())
    np.testing.assert_array_equal(lin.state_dict()["bias"], tlin.bias.detach().numpy())
    before = lin.state_dict()
    with pytest.raises(AttributeError, match=r"cannot be rebound"):
        lin.weight.data = np.zeros((2, 3))
    with pytest.raises(AttributeError, match=r"cannot be rebound"):
        lin.weight.data = lin.weight.data.copy()
    assert _same_state(lin.state_dict(), before)
    plain = tc.parameter.Parameter(np.ones(3))
    plain.data += 1.0
    np.testing.assert_array_equal(plain.data, np.full(3, 2.0))


# ---- 3, 4. the sizes and settings a C++ layer was built with -------------------------------------------------
_FIXED = [  # (build, the settings), one per class
    (lambda: nn.Linear(3, 2, dtype=F64), ["in_features", "out_features"]),
    (lambda: nn.Embedding(5, 4, dtype=F64), ["num_embeddings", "embedding_dim"]),
    (lambda: nn.LayerNorm(4, dtype=F64), ["normalized_shape", "normalized_size", "eps", "elementwise_affine"]),
    (lambda: nn.RMSNorm(4, dtype=F64), ["normalized_shape", "normalized_size", "eps", "elementwise_affine"]),
    (lambda: nn.FeedForward(4, 8, dtype=F64), ["d_model", "dim_feedforward", "activation"]),
    (lambda: nn.GatedFeedForward(4, 8, dtype=F64), ["d_model", "dim_feedforward", "activation"]),
    (lambda: nn.MultiheadAttention(8, 2, dtype=F64),
     ["embed_dim", "num_heads", "num_key_value_heads", "kdim", "vdim", "head_dim", "bias"]),
    (lambda: nn.TransformerEncoderLayer(8, 2, 16, dtype=F64),
     ["d_model", "nhead", "dim_feedforward", "activation", "layer_norm_eps", "norm_first", "bias"]),
    (lambda: nn.TransformerDecoderLayer(8, 2, 16, dtype=F64),
     ["d_model", "nhead", "dim_feedforward", "activation", "layer_norm_eps", "norm_first", "bias"]),
    (lambda: nn.Transformer(8, 2, 1, 1, 16, dtype=F64), ["d_model", "nhead"]),
]

_NEW_VALUE = {"activation": "gelu", "eps": 10.0, "layer_norm_eps": 10.0, "norm_first": True, "bias": False,
              "elementwise_affine": False, "normalized_shape": (16,)}


@pytest.mark.parametrize("build, names", _FIXED, ids=[type(build()).__name__ for build, _ in _FIXED])
def test_a_setting_the_layer_was_built_with_is_read_only(build, names):
    """``lin.in_features = 5`` then a forward read 3 columns of 5 (or segfaulted),
    ``layer.d_model = 16`` let a (1, 3, 16) input through, ``ln.eps = 10`` and ``layer.norm_first
    = True`` were ignored by the forward (torch's reads them). Such an assignment (or deletion) now
    raises AttributeError saying to build a new layer, and the layer computes as before."""
    module = build()
    for name in names:
        value = getattr(module, name)
        new = _NEW_VALUE.get(name, 16)
        with pytest.raises(AttributeError, match=rf"{name} is fixed when the layer is built.*build a new layer"):
            setattr(module, name, new)
        with pytest.raises(AttributeError, match=rf"{name} is fixed when the layer is built"):
            delattr(module, name)
        assert getattr(module, name) == value
    for how in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):  # copies carry the values
        dup = how(module)
        assert all(getattr(dup, name) == getattr(module, name) for name in names)


def test_dtype_is_fixed_once_a_package_module_set_it():
    """``lin.dtype = np.float32`` on a float64 layer was taken: ``state_dict`` then rounded the
    weights to float32 and the forward failed with pybind's argument error. The dtype of this
    package's modules (and of a caller's subclass of one) is read-only now, as the sizes above; a
    caller's own ``Module`` subclass keeps its ``dtype`` its own."""
    from transformer_core.module import Module

    class Doubled(nn.Linear):
        pass

    x = np.arange(1.0, 4.0)[None]
    for module in (nn.Linear(3, 2, dtype=F64), Doubled(3, 2, dtype=F64), nn.TransformerEncoderLayer(8, 2, 16, dtype=F64)):
        before = module.state_dict()
        with pytest.raises(AttributeError, match=r"dtype is fixed when the layer is built.*build a new layer"):
            module.dtype = np.float32
        with pytest.raises(AttributeError, match=r"dtype is fixed when the layer is built"):
            del module.dtype
        assert module.dtype is F64
        assert _same_state(module.state_dict(), before)
        assert all(v.dtype == F64 for v in module.state_dict().values())
    lin = nn.Linear(3, 2, dtype=F64)
    tlin = torch.nn.Linear(3, 2).double()
    tlin.load_state_dict({k: to_torch(v) for k, v in lin.state_dict().items()})
    with pytest.raises(AttributeError):
        lin.dtype = np.float32
    with torch.no_grad():
        np.testing.assert_allclose(lin(x), tlin(to_torch(x)).numpy(), rtol=1e-13, atol=1e-14)

    class Own(Module):
        def __init__(self):
            self.dtype = F64
            self.dtype = np.float32  # a caller's own module: its dtype is its own to change

    own = Own()
    assert own.dtype is np.float32
    del own.dtype
    assert own.dtype is np.float32  # Module's class default

    class Early(nn.Linear):  # sets dtype before the constructor builds anything: taken
        def __init__(self, dtype):
            self.dtype = np.float32
            super().__init__(3, 2, dtype=dtype)

    early = Early(F64)
    assert early.dtype is F64 and early.state_dict()["weight"].dtype == F64
    with pytest.raises(AttributeError, match=r"dtype is fixed when the layer is built"):
        early.dtype = np.float32


def test_linear_keeps_its_input_check_as_torchs():
    """After ``lin.in_features = 5`` (now refused) a 5-column input ran over 3 columns; torch's
    forward refuses it (mat1 and mat2 shapes cannot be multiplied). So does ours, and a 3-column
    input gives torch's output."""
    lin, tlin = nn.Linear(3, 2, dtype=F64), torch.nn.Linear(3, 2).double()
    tlin.load_state_dict({k: to_torch(v) for k, v in lin.state_dict().items()})
    with pytest.raises(AttributeError):
        lin.in_features = 5
    x5 = np.arange(1.0, 6.0)[None]
    with pytest.raises(RuntimeError):
        tlin(to_torch(x5))
    with pytest.raises(ValueError, match=r"expected last dim 3 \(in_features\)"):
        lin(x5)
    x = np.arange(1.0, 4.0)[None]
    with torch.no_grad():
        np.testing.assert_allclose(lin(x), tlin(to_torch(x)).numpy(), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_a_stack_computes_as_its_layer_and_as_torchs(norm_first, activation):
    """``layer.norm_first = True`` made the layer (still post-norm in C++) and the stack copy built
    from the attribute (pre-norm) compute differently (1.38 apart). The setting is read-only, so a
    stack's copy, the layer and torch's layer of the same arguments agree."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, activation=activation, norm_first=norm_first, dtype=F64)
    layer.load_state_dict(_random_state(layer))
    with pytest.raises(AttributeError):
        layer.norm_first = not norm_first
    enc = nn.TransformerEncoder(layer, 1)
    t = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=activation, norm_first=norm_first,
                                         batch_first=True).double().eval()
    t.load_state_dict({k: to_torch(v) for k, v in layer.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((1, 4, 8))
    with torch.no_grad():
        ref = t(to_torch(x)).numpy()
    np.testing.assert_allclose(layer(x), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(enc.layers[0](x), layer(x))
    assert enc.layers[0].norm_first == norm_first and enc.layers[0].activation == activation


def test_layer_norm_settings_stay_what_the_forward_computes_as_torchs():
    """``ln.eps = 10`` was ignored by the forward (torch's reads it: 1.65 apart), and
    ``ln.elementwise_affine = False`` emptied state_dict while the forward still scaled by the
    weight. Both are refused; the layer computes as torch's of its arguments."""
    ln, tln = nn.LayerNorm(8, eps=0.5, dtype=F64), torch.nn.LayerNorm(8, eps=0.5).double()
    ln.load_state_dict(_random_state(ln))
    tln.load_state_dict({k: to_torch(v) for k, v in ln.state_dict().items()})
    with pytest.raises(AttributeError):
        ln.eps = 10.0
    with pytest.raises(AttributeError):
        ln.elementwise_affine = False
    assert list(ln.state_dict()) == ["weight", "bias"]
    x = np.random.default_rng(0).standard_normal((3, 8))
    with torch.no_grad():
        np.testing.assert_allclose(ln(x), tln(to_torch(x)).numpy(), rtol=1e-12, atol=1e-13)
    dup = copy.deepcopy(ln)
    assert dup.eps == 0.5
    np.testing.assert_array_equal(dup(x), ln(x))


# ---- 5. a weight the module was built without ------------------------------------------------------------
@pytest.mark.parametrize("build, name", [
    (lambda: nn.Linear(2, 2, bias=False, dtype=F64), "bias"),
    (lambda: nn.LayerNorm(4, elementwise_affine=False, dtype=F64), "weight"),
    (lambda: nn.LayerNorm(4, bias=False, dtype=F64), "bias"),
    (lambda: nn.MultiheadAttention(8, 2, bias=False, dtype=F64), "in_proj_bias"),
])
def test_assigning_a_weight_the_module_was_built_without_is_refused(build, name):
    """``Linear(bias=False).bias = array`` was accepted and ignored by the forward (torch's raises
    TypeError for a tensor, and registers and uses a Parameter). Refused now (ValueError, saying to
    build the module with that weight); None is still accepted (it reads None, as torch's)."""
    module = build()
    before = module.state_dict()
    for value in (np.full(4 if name != "in_proj_bias" else 24, 10.0), tc.parameter.Parameter(np.ones(2))):
        with pytest.raises(ValueError, match=rf"built without a '{name}' weight.*build a new"):
            setattr(module, name, value)
        assert getattr(module, name) is None
    module.__setattr__(name, None)
    assert getattr(module, name) is None
    assert _same_state(module.state_dict(), before)


def test_a_linear_without_bias_computes_as_torchs_after_the_refusal():
    lin, tlin = nn.Linear(2, 2, bias=False, dtype=F64), torch.nn.Linear(2, 2, bias=False).double()
    tlin.load_state_dict({k: to_torch(v) for k, v in lin.state_dict().items()})
    with pytest.raises(TypeError):
        tlin.bias = to_torch(np.array([10.0, 10.0]))
    with pytest.raises(ValueError):
        lin.bias = np.array([10.0, 10.0])
    x = np.ones((1, 2))
    with torch.no_grad():
        np.testing.assert_allclose(lin(x), tlin(to_torch(x)).numpy(), rtol=1e-13, atol=1e-14)


# ---- 6. non-str keys ----------------------------------------------------------------------------------------
def _bert():
    return tc.BertModel(dict(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=12, max_position_embeddings=16), dtype=F64)


@pytest.mark.parametrize("build", [_gpt2, lambda: _llama(), _bert, lambda: nn.Linear(2, 2, dtype=F64)],
                         ids=["gpt2", "llama", "bert", "linear"])
def test_a_non_str_key_is_an_unexpected_key(build):
    """A non-str key made GPT-2's, Llama's and BERT's renaming raise a regex TypeError or an
    AttributeError naming neither the argument nor the key. As the base Module (and nn layers):
    strict=False returns it in unexpected_keys and loads the rest; strict=True refuses it as unknown."""
    model = build()
    state = _random_state(model)
    given = {**state, 0: np.zeros(2), (1, 2): np.zeros(2)}
    with pytest.raises(ValueError, match=r"unknown keys: \[0, \(1, 2\)\]"):
        model.load_state_dict(given)
    result = model.load_state_dict(given, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == [0, (1, 2)]
    assert _same_state(model.state_dict(), state)


# ---- 7. MultiheadAttention's separate q/k/v weights -----------------------------------------------------------
def test_separate_qkv_weights_are_shape_checked_before_any_copy():
    """A mis-shaped ``q_proj_weight`` was converted (a full float32 copy) before its shape was
    checked: a broadcast (10**6, 10**6) one was refused for its memory, not as mis-shaped. It is
    refused as mis-shaped at once, the module unchanged; well-shaped ones load as torch's packed
    weight."""
    mha = nn.MultiheadAttention(8, 2, dtype=F64)
    before = mha.state_dict()
    sd = dict(before)
    del sd["in_proj_weight"]
    sd.update(q_proj_weight=np.broadcast_to(np.float64(1), (10**6, 10**6)), k_proj_weight=np.zeros((8, 8)),
              v_proj_weight=np.zeros((8, 8)))
    with pytest.raises(ValueError, match=r"mis-shaped: \['q_proj_weight: expected \(8, 8\), got \(1000000, 1000000\)'\]"):
        mha.load_state_dict(sd)
    assert _same_state(mha.state_dict(), before)
    sd["q_proj_weight"] = np.zeros((8, 8), np.int64)
    with pytest.raises(TypeError, match=r"q_proj_weight"):
        mha.load_state_dict(sd)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((8, 8)) for _ in range(3))
    sd.update(q_proj_weight=q, k_proj_weight=torch.from_numpy(k), v_proj_weight=v)
    mha.load_state_dict(sd)
    t = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    t.load_state_dict({**{n: to_torch(a) for n, a in before.items()}, "in_proj_weight": to_torch(np.concatenate([q, k, v]))})
    x = rng.standard_normal((2, 3, 8))
    with torch.no_grad():
        ref = t(*[to_torch(x)] * 3)[0].numpy()
    np.testing.assert_allclose(mha(x)[0], ref, rtol=1e-10, atol=1e-12)


def test_the_refusals_name_a_constructor_call_that_works():
    """The messages of a fixed setting or a left-out weight give the constructor argument that sets
    it (LayerNorm's is normalized_shape; head_dim follows embed_dim and num_heads; no layer here has
    MultiheadAttention's bias_k), and the call they name builds."""
    cases = [(tc.nn.LayerNorm(4), "normalized_size", 8, r"LayerNorm\(\.\.\., normalized_shape=\.\.\.\)"),
             (tc.nn.MultiheadAttention(8, 2), "head_dim", 2, r"embed_dim and num_heads set it"),
             (tc.nn.Linear(2, 2), "in_features", 3, r"Linear\(\.\.\., in_features=\.\.\.\)")]
    for module, name, value, pattern in cases:
        with pytest.raises(AttributeError, match=pattern):
            setattr(module, name, value)
    tc.nn.LayerNorm(normalized_shape=8)
    tc.nn.Linear(in_features=3, out_features=2)
    with pytest.raises(ValueError, match=r"MultiheadAttention cannot have one"):
        tc.nn.MultiheadAttention(8, 2).bias_k = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=r"LayerNorm\(\.\.\., elementwise_affine=True\)"):
        tc.nn.LayerNorm(4, elementwise_affine=False).weight = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"Linear\(\.\.\., bias=True\)"):
        tc.nn.Linear(2, 2, bias=False).bias = np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"MultiheadAttention\(\.\.\., bias=True\)"):
        tc.nn.MultiheadAttention(8, 2, bias=False).in_proj_bias = np.ones(24, np.float32)
    assert tc.nn.LayerNorm(4, elementwise_affine=True).weight is not None
