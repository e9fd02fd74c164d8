"""Training of whole models: the loss and every parameter's gradient against torch.autograd on the
same weights (transformers' GPT2LMHeadModel, LlamaForCausalLM and BertModel; a seq2seq model built
from torch.nn.Transformer), 20 AdamW steps with warmup + cosine and clipping against torch's, the
checkpoints (safetensors, loaded by transformers and back), and bad input.

Tolerances: gradients fp64 <= 1e-10 and fp32 <= 1e-4 relative (test_training_layers.assert_grad);
parameters after 20 optimizer steps fp64 <= 1e-9.

Hugging Face's causal-LM loss upcasts the logits to float32 even for a float64 model; the fp64
reference loss here is torch's cross_entropy on the float64 logits (the same formula: position t
predicts labels[t + 1], -100 ignored, mean over the rest). Its Llama computes RMSNorm and the RoPE
angles in float32 too: test_models_llama's ``_true_fp64`` computes them in float64.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import TORCH_DTYPE
from test_models_llama import _true_fp64
from test_training_layers import assert_grad
from transformer_core.decoder import positions_from_mask

transformers = pytest.importorskip("transformers")

V = 61


def _randomise(hf, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or ".ln_" in name or name.startswith("ln_") or "LayerNorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("weight") else 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return hf


def gpt2_pair(dtype, seed=0, **kw):
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=24, n_embd=16, n_layer=2, n_head=4, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager", **kw)
    hf = _randomise(transformers.GPT2LMHeadModel(cfg).to(TORCH_DTYPE[np.dtype(dtype)]), seed)
    ours = tc.GPT2LMHeadModel(tc.GPT2Config.from_dict(cfg.to_dict()), dtype=dtype)
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    return hf, ours


def llama_pair(dtype, tie, seed=0, num_key_value_heads=2):
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=num_key_value_heads,
                                   max_position_embeddings=32, rms_norm_eps=1e-5, tie_word_embeddings=tie,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                   attn_implementation="sdpa")
    hf = _randomise(transformers.LlamaForCausalLM(cfg).to(TORCH_DTYPE[np.dtype(dtype)]), seed)
    ours = tc.LlamaForCausalLM(tc.LlamaConfig.from_dict(cfg.to_dict()), dtype=dtype)
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    return hf, ours


def torch_causal_loss(hf, ids, labels, mask=None, positions=None):
    """HF's causal-LM loss in the logits' own dtype."""
    kw = {}
    if mask is not None:
        kw["attention_mask"] = torch.from_numpy(mask.astype(np.int64))
    if positions is not None:
        kw["position_ids"] = torch.from_numpy(positions)
    logits = hf(torch.from_numpy(ids), **kw).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(labels[:, 1:]).reshape(-1), ignore_index=-100)


def check_model_grads(ours, hf, dtype, rename=lambda n: n):
    grads = ours.gradients()
    names = []
    for name, p in hf.named_parameters():
        key = rename(name)
        names.append(key)
        if key.endswith("attention.self.key.bias") and dtype == np.float32:
            # zero in exact arithmetic (adding q·b to a whole row of scores leaves the softmax as it
            # is): both sides are float32 rounding noise
            assert np.abs(grads[key]).max() <= 1e-5 and np.abs(p.grad.numpy()).max() <= 1e-5, key
            continue
        assert_grad(grads.get(key), p.grad, dtype, key)
    assert sorted(grads) == sorted(names), "gradients of other names"


def batch(rng, N, L, padding=None):
    ids = rng.integers(0, V, (N, L))
    mask = np.ones((N, L), bool)
    if padding == "right":
        mask[0, L - 3:] = False
    elif padding == "left":
        mask[1, :4] = False
    labels = np.where(mask, ids, -100)
    if padding == "left":
        # the first real token is no target (the last padding position would predict it, from a row
        # that sees no key: zeros here, Hugging Face's eager mask gives it a uniform average instead)
        labels[1, 4] = -100
    return ids, mask, labels


# --------------------------------------------------------------------------------------------------
# GPT-2 and Llama against transformers
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("padding", [None, "right", "left"])
def test_gpt2_loss_and_gradients(rng, dtype, padding):
    hf, ours = gpt2_pair(dtype)
    ids, mask, labels = batch(rng, 3, 11, padding)
    # left padding: the positions counted over the real tokens (as HF's generate), passed to both
    positions = positions_from_mask(mask, 0) if padding == "left" else None
    ref = torch_causal_loss(hf, ids, labels, mask, positions)
    ref.backward()
    ours.train()
    loss = ours.loss(ids, labels, attention_mask=mask, position_ids=positions)
    assert abs(loss - ref.item()) <= (1e-12 if dtype == np.float64 else 1e-5)
    ours.backward()
    check_model_grads(ours, hf, dtype, lambda n: n.removeprefix("transformer."))
    ours.eval()
    assert abs(ours.loss(ids, labels, attention_mask=mask, position_ids=positions) - loss) <= (
        1e-12 if dtype == np.float64 else 1e-6)
    if padding == "left":  # no position_ids: 0 .. L-1 whatever the mask, HF's loss for the same arguments
        with torch.no_grad():
            default = torch_causal_loss(hf, ids, labels, mask).item()
        assert abs(ours.loss(ids, labels, attention_mask=mask) - default) <= (1e-12 if dtype == np.float64 else 1e-5)
        assert abs(default - ref.item()) > 1e-3  # the two positions differ


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("tie,kv", [(False, 2), (True, 2), (True, 1)], ids=["gqa_untied", "gqa_tied", "mqa_tied"])
def test_llama_loss_and_gradients(rng, dtype, tie, kv):
    hf, ours = llama_pair(dtype, tie, num_key_value_heads=kv)
    ids, mask, labels = batch(rng, 2, 13, "right")
    with _true_fp64():
        ref = torch_causal_loss(hf, ids, labels, mask)
        ref.backward()
    ours.train()
    loss = ours.loss(ids, labels, attention_mask=mask)
    assert abs(loss - ref.item()) <= (1e-12 if dtype == np.float64 else 1e-5)
    ours.backward()
    check_model_grads(ours, hf, dtype)


def test_training_loss_is_the_inference_forward(rng):
    """The training forward gives the eval forward's hidden states: the loss of the eval logits."""
    _, ours = gpt2_pair(np.float32)
    ids, mask, labels = batch(rng, 2, 9, "right")
    logits = ours(ids, attention_mask=mask).logits
    expected = tc.functional.cross_entropy(logits[:, :-1], labels[:, 1:])
    ours.train()
    assert abs(ours.loss(ids, labels, attention_mask=mask) - float(expected)) < 1e-5


def test_left_padding_equals_unpadded(rng):
    """A left-padded sequence gets the gradients of the same sequence alone, given the positions
    counted over its real tokens (position_ids=positions_from_mask(mask, 0), as HF's generate)."""
    _, a = gpt2_pair(np.float64)
    _, b = gpt2_pair(np.float64)
    a.train()
    b.train()
    ids = rng.integers(0, V, (1, 7))
    padded = np.concatenate([np.zeros((1, 3), np.int64), ids], axis=1)
    mask = np.concatenate([np.zeros((1, 3), bool), np.ones((1, 7), bool)], axis=1)
    labels = np.where(mask, padded, -100)
    labels[0, 3] = -100  # the first token is no target unpadded either
    la = a.loss(padded, labels, attention_mask=mask, position_ids=positions_from_mask(mask, 0))
    a.backward()
    lb = b.loss(ids, ids)
    b.backward()
    assert abs(la - lb) < 1e-12
    ga, gb = a.gradients(), b.gradients()
    for name in gb:
        np.testing.assert_allclose(ga[name], gb[name], atol=1e-12, err_msg=name)


