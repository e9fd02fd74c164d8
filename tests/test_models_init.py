"""Fresh models' initial weights (nothing loaded) against torch's and Hugging Face's fresh modules:
which parameters start as norms (ones / zeros), biases (zeros) and matrices (uniform(±1/sqrt(fan_in))
from a seed of the package generator, which manual_seed sets), and that drawing the matrices in
chunks gives the values of one draw. Here rather than in test_layers_core.py because they build
models, which the sanitizer's reduced core (.ci/sanitize) does not have."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformer_core as tc
from conftest import DTYPE_IDS, FLOAT_DTYPES, TORCH_DTYPE
from transformers.models.llama.configuration_llama import LlamaConfig as HFLlamaConfig


def _torch_norm_params(module: torch.nn.Module, strip: str = "") -> set:
    """Names of the parameters of ``module``'s norm submodules (LayerNorm, RMSNorm, LlamaRMSNorm):
    the oracle of which weights start at ones, from torch's module tree, not from names."""
    out = set()
    for prefix, sub in module.named_modules():
        if "norm" in type(sub).__name__.lower():
            out |= {f"{prefix}.{n}".lstrip(".").removeprefix(strip) for n, _ in sub.named_parameters(recurse=False)}
    return out


def _torch_padding_rows(module: torch.nn.Module, strip: str = "") -> dict:
    """``{weight name: padding_idx}`` of ``module``'s ``nn.Embedding`` submodules that have one: the
    rows torch and Hugging Face start at zero (the oracle, from torch's module tree)."""
    return {f"{prefix}.weight".removeprefix(strip): sub.padding_idx for prefix, sub in module.named_modules()
            if isinstance(sub, torch.nn.Embedding) and sub.padding_idx is not None}


INIT_SEED = 7


def _seeded(module):
    """``module``, then the package generator reseeded with INIT_SEED for the next one."""
    tc.manual_seed(INIT_SEED)
    return module


def _fresh_pairs(dtype):
    """(our fresh module, torch's fresh counterpart or None, prefix of torch's names to strip)."""
    from transformers import BertConfig as HFBertConfig
    from transformers import BertModel as HFBertModel
    from transformers import GPT2Config as HFGPT2Config
    from transformers import GPT2LMHeadModel as HFGPT2LMHeadModel
    from transformers import LlamaForCausalLM as HFLlamaForCausalLM

    tdt = TORCH_DTYPE[np.dtype(dtype)]
    llama = dict(vocab_size=10, hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=16)
    gpt2 = dict(vocab_size=10, n_positions=16, n_embd=8, n_layer=2, n_head=2)
    bert = dict(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
                max_position_embeddings=16)
    layer = dict(d_model=8, nhead=2, dim_feedforward=12)
    tc.manual_seed(INIT_SEED)  # each of ours below is built right after it (a list is built in order)
    return [
        (_seeded(tc.nn.Linear(5, 3, dtype=dtype)), torch.nn.Linear(5, 3, dtype=tdt), ""),
        (_seeded(tc.nn.MultiheadAttention(8, 2, dtype=dtype)), torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=tdt), ""),
        (_seeded(tc.nn.FeedForward(8, 12, dtype=dtype)), None, ""),
        (_seeded(tc.nn.GatedFeedForward(8, 12, dtype=dtype)), None, ""),
        (_seeded(tc.nn.TransformerEncoderLayer(**layer, dtype=dtype)),
         torch.nn.TransformerEncoderLayer(**layer, batch_first=True, dtype=tdt), ""),
        (_seeded(tc.nn.TransformerDecoderLayer(**layer, dtype=dtype)),
         torch.nn.TransformerDecoderLayer(**layer, batch_first=True, dtype=tdt), ""),
        (_seeded(tc.nn.Transformer(8, 2, 1, 1, 12, dtype=dtype)),
         torch.nn.Transformer(8, 2, 1, 1, 12, batch_first=True, dtype=tdt), ""),
        (_seeded(tc.LlamaForCausalLM(tc.LlamaConfig(**llama), dtype=dtype)), HFLlamaForCausalLM(HFLlamaConfig(**llama)), ""),
        (_seeded(tc.GPT2LMHeadModel(tc.GPT2Config(**gpt2), dtype=dtype)),
         HFGPT2LMHeadModel(HFGPT2Config(**gpt2, bos_token_id=None, eos_token_id=None)), "transformer."),
        (_seeded(tc.BertModel(tc.BertConfig(**bert), dtype=dtype)), HFBertModel(HFBertConfig(**bert)), ""),
    ]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_fresh_layers_init_conventions(dtype):
    """Every fresh module: the parameters of norms (by torch's module tree) are torch's fresh values
    (weight ones, bias zeros); every other 1-D parameter is zeros (a bias: not mistaken for a norm
    weight); every matrix is uniform(±1/sqrt(fan_in)) drawn in registration order from the seed the
    constructor draws from the package generator (manual_seed(INIT_SEED) before it here), the
    same values in float32 (rounded) and float64 as before matrices were drawn in chunks, except the
    padding row of an embedding (BERT's pad_token_id 0), which is zeros as in torch."""
    for ours, ref, strip in _fresh_pairs(dtype):
        what = type(ours).__name__
        state = ours.state_dict()
        norms, padding = set(), {}
        if ref is not None:
            padding = _torch_padding_rows(ref, strip)
            norms = _torch_norm_params(ref, strip)
            ref_state = {k.removeprefix(strip): v for k, v in ref.state_dict().items()}
            assert norms <= set(state), f"{what}: {norms - set(state)}"
            for name in norms:
                np.testing.assert_array_equal(state[name], ref_state[name].float().numpy(), err_msg=f"{what}.{name}")
        if what.startswith(("Transformer", "Llama", "GPT2", "Bert")):
            assert norms, f"{what}: the oracle found no norm"
        tc.manual_seed(INIT_SEED)
        draw = np.random.default_rng(tc.module.next_seed())
        for name, slot in ours._slots().items():
            if len(slot.shape) == 1:
                if name not in norms:
                    np.testing.assert_array_equal(state[name], 0, err_msg=f"{what}.{name}")
                continue
            fan_in = slot.shape[0] if slot.transposed else slot.shape[-1]
            expected = draw.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), size=slot.shape).astype(dtype)
            if name in padding:
                expected[padding[name]] = 0
            if ours._children():  # each child drew its own seed (nn.Transformer's layers)
                assert np.abs(state[name]).max() <= 1 / np.sqrt(fan_in) and np.std(state[name]) > 0, f"{what}.{name}"
            else:
                np.testing.assert_array_equal(state[name], expected, err_msg=f"{what}.{name}")


