"""The numpy reference (transformer_core.reference) is itself checked against torch, then used as a
second oracle for the C++ layers and the real MiniLM checkpoint."""

import re

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import module_state_to_numpy, to_torch
from transformer_core import reference as ref


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_reference_encoder_layer_matches_torch_and_ours(norm_first, activation):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(12, 3, 19, dropout=0.0, activation=activation, batch_first=True,
                                             norm_first=norm_first).double().eval()
    state = module_state_to_numpy(layer)
    x = np.random.default_rng(0).standard_normal((3, 7, 12))
    key_mask = np.ones((3, 7), dtype=bool)
    key_mask[1, 4:] = False
    with torch.no_grad():
        expected = layer(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(~key_mask)).numpy()
    got = ref.encoder_layer(x, state, 3, activation=activation, norm_first=norm_first, key_mask=key_mask)
    np.testing.assert_allclose(got[key_mask], expected[key_mask], atol=1e-10)
    ours = tc.nn.TransformerEncoderLayer(12, 3, 19, activation=activation, norm_first=norm_first, dtype=np.float64)
    ours.load_state_dict(state)
    np.testing.assert_allclose(ours(x, src_key_mask=key_mask)[key_mask], got[key_mask], atol=1e-10)


@pytest.mark.parametrize("activation", ["silu", "rleu", "GELU"])
def test_reference_encoder_layer_refuses_an_activation_torch_refuses(activation):
    # any activation but "relu" used to become GELU silently; torch raises for these
    state = module_state_to_numpy(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).double())
    with pytest.raises(ValueError, match=f"activation: expected 'relu' or 'gelu', got '{activation}'"):
        ref.encoder_layer(np.zeros((1, 3, 8)), state, 2, activation=activation)


def test_reference_sdpa_fully_masked_row_is_zero():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 3))
    mask = rng.random((2, 5, 6)) > 0.4
    mask[0, 2] = False
    out, weights = ref.scaled_dot_product_attention(q, k, v, mask)
    assert np.all(out[0, 2] == 0) and np.all(weights[0, 2] == 0)
    ours, ours_w = tc.functional.scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    np.testing.assert_allclose(ours, out, atol=1e-10)
    np.testing.assert_allclose(ours_w, weights, atol=1e-10)


def test_reference_bert_matches_ours_on_minilm(tc_bert):
    from transformer_core.hub import load_safetensors, read_config, resolve_model_dir

    model_dir = resolve_model_dir("all-MiniLM-L6-v2")
    state = {k: v.astype(np.float64) for k, v in load_safetensors(model_dir).items() if v.dtype.kind == "f"}
    enc = tc.Tokenizer.from_pretrained("all-MiniLM-L6-v2").encode_batch(
        ["time flies like an arrow", "the reference is slow but simple"])
    hidden, pooled = ref.bert(enc["input_ids"], state, read_config(model_dir), enc["attention_mask"])
    out = tc_bert(enc["input_ids"], enc["attention_mask"])
    real = enc["attention_mask"].astype(bool)
    np.testing.assert_allclose(out.last_hidden_state[real], hidden[real], atol=1e-4)
    np.testing.assert_allclose(out.pooler_output, pooled, atol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-13)], ids=["fp32", "fp64"])
def test_reference_softmax_gelu_linear_match_torch_and_keep_the_dtype(dtype, tol):
    """The oracle's small functions against torch's, computed here: the documented shapes and dtype
    (float32 stays float32), an all -inf softmax slice gives zeros (torch: NaN), and an unknown
    ``approximate`` is refused as torch refuses it."""
    import torch.nn.functional as F

    rng = np.random.default_rng(3)
    x = (2 * rng.standard_normal((2, 5, 7))).astype(dtype)
    w, b = rng.standard_normal((4, 7)).astype(dtype), rng.standard_normal(4).astype(dtype)
    t = torch.from_numpy(x)
    for axis in (-1, 0, 1):
        got = ref.softmax(x, axis)
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_allclose(got, torch.softmax(t, axis).numpy(), rtol=tol, atol=tol)
    for approximate in ("none", "tanh"):
        got = ref.gelu(x, approximate)
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_allclose(got, F.gelu(t, approximate=approximate).numpy(), rtol=tol, atol=tol)
    for bias in (b, None):
        got = ref.linear(x, w, bias)
        assert got.dtype == dtype and got.shape == (2, 5, 4)
        expected = F.linear(t, torch.from_numpy(w), None if bias is None else torch.from_numpy(bias)).numpy()
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)
    masked = np.full((2, 3), -np.inf, dtype=dtype)
    masked[0] = [0.0, 1.0, -np.inf]
    got = ref.softmax(masked)
    assert np.all(got[1] == 0) and np.isnan(torch.softmax(torch.from_numpy(masked), -1).numpy()[1]).all()
    np.testing.assert_allclose(got[0], torch.softmax(torch.from_numpy(masked[0]), -1).numpy(), rtol=tol)
    with pytest.raises(ValueError, match=r"^approximate: expected 'none' or 'tanh', got 'erf'$"):
        ref.gelu(x, "erf")
    with pytest.raises(RuntimeError):
        F.gelu(t, approximate="erf")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_reference_gelu_of_integers_is_computed_in_float64(approximate):
    """The erf form rounded erf to x's integer dtype (``np.vectorize(otypes=[x.dtype])``): gelu([1, 2])
    gave [0.5, 1.0], and a list raised AttributeError. Integers and lists of them are computed in
    float64 in both forms, as torch's gelu of their float64 values (computed here)."""
    import torch.nn.functional as F

    for x in (np.array([-3, -1, 0, 1, 2], np.int64), np.array([1, 2], np.int32), np.array([7], np.uint8),
              [-3, -1, 0, 1, 2]):
        got = ref.gelu(x, approximate)
        expected = F.gelu(torch.tensor(np.asarray(x), dtype=torch.float64), approximate=approximate).numpy()
        assert got.dtype == np.float64 and got.shape == np.shape(x)
        np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-15)
    for bad, kind in ((np.array([True, False]), "bool"), (np.array([1j]), "complex128")):
        with pytest.raises(TypeError, match=rf"^x: expected real numbers \(float or integer\), got dtype {kind}$"):
            ref.gelu(bad, approximate)


