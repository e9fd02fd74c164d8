"""GPT-2 (Radford et al. 2019): decoder-only, pre-LN, learned positions, tanh GELU, LM head tied to
the token embedding; seed 000 "BERT vs GPT". Hugging Face checkpoints load without torch; decoding
uses a KV cache (:class:`KVCache`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ._runtime import core as _core
from ._runtime import variant
from ._validation import as_bool, as_ids, check_positive_int, resolve_dtype
from .hub import load_safetensors, read_config, resolve_model_dir
from .module import Module

__all__ = ["GPT2Config", "GPT2Model", "GPT2LMHeadModel", "KVCache", "CausalLMOutput"]

_IGNORED = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")


@dataclass
class GPT2Config:
    """The fields of a Hugging Face ``GPT2Config`` the forward pass needs (``config.json``)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = 50256
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> "GPT2Config":
        """Reads a ``config.json`` dict.

        Raises:
            ValueError: options this implementation does not support (``scale_attn_weights=False``,
                ``scale_attn_by_inverse_layer_idx``, ``reorder_and_upcast_attn``, an activation
                other than gelu_new / gelu / relu).
        """
        if d.get("scale_attn_weights", True) is not True:
            raise ValueError("config.json: scale_attn_weights=False is not supported")
        for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
            if d.get(key, False):
                raise ValueError(f"config.json: {key}=True is not supported")
        act = d.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu"):
            raise ValueError(f"config.json: activation_function {act!r} is not supported")
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "extra"}
        return cls(**fields)

    def _core_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d["activation_function"] = {"gelu_pytorch_tanh": "gelu_new"}.get(self.activation_function,
                                                                          self.activation_function)
        return d


class KVCache:
    """Keys and values of past positions, per layer, for incremental decoding (seed 000 "KV cache").

    Storage per layer: keys and values ``(N, H_kv, capacity, D)``; ``length`` positions are filled.
    Each forward step appends its L new positions; when full, the capacity doubles (at least to what
    is needed) and the contents are copied once, so decoding T tokens copies O(T) in all. Memory:
    ``2 · num_layers · N · H_kv · capacity · D`` values — grouped-query attention (H_kv < H) shrinks
    it by H / H_kv. The cache is updated in place by the model.

    Args:
        num_layers, batch, num_kv_heads, head_dim: sizes.
        capacity: positions to reserve up front (e.g. prompt + max_new_tokens).
        dtype: ``np.float32`` or ``np.float64`` (the model's).
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int, capacity: int = 0,
                 dtype=np.float32):
        self.dtype = resolve_dtype(dtype)
        self._impl = variant("KVCache", self.dtype)(num_layers, batch, num_kv_heads, head_dim, max(int(capacity), 1))

    @property
    def length(self) -> int:
        """Positions cached (the past length)."""
        return self._impl.length

    @property
    def capacity(self) -> int:
        """Positions the storage holds before it grows."""
        return self._impl.capacity

    def __len__(self) -> int:
        return self._impl.num_layers

    def __getitem__(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, values)`` of one layer, copies of shape ``(N, H_kv, length, D)``."""
        if not -len(self) <= layer < len(self):
            raise IndexError(f"layer: expected an index in [0, {len(self)}), got {layer}")
        return self._impl.get(layer % len(self))

    def to_legacy(self) -> tuple:
        """Hugging Face's legacy format: a tuple of ``(keys, values)`` per layer."""
        return tuple(self[i] for i in range(len(self)))

    def crop(self, length: int) -> None:
        """Forgets every position from ``length`` on."""
        self._impl.crop(int(length))

    @classmethod
    def from_legacy(cls, past, num_kv_heads: int, head_dim: int, dtype=np.float32) -> "KVCache":
        """A cache holding per-layer ``(keys, values)`` arrays ``(N, H_kv, S, D)``.

        Raises:
            ValueError: arrays of inconsistent shapes.
        """
        past = list(past)
        if not past:
            raise ValueError("past_key_values: expected one (keys, values) pair per layer, got none")
        pairs = []
        shape = None
        for i, pair in enumerate(past):
            if len(pair) != 2:
                raise ValueError(f"past_key_values[{i}]: expected a (keys, values) pair")
            k = np.ascontiguousarray(np.asarray(pair[0]), dtype=dtype)
            v = np.ascontiguousarray(np.asarray(pair[1]), dtype=dtype)
            if k.ndim != 4 or k.shape != v.shape or k.shape[1] != num_kv_heads or k.shape[3] != head_dim:
                raise ValueError(f"past_key_values[{i}]: expected keys and values of shape (N, {num_kv_heads}, S, "
                                 f"{head_dim}), got {k.shape} and {v.shape}")
            if shape is not None and k.shape != shape:
                raise ValueError(f"past_key_values[{i}]: shape {k.shape} differs from layer 0's {shape}")
            shape = k.shape
            pairs.append((k, v))
        cache = cls(len(pairs), shape[0], num_kv_heads, head_dim, shape[2], dtype)
        cache._impl.load(pairs)
        return cache


