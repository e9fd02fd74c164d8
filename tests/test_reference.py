"""The numpy reference (transformer_core.reference) is itself checked against torch, then used as a
second oracle for the C++ layers and the real MiniLM checkpoint."""

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import module_state_to_numpy
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
