"""tc.nn.FeedForward and tc.nn.TransformerEncoderLayer vs torch.

The torch reference is torch.nn.TransformerEncoderLayer(batch_first=True, dropout=0.0).eval() under
no_grad with the MHA fast path disabled (conftest); a separate test checks against the fast path.
"""
from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
import transformer_core as tc
from conftest import (
    DTYPE_IDS,
    FLOAT_DTYPES,
    TORCH_DTYPE,
    assert_close,
    module_state_to_numpy,
    randn,
    randomise_,
    states_equal,
    to_torch,
)


# ----------------------------------------------------------------------------------- FeedForward
class TorchFF(torch.nn.Module):
    def __init__(self, d, f, activation):
        super().__init__()
        self.linear1 = torch.nn.Linear(d, f)
        self.linear2 = torch.nn.Linear(f, d)
        self.act = TF.relu if activation == "relu" else TF.gelu

    def forward(self, x):
        return self.linear2(self.act(self.linear1(x)))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("d,f", [(1, 1), (9, 17), (16, 65), (7, 7)])
@pytest.mark.parametrize("lead", [(1,), (7,), (2, 9), (9, 9)], ids=lambda s: "x".join(map(str, s)))
def test_feed_forward_matches_torch(rng, lead, d, f, activation):
    ref = TorchFF(d, f, activation).eval()
    ours = tc.nn.FeedForward(d, f, activation=activation)
    sd = module_state_to_numpy(ref)
    assert set(sd) == {"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}
    ours.load_state_dict(sd)
    x = randn(rng, lead + (d,))
    with torch.no_grad():
        r = ref(to_torch(x))
    assert_close(ours(x), r, np.float32, what=f"ffn {activation}")
    assert states_equal(ours.state_dict(), sd)


def test_feed_forward_load_errors(rng):
    ref = TorchFF(9, 17, "gelu")
    ours = tc.nn.FeedForward(9, 17, activation="gelu")
    ours.load_state_dict(module_state_to_numpy(ref))
    before = {k: np.array(v, copy=True) for k, v in ours.state_dict().items()}
    bad = module_state_to_numpy(TorchFF(9, 17, "gelu"))
    bad["linear1.weight"] = np.zeros((17, 8), np.float32)
    with pytest.raises(ValueError, match="linear1.weight"):
        ours.load_state_dict(bad)
    bad = module_state_to_numpy(TorchFF(9, 17, "gelu"))
    del bad["linear2.bias"]
    with pytest.raises(ValueError, match="linear2.bias"):
        ours.load_state_dict(bad)
    assert states_equal(ours.state_dict(), before)


# ------------------------------------------------------------------------ TransformerEncoderLayer
def make_torch_layer(d, h, f, activation, norm_first, dtype, bias=True, eps=1e-5):
    m = torch.nn.TransformerEncoderLayer(d, h, dim_feedforward=f, dropout=0.0,
                                         activation=activation, layer_norm_eps=eps,
                                         batch_first=True, norm_first=norm_first, bias=bias)
    return randomise_(m.to(TORCH_DTYPE[np.dtype(dtype)]).eval())


def make_pair(d, h, f, activation, norm_first, dtype, bias=True, eps=1e-5):
    ref = make_torch_layer(d, h, f, activation, norm_first, dtype, bias, eps)
    ours = tc.nn.TransformerEncoderLayer(d, h, dim_feedforward=f, activation=activation,
                                         layer_norm_eps=eps, norm_first=norm_first, bias=bias,
                                         dtype=dtype)
    ours.load_state_dict(module_state_to_numpy(ref))
    return ours, ref


def torch_layer(ref, x, src_mask=None, key_mask=None):
    am = None
    if src_mask is not None:
        am = ~to_torch(src_mask) if src_mask.dtype == bool else to_torch(src_mask)
    kpm = None if key_mask is None else ~to_torch(key_mask)
    with torch.no_grad():
        return ref(to_torch(x), src_mask=am, src_key_padding_mask=kpm).numpy()


def _padding(rng, N, S):
    lengths = rng.integers(1, S + 1, size=N)
    lengths[0] = max(1, S - 2) if S > 1 else 1  # at least one padded element where possible
    return np.arange(S) < lengths[:, None]


CONFIGS = [(16, 4, 37), (9, 3, 17), (8, 1, 8)]
CONFIG_IDS = [f"d{d}h{h}f{f}" for d, h, f in CONFIGS]
NL = [(1, 1), (2, 7), (7, 7), (3, 17)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("padding", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("N,L", NL, ids=[f"N{n}L{length}" for n, length in NL])
@pytest.mark.parametrize("d,h,f", CONFIGS, ids=CONFIG_IDS)
def test_encoder_layer_matches_torch(rng, d, h, f, N, L, activation, norm_first, padding, dtype):
    ours, ref = make_pair(d, h, f, activation, norm_first, dtype)
    x = randn(rng, (N, L, d), dtype)
    km = _padding(rng, N, L) if padding else None
    out = ours(x, src_key_mask=km) if padding else ours(x)
    ref_out = torch_layer(ref, x, key_mask=km)
    assert out.dtype == np.dtype(dtype) and out.shape == (N, L, d)
    real = km if padding else np.ones((N, L), bool)
    assert_close(out[real], ref_out[real], dtype, what="encoder layer (real tokens)")
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["additive", "float", "causal", "additive+pad"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_encoder_layer_src_mask(rng, kind, norm_first, dtype):
    """``src_mask`` is float (torch's name, torch's meaning); a bool pattern in the library's
    convention goes in as ``masks.to_additive`` and reaches torch as its own bool (True = blocked)."""
    d, h, f, N, L = 12, 3, 29, 3, 9
    ours, ref = make_pair(d, h, f, "gelu", norm_first, dtype)
    x = randn(rng, (N, L, d), dtype)
    km = _padding(rng, N, L) if "pad" in kind else None
    if kind.startswith("additive"):
        m = rng.random((L, L)) < 0.6
        m[:, 0] = True
        out = ours(x, src_mask=tc.masks.to_additive(m, dtype), src_key_mask=km)
        ref_out = torch_layer(ref, x, src_mask=m, key_mask=km)
    elif kind == "float":
        m = randn(rng, (L, L), dtype)
        out = ours(x, src_mask=m)
        ref_out = torch_layer(ref, x, src_mask=m)
    else:
        out = ours(x, is_causal=True)
        ref_out = torch_layer(ref, x, src_mask=np.tril(np.ones((L, L), bool)))
    real = km if km is not None else np.ones((N, L), bool)
    assert_close(out[real], ref_out[real], dtype, what=f"encoder layer {kind}")


def test_encoder_bool_src_mask_refused(rng):
    """torch's TransformerEncoderLayer/TransformerEncoder read a bool src_mask/mask as True =
    blocked; the library's bool masks are True = may attend: a bool mask under torch's name is refused."""
    ours, _ = make_pair(12, 3, 29, "gelu", False, np.float32)
    x = randn(rng, (2, 5, 12))
    with pytest.raises(TypeError, match=r"src_mask: expected a float mask .*got a bool mask"):
        ours(x, src_mask=np.ones((5, 5), bool))
    with pytest.raises(TypeError, match="src_mask: expected a float mask"):
        ours.train()(x, src_mask=torch.ones(5, 5, dtype=torch.bool))
    ours.eval()
    stack = tc.nn.TransformerEncoder(ours, 2)
    with pytest.raises(TypeError, match=r"^mask: expected a float mask"):
        stack(x, mask=np.ones((5, 5), bool))
    m = tc.nn.Transformer(12, 3, 1, 1, 29)
    with pytest.raises(TypeError, match=r"^src_mask: expected a float mask"):
        m(x, x, src_mask=np.ones((5, 5), bool))
    for name in ("tgt_mask", "memory_mask"):
        with pytest.raises(TypeError, match=rf"^{name}: expected a float mask"):
            m(x, x, **{name: np.ones((5, 5), bool)})


@pytest.mark.parametrize("eps", [1e-5, 1e-12, 1e-2])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_encoder_layer_eps_and_bias(rng, eps, bias):
    ours, ref = make_pair(9, 3, 17, "relu", False, np.float32, bias=bias, eps=eps)
    x = randn(rng, (2, 7, 9))
    assert_close(ours(x), torch_layer(ref, x), np.float32)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_encoder_layer_vs_torch_fast_path(rng, norm_first):
    """Against torch's fused eval fast path (when torch takes it), still at fp32 atol 1e-5."""
    ours, ref = make_pair(16, 4, 37, "relu", norm_first, np.float32)
    x = randn(rng, (3, 9, 16))
    km = _padding(rng, 3, 9)
    prev = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(True)
    try:
        with torch.inference_mode():
            r = ref(to_torch(x), src_key_padding_mask=~to_torch(km))
            r_nopad = ref(to_torch(x))
        if r.is_nested:
            r = r.to_padded_tensor(0.0)
        r = r.numpy()
    finally:
        torch.backends.mha.set_fastpath_enabled(prev)
    assert_close(ours(x, src_key_mask=km)[km], r[km], np.float32, what="vs fast path (pad)")
    assert_close(ours(x), r_nopad.numpy(), np.float32, what="vs fast path")


def test_encoder_layer_noncontiguous(rng):
    ours, ref = make_pair(9, 3, 17, "gelu", True, np.float64)
    x = randn(rng, (2, 7, 9), np.float64)
    ref_out = torch_layer(ref, x)
    assert_close(ours(np.asfortranarray(x)), ref_out, np.float64)
    assert_close(ours(np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)), ref_out,
                 np.float64)


# ------------------------------------------------------------------------------------ state dict
def test_encoder_layer_state_dict_names_and_roundtrip(rng):
    ours, ref = make_pair(9, 3, 17, "relu", False, np.float32)
    ref_sd = module_state_to_numpy(ref)
    sd = ours.state_dict()
    assert set(sd) == set(ref_sd)
    for name in ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                 "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                 "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"]:
        assert name in sd
        np.testing.assert_array_equal(np.asarray(sd[name]), ref_sd[name])
    fresh = tc.nn.TransformerEncoderLayer(9, 3, dim_feedforward=17)
    fresh.load_state_dict({k: np.array(v) for k, v in sd.items()})
    assert states_equal(fresh.state_dict(), sd)
    x = randn(rng, (2, 5, 9))
    np.testing.assert_array_equal(fresh(x), ours(x))


@pytest.mark.parametrize("case", ["missing", "unknown", "misshaped"])
def test_encoder_layer_load_state_dict_errors(rng, case):
    ours, ref = make_pair(9, 3, 17, "relu", False, np.float32)
    before = {k: np.array(v, copy=True) for k, v in ours.state_dict().items()}
    bad = module_state_to_numpy(make_torch_layer(9, 3, 17, "relu", False, np.float32))
    if case == "missing":
        del bad["norm2.bias"]
        name = "norm2.bias"
    elif case == "unknown":
        bad["norm3.weight"] = np.ones(9, np.float32)
        name = "norm3.weight"
    else:
        bad["linear1.weight"] = np.zeros((17, 10), np.float32)
        name = "linear1.weight"
    with pytest.raises(ValueError) as ei:
        ours.load_state_dict(bad)
    assert name in str(ei.value)
    assert states_equal(ours.state_dict(), before)
    x = randn(rng, (2, 5, 9))
    assert_close(ours(x), torch_layer(ref, x), np.float32)


@pytest.mark.parametrize("which", ["mha", "encoder_layer"])
def test_layers_identical_with_1_and_2_threads(rng, which):
    if which == "mha":
        layer = tc.nn.MultiheadAttention(64, 4)
        layer.load_state_dict(module_state_to_numpy(torch.nn.MultiheadAttention(64, 4,
                                                                                batch_first=True)))
    else:
        layer, _ = make_pair(64, 4, 256, "gelu", False, np.float32)
    x = randn(rng, (8, 33, 64))
    km = np.arange(33) < rng.integers(1, 34, size=8)[:, None]

    def run():
        r = layer(x, key_mask=km) if which == "mha" else layer(x, src_key_mask=km)
        return r[0] if which == "mha" else r

    old = tc.get_num_threads()
    try:
        tc.set_num_threads(1)
        a = run()
        tc.set_num_threads(2)
        b = run()
    finally:
        tc.set_num_threads(old)
    assert np.array_equal(a, b), f"{which}: max |1 thread - 2 threads| = {np.abs(a - b).max():.3e}"


def test_unbatched_src_key_mask_shape_is_named():
    """An unbatched src (L, E) takes an (L,) key mask; another shape is named as given, not as the
    (1, ...) the layer makes of it."""
    ours = tc.nn.TransformerEncoderLayer(8, 2, 16)
    x = randn(np.random.default_rng(0), (3, 8))
    with pytest.raises(ValueError, match=r"^src_key_mask: expected shape \(3,\) \(L,\) for an unbatched src "
                                         r"\(3, 8\) \(L, E\), got \(1, 3\)$"):
        ours(x, src_key_mask=np.ones((1, 3), bool))
    km = np.array([True, True, False])
    np.testing.assert_array_equal(ours(x, src_key_mask=km), ours(x[None], src_key_mask=km[None])[0])


def test_unbatched_src_shape_errors_quote_the_shape_given():
    """An unbatched src of the wrong width is named with its own shape (3, 9), not the (1, 3, 9)
    the layer makes of it; the same for the stack."""
    ours = tc.nn.TransformerEncoderLayer(8, 2, 16)
    for call in (ours, tc.nn.TransformerEncoder(ours, 2)):
        with pytest.raises(ValueError, match=r"^src: expected last dim 8 \(d_model\), got shape \(3, 9\)$"):
            call(np.ones((3, 9), np.float32))
        with pytest.raises(ValueError, match=r"^src: expected \(N, L, E\) or \(L, E\), got shape \(2, 3, 4, 8\)$"):
            call(np.ones((2, 3, 4, 8), np.float32))


def test_stacks_refuse_torch_modules_naming_their_library():
    """A torch layer or norm where ours is expected: the message said "expected a
    TransformerEncoderLayer, got TransformerEncoderLayer"; it names torch's class and says how to
    load its weights into ours. A torch dtype names numpy's."""
    enc, dec = tc.nn.TransformerEncoderLayer(8, 2, 16), tc.nn.TransformerDecoderLayer(8, 2, 16)
    load = r" \(a torch module: build transformer_core\.nn\.{} with the same arguments and call its load_state_dict"
    cases = [
        (lambda: tc.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, batch_first=True), 2),
         r"^encoder_layer: expected a transformer_core\.nn\.TransformerEncoderLayer, got "
         r"torch\.nn\.modules\.transformer\.TransformerEncoderLayer" + load.format("TransformerEncoderLayer")),
        (lambda: tc.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(8, 2, batch_first=True), 2),
         r"^decoder_layer: expected a transformer_core\.nn\.TransformerDecoderLayer, got "
         r"torch\.nn\.modules\.transformer\.TransformerDecoderLayer" + load.format("TransformerDecoderLayer")),
        (lambda: tc.nn.TransformerEncoder(enc, 2, norm=torch.nn.LayerNorm(8)),
         r"^norm: expected a transformer_core\.nn\.LayerNorm or None, got "
         r"torch\.nn\.modules\.normalization\.LayerNorm" + load.format("LayerNorm")),
        # torch's other classes: named, but no hint (their weights would not load into ours)
        (lambda: tc.nn.TransformerEncoder(torch.nn.TransformerDecoderLayer(8, 2, batch_first=True), 2),
         r"^encoder_layer: expected a transformer_core\.nn\.TransformerEncoderLayer, got "
         r"torch\.nn\.modules\.transformer\.TransformerDecoderLayer$"),
        (lambda: tc.nn.TransformerEncoder(enc, 2, norm=torch.nn.RMSNorm(8)),
         r"^norm: expected a transformer_core\.nn\.LayerNorm or None, got torch\.nn\.modules\.normalization\.RMSNorm$"),
        (lambda: tc.nn.TransformerEncoder(enc, 2, norm=torch.nn.Parameter(torch.ones(8))),
         r"^norm: expected a transformer_core\.nn\.LayerNorm or None, got torch\.nn\.parameter\.Parameter$"),
        (lambda: tc.nn.Linear(3, 4, dtype=torch.ones(2)),
         r"^dtype: expected float32 or float64, got Tensor \(2,\) torch\.float32 \(a numpy dtype"),
        (lambda: tc.nn.TransformerEncoder(dec, 2),
         r"^encoder_layer: expected a transformer_core\.nn\.TransformerEncoderLayer, got TransformerDecoderLayer$"),
        (lambda: tc.nn.TransformerDecoder("layer", 2),
         r"^decoder_layer: expected a transformer_core\.nn\.TransformerDecoderLayer, got str$"),
        (lambda: tc.nn.Linear(3, 4, dtype=torch.float32),
         r"^dtype: expected float32 or float64, got torch\.float32 \(a numpy dtype or its name: np\.float32, "
         r"'float64'\)$"),
    ]
    for call, match in cases:
        with pytest.raises(TypeError, match=match):
            call()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_encoder_stack_mask_errors_name_mask(rng, dtype):
    """TransformerEncoder's argument is ``mask``: its shape errors name it (they named the layers'
    src_mask); Transformer's src_mask keeps its own name. A good mask still gives torch's result."""
    layer = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=dtype)
    stack = tc.nn.TransformerEncoder(layer, 2)
    x = randn(rng, (2, 3, 8), dtype)
    with pytest.raises(ValueError, match=r"^mask: expected shape \(3, 3\) \(L, S\), got \(4, 3\)$"):
        stack(x, mask=np.zeros((4, 3), dtype))
    with pytest.raises(ValueError, match=r"^mask: expected a 3-D mask of shape \(4, 3, 3\)"):
        stack(x, mask=np.zeros((2, 3, 3), dtype))
    with pytest.raises(ValueError, match=r"^mask: expected shape \(3, 3\) \(L, S\), got \(2, 2\)$"):
        stack(x[0], mask=np.zeros((2, 2), dtype))
    with pytest.raises(ValueError, match=r"^src_mask: expected shape \(3, 3\) \(L, S\), got \(4, 3\)$"):
        tc.nn.Transformer(8, 2, 1, 1, 16, dtype=dtype)(x, x, src_mask=np.zeros((4, 3), dtype))
    ref_layer = randomise_(torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)
                           .to(TORCH_DTYPE[np.dtype(dtype)])).eval()
    ref = torch.nn.TransformerEncoder(ref_layer, 2, enable_nested_tensor=False).eval()
    stack.load_state_dict(module_state_to_numpy(ref))
    m = randn(rng, (3, 3), dtype, 0.5)
    with torch.no_grad():
        r = ref(to_torch(x), mask=to_torch(m)).numpy()
    assert_close(stack(x, mask=m), r, dtype)
    with torch.no_grad():
        r = ref(to_torch(x[0]), mask=to_torch(m)).numpy()
    assert_close(stack(x[0], mask=m), r, dtype)