def test_manual_seed_chooses_the_initial_weights_as_torchs():
    """As after torch.manual_seed: the same seed builds the same model, another seed another; the
    layers of a stack and a seq2seq model's two embeddings start different (each constructor draws
    its own seed: they all started from seed 0, equal); copying or loading a model draws nothing
    (the dropout masks after it are those without it)."""
    def build(seed):
        """A small seq2seq model's state after manual_seed(seed)."""
        tc.manual_seed(seed)
        return tc.Seq2SeqTransformer(20, 20, d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                     dim_feedforward=24).state_dict()

    a, a2, b = build(0), build(0), build(1)
    assert all(np.array_equal(a[k], a2[k]) for k in a)
    matrices = [k for k in a if a[k].ndim == 2]
    assert not any(np.array_equal(a[k], b[k]) for k in matrices)
    assert not np.array_equal(a["src_tok_emb.weight"], a["tgt_tok_emb.weight"])
    k = "transformer.encoder.layers.0.self_attn.in_proj_weight"
    assert not np.array_equal(a[k], a[k.replace(".0.", ".1.")])
    assert not np.array_equal(a[k], a[k.replace("encoder", "decoder")])

    import copy

    model = tc.nn.TransformerEncoderLayer(8, 2, 16)
    tc.manual_seed(3)
    expected = tc.module.next_seed()
    tc.manual_seed(3)
    copy.deepcopy(model)
    model.state_dict()
    assert tc.module.next_seed() == expected