def test_gradient_accumulation_over_micro_batches(rng):
    """Two micro-batches, each loss scaled by 1/2 (as a training loop does), add up to the gradient of
    the mean of the two losses; zero_grad starts over."""
    hf, ours = gpt2_pair(np.float64)
    ids, _, labels = batch(rng, 4, 9)
    ref = (torch_causal_loss(hf, ids[:2], labels[:2]) + torch_causal_loss(hf, ids[2:], labels[2:])) / 2
    ref.backward()
    ours.train()
    for sl in (slice(0, 2), slice(2, 4)):
        ours.loss(ids[sl], labels[sl])
        ours.backward()
    half = {k: v / 2 for k, v in ours.gradients().items()}
    for name, p in hf.named_parameters():
        assert_grad(half[name.removeprefix("transformer.")], p.grad, np.float64, name)
    ours.zero_grad()
    assert ours.gradients() == {}
    assert all(p.grad is None for p in ours.parameters())


@pytest.mark.parametrize("set_to_none", [True, False])
def test_optimizer_zero_grad_clears_fused_weights_whole(rng, set_to_none):
    """Llama stores q/k/v (and gate/up) as rows of one matrix with one gradient buffer. The
    optimizer's zero_grad clears parameter by parameter: k_proj, v_proj and up_proj kept the last
    step's gradient under a flag that said "unwritten", and the next backward added to it (0.26 off
    on v_proj). The second batch's gradients must be HF's for that batch alone."""
    hf, ours = llama_pair(np.float64, tie=False)
    ids, _, labels = batch(rng, 4, 9)
    ours.train()
    opt = tc.optim.SGD(ours.named_parameters(), lr=0.0)  # no update: HF's weights stay ours
    for sl in (slice(0, 2), slice(2, 4)):
        opt.zero_grad(set_to_none=set_to_none)
        ours.loss(ids[sl], labels[sl])
        ours.backward()
    with _true_fp64():
        torch_causal_loss(hf, ids[2:], labels[2:]).backward()
    check_model_grads(ours, hf, np.float64)


def _causal_pair(arch, tie, dtype=np.float64):
    """(hf, ours, hf name -> our name) of a GPT-2 (tied) or Llama pair (the head tied or not)."""
    if arch == "gpt2":  # (GPT-2's head is always tied)
        hf, ours = gpt2_pair(dtype)
        return hf, ours, lambda n: n.removeprefix("transformer.")
    hf, ours = llama_pair(dtype, tie)
    return hf, ours, lambda n: n


def _hf_grads(hf, ids, labels, rename):
    """{our name: torch's gradient} of HF's causal-LM loss on (ids, labels) (fp64, from zero)."""
    hf.zero_grad(set_to_none=True)
    with _true_fp64():
        torch_causal_loss(hf, ids, labels).backward()
    return {rename(n): p.grad.clone() for n, p in hf.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch,tie", [("gpt2", True), ("llama", True), ("llama", False)],
                         ids=["gpt2", "llama_tied", "llama_untied"])
def test_loss_without_backward_touches_no_gradient(rng, arch, tie):
    """A training loss keeps what backward needs and touches no gradient, the LM head's included
    (tied to the embedding or not): loss(A); loss(B); backward() gives B's gradients alone, a loss
    after a backward leaves the accumulated gradients as they were until its own backward adds,
    and eval() (or a non-finite loss) drops a pending head gradient."""
    hf, ours, rename = _causal_pair(arch, tie)
    head = "wte.weight" if arch == "gpt2" else "model.embed_tokens.weight" if tie else "lm_head.weight"
    assert head in ours.state_dict()
    (ids_a, _, lab_a), (ids_b, _, lab_b) = batch(rng, 2, 9), batch(rng, 3, 7)
    grad_a, grad_b = _hf_grads(hf, ids_a, lab_a, rename), _hf_grads(hf, ids_b, lab_b, rename)
    ours.train()
    ours.loss(ids_a, lab_a)
    assert ours.gradients() == {}
    assert all(p.grad is None for p in ours.parameters())
    assert all(np.all(p._impl.gradient_view(p._core_name) == 0) for p in ours.parameters())
    ours.loss(ids_b, lab_b)  # replaces A's training state: A leaves nothing behind
    assert ours.gradients() == {}
    ours.backward()
    grads = ours.gradients()
    assert sorted(grads) == sorted(grad_b)
    for name, ref in grad_b.items():
        assert_grad(grads[name], ref, np.float64, name)
    # accumulation: a loss after a backward leaves the gradients alone; its backward adds
    ours.loss(ids_a, lab_a)
    for name, value in ours.gradients().items():
        np.testing.assert_array_equal(value, grads[name], err_msg=name)
    ours.backward()
    total = ours.gradients()
    for name in grad_b:
        assert_grad(total[name], grad_a[name] + grad_b[name], np.float64, name)
    # eval() drops the pending head gradient; so does a new loss after zero_grad
    ours.zero_grad()
    ours.loss(ids_a, lab_a)
    ours.eval()
    assert ours.gradients() == {}
    ours.train()
    with pytest.raises(tc.NoTrainingStateError):
        ours.backward()
    assert ours.gradients() == {}
    # zero_grad between the loss and its backward (torch allows it): the gradient of that loss
    ours.loss(ids_b, lab_b)
    ours.zero_grad()
    ours.backward()
    for name, ref in grad_b.items():
        assert_grad(ours.gradients()[name], ref, np.float64, name)


@pytest.mark.parametrize("arch,tie", [("gpt2", True), ("llama", True), ("llama", False)],
                         ids=["gpt2", "llama_tied", "llama_untied"])
def test_loss_with_no_counted_label_gives_every_parameter_a_zero_gradient(rng, arch, tie):
    """Every label ignored (-100): the loss is 0 and backward gives every parameter a gradient of
    zeros, the LM head's included, as torch's (sum / max(count, 1)); the untied head's was left
    None, so an optimizer skipped it for that step while momentum and decay moved the rest."""
    hf, ours, rename = _causal_pair(arch, tie)
    ids, _, labels = batch(rng, 2, 7)
    labels = np.full_like(labels, -100)
    hf.zero_grad(set_to_none=True)  # torch: sum / max(count, 1), a loss of 0 and every gradient zeros
    logits = hf(torch.from_numpy(ids)).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), torch.from_numpy(labels[:, 1:]).reshape(-1),
                                      ignore_index=-100, reduction="sum").backward()
    expected = {rename(n) for n, p in hf.named_parameters() if p.grad is not None and not p.grad.any()}
    assert expected == {rename(n) for n, _ in hf.named_parameters()}
    ours.train()
    assert ours.loss(ids, labels) == 0.0
    ours.backward()
    grads = ours.gradients()
    assert set(grads) == expected
    assert all(p.grad is not None for p in ours.parameters())
    for name, value in grads.items():
        np.testing.assert_array_equal(value, 0, err_msg=name)
    # and after a real step the head's gradient is that step's alone (nothing stale became written)
    ours.zero_grad()
    _, _, real = batch(rng, 2, 7)
    reference = _hf_grads(hf, ids, real, rename)
    ours.loss(ids, labels)
    ours.backward()
    ours.loss(ids, real)
    ours.backward()
    for name, ref in reference.items():
        assert_grad(ours.gradients()[name], ref, np.float64, name)


def _attention_dropout_models():
    """(model, field) of a BERT, a GPT-2 and a Llama model whose config asks for attention dropout."""
    small = dict(vocab_size=13, num_attention_heads=2, max_position_embeddings=16)
    yield tc.BertModel(tc.BertConfig(**small, hidden_size=8, num_hidden_layers=1, intermediate_size=16,
                                     attention_probs_dropout_prob=0.1)), "attention_probs_dropout_prob"
    yield tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=13, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                           attn_pdrop=0.1)), "attn_pdrop"
    yield tc.LlamaForCausalLM(tc.LlamaConfig(**small, hidden_size=8, num_hidden_layers=1, intermediate_size=16,
                                             attention_dropout=0.1)), "attention_dropout"