def test_torch_key_padding_masks_are_refused_naming_the_replacement(rng):
    """torch's src/tgt/memory_key_padding_mask (True = padding) were a bare "unexpected keyword
    argument" on every layer, stack and Transformer: now a TypeError naming the library's key mask
    and the inversion; the replacement gives torch's output for torch's mask."""
    d, h, f = 8, 2, 16
    x, mem = randn(rng, (2, 3, d)), randn(rng, (2, 4, d))
    pad3, pad4 = np.zeros((2, 3), bool), np.zeros((2, 4), bool)
    pad3[0, 2:] = pad4[1, 1:] = True
    enc, ref = make_pair(d, h, f, "relu", False, np.float32)
    dec = tc.nn.TransformerDecoderLayer(d, h, f)
    calls = {
        "encoder layer": lambda name, m: enc(x, **{name: m}),
        "encoder stack": lambda name, m: tc.nn.TransformerEncoder(enc, 2)(x, **{name: m}),
        "decoder layer": lambda name, m: dec(x, mem, **{name: m}),
        "decoder stack": lambda name, m: tc.nn.TransformerDecoder(dec, 2)(x, mem, **{name: m}),
        "transformer": lambda name, m: tc.nn.Transformer(d, h, 1, 1, f)(mem, x, **{name: m}),
    }
    names = {"encoder layer": ["src_key_padding_mask"], "encoder stack": ["src_key_padding_mask"],
             "decoder layer": ["tgt_key_padding_mask", "memory_key_padding_mask"],
             "decoder stack": ["tgt_key_padding_mask", "memory_key_padding_mask"],
             "transformer": ["src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask"]}
    for where, call in calls.items():
        for name in names[where]:
            replacement = name.replace("_padding", "")
            expected = (f"{name}: not supported (torch's True = padding, ignored); pass {replacement}=~{name} "
                        f"(True = a real token)")
            with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
                call(name, pad3)
            call(name, None)  # None (no mask, in both conventions) passes
    with torch.no_grad():
        torch_out = ref(to_torch(x), src_key_padding_mask=to_torch(pad3)).numpy()
    assert_close(enc(x, src_key_mask=~pad3), torch_out, np.float32, what="src_key_mask=~src_key_padding_mask")