def test_init_chunks_give_the_values_of_one_draw(monkeypatch):
    """Chunks smaller than a row and than a matrix: the same values (the chunk size is an
    implementation detail)."""
    from transformer_core import module

    def build():
        """An MHA, an embedding and a GPT-2 model, each built from the same seed."""
        tc.manual_seed(INIT_SEED)
        mha = tc.nn.MultiheadAttention(8, 2, kdim=5)
        tc.manual_seed(INIT_SEED)
        emb = tc.nn.Embedding(9, 7)
        tc.manual_seed(INIT_SEED)  # GPT-2: transposed weights
        gpt2 = tc.GPT2Model(tc.GPT2Config(vocab_size=10, n_positions=16, n_embd=8, n_layer=1, n_head=2))
        return mha, emb, gpt2

    refs = [m.state_dict() for m in build()]
    for chunk in (3, 8, 13):
        monkeypatch.setattr(module, "_INIT_CHUNK", chunk)
        for ours, expected in zip(build(), refs):
            for name, value in ours.state_dict().items():
                np.testing.assert_array_equal(value, expected[name], err_msg=f"chunk {chunk}: {name}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_fresh_models_zero_the_pad_token_id_row(dtype, tmp_path):
    """A model built from a config starts the pad_token_id row of its token embedding at zeros, as
    Hugging Face's fresh model (torch's padding_idx; Llama's -1 is the last row); it was random. The
    other rows are not zero. GPT-2 has no padding row (HF's wte has no padding_idx): none is zeroed.
    from_pretrained keeps the file's row as it is, not zeroed."""
    from transformers import BertConfig as HFBertConfig
    from transformers import BertModel as HFBertModel
    from transformers import GPT2Config as HFGPT2Config
    from transformers import GPT2Model as HFGPT2Model
    from transformers import LlamaForCausalLM as HFLlamaForCausalLM

    llama = dict(vocab_size=10, hidden_size=8, intermediate_size=12, num_hidden_layers=1, num_attention_heads=2,
                 max_position_embeddings=16)
    bert = dict(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=12,
                max_position_embeddings=16)
    gpt2 = dict(vocab_size=10, n_positions=16, n_embd=8, n_layer=1, n_head=2, pad_token_id=5)
    cases = [(tc.LlamaForCausalLM({**llama, "pad_token_id": pad}, dtype=dtype),
              HFLlamaForCausalLM(HFLlamaConfig(**llama, pad_token_id=pad)), "model.embed_tokens.weight", "")
             for pad in (5, -1, None)]
    cases += [(tc.LlamaModel({**llama, "pad_token_id": 5, "tie_word_embeddings": True}, dtype=dtype),
               HFLlamaForCausalLM(HFLlamaConfig(**llama, pad_token_id=5, tie_word_embeddings=True)),
               "embed_tokens.weight", "model.")]
    cases += [(tc.BertModel({**bert, "pad_token_id": pad}, dtype=dtype), HFBertModel(HFBertConfig(**bert, pad_token_id=pad)),
               "embeddings.word_embeddings.weight", "") for pad in (5, None)]
    cases += [(tc.bert.BertEmbeddings({**bert, "pad_token_id": 5}, dtype=dtype),
               HFBertModel(HFBertConfig(**bert, pad_token_id=5)), "word_embeddings.weight", "embeddings.")]
    cases += [(tc.GPT2Model(gpt2, dtype=dtype), HFGPT2Model(HFGPT2Config(**gpt2)), "wte.weight", "")]
    for ours, ref, name, strip in cases:
        what = f"{type(ours).__name__} pad_token_id={ours.config.pad_token_id}"
        table = ours.state_dict()[name]
        ref_table = ref.state_dict()[strip + name].numpy()
        zero = [r for r in range(len(table)) if not table[r].any()]
        assert zero == [r for r in range(len(ref_table)) if not ref_table[r].any()], what
        expected = _torch_padding_rows(ref, strip).get(name)
        assert zero == ([] if expected is None else [expected]), what
    assert _torch_padding_rows(cases[1][1]) == {"model.embed_tokens.weight": 9}  # -1: the last row
    # from_pretrained: the file's row, not zeros
    for hf, ours_cls, name in ((HFLlamaForCausalLM(HFLlamaConfig(**llama, pad_token_id=5)), tc.LlamaForCausalLM,
                                "model.embed_tokens.weight"),
                               (HFBertModel(HFBertConfig(**bert, pad_token_id=5)), tc.BertModel,
                                "embeddings.word_embeddings.weight")):
        with torch.no_grad():
            hf.get_input_embeddings().weight[5] = torch.linspace(-1, 1, 8)
        path = tmp_path / ours_cls.__name__
        hf.save_pretrained(path, safe_serialization=True)
        loaded = ours_cls.from_pretrained(path, dtype=dtype).state_dict()[name]
        np.testing.assert_array_equal(loaded, hf.state_dict()[name].numpy().astype(dtype), err_msg=name)