@dataclass
class CausalLMOutput:
    """What :class:`GPT2LMHeadModel` returns.

    Attributes:
        logits: ``(N, L, vocab_size)`` (``(N, 1, vocab_size)`` with ``logits_to_keep=1``).
        past_key_values: the :class:`KVCache` (with ``use_cache``), else None.
        last_hidden_state: ``(N, L, n_embd)`` after the final LayerNorm.
    """

    logits: np.ndarray
    past_key_values: KVCache | None
    last_hidden_state: np.ndarray


def _rename_hf(state: dict) -> dict:
    out = {}
    for name, value in state.items():
        if _IGNORED.search(name):
            continue
        if name.startswith("transformer."):
            name = name[len("transformer."):]
        out[name] = value
    return out


class GPT2Model(Module):
    """The GPT-2 transformer: token + position embeddings, pre-LN blocks, final ``ln_f``.

    Weights: Hugging Face's ``GPT2Model`` names (``wte.weight``, ``wpe.weight``,
    ``h.{i}.attn.c_attn.weight (E, 3E)`` — Conv1D, stored ``(in, out)`` —, ``h.{i}.ln_1.*``,
    ``h.{i}.mlp.c_fc.*``, ``ln_f.*``, ...).

    Args:
        config: :class:`GPT2Config` or a ``config.json`` dict.
        dtype: ``np.float32`` or ``np.float64``.
    """

    def __init__(self, config, dtype=np.float32):
        sfx = self._init_dtype(dtype)
        self.config = config if isinstance(config, GPT2Config) else GPT2Config.from_dict(config)
        self._impl = getattr(_core, "GPT2Model" + sfx)(self.config._core_dict())
        self._init_weights()

    def _rename_state_dict(self, state: dict) -> dict:
        state = _rename_hf(state)
        state.pop("lm_head.weight", None)  # tied to wte
        return state

    @property
    def head_dim(self) -> int:
        """``n_embd // n_head``."""
        return self.config.n_embd // self.config.n_head

    def new_cache(self, batch: int, capacity: int = 0) -> KVCache:
        """An empty :class:`KVCache` for this model."""
        return KVCache(self.config.n_layer, batch, self.config.n_head, self.head_dim, capacity, self.dtype)

    @classmethod
    def from_pretrained(cls, name_or_path, dtype=np.float32):
        """Loads a Hugging Face GPT-2 directory (``config.json`` + ``model.safetensors``), with the
        ``safetensors`` package's numpy API. A ``transformer.`` prefix and a tied ``lm_head.weight``
        are accepted.

        Raises:
            FileNotFoundError: no directory, ``config.json`` or ``model.safetensors``.
            ValueError: a missing, unknown or mis-shaped tensor (listed); an unsupported config.
        """
        model_dir = resolve_model_dir(name_or_path)
        model = cls(GPT2Config.from_dict(read_config(model_dir)), dtype=dtype)
        model.load_state_dict(load_safetensors(model_dir))
        return model

    def _prepare(self, input_ids, attention_mask, past_key_values):
        ids = as_ids(input_ids, "input_ids")
        N, L = ids.shape
        cache = past_key_values
        if cache is None:
            cache = self.new_cache(N, L)
        elif not isinstance(cache, KVCache):
            cache = KVCache.from_legacy(cache, self.config.n_head, self.head_dim, self.dtype)
        if cache._impl.batch != N:
            raise ValueError(f"past_key_values: cache batch {cache._impl.batch} differs from input_ids' {N}")
        mask = None
        if attention_mask is not None:
            mask = np.ascontiguousarray(as_bool(attention_mask, "attention_mask"))
            if mask.ndim == 1:
                mask = mask[None]
            expected = (N, cache.length + L)
            if mask.shape != expected:
                raise ValueError(f"attention_mask: expected shape {expected} (batch, past + new length), got {mask.shape}")
            if mask.all():
                mask = None
        return ids, mask, cache

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache: bool = False):
        """Runs the transformer.

        Args:
            input_ids: ``(N, L)`` token ids in ``[0, vocab_size)``; past + L <= n_positions.
            attention_mask: ``(N, past + L)``, 1 = real token (left padding for batched prompts).
            past_key_values: a :class:`KVCache` (updated in place) or Hugging Face's legacy tuple.
            use_cache: return the cache.

        Returns:
            ``(hidden (N, L, n_embd), cache or None)``.

        Raises:
            ValueError: ids out of range, too long, masks or caches that do not fit.
        """
        ids, mask, cache = self._prepare(input_ids, attention_mask, past_key_values)
        hidden = self._impl.forward(ids, mask, cache._impl)
        return hidden, (cache if use_cache else None)