def test_attention_dropout_of_a_config_is_applied_without_a_warning():
    """A config's attention-probability dropout applies in training (it used to be skipped with a
    warning): no warning, and the training output differs from the eval one while a seed fixes it
    (tests/test_attention_dropout.py checks the values and gradients)."""
    ids = np.arange(10).reshape(2, 5)
    for model, field in _attention_dropout_models():
        # BERT's training forward; a causal LM's training call is its loss (its forward is inference)
        def call():
            """The model's training call (BERT's forward, a causal LM's loss) after manual_seed(1)."""
            tc.manual_seed(1)
            return (model(ids).last_hidden_state if isinstance(model, tc.BertModel)
                    else np.asarray(model.loss(ids, ids)))
        plain = call()
        model.train()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dropped = call()
        assert not np.array_equal(dropped, plain), field
        np.testing.assert_array_equal(call(), dropped)


def test_interleaved_llama_speaks_hf_row_order(rng, tmp_path):
    """A Llama of rope_layout="interleaved" holds its q/k rows in Meta's order; every public view
    still speaks Hugging Face's: gradients() against HF's autograd (fp64), the parameters' layout
    maps (to_checkpoint_layout of data / grad = state_dict / gradients), the AdamW moments that
    save_checkpoint writes against torch's AdamW, and load_checkpoint into either layout resumes
    the same training."""
    from safetensors.numpy import load_file

    hf, half = llama_pair(np.float64, tie=False)
    cfg = half.config
    ours = tc.LlamaForCausalLM(cfg, dtype=np.float64, rope_layout="interleaved")
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    ids, mask, labels = batch(rng, 2, 13, "right")
    with _true_fp64():
        ref = torch_causal_loss(hf, ids, labels, mask)
        ref.backward()
    ours.train()
    assert abs(ours.loss(ids, labels, attention_mask=mask) - ref.item()) <= 1e-12
    ours.backward()
    check_model_grads(ours, hf, np.float64)
    q, k = "model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    params = dict(ours.named_parameters())
    assert params[q].row_permutation is not None and not params[q].checkpoint_layout
    assert params["model.layers.0.self_attn.v_proj.weight"].row_permutation is None
    state, grads = ours.state_dict(), ours.gradients()
    for name in (q, k):
        p = params[name]
        assert not np.array_equal(p.data, state[name])  # the model's own order ...
        np.testing.assert_array_equal(p.to_checkpoint_layout(p.data), state[name])  # ... mapped
        np.testing.assert_array_equal(p.to_checkpoint_layout(p.grad), grads[name])
        np.testing.assert_array_equal(p.from_checkpoint_layout(grads[name]), p.grad)
    # one AdamW step on each side: the weights and the saved moments are torch's
    hp = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt = tc.optim.AdamW(ours.named_parameters(), **hp)
    opt.step()
    opt_t = torch.optim.AdamW(hf.parameters(), **hp)
    opt_t.step()
    state = ours.state_dict()
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(state[name], p.detach().numpy(), atol=1e-10, rtol=0, err_msg=name)
    tc.training.save_checkpoint(tmp_path, ours, opt)
    saved = load_file(str(tmp_path / "optimizer.safetensors"))
    for name, p in hf.named_parameters():
        for field in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(saved[f"state.{name}.{field}"], opt_t.state[p][field].numpy(), atol=1e-10,
                                       rtol=0, err_msg=f"{name}.{field}")
    # load_checkpoint back into the model's own layout, and into a half-layout model: the next step
    # (same batch) lands on the same weights from both, and on torch's
    resumed = {}
    for layout in ("interleaved", "half"):
        model = tc.LlamaForCausalLM(cfg, dtype=np.float64, rope_layout=layout).train()
        o = tc.optim.AdamW(model.named_parameters(), **hp)
        tc.training.load_checkpoint(tmp_path, model, o)
        if layout == "interleaved":
            for name, p in model.named_parameters():
                for field in ("exp_avg", "exp_avg_sq"):
                    np.testing.assert_array_equal(o.state[name][field], opt.state[name][field], err_msg=name)
        model.loss(ids, labels, attention_mask=mask)
        model.backward()
        o.step()
        resumed[layout] = model.state_dict()
    hf.zero_grad()
    with _true_fp64():
        torch_causal_loss(hf, ids, labels, mask).backward()
    opt_t.step()
    for name, p in hf.named_parameters():
        for layout, st in resumed.items():
            np.testing.assert_allclose(st[name], p.detach().numpy(), atol=1e-10, rtol=0, err_msg=f"{layout} {name}")


def test_interleaved_llama_initial_weights_are_the_half_layouts(rng):
    """A freshly built model's weights (seeded init) do not depend on the order it holds q/k rows in."""
    cfg = tc.LlamaConfig(vocab_size=V, hidden_size=24, intermediate_size=40, num_hidden_layers=1,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32)
    tc.manual_seed(0)
    a = tc.LlamaForCausalLM(cfg, dtype=np.float64).state_dict()
    tc.manual_seed(0)
    b = tc.LlamaForCausalLM(cfg, dtype=np.float64, rope_layout="interleaved").state_dict()
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("value", ["False", "True", 0, 1, None])
def test_llama_from_pretrained_quantize_activations_must_be_a_bool(tmp_path, value):
    """quantize_activations is a flag: a string ("False" is truthy) or a number is a TypeError, for
    a GGUF file as for a directory; True / False load."""
    from gguf_fakes import random_llama_state, write_llama_gguf

    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, random_llama_state(np.random.default_rng(0)), ggml_type="Q8_0")
    for where in (path, tmp_path):
        with pytest.raises(TypeError, match=r"^quantize_activations: expected a bool, got"):
            tc.LlamaForCausalLM.from_pretrained(where, quantize_activations=value)
    ids = np.array([[1, 5, 7, 3]])
    on = tc.LlamaForCausalLM.from_pretrained(path, quantize_activations=True)
    off = tc.LlamaForCausalLM.from_pretrained(path, quantize_activations=False)
    assert on.weight_formats()["model.layers.0.mlp.up_proj.weight"] == "Q8_0"
    assert np.isfinite(on(ids).logits).all() and np.isfinite(off(ids).logits).all()


# --------------------------------------------------------------------------------------------------
# BERT fine-tuning
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_bert_gradients(rng, dtype):
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=24, max_position_embeddings=20, type_vocab_size=2,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  attn_implementation="eager")
    hf = _randomise(transformers.BertModel(cfg).to(TORCH_DTYPE[np.dtype(dtype)]), 3)
    ours = tc.BertModel(tc.BertConfig.from_dict(cfg.to_dict()), dtype=dtype)
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    N, L = 3, 9
    ids = rng.integers(0, V, (N, L))
    tt = rng.integers(0, 2, (N, L))
    mask = np.ones((N, L), bool)
    mask[1, 6:] = False
    mask[2, 3:] = False
    g = rng.standard_normal((N, L, 16)).astype(dtype) * mask[..., None]  # a loss over the real tokens
    gp = rng.standard_normal((N, 16)).astype(dtype)
    out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
             token_type_ids=torch.from_numpy(tt))
    ((out.last_hidden_state * torch.from_numpy(g)).sum() + (out.pooler_output * torch.from_numpy(gp)).sum()).backward()
    ours.train()
    res = ours(ids, attention_mask=mask, token_type_ids=tt)
    real = mask
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(res.last_hidden_state[real], out.last_hidden_state.detach().numpy()[real], atol=tol)
    assert np.all(res.last_hidden_state[~real] == 0), "padding rows are zeros, as in eval mode"
    ours.backward(g, gp)
    check_model_grads(ours, hf, dtype)
    # no pooler gradient: the pooler's gradients stay None (unwritten), as torch leaves them
    ours.zero_grad()
    ours(ids, attention_mask=mask, token_type_ids=tt)
    ours.backward(g)
    assert not any(k.startswith("pooler.") for k in ours.gradients())
    with pytest.raises(tc.NoTrainingStateError):
        ours.backward(g)


def _bert_pair(dtype, seed=3):
    cfg = transformers.BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=24, max_position_embeddings=20, type_vocab_size=2,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
                                  attn_implementation="eager")
    hf = _randomise(transformers.BertModel(cfg).to(TORCH_DTYPE[np.dtype(dtype)]), seed)
    ours = tc.BertModel(tc.BertConfig.from_dict(cfg.to_dict()), dtype=dtype)
    ours.load_state_dict({k: v.detach().numpy() for k, v in hf.state_dict().items()})
    return hf, ours