def test_reference_sdpa_key_mask_forms_match_torch():
    """key_mask ``(S,)`` (shared by every row: it failed in numpy's reshape) and ``(N, S)`` (per batch
    entry, broadcast over the heads), bool or integer, with and without is_causal (top-left): the
    values of torch's SDPA with the equivalent boolean attn_mask, computed here."""
    import torch.nn.functional as F

    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 6, 4)), rng.standard_normal((2, 3, 6, 3))
    shared = np.array([True, False, True, True, False, True])
    per_batch = np.array([[True, True, True, False, False, True], [False, True, True, True, True, True]])
    causal = np.tril(np.ones((5, 6), bool))
    for key_mask, as_attn in ((shared, shared), (per_batch, per_batch[:, None, None, :])):
        for is_causal in (False, True):
            allowed = as_attn & causal if is_causal else as_attn
            expected = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                                      attn_mask=to_torch(np.broadcast_to(allowed, (2, 3, 5, 6))))
            for given in (key_mask, key_mask.astype(np.int8), key_mask.tolist()):
                out, weights = ref.scaled_dot_product_attention(q, k, v, key_mask=given, is_causal=is_causal)
                np.testing.assert_allclose(out, expected.numpy(), atol=1e-12)
                assert np.all(weights[..., ~np.broadcast_to(allowed, (2, 3, 5, 6))] == 0)
    # and the library's reading of the same (S,) mask
    ours = tc.functional.scaled_dot_product_attention(q, k, v, key_mask=shared)
    np.testing.assert_allclose(ours, ref.scaled_dot_product_attention(q, k, v, key_mask=shared)[0], atol=1e-12)


def test_reference_sdpa_refuses_int_attn_mask_and_bad_key_masks():
    """An integer attn_mask was added to the scores (0/1 read as a float mask, nothing masked); a
    float key_mask read as nonzero = real; a key_mask of another shape failed in numpy's reshape
    (or broadcast silently). Each is refused naming the argument, as the library refuses them."""
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 3))
    with pytest.raises(TypeError, match=r"^attn_mask: expected bool \(True = may attend\) or float \(added to the "
                                        r"scores\), got dtype int64$"):
        ref.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((5, 6), np.int64))
    with pytest.raises(TypeError, match=r"^key_mask: expected bool or integer .*got dtype float64$"):
        ref.scaled_dot_product_attention(q, k, v, key_mask=np.ones((2, 6)))
    for bad in (np.ones((2, 5), bool), np.ones((3, 6), bool), np.ones((2, 1, 6), bool), np.ones(5, bool)):
        with pytest.raises(ValueError, match=r"^key_mask: expected shape \(6,\) or \(2, 6\) \(key length 6\), "
                                             r"got " + re.escape(str(bad.shape)) + "$"):
            ref.scaled_dot_product_attention(q, k, v, key_mask=bad)
    with pytest.raises(ValueError, match=r"^key_mask: expected shape \(6,\) \(key length 6\), got \(1, 6\)$"):
        ref.scaled_dot_product_attention(q[0], k[0], v[0], key_mask=np.ones((1, 6), bool))  # 2-D q: (S,) only


def test_reference_bert_reads_hugging_faces_attention_mask():
    """ref.bert against Hugging Face's BertModel (a small random one, float64, computed here): its
    attention_mask is HF's 1 = real / 0 = padding, given as int, float or bool; the real rows and the
    pooler match. A 1-D input_ids is refused naming it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=12, type_vocab_size=2)
    torch.manual_seed(0)
    model = transformers.BertModel(config).double().eval()
    state = {name: t.numpy() for name, t in model.state_dict().items() if t.is_floating_point()}
    rng = np.random.default_rng(7)
    ids, types = rng.integers(0, 40, (2, 7)), rng.integers(0, 2, (2, 7))
    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         token_type_ids=torch.from_numpy(types))
    real = mask.astype(bool)
    for given in (mask, mask.astype(np.float32), real):
        hidden, pooled = ref.bert(ids, state, config.to_dict(), given, types)
        np.testing.assert_allclose(hidden[real], expected.last_hidden_state.numpy()[real], atol=1e-10)
        np.testing.assert_allclose(pooled, expected.pooler_output.numpy(), atol=1e-10)
    with pytest.raises(ValueError, match=r"^input_ids: expected \(N, L\) token ids, got shape \(7,\)$"):
        ref.bert(ids[0], state, config.to_dict())