class GPT2LMHeadModel(GPT2Model):
    """GPT-2 with its language-model head (tied to ``wte``): next-token logits, KV-cache decoding
    and ``generate`` (greedy or sampling), as Hugging Face's ``GPT2LMHeadModel``.
    """

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache: bool = False,
                logits_to_keep: int = 0) -> CausalLMOutput:
        """Next-token logits.

        Args:
            input_ids, attention_mask, past_key_values, use_cache: as :meth:`GPT2Model.forward`.
            logits_to_keep: 0 = logits for every position; k > 0 = only the last k.

        Returns:
            :class:`CausalLMOutput` with ``logits (N, L, vocab_size)``.
        """
        hidden, cache = GPT2Model.forward(self, input_ids, attention_mask, past_key_values, use_cache=True)
        N, L, E = hidden.shape
        keep = hidden if not logits_to_keep else hidden[:, -logits_to_keep:]
        logits = self._impl.lm_head(np.ascontiguousarray(keep).reshape(-1, E)).reshape(N, keep.shape[1], -1)
        return CausalLMOutput(logits=logits, past_key_values=cache if use_cache else None, last_hidden_state=hidden)

    def generate(self, input_ids, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 attention_mask=None, eos_token_id: int | None = None) -> np.ndarray:
        """Autoregressive decoding with a KV cache: the prompt once, then one token per step.

        Args:
            input_ids: ``(N, L)`` prompt ids (left-padded, with ``attention_mask``, for a batch of
                different lengths).
            max_new_tokens: tokens to add (>= 1).
            do_sample: sample from ``softmax(logits / temperature)`` (after top-k / top-p
                filtering); else greedy (argmax).
            temperature, top_k, top_p: sampling controls (temperature > 0, top_k >= 1,
                0 < top_p <= 1).
            seed: seeds numpy's generator for sampling.
            attention_mask: ``(N, L)``, 1 = real prompt token.
            eos_token_id: a sequence that emits it is finished and padded with it (default: the
                config's, if inside the vocabulary).

        Returns:
            ``(N, L + new)`` int64 ids, prompt included (as Hugging Face returns them); fewer new
            tokens if every sequence finished early.

        Raises:
            ValueError: bad sampling arguments, or prompt + max_new_tokens > n_positions.
        """
        from .functional import softmax

        ids = as_ids(input_ids, "input_ids")
        max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
        if do_sample:
            if not temperature > 0:
                raise ValueError(f"temperature: expected a value > 0, got {temperature}")
            if top_k is not None and (isinstance(top_k, bool) or int(top_k) < 1):
                raise ValueError(f"top_k: expected an int >= 1 or None, got {top_k}")
            if top_p is not None and not 0 < top_p <= 1:
                raise ValueError(f"top_p: expected a value in (0, 1] or None, got {top_p}")
        N, L = ids.shape
        if L + max_new_tokens > self.config.n_positions:
            raise ValueError(f"max_new_tokens: prompt length {L} + {max_new_tokens} exceeds n_positions "
                             f"({self.config.n_positions})")
        if eos_token_id is None:
            eos = self.config.eos_token_id
            eos_token_id = eos if eos is not None and 0 <= eos < self.config.vocab_size else None
        rng = np.random.default_rng(seed)
        mask = None if attention_mask is None else as_bool(attention_mask, "attention_mask").astype(np.int64)
        cache = self.new_cache(N, L + max_new_tokens)
        out = self(ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        tokens = [ids]
        finished = np.zeros(N, dtype=bool)
        for step in range(max_new_tokens):
            logits = out.logits[:, -1].astype(np.float64)  # (N, vocab)
            if do_sample:
                nxt = self._sample(logits, temperature, top_k, top_p, rng, softmax)
            else:
                nxt = logits.argmax(axis=-1)
            if eos_token_id is not None:
                nxt = np.where(finished, eos_token_id, nxt)
                finished |= nxt == eos_token_id
            nxt = nxt.astype(np.int64)[:, None]
            tokens.append(nxt)
            if (eos_token_id is not None and finished.all()) or step == max_new_tokens - 1:
                break
            if mask is not None:
                mask = np.concatenate([mask, np.ones((N, 1), np.int64)], axis=1)
            out = self(nxt, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return np.concatenate(tokens, axis=1)

    @staticmethod
    def _sample(logits, temperature, top_k, top_p, rng, softmax) -> np.ndarray:
        logits = logits / temperature
        if top_k is not None:
            k = min(int(top_k), logits.shape[-1])
            kth = np.sort(logits, axis=-1)[:, -k][:, None]
            logits = np.where(logits < kth, -np.inf, logits)
        if top_p is not None and top_p < 1:
            order = np.argsort(-logits, axis=-1)
            sorted_probs = np.take_along_axis(softmax(logits), order, axis=-1)
            cum = np.cumsum(sorted_probs, axis=-1)
            drop_sorted = cum - sorted_probs > top_p  # keep the smallest prefix whose mass reaches top_p
            drop = np.zeros_like(drop_sorted)
            np.put_along_axis(drop, order, drop_sorted, axis=-1)
            logits = np.where(drop, -np.inf, logits)
        probs = softmax(logits)
        return np.array([rng.choice(probs.shape[-1], p=p / p.sum()) for p in probs])