def _assert_close(ours, ref, dtype, what):
    """|ours - ref| <= tol · max(1, max|ref|): fp32 1e-5, fp64 1e-10."""
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert ours is not None, f"{what}: none"
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-10
    err = float(np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max(initial=0.0))
    assert err <= tol * max(1.0, float(np.abs(ref).max(initial=0.0))), f"{what}: max error {err:.3g}"


# Each row's mask: right padding, left padding, holes with position 0 masked, one real token at the
# end, no padding.
_POSITION_0_MASKS = np.array([[1, 1, 1, 1, 1, 0, 0, 0],
                              [0, 0, 0, 1, 1, 1, 1, 1],
                              [0, 1, 0, 1, 1, 0, 1, 1],
                              [0, 0, 0, 0, 0, 0, 0, 1],
                              [1, 1, 1, 1, 1, 1, 1, 1]], bool)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_bert_training_pools_position_0_where_it_is_padding(rng, dtype):
    """Where position 0 is padding (left padding, a hole there, one real token at the end), the
    training forward's pooler reads position 0's state as transformers computes it (its attention
    over the row's real tokens), as the eval forward does, and the backward carries the pooler's
    gradient through that padding query: pooler_output, the real tokens' states and every
    parameter's gradient match transformers' BertModel in train mode (dropout 0) with a loss over
    pooler_output and the real tokens' last_hidden_state."""
    hf, ours = _bert_pair(dtype)
    mask = _POSITION_0_MASKS
    N, L = mask.shape
    ids = np.where(mask, rng.integers(1, V, (N, L)), 0)  # padding holds pad_token_id (no word gradient)
    tt = rng.integers(0, 2, (N, L))
    g = rng.standard_normal((N, L, 16)).astype(dtype) * mask[..., None]  # a loss over the real tokens
    gp = rng.standard_normal((N, 16)).astype(dtype)
    hf.train()
    out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
             token_type_ids=torch.from_numpy(tt))
    ((out.last_hidden_state * torch.from_numpy(g)).sum() + (out.pooler_output * torch.from_numpy(gp)).sum()).backward()
    ours.train()
    res = ours(ids, attention_mask=mask, token_type_ids=tt)
    _assert_close(res.pooler_output, out.pooler_output, dtype, "pooler_output")
    _assert_close(res.last_hidden_state[mask], out.last_hidden_state.detach().numpy()[mask], dtype,
                  "last_hidden_state")
    assert np.all(res.last_hidden_state[~mask] == 0), "padding rows are zeros, as in eval mode"
    ours.backward(g, gp)
    grads = ours.gradients()
    names = [name for name, _ in hf.named_parameters()]
    assert sorted(grads) == sorted(names)
    for name, p in hf.named_parameters():
        _assert_close(grads[name], p.grad, dtype, name)
    # the same outputs as the eval forward
    ours.eval()
    ev = ours(ids, attention_mask=mask, token_type_ids=tt)
    _assert_close(res.pooler_output, ev.pooler_output, dtype, "train vs eval pooler_output")
    _assert_close(res.last_hidden_state, ev.last_hidden_state, dtype, "train vs eval last_hidden_state")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_bert_training_row_of_padding_only(rng, dtype):
    """A row of padding only has no state in training as in eval: its hidden states are zeros and
    its pooler output tanh(pooler.dense.bias) (transformers' eager and SDPA attentions give two
    other values there); its pooler gradient reaches pooler.dense.bias only. The other rows and
    every other gradient match transformers."""
    hf, ours = _bert_pair(dtype, seed=5)
    mask = _POSITION_0_MASKS.copy()
    mask[3] = False
    N, L = mask.shape
    ids = np.where(mask, rng.integers(1, V, (N, L)), 0)
    g = rng.standard_normal((N, L, 16)).astype(dtype) * mask[..., None]
    gp = rng.standard_normal((N, 16)).astype(dtype)
    keep = torch.from_numpy(mask.any(axis=1).astype(np.float64)).to(TORCH_DTYPE[np.dtype(dtype)])[:, None]
    hf.train()
    out = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)))
    loss = (out.last_hidden_state * torch.from_numpy(g)).sum() + (out.pooler_output * torch.from_numpy(gp) * keep).sum()
    loss.backward()
    ours.train()
    res = ours(ids, attention_mask=mask)
    bias = hf.pooler.dense.bias.detach().numpy()
    _assert_close(res.pooler_output[3], np.tanh(bias), dtype, "padding-only pooler_output")
    assert np.all(res.last_hidden_state[3] == 0)
    real = [0, 1, 2, 4]
    _assert_close(res.pooler_output[real], out.pooler_output.detach().numpy()[real], dtype, "pooler_output")
    _assert_close(res.last_hidden_state[mask], out.last_hidden_state.detach().numpy()[mask], dtype,
                  "last_hidden_state")
    ours.backward(g, gp)
    grads = ours.gradients()
    for name, p in hf.named_parameters():
        ref = p.grad.detach().numpy()
        if name == "pooler.dense.bias":  # tanh(0 · Wᵀ + b): d b = gp · (1 - tanh²(b)), nothing else
            ref = ref + gp[3] * (1 - np.tanh(bias) ** 2)
        _assert_close(grads[name], ref, dtype, name)
    ours.eval()
    ev = ours(ids, attention_mask=mask)
    _assert_close(res.pooler_output, ev.pooler_output, dtype, "train vs eval pooler_output")


# --------------------------------------------------------------------------------------------------
# The seq2seq Transformer against torch.nn.Transformer + embeddings + Linear
# --------------------------------------------------------------------------------------------------

class TorchSeq2Seq(torch.nn.Module):
    """PyTorch's translation tutorial's Seq2SeqTransformer, batch-first, dropout 0."""

    def __init__(self, src_vocab, tgt_vocab, d_model, nhead, n_enc, n_dec, dff, norm_first):
        super().__init__()
        self.transformer = torch.nn.Transformer(d_model, nhead, n_enc, n_dec, dff, dropout=0.0, batch_first=True,
                                                norm_first=norm_first)
        self.src_tok_emb = torch.nn.Embedding(src_vocab, d_model)
        self.tgt_tok_emb = torch.nn.Embedding(tgt_vocab, d_model)
        self.generator = torch.nn.Linear(d_model, tgt_vocab)
        self.d_model = d_model

    def forward(self, src, tgt, src_key_mask):
        pe = torch.from_numpy(tc.positional.sinusoidal_positional_encoding(64, self.d_model, dtype=np.float64))
        pe = pe.to(self.generator.weight.dtype)
        x = self.src_tok_emb(src) * math.sqrt(self.d_model) + pe[:src.shape[1]]
        y = self.tgt_tok_emb(tgt) * math.sqrt(self.d_model) + pe[:tgt.shape[1]]
        T = tgt.shape[1]
        causal = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)
        kpm = torch.zeros(src_key_mask.shape, dtype=x.dtype).masked_fill(~src_key_mask, float("-inf"))
        out = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=kpm, memory_key_padding_mask=kpm,
                               tgt_is_causal=True)
        return self.generator(out)

    # the tutorial's encode / decode (no padding), for its greedy_decode
    def _embed(self, table, ids):
        pe = torch.from_numpy(tc.positional.sinusoidal_positional_encoding(64, self.d_model, dtype=np.float64))
        return table(ids) * math.sqrt(self.d_model) + pe.to(self.generator.weight.dtype)[:ids.shape[1]]

    def encode(self, src):
        return self.transformer.encoder(self._embed(self.src_tok_emb, src))

    def decode(self, tgt, memory):
        causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=memory.dtype)
        return self.transformer.decoder(self._embed(self.tgt_tok_emb, tgt), memory, tgt_mask=causal,
                                        tgt_is_causal=True)