def test_layer_constructors_name_torchs_positional_dropout():
    """torch's fourth positional argument of the encoder/decoder layers is dropout, this library's
    activation: a number there, a float or an int such as 0, says so (it was "activation: expected
    a str"; an int 0 still was). The position is read from torch's own signature."""
    import inspect

    for layer, ref in ((tc.nn.TransformerEncoderLayer, torch.nn.TransformerEncoderLayer),
                       (tc.nn.TransformerDecoderLayer, torch.nn.TransformerDecoderLayer)):
        assert list(inspect.signature(ref).parameters).index("dropout") == 3  # torch's fourth
        for value, got in ((0.1, "float 0.1"), (0, "int 0"), (np.int64(0), "int64 0"),
                           (np.float32(0.5), "float32 0.5")):
            expected = (f"activation: expected a str, got {got} (torch's fourth positional argument is dropout, "
                        f"this layer's is activation: pass dropout= by keyword)")
            with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
                layer(8, 2, 16, value)
        torch_layer = ref(8, 2, 16, 0)  # torch's positional call with an int dropout
        assert torch_layer.dropout1.p == 0
        ours = layer(8, 2, 16, dropout=0)  # the hint's call builds the layer
        assert ours.dropout == 0 and ours.activation == "relu"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_encoder_layer_takes_torchs_batch_first(rng, dtype):
    """torch's ``batch_first=True`` (its most common idiom) was an "unexpected keyword argument":
    it is this layer's one layout and gives torch's batch_first=True output; ``batch_first=False``
    is a ValueError whose advice (transpose in and out) gives torch's batch_first=False output."""
    t = TORCH_DTYPE[np.dtype(dtype)]
    ref = randomise_(torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True).to(t)).eval()
    ours = tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=dtype, batch_first=True)
    ours.load_state_dict(module_state_to_numpy(ref))
    x = randn(rng, (3, 5, 8), dtype)
    with torch.no_grad():
        r = ref(to_torch(x)).numpy()
    assert_close(ours(x), r, dtype, what="batch_first=True")
    with pytest.raises(ValueError, match=re.escape("batch_first: expected True, got False: this library's layers "
                                                   "take batch-first (N, L, E) inputs only")) as info:
        tc.nn.TransformerEncoderLayer(8, 2, 16, dtype=dtype, batch_first=False)
    assert "x.transpose(1, 0, 2)" in str(info.value)
    ref_seq_first = randomise_(torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=False).to(t)).eval()
    ours.load_state_dict(module_state_to_numpy(ref_seq_first))
    x_lne = randn(rng, (5, 3, 8), dtype)  # torch's default layout (L, N, E)
    with torch.no_grad():
        r = ref_seq_first(to_torch(x_lne)).numpy()
    assert_close(ours(x_lne.transpose(1, 0, 2)).transpose(1, 0, 2), r, dtype, what="the advice, transposed")
    with pytest.raises(TypeError, match="batch_first: expected a bool"):
        tc.nn.TransformerEncoderLayer(8, 2, 16, batch_first=1)


