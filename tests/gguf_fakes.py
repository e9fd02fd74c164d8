"""Small GGUF files written with the ``gguf`` package's own GGUFWriter, for the GGUF tests.

``write_llama_gguf`` writes a tiny Llama the way llama.cpp's converter does: Hugging Face tensors
renamed to llama.cpp's names, the query/key rows permuted for ggml's RoPE layout with the
converter's own formula (written out here, independently of ``gguf_file``), then stored as the
asked ggml type. It returns the Hugging Face state dict the file stands for (the values after
quantization, as the gguf package dequantizes them), so a reader can be checked against it.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}

#: A tiny byte-level BPE vocabulary: control tokens, the printable ASCII bytes, the space/newline
#: bytes in GPT-2's spelling, and a few merges.
TINY_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_MERGES = ["Ġ Ġ", "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ċ Ġ"]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """``(tokens, token_types, merges)`` of the tiny vocabulary."""
    tokens = list(TINY_SPECIAL) + [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ", "ĉ"]
    for merge in TINY_MERGES:
        tokens.append(merge.replace(" ", ""))
    types = [3] * len(TINY_SPECIAL) + [1] * (len(tokens) - len(TINY_SPECIAL))
    return tokens, types, list(TINY_MERGES)


def converter_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's ``LlamaModel.permute``: the q/k rows of each head, from
    rotate-half order to ggml's adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_llama_state(rng, *, hidden=64, heads=4, kv_heads=2, layers=2, inter=96, vocab=None, tie=True,
                       attention_bias=False) -> dict:
    """Random float32 weights under Hugging Face LlamaForCausalLM names."""
    if vocab is None:
        vocab = len(tiny_vocab()[0])
    hd = hidden // heads
    sd = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden)),
          "model.norm.weight": 1 + 0.1 * rng.standard_normal(hidden)}
    if not tie:
        sd["lm_head.weight"] = rng.standard_normal((vocab, hidden))
    shapes = {"input_layernorm": (hidden,), "self_attn.q_proj": (heads * hd, hidden),
              "self_attn.k_proj": (kv_heads * hd, hidden), "self_attn.v_proj": (kv_heads * hd, hidden),
              "self_attn.o_proj": (hidden, heads * hd), "post_attention_layernorm": (hidden,),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    for i in range(layers):
        for name, shape in shapes.items():
            scale = 0.1 if len(shape) == 1 else 0.3
            base = 1.0 if len(shape) == 1 else 0.0
            sd[f"model.layers.{i}.{name}.weight"] = base + scale * rng.standard_normal(shape)
            if attention_bias and name.startswith("self_attn"):
                sd[f"model.layers.{i}.{name}.bias"] = 0.1 * rng.standard_normal(shape[0])
    return {k: v.astype(np.float32) for k, v in sd.items()}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf_name.split(".", 3)
    leaf, suffix = rest.rsplit(".", 1)
    return f"blk.{i}.{LAYER_NAMES[leaf]}.{suffix}"


def write_llama_gguf(path: Path, state: dict, *, heads=4, kv_heads=2, ggml_type="F32", arch="llama",
                     metadata=None, skip=(), tensor_override=None, tokenizer=True, pre="smollm",
                     add_bos=None, tokens=None, extra=None) -> dict:
    """Writes ``state`` (Hugging Face names, float32) as a llama.cpp-style GGUF.

    Args:
        ggml_type: storage type of the 2-D weights ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", or a
            type name to write as raw random bytes, e.g. "Q2_K"); norms and biases stay F32 as
            llama.cpp writes them.
        metadata: extra/overriding key -> value (a value of None drops the key).
        skip: GGUF tensor names to leave out. tensor_override: GGUF name -> array written as is (F32).
        extra: more GGUF name -> array (F32) tensors to write.

    Returns:
        The Hugging Face state dict the file holds (values as stored), float32.
    """
    hidden = state["model.embed_tokens.weight"].shape[1]
    vocab = state["model.embed_tokens.weight"].shape[0]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("model.layers."))
    inter = state["model.layers.0.mlp.up_proj.weight"].shape[0]
    hd = hidden // heads
    writer = gguf.GGUFWriter(str(path), arch)
    kv = {
        f"{arch}.block_count": (layers, gguf.GGUFValueType.UINT32),
        f"{arch}.context_length": (256, gguf.GGUFValueType.UINT32),
        f"{arch}.embedding_length": (hidden, gguf.GGUFValueType.UINT32),
        f"{arch}.feed_forward_length": (inter, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count": (heads, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count_kv": (kv_heads, gguf.GGUFValueType.UINT32),
        f"{arch}.rope.freq_base": (10000.0, gguf.GGUFValueType.FLOAT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (1e-5, gguf.GGUFValueType.FLOAT32),
        f"{arch}.rope.dimension_count": (hd, gguf.GGUFValueType.UINT32),
        f"{arch}.vocab_size": (vocab, gguf.GGUFValueType.UINT32),
    }
    if tokenizer:
        toks, types, merges = tiny_vocab()
        if tokens is not None:
            toks = tokens
        kv.update({
            "tokenizer.ggml.model": ("gpt2", gguf.GGUFValueType.STRING),
            "tokenizer.ggml.pre": (pre, gguf.GGUFValueType.STRING),
            "tokenizer.ggml.tokens": (toks, gguf.GGUFValueType.ARRAY),
            "tokenizer.ggml.token_type": (types, gguf.GGUFValueType.ARRAY),
            "tokenizer.ggml.merges": (merges, gguf.GGUFValueType.ARRAY),
            "tokenizer.ggml.bos_token_id": (1, gguf.GGUFValueType.UINT32),
            "tokenizer.ggml.eos_token_id": (2, gguf.GGUFValueType.UINT32),
            "tokenizer.ggml.unknown_token_id": (0, gguf.GGUFValueType.UINT32),
            "tokenizer.ggml.padding_token_id": (2, gguf.GGUFValueType.UINT32),
            "tokenizer.ggml.add_bos_token": (False if add_bos is None else add_bos, gguf.GGUFValueType.BOOL),
            "tokenizer.chat_template": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                        "<|im_end|>\n{% endfor %}", gguf.GGUFValueType.STRING),
        })
    for key, value in (metadata or {}).items():
        if value is None:
            kv.pop(key, None)
        else:
            kv[key] = value
    for key, (value, vtype) in kv.items():
        sub = None
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType.STRING if isinstance(value[0], str) else gguf.GGUFValueType.INT32
        writer.add_key_value(key, value, vtype, sub_type=sub)

    stored = {}
    qtype = gguf.GGMLQuantizationType[ggml_type]
    for hf, value in state.items():
        name = gguf_name(hf)
        if name in skip:
            continue
        if tensor_override and name in tensor_override:
            writer.add_tensor(name, np.ascontiguousarray(tensor_override[name], dtype=np.float32))
            continue
        w = value
        if ".attn_q." in name:
            w = converter_permute(w, heads)
        elif ".attn_k." in name:
            w = converter_permute(w, kv_heads)
        w = np.ascontiguousarray(w, dtype=np.float32)
        original = np.ascontiguousarray(value, dtype=np.float32)
        if w.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, w)
            stored[hf] = original.copy()
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, w.astype(np.float16))
            stored[hf] = original.astype(np.float16).astype(np.float32)
        elif qtype in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1,
                       gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.BF16):
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
            # blocks run along rows, so quantizing the un-permuted rows gives the same values, in
            # Hugging Face order, without inverting the permutation here
            stored[hf] = np.array(gguf.quants.dequantize(gguf.quants.quantize(original, qtype), qtype),
                                  dtype=np.float32).reshape(original.shape)
        else:  # a type this reader does not support: random bytes of the right size
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            data = np.random.default_rng(0).integers(0, 256, (w.shape[0], w.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(name, data, raw_dtype=qtype)
    for name, value in (extra or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