def tutorial_greedy_decode(model, src, max_len, start_symbol, eos_idx):
    """PyTorch's translation tutorial's greedy_decode (one sequence), batch-first: its ys is (T, 1),
    here (1, T). Its loop runs max_len - 1 times: max_len tokens at most, the start symbol included."""
    memory = model.encode(src)
    ys = torch.ones(1, 1).fill_(start_symbol).type(torch.long)
    for _ in range(max_len - 1):
        out = model.decode(ys, memory)
        prob = model.generator(out[:, -1])
        _, next_word = torch.max(prob, dim=1)
        next_word = next_word.item()
        ys = torch.cat([ys, torch.ones(1, 1).type_as(src.data).fill_(next_word)], dim=1)
        if next_word == eos_idx:
            break
    return ys


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_seq2seq_transformer(rng, dtype, norm_first):
    args = (13, 11, 8, 2, 2, 2, 16, norm_first)
    ref = TorchSeq2Seq(*args).to(TORCH_DTYPE[np.dtype(dtype)])
    _randomise(ref, 5)
    ours = tc.Seq2SeqTransformer(13, 11, d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                 dim_feedforward=16, norm_first=norm_first, max_len=64, dtype=dtype)
    ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    N, S, T = 3, 7, 6
    src, tgt = rng.integers(0, 13, (N, S)), rng.integers(0, 11, (N, T))
    src_key = np.ones((N, S), bool)
    src_key[1, 5:] = False
    labels = rng.integers(0, 11, (N, T))
    labels[2, 4:] = -100
    logits = ref(torch.from_numpy(src), torch.from_numpy(tgt), torch.from_numpy(src_key))
    lt = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), torch.from_numpy(labels).reshape(-1))
    lt.backward()
    ours.train()
    loss = ours.loss(src, tgt, labels, src_key_mask=src_key)
    assert abs(loss - lt.item()) <= (1e-12 if dtype == np.float64 else 1e-5)
    ours.backward()
    check_model_grads(ours, ref, dtype)
    ours.eval()
    np.testing.assert_allclose(ours(src, tgt, src_key_mask=src_key), logits.detach().numpy(),
                               atol=1e-4 if dtype == np.float32 else 1e-10)
    ys = ours.greedy_decode(src, 4, start_token=1, src_key_mask=src_key)
    assert ys.shape == (N, 4) and np.all(ys[:, 0] == 1)  # max_len counts the start token


def test_seq2seq_greedy_decode_is_the_tutorials(rng):
    """greedy_decode(max_len) against the translation tutorial's loop on the same weights: at most
    max_len tokens, the start token included (it returned max_len + 1), the same ids, the same stop
    at the end token; batched rows are the tutorial's, padded with the end token."""
    ref = _randomise(TorchSeq2Seq(13, 11, 8, 2, 2, 2, 16, False), 1).double().eval()  # (seed 1: varied ids)
    ours = tc.Seq2SeqTransformer(13, 11, d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                 dim_feedforward=16, max_len=64, dtype=np.float64).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    srcs = rng.integers(0, 13, (4, 5))
    with torch.no_grad():
        for src in srcs:
            for max_len in (1, 2, 6, 12):
                want = tutorial_greedy_decode(ref, torch.from_numpy(src[None]), max_len, 1, None).numpy()
                assert want.shape == (1, max_len)
                np.testing.assert_array_equal(ours.greedy_decode(src[None], max_len, 1), want)
            # an end token the sequence emits at its 3rd step: both stop there, end token included
            eos = int(want[0, 3])
            stop = tutorial_greedy_decode(ref, torch.from_numpy(src[None]), 12, 1, eos).numpy()
            assert stop.shape[1] <= 4 and stop[0, -1] == eos
            np.testing.assert_array_equal(ours.greedy_decode(src[None], 12, 1, eos), stop)
        eos = int(tutorial_greedy_decode(ref, torch.from_numpy(srcs[:1]), 4, 1, None)[0, 3])  # row 0 stops
        rows = [tutorial_greedy_decode(ref, torch.from_numpy(src[None]), 9, 1, eos).numpy()[0] for src in srcs]
    assert len({len(r) for r in rows}) > 1  # rows that stop at different steps: the padding is exercised
    batched = ours.greedy_decode(srcs, 9, 1, eos)
    assert batched.shape == (4, max(len(r) for r in rows)) and batched.shape[1] <= 9
    for row, want in zip(batched, rows):
        np.testing.assert_array_equal(row[:len(want)], want)
        assert np.all(row[len(want):] == eos)


def test_seq2seq_greedy_decode_checks_its_arguments_first(rng):
    """end_token and max_len are checked before anything is decoded (a float end_token came back as a
    float64 result; max_len over the model's failed after decoding, naming tgt)."""
    m = tc.Seq2SeqTransformer(10, 12, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=16, max_len=6)
    m.eval()
    src = np.array([[1, 2, 3, 4]])
    for end, err, match in [(1.5, TypeError, "end_token"), (-5, ValueError, "end_token"),
                            (12, ValueError, r"end_token: expected an id in \[0, 12\), got 12"),
                            ("a", TypeError, "end_token")]:
        with pytest.raises(err, match=match):
            m.greedy_decode(src, 3, 1, end)
    with pytest.raises(ValueError, match=r"^max_len: expected <= the model's max_len \(6\)"):
        m.greedy_decode(src, 7, 1)
    with pytest.raises(ValueError, match=r"^max_len: expected an int in \[1, "):
        m.greedy_decode(src, 0, 1)
    ys = m.greedy_decode(src, 6, 1, 11)
    assert ys.dtype == np.int64 and ys.shape[0] == 1 and 2 <= ys.shape[1] <= 6
    np.testing.assert_array_equal(m.greedy_decode(src, 1, 4), [[4]])  # the start token alone


def test_seq2seq_backward_takes_the_forwards_dropout(rng):
    """The embeddings' dropout of the backward is the forward's (its p and seed), also when dropout
    is changed between loss and backward (a schedule updated after the loss): it read the new p,
    rescaling by 1/(1 - p_new) with another mask, and the embeddings' gradients were wrong."""
    src, tgt, lab = rng.integers(0, 13, (3, 7)), rng.integers(0, 11, (3, 6)), rng.integers(0, 11, (3, 6))
    m = tc.Seq2SeqTransformer(13, 11, d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=24, dropout=0.3, max_len=32, dtype=np.float64).train()
    tc.manual_seed(1)
    m.loss(src, tgt, lab)
    m.backward()
    ref = m.gradients()
    m.zero_grad()
    tc.manual_seed(1)
    m.loss(src, tgt, lab)
    m.dropout = 0.5
    m.backward()
    got = m.gradients()
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)


def test_losses_and_the_clipped_norm_have_torchs_item(rng):
    """A ported loop's loss.item() and clip_grad_norm_(...).item() run (torch returns 0-d tensors);
    the values are still floats."""
    m = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2)).train()
    loss = m.loss(np.arange(8)[None], np.arange(8)[None])
    m.backward()
    total = tc.optim.clip_grad_norm_(m.parameters(), 1.0)
    s2s = tc.Seq2SeqTransformer(13, 11, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                dim_feedforward=16, max_len=8).train()
    ids = rng.integers(1, 11, (2, 5))
    for value in (loss, total, s2s.loss(ids, ids, ids), tc.optim.clip_grad_norm_([], 1.0)):
        assert isinstance(value, float) and type(value.item()) is float and value.item() == value