# ------------------------------------------------------------------- activation given as a callable
@pytest.mark.parametrize("make_activation, name", [
    (lambda: TF.relu, "relu"), (lambda: TF.gelu, "gelu"), (lambda: torch.nn.ReLU(), "relu"),
    (lambda: torch.nn.GELU(), "gelu"), (lambda: torch.nn.GELU(approximate="tanh"), "gelu_tanh"),
    (lambda: tc.functional.gelu, "gelu")], ids=["F.relu", "F.gelu", "nn.ReLU", "nn.GELU", "nn.GELU-tanh", "tc.gelu"])
def test_encoder_layer_takes_torch_activation_callables(rng, make_activation, name):
    """torch's layers take F.gelu, nn.GELU(), ... as activation: ours run the same function by name,
    and match torch's layer built with torch's callable of that function."""
    torch_activation = {"relu": TF.relu, "gelu": TF.gelu, "gelu_tanh": torch.nn.GELU(approximate="tanh")}[name]
    ref = make_torch_layer(12, 3, 20, torch_activation, False, np.float64)
    ours = tc.nn.TransformerEncoderLayer(12, 3, dim_feedforward=20, activation=make_activation(), dtype=np.float64)
    assert ours.activation == name
    ours.load_state_dict(module_state_to_numpy(ref))
    x = randn(rng, (2, 5, 12), np.float64)
    assert_close(ours(x), torch_layer(ref, x), np.float64, what=f"activation {name}")