# --------------------------------------------------------------------------------------------------
# 20 AdamW steps with warmup + cosine and gradient clipping, against torch
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gpt2", "llama_tied"])
def test_adamw_warmup_cosine_clipping_20_steps(rng, arch, tmp_path):
    steps, warmup = 20, 5
    if arch == "gpt2":
        hf, ours = gpt2_pair(np.float64, seed=1)
        rename = lambda n: n.removeprefix("transformer.")  # noqa: E731
        ctx = _NoPatch
    else:
        hf, ours = llama_pair(np.float64, tie=True, seed=1)
        rename = lambda n: n  # noqa: E731
        ctx = _true_fp64
    batches = [batch(rng, 2, 10, "right" if i % 3 == 0 else None) for i in range(steps)]
    hp = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    opt_t = torch.optim.AdamW(hf.parameters(), **hp)
    sched_t = transformers.get_cosine_schedule_with_warmup(opt_t, warmup, steps)
    lam = lambda s: (s / warmup if s < warmup else  # noqa: E731
                     0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))))
    sched_lambda = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.zeros(1)], lr=hp["lr"]), lam)
    lrs_t, lrs_lambda, norms_t = [], [], []
    with ctx():
        for ids, mask, labels in batches:
            lrs_t.append(opt_t.param_groups[0]["lr"])
            lrs_lambda.append(sched_lambda.get_last_lr()[0])
            torch_causal_loss(hf, ids, labels, mask).backward()
            norms_t.append(float(torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)))
            opt_t.step()
            sched_t.step()
            sched_lambda.optimizer.step()
            sched_lambda.step()
            opt_t.zero_grad()

    ours.train()
    opt = tc.optim.AdamW(ours.named_parameters(), **hp)
    sched = tc.lr_scheduler.get_cosine_schedule_with_warmup(opt, warmup, steps)
    lrs, norms = [], []
    for i, (ids, mask, labels) in enumerate(batches):
        lrs.append(opt.param_groups[0]["lr"])
        ours.loss(ids, labels, attention_mask=mask)
        ours.backward()
        norms.append(tc.optim.clip_grad_norm_(ours.parameters(), 1.0))
        opt.step()
        sched.step()
        ours.zero_grad()
        if i == steps // 2 - 1:  # a checkpoint half-way; the rest runs on a model resumed from it
            tc.training.save_checkpoint(tmp_path, ours, opt, sched)
            ours = type(ours)(ours.config, dtype=np.float64).train()
            opt = tc.optim.AdamW(ours.named_parameters(), **hp)
            sched = tc.lr_scheduler.get_cosine_schedule_with_warmup(opt, warmup, steps)
            tc.training.load_checkpoint(tmp_path, ours, opt, sched)

    assert lrs == pytest.approx(lrs_t, rel=1e-15, abs=1e-18)
    assert lrs == pytest.approx(lrs_lambda, rel=1e-15, abs=1e-18)
    assert all(n > 1.0 for n in norms_t[:3]), "clipping is exercised"
    np.testing.assert_allclose(norms, norms_t, rtol=1e-9)
    state = ours.state_dict()
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(state[rename(name)], p.detach().numpy(), atol=1e-9, rtol=0, err_msg=name)
    # the optimizer's moments, in the checkpoint's layout, equal torch's
    tc.training.save_checkpoint(tmp_path, ours, opt, sched)
    from safetensors.numpy import load_file

    saved = load_file(str(tmp_path / "optimizer.safetensors"))
    for name, p in hf.named_parameters():
        st = opt_t.state[p]
        np.testing.assert_allclose(saved[f"state.{rename(name)}.exp_avg"], st["exp_avg"].numpy(), atol=1e-12,
                                   err_msg=name)
        np.testing.assert_allclose(saved[f"state.{rename(name)}.exp_avg_sq"], st["exp_avg_sq"].numpy(),
                                   atol=1e-14, err_msg=name)


class _NoPatch:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --------------------------------------------------------------------------------------------------
# Checkpoints load in transformers and back
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_save_pretrained_loads_in_transformers_and_back(rng, arch, tmp_path):
    if arch == "gpt2":
        _, ours = gpt2_pair(np.float32, seed=2)
        cls, tc_cls = transformers.GPT2LMHeadModel, tc.GPT2LMHeadModel
    else:
        _, ours = llama_pair(np.float32, tie=False, seed=2)
        cls, tc_cls = transformers.LlamaForCausalLM, tc.LlamaForCausalLM
    ours.train()  # a step, so the weights are ours
    ids, _, labels = batch(rng, 2, 8)
    ours.loss(ids, labels)
    ours.backward()
    tc.optim.SGD(ours.parameters(), lr=0.1).step()
    ours.save_pretrained(tmp_path)
    hf = cls.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    ours.eval()
    np.testing.assert_allclose(ours(ids).logits, ref, atol=1e-4)
    back = tc_cls.from_pretrained(tmp_path)
    np.testing.assert_array_equal(back(ids).logits, ours(ids).logits)


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------

def test_bad_labels_and_backward_without_loss(rng):
    _, ours = gpt2_pair(np.float32)
    ids = rng.integers(0, V, (2, 6))
    ours.train()
    with pytest.raises(ValueError, match=r"labels: expected shape \(2, 6\)"):
        ours.loss(ids, ids[:, :5])
    bad = ids.copy()
    bad[1, 3] = V
    with pytest.raises(ValueError, match=rf"labels: expected values in \[0, {V}\) or ignore_index \(-100\), "
                                         r"got 61 at \(1, 3\)"):
        ours.loss(ids, bad)
    bad[1, 3] = -5
    with pytest.raises(ValueError, match="got -5"):
        ours.loss(ids, bad)
    with pytest.raises(TypeError, match="labels"):
        ours.loss(ids, ids.astype(np.float32) + 0.5)
    with pytest.raises(tc.NoTrainingStateError, match="model.loss"):
        ours.backward()
    ours.loss(ids, ids)
    ours.backward()
    with pytest.raises(tc.NoTrainingStateError, match="one backward"):
        ours.backward()
    ours.eval()
    ours.loss(ids, ids)  # a validation loss keeps nothing
    with pytest.raises(tc.NoTrainingStateError):
        ours.backward()


def test_nan_loss_is_reported_and_touches_no_gradient(rng):
    _, ours = gpt2_pair(np.float64)
    ids = rng.integers(0, V, (2, 6))
    ours.train()
    ours.loss(ids, ids)
    ours.backward()
    before = ours.gradients()
    state = ours.state_dict()
    state["h.1.mlp.c_fc.bias"][3] = np.nan
    ours.load_state_dict(state)
    with pytest.raises(tc.NonFiniteLossError, match="no gradient was touched") as info:
        ours.loss(ids, ids)
    assert math.isnan(info.value.loss)
    after = ours.gradients()
    assert sorted(after) == sorted(before)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    with pytest.raises(tc.NoTrainingStateError):
        ours.backward()  # nothing was kept
    ours.zero_grad()  # from zero (the head's gradient written in place, then restored)
    with pytest.raises(tc.NonFiniteLossError):
        ours.loss(ids, ids)
    assert ours.gradients() == {}
    assert np.all(dict(ours.named_parameters())["wte.weight"]._impl.gradient_view("wte.weight") == 0)


def test_optimizer_with_unknown_parameter_names(rng, tmp_path):
    _, ours = gpt2_pair(np.float32)
    opt = tc.optim.AdamW(ours.named_parameters(), lr=1e-3)
    state = opt.state_dict()
    state["params.h.9.attn.c_attn.weight.group"] = np.array(0)
    with pytest.raises(ValueError, match=r"unknown parameter names \['h.9.attn.c_attn.weight'\]"):
        opt.load_state_dict(state)
    _, other = llama_pair(np.float32, tie=True)
    tc.training.save_checkpoint(tmp_path, other, tc.optim.AdamW(other.named_parameters()))
    # an optimizer over another model's parameters: refused by identity, before anything is read
    with pytest.raises(ValueError, match=r"^optimizer: it steps parameters \['wte\.weight', .* that are not "
                                         r"`model`'s \(LlamaForCausalLM\)"):
        tc.training.load_checkpoint(tmp_path, other, opt)



# --------------------------------------------------------------------------------------------------
# Training checkpoints: one set, read and checked whole before anything loads
# --------------------------------------------------------------------------------------------------

_CKPT_FILES = ("model.safetensors", "optimizer.safetensors", "scheduler.safetensors")


def _training_set(seed):
    """(model, AdamW, warmup+cosine schedule) of a small Llama after one step, the weights drawn from
    ``seed`` (so that two seeds give sets that differ in every array)."""
    cfg = tc.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                         tie_word_embeddings=True)
    model = tc.LlamaForCausalLM(cfg)
    r = np.random.default_rng(seed)
    model.load_state_dict({k: 0.3 * r.standard_normal(v.shape) for k, v in model.state_dict().items()})
    opt = tc.optim.AdamW(model.named_parameters(), lr=1e-3 * (1 + seed))
    sched = tc.lr_scheduler.get_cosine_schedule_with_warmup(opt, 2 + seed, 20)
    ids = r.integers(0, V, (2, 6))
    model.train()
    model.loss(ids, ids)
    model.backward()
    opt.step()
    sched.step()
    model.zero_grad()
    return model, opt, sched


def _states(model, opt, sched):
    return [model.state_dict(), opt.state_dict(), sched.state_dict()]


def _assert_states_equal(got, expected):
    for g, e in zip(got, expected):
        assert sorted(g) == sorted(e)
        for k in e:
            np.testing.assert_array_equal(g[k], e[k], err_msg=k)


def _rewrite(path, edit):
    """Rewrites a safetensors file with ``edit(arrays)`` applied, its metadata (the save's stamp) kept."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        metadata = f.metadata()
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    edit(arrays)
    save_file(arrays, str(path), metadata=metadata)


def _drop_step(a):
    del a[next(k for k in a if k.startswith("state.") and k.endswith(".step"))]


def _negative_second_moment(a):
    k = next(k for k in a if k.endswith(".exp_avg_sq"))
    a[k] = -np.abs(a[k]) - 1


def _misshape(a):
    k = next(iter(a))
    a[k] = a[k][:1]


@pytest.mark.parametrize("file,edit", [
    ("optimizer.safetensors", _drop_step),
    ("optimizer.safetensors", _negative_second_moment),
    ("scheduler.safetensors", lambda a: a.pop("last_epoch")),  # refused after the optimizer would load
    ("model.safetensors", _misshape),  # refused last: the optimizer and schedule are put back
], ids=["optimizer_key_missing", "optimizer_negative_moment", "scheduler_key_missing", "model_misshaped"])
def test_load_checkpoint_refused_changes_nothing(tmp_path, file, edit):
    """A checkpoint one of whose files is refused leaves the model, the optimizer and the schedule
    (and the learning rates it writes into the optimizer) exactly as they were."""
    tc.training.save_checkpoint(tmp_path, *_training_set(1))
    _rewrite(tmp_path / file, edit)
    target = _training_set(2)
    before = _states(*target)
    lrs = [g["lr"] for g in target[1].param_groups]
    with pytest.raises(ValueError):
        tc.training.load_checkpoint(tmp_path, *target)
    _assert_states_equal(_states(*target), before)
    assert [g["lr"] for g in target[1].param_groups] == lrs


@pytest.mark.parametrize("damage", ["header_length", "header_json", "truncated"])
@pytest.mark.parametrize("file", _CKPT_FILES)
def test_load_checkpoint_damaged_file_is_named(tmp_path, file, damage):
    """A flipped header byte or a truncated file gives a ValueError naming the file (never the
    safetensors library's own error), before anything is loaded."""
    tc.training.save_checkpoint(tmp_path, *_training_set(1))
    path = tmp_path / file
    data = bytearray(path.read_bytes())
    if damage == "header_length":
        data[5] ^= 0x40
    elif damage == "header_json":
        data[10] ^= 0x55
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    target = _training_set(2)
    before = _states(*target)
    with pytest.raises((ValueError, OSError), match=file) as info:
        tc.training.load_checkpoint(tmp_path, *target)
    assert type(info.value) in (ValueError, OSError), type(info.value)
    _assert_states_equal(_states(*target), before)


@pytest.mark.parametrize("failing", _CKPT_FILES)
def test_failed_save_checkpoint_leaves_the_previous_set(tmp_path, monkeypatch, failing):
    """A save that fails while writing any of its files (a full disk) raises an OSError naming that
    file and leaves the folder as it was: the previous set, byte for byte, loadable, no temporary."""
    import errno


    first = _training_set(1)
    tc.training.save_checkpoint(tmp_path, *first)
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(saved) == sorted(_CKPT_FILES)
    real = tc.training.save_safetensors

    def save(tensors, filename, metadata=None):
        if failing in str(filename):
            with open(filename, "wb") as f:  # half a file, then the disk is full
                f.write(b"\0" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, filename, metadata)

    monkeypatch.setattr(tc.training, "save_safetensors", save)
    with pytest.raises(OSError, match=failing) as info:
        tc.training.save_checkpoint(tmp_path, *_training_set(2))
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == saved
    target = _training_set(3)
    tc.training.load_checkpoint(tmp_path, *target)
    _assert_states_equal(_states(*target), _states(*first))


def test_load_checkpoint_refuses_files_of_different_saves(tmp_path):
    """The files of one save carry one checkpoint_id: a model of one save beside the optimizer of
    another (copied in, or left by an older save that wrote one when this one did not) is refused,
    naming the files, and nothing changes; a set of the format before the stamp (no id in any file)
    still loads."""
    import shutil

    from safetensors.numpy import save_file

    a, b = tmp_path / "a", tmp_path / "b"
    first, second = _training_set(1), _training_set(2)
    tc.training.save_checkpoint(a, *first)
    tc.training.save_checkpoint(b, *second)
    target = _training_set(3)
    before = _states(*target)
    shutil.copy(b / "optimizer.safetensors", a / "optimizer.safetensors")
    with pytest.raises(ValueError, match=r"different saves.*model\.safetensors: [0-9a-f]+.*optimizer\.safetensors"):
        tc.training.load_checkpoint(a, *target)
    _assert_states_equal(_states(*target), before)
    # a later save without an optimizer leaves the old optimizer file: not read with the new model
    tc.training.save_checkpoint(b, second[0])
    with pytest.raises(ValueError, match="different saves"):
        tc.training.load_checkpoint(b, target[0], target[1])
    _assert_states_equal(_states(*target), before)
    tc.training.load_checkpoint(b, target[0])  # the model alone is one save
    _assert_states_equal(_states(*target)[:1], _states(*second)[:1])
    # the format before the stamp: no checkpoint_id in any file, accepted; in some but not all, refused
    old = tmp_path / "old"
    old.mkdir()
    save_file(first[0].state_dict(), str(old / "model.safetensors"), metadata={"format": "np"})
    save_file(first[1].state_dict(), str(old / "optimizer.safetensors"))
    save_file(first[2].state_dict(), str(old / "scheduler.safetensors"))
    target = _training_set(3)
    tc.training.load_checkpoint(old, *target)
    _assert_states_equal(_states(*target), _states(*first))
    shutil.copy(a / "model.safetensors", old / "model.safetensors")
    with pytest.raises(ValueError, match="optimizer.safetensors: none"):
        tc.training.load_checkpoint(old, *_training_set(3))


def test_checkpoint_arguments_are_checked_before_anything_is_written_or_changed(tmp_path):
    """save_checkpoint / load_checkpoint check ``optimizer`` and ``scheduler`` first: a value of
    the wrong type (a str, swapped arguments) is a TypeError naming the argument, a scheduler of
    another optimizer (or of none given: the learning rates are saved with the optimizer's state) a
    ValueError; no file is written, nothing is loaded."""
    model, opt, sched = _training_set(1)
    other_opt = tc.optim.AdamW(model.named_parameters())
    bad = [
        (("adam",), TypeError, r"^optimizer: expected a transformer_core\.optim Optimizer or None, got str"),
        ((opt, "sched"), TypeError, r"^scheduler: expected a transformer_core\.lr_scheduler LRScheduler or None, "
                                    r"got str"),
        ((sched, opt), TypeError, r"^optimizer: expected .* got LambdaLR"),
        ((opt, 3), TypeError, r"^scheduler: expected .* got int"),
        ((None, sched), ValueError, r"^scheduler: expected a scheduler of `optimizer`.* got optimizer=None"),
        ((other_opt, sched), ValueError, r"^scheduler: .* got a scheduler of another optimizer"),
    ]
    empty = tmp_path / "empty"
    for args, error, match in bad:
        with pytest.raises(error, match=match):
            tc.training.save_checkpoint(empty, model, *args)
        assert not empty.exists()
    full = tmp_path / "full"
    tc.training.save_checkpoint(full, model, opt, sched)
    target = _training_set(2)
    before = _states(*target)
    lrs = [g["lr"] for g in target[1].param_groups]
    for args, error, match in bad:
        args = tuple({id(opt): target[1], id(sched): target[2]}.get(id(a), a) for a in args)
        with pytest.raises(error, match=match):
            tc.training.load_checkpoint(full, target[0], *args)
        _assert_states_equal(_states(*target), before)
        assert [g["lr"] for g in target[1].param_groups] == lrs
    tc.training.load_checkpoint(full, *target)
    _assert_states_equal(_states(*target), _states(model, opt, sched))
    assert [g["lr"] for g in target[1].param_groups] == [g["lr"] for g in opt.param_groups]


@pytest.mark.parametrize("directory", [None, 5, ["a"], b"run"], ids=["None", "int", "list", "bytes"])
def test_checkpoint_directory_must_be_a_path(tmp_path, monkeypatch, directory):
    """A ``directory`` that is no path was a bare TypeError of pathlib's ("expected str, bytes or
    os.PathLike object, not NoneType"), not naming the argument. Now a TypeError naming it, before
    anything is written or loaded."""
    monkeypatch.chdir(tmp_path)
    model, opt, sched = _training_set(1)
    full = tmp_path / "full"
    tc.training.save_checkpoint(full, model, opt, sched)
    target = _training_set(2)
    before = _states(*target)
    match = rf"^directory: expected a str or os\.PathLike, got {type(directory).__name__}$"
    with pytest.raises(TypeError, match=match):
        tc.training.save_checkpoint(directory, model, opt, sched)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]
    with pytest.raises(TypeError, match=match):
        tc.training.load_checkpoint(directory, *target)
    _assert_states_equal(_states(*target), before)
    assert "TypeError: ``directory`` not a str or ``os.PathLike``" in " ".join(tc.training.save_checkpoint.__doc__.split())
    assert "TypeError: ``directory``, ``model``" in " ".join(tc.training.load_checkpoint.__doc__.split())