def test_feed_forward_and_gated_take_callables_and_refuse_others():
    assert tc.nn.FeedForward(4, 8, activation=torch.nn.GELU()).activation == "gelu"
    assert tc.nn.GatedFeedForward(4, 8, activation=TF.silu).activation == "silu"
    assert tc.nn.Transformer(8, 2, 1, 1, 16, activation=TF.gelu).encoder.layers[0].activation == "gelu"
    # kept by its name where copies, pickles and the repr are built from: no torch object in them
    for m in (tc.nn.TransformerEncoderLayer(8, 2, 16, activation=torch.nn.GELU(approximate="tanh")),
              tc.nn.Transformer(8, 2, 1, 1, 16, activation=TF.gelu),
              tc.Seq2SeqTransformer(11, 13, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                    dim_feedforward=16, activation=TF.gelu)):
        assert b"torch" not in pickle.dumps(m), type(m).__name__
        assert "<" not in repr(m).splitlines()[0], repr(m)
    assert "activation='gelu_tanh'" in repr(tc.nn.TransformerEncoderLayer(8, 2, 16, activation=torch.nn.GELU("tanh")))
    for bad in (lambda t: t * 2, torch.nn.LeakyReLU(), torch.sigmoid):
        with pytest.raises(TypeError, match=r"activation: .*other callables cannot run in the C\+\+ layer"):
            tc.nn.TransformerEncoderLayer(8, 2, 16, activation=bad)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_encoder_stack_takes_torchs_nested_tensor_switches(rng, norm_first):
    """torch's ``TransformerEncoder(..., enable_nested_tensor=False, mask_check=False)`` (what its
    warning about pre-LN stacks advises) was a TypeError here. Both are taken, checked as bools,
    kept as attributes, and change nothing: with them the stack equals torch's regular path,
    padding rows included."""
    ours_layer, ref_layer = make_pair(16, 4, 24, "gelu", norm_first, np.float64)
    ours = tc.nn.TransformerEncoder(ours_layer, 2, enable_nested_tensor=False, mask_check=False)
    ref = torch.nn.TransformerEncoder(ref_layer, 2, enable_nested_tensor=False, mask_check=False).double().eval()
    ref.load_state_dict({k: to_torch(v) for k, v in ours.state_dict().items()})
    assert (ours.enable_nested_tensor, ours.mask_check) == (False, False)
    x = randn(rng, (3, 7, 16), np.float64)
    km = _padding(rng, 3, 7)
    with torch.no_grad():
        want = ref(to_torch(x), src_key_padding_mask=~to_torch(km)).numpy()
    np.testing.assert_allclose(ours(x, src_key_mask=km), want, atol=1e-10, rtol=0)
    default = tc.nn.TransformerEncoder(ours_layer, 2)
    assert (default.enable_nested_tensor, default.mask_check) == (True, True)  # torch's defaults
    np.testing.assert_array_equal(default(x, src_key_mask=km), ours(x, src_key_mask=km))
    for name in ("enable_nested_tensor", "mask_check"):
        with pytest.raises(TypeError, match=rf"^{name}: expected a bool, got str 'no'"):
            tc.nn.TransformerEncoder(ours_layer, 2, **{name: "no"})
    positional = tc.nn.TransformerEncoder(ours_layer, 2, None, False, False)  # torch takes them by position
    assert (positional.enable_nested_tensor, positional.mask_check) == (False, False)