def test_gradients_are_bitwise_the_same_for_any_thread_count(rng):
    """Every sum of the backward passes is owned by one task in a fixed order: 1 and 2 threads give the
    same bits (a model large enough that the ops split their work)."""
    cfg = tc.GPT2Config(vocab_size=300, n_positions=80, n_embd=64, n_layer=2, n_head=4)
    ids = rng.integers(0, 300, (4, 70))
    grads, losses = [], []
    before = tc.get_num_threads()
    try:
        for threads in (1, 2):
            tc.set_num_threads(threads)
            tc.manual_seed(0)  # the same initial weights
            m = tc.GPT2LMHeadModel(cfg).train()
            losses.append(m.loss(ids, ids))
            m.backward()
            grads.append(m.gradients())
    finally:
        tc.set_num_threads(before)
    assert losses[0] == losses[1]
    for name in grads[0]:
        np.testing.assert_array_equal(grads[0][name], grads[1][name], err_msg=name)


# --------------------------------------------------------------------------------------------------
# Resuming with dropout; the checkpoint's names; quantizing a model in training mode
# --------------------------------------------------------------------------------------------------

def test_resume_with_dropout_is_bitwise_the_uninterrupted_run(rng, tmp_path):
    """The dropout seeds' generator is saved with the weights and restored by load_checkpoint: a
    run resumed half-way (its generator moved on meanwhile) ends bitwise where the uninterrupted
    one does; get/set_rng_state round-trip and refuse what is not a state."""
    cfg = tc.GPT2Config(vocab_size=V, n_positions=24, n_embd=16, n_layer=2, n_head=4, resid_pdrop=0.2,
                        embd_pdrop=0.1, attn_pdrop=0.0)
    batches = [batch(rng, 2, 10) for _ in range(6)]
    start = tc.GPT2LMHeadModel(cfg, dtype=np.float64).state_dict()

    def run(resume_at=None):
        tc.manual_seed(7)
        model = tc.GPT2LMHeadModel(cfg, dtype=np.float64)
        model.load_state_dict(start)
        model.train()
        opt = tc.optim.AdamW(model.named_parameters(), lr=1e-2)
        for i, (ids, mask, labels) in enumerate(batches):
            if i == resume_at:
                tc.training.save_checkpoint(tmp_path, model, opt)
                tc.manual_seed(12345)  # the process that resumes starts elsewhere
                model = tc.GPT2LMHeadModel(cfg, dtype=np.float64).train()
                opt = tc.optim.AdamW(model.named_parameters(), lr=1e-2)
                tc.training.load_checkpoint(tmp_path, model, opt)
            model.loss(ids, labels, attention_mask=mask)
            model.backward()
            opt.step()
            model.zero_grad()
        return model.state_dict()

    straight, resumed = run(), run(resume_at=3)
    assert all(np.array_equal(straight[k], resumed[k]) for k in straight)
    state = tc.get_rng_state()
    first = tc.module.next_seed()
    tc.set_rng_state(state)
    assert tc.module.next_seed() == first
    with pytest.raises(ValueError, match="^state: expected a state from get_rng_state"):
        tc.set_rng_state({"bit_generator": "MT19937"})
    with pytest.raises(TypeError, match="^state: expected a dict"):
        tc.set_rng_state(3)
    for field, value in (("state", -1), ("state", 2**200), ("state", 1.5), ("inc", None)):
        bad = {**state, "state": {**state["state"], field: value}}
        with pytest.raises(ValueError, match="^state: expected a state from get_rng_state"):
            tc.set_rng_state(bad)
    assert tc.module.next_seed() != first  # the refusals left the generator where it was


def test_gpt2_checkpoint_loads_in_transformers(rng, tmp_path):
    """model.safetensors of save_checkpoint holds the names save_pretrained writes, so
    transformers' GPT2LMHeadModel loads it with load_state_dict (it lacked "transformer.")."""
    from safetensors.torch import load_file

    hf, ours = gpt2_pair(np.float32, seed=3)
    tc.training.save_checkpoint(tmp_path, ours)
    fresh = transformers.GPT2LMHeadModel(hf.config)
    missing, unexpected = fresh.load_state_dict(load_file(str(tmp_path / "model.safetensors")), strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to wte
    fresh.tie_weights()
    ids = rng.integers(0, V, (2, 7))
    with torch.no_grad():
        np.testing.assert_allclose(fresh(torch.from_numpy(ids)).logits.numpy(), ours(ids).logits, rtol=0, atol=1e-5)
    back = tc.GPT2LMHeadModel(ours.config)
    tc.training.load_checkpoint(tmp_path, back)
    np.testing.assert_array_equal(back(ids).logits, ours(ids).logits)


def test_quantizing_a_model_in_training_mode_in_place_is_refused():
    """quantize(inplace=True) / set_gguf_weights of a model in training mode: refused (it was
    accepted, then backward failed half-way with some gradients written)."""
    model = tc.GPT2LMHeadModel(tc.GPT2Config(vocab_size=V, n_positions=16, n_embd=32, n_layer=1, n_head=2)).train()
    with pytest.raises(ValueError, match=r"^model: in training mode .*call model.eval\(\)"):
        tc.quantize(model, "int8", inplace=True)
    assert set(model.weight_formats().values()) == {"float32"}
    with pytest.raises(ValueError, match="^module: in training mode"):
        tc.quantization.set_gguf_weights(model, {})
    assert tc.quantize(model, "int8").weight_formats()["h.0.mlp.c_fc.weight"] == "int8"  # a copy is fine


def test_checkpoint_directory_of_an_unknown_user_is_file_not_found(tmp_path, monkeypatch):
    """``~nosuchuser/run`` was pathlib's RuntimeError ("Could not determine home directory"), raised
    by save_checkpoint after every state was taken: now FileNotFoundError naming ``directory``,
    before anything is written or loaded."""
    monkeypatch.chdir(tmp_path)
    model, opt, sched = _training_set(1)
    target = _training_set(2)
    before = _states(*target)
    match = r"^directory: cannot expand the home directory of '~no_such_user_tc_39/run'"
    with pytest.raises(FileNotFoundError, match=match):
        tc.training.save_checkpoint("~no_such_user_tc_39/run", model, opt, sched)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match=match):
        tc.training.load_checkpoint("~no_such_user_tc_39/run", *target)
    _assert_states_equal(_states(*target), before)
