"""BERT (Devlin et al. 2019): encoder-only; seed 001 ("Positional Embeddings", "Encoder") and
seed 000 ("BERT vs GPT"). Weights load from a Hugging Face directory without torch.

    embeddings = LayerNorm(word[input_ids] + position[0..L) + token_type[token_type_ids])
    hidden     = post-LN encoder layer (GELU) x num_hidden_layers
    pooler     = tanh(dense(hidden[:, 0]))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ._runtime import core as _core
from ._validation import as_bool, as_ids, resolve_dtype
from .hub import load_safetensors, read_config, resolve_model_dir
from .module import Module

__all__ = ["BertConfig", "BertEmbeddings", "BertModel", "BertOutput"]

# Buffers some checkpoints carry that are not weights.
_IGNORED_KEYS = re.compile(r"(^|\.)(position_ids|token_type_ids)$")


@dataclass
class BertConfig:
    """The fields of a Hugging Face ``BertConfig`` that the forward pass needs (``config.json``)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    add_pooling_layer: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        """Reads the known fields of a ``config.json`` dict; unknown fields are ignored.

        Raises:
            ValueError: an unsupported ``hidden_act`` or ``position_embedding_type``.
        """
        act = d.get("hidden_act", "gelu")
        if act not in ("gelu", "relu", "gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"config.json: hidden_act {act!r} is not supported (gelu, relu, gelu_new)")
        pe = d.get("position_embedding_type", "absolute")
        if pe != "absolute":
            raise ValueError(f"config.json: position_embedding_type {pe!r} is not supported (absolute)")
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**fields)

    def _core_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class BertOutput:
    """What ``BertModel`` returns.

    Attributes:
        last_hidden_state: ``(N, L, H)`` float array, the last layer's hidden states.
        pooler_output: ``(N, H)`` ``tanh(dense(last_hidden_state[:, 0]))``, or None without a pooler.
    """

    last_hidden_state: np.ndarray
    pooler_output: np.ndarray | None


def _rename_hf(state: dict, *, strip_prefix: bool = True) -> dict:
    """Checkpoint names -> ours: drops a leading ``bert.``, old ``gamma``/``beta`` LayerNorm names
    become ``weight``/``bias``, buffers (``position_ids``) are dropped."""
    out = {}
    for name, value in state.items():
        if _IGNORED_KEYS.search(name):
            continue
        if strip_prefix and name.startswith("bert."):
            name = name[len("bert."):]
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        out[name] = value
    return out


class BertModel(Module):
    """BERT encoder (embeddings + post-LN encoder stack + optional pooler), weights named as Hugging
    Face's ``BertModel`` state_dict.

    Args:
        config: a :class:`BertConfig` (or a ``config.json`` dict).
        dtype: ``np.float32`` (default) or ``np.float64``.

    Use :meth:`from_pretrained` to load a checkpoint.
    """

    def __init__(self, config, dtype=np.float32):
        sfx = self._init_dtype(dtype)
        self.config = config if isinstance(config, BertConfig) else BertConfig.from_dict(config)
        self._impl = getattr(_core, "BertModel" + sfx)(self.config._core_dict())
        self._init_weights()

    def _rename_state_dict(self, state: dict) -> dict:
        # Drop classification heads of BertFor* checkpoints (cls.*) only when loading from a file.
        return _rename_hf(state)

    @classmethod
    def from_pretrained(cls, name_or_path, dtype=np.float32) -> "BertModel":
        """Loads a Hugging Face BERT directory (``config.json`` + ``model.safetensors``) or an
        embedded model by name (``"all-MiniLM-L6-v2"``, the default), with the ``safetensors``
        package's numpy API: no torch.

        A ``bert.`` prefix (``BertFor*`` checkpoints) and old ``gamma``/``beta`` names are accepted;
        heads other than the pooler (``cls.*``) are ignored.

        Raises:
            FileNotFoundError: no such directory/model, or no ``config.json``/``model.safetensors``.
            ValueError: a missing, unknown or mis-shaped tensor (listed); an unsupported config.
        """
        model_dir = resolve_model_dir(name_or_path)
        config = BertConfig.from_dict(read_config(model_dir))
        state = _rename_hf(load_safetensors(model_dir))
        state = {k: v for k, v in state.items() if not k.startswith("cls.")}
        if not any(k.startswith("pooler.") for k in state):
            config.add_pooling_layer = False
        model = cls(config, dtype=dtype)
        model.load_state_dict(state)
        model.name_or_path = str(name_or_path)
        return model

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> BertOutput:
        """Runs BERT.

        Args:
            input_ids: ``(N, L)`` (or ``(L,)``) integer token ids in ``[0, vocab_size)``,
                ``L <= max_position_embeddings``.
            attention_mask: ``(N, L)``, 1/True = a real token, 0 = padding (Hugging Face's
                convention); None = all real.
            token_type_ids: ``(N, L)`` segment ids in ``[0, type_vocab_size)``; None = zeros.

        Returns:
            :class:`BertOutput` with ``last_hidden_state (N, L, H)`` and ``pooler_output (N, H)``
            (None without a pooler), in ``self.dtype``. With padding, the layers run on the real
            tokens only and the hidden states of padding positions are zeros (as torch's
            nested-tensor encoder returns them); real tokens match Hugging Face's.

        Raises:
            ValueError: ids out of range, L > max_position_embeddings, shapes that disagree,
                empty input. TypeError: non-integer ids.
        """
        ids = as_ids(input_ids, "input_ids")
        mask = None
        if attention_mask is not None:
            mask = np.ascontiguousarray(as_bool(attention_mask, "attention_mask"))
            if mask.ndim == 1:
                mask = mask[None]
            if mask.shape != ids.shape:
                raise ValueError(f"attention_mask: expected shape {ids.shape} (input_ids'), got {mask.shape}")
        tt = None
        if token_type_ids is not None:
            tt = as_ids(token_type_ids, "token_type_ids")
            if tt.shape != ids.shape:
                raise ValueError(f"token_type_ids: expected shape {ids.shape} (input_ids'), got {tt.shape}")
        hidden, pooled = self._impl.forward(ids, mask, tt)
        return BertOutput(last_hidden_state=hidden, pooler_output=pooled)


class BertEmbeddings:
    """BERT's input embeddings (seed 001 ``Embeddings``): word + learned position + token type,
    then LayerNorm (eps from the config, 1e-12 for BERT). Dropout is the identity (inference).

    Shares the weights of a :class:`BertModel` (``model.embeddings``) or standalone from a config.

    Args:
        config: :class:`BertConfig` or dict.
        dtype: ``np.float32`` or ``np.float64``.
    """

    def __init__(self, config, dtype=np.float32, *, weights: dict | None = None):
        self.config = config if isinstance(config, BertConfig) else BertConfig.from_dict(config)
        self.dtype = resolve_dtype(dtype)
        rng = np.random.default_rng(0)
        c = self.config
        self.word_embeddings = rng.normal(0, 0.02, (c.vocab_size, c.hidden_size)).astype(self.dtype)
        self.position_embeddings = rng.normal(0, 0.02, (c.max_position_embeddings, c.hidden_size)).astype(self.dtype)
        self.token_type_embeddings = rng.normal(0, 0.02, (c.type_vocab_size, c.hidden_size)).astype(self.dtype)
        self.layer_norm_weight = np.ones(c.hidden_size, self.dtype)
        self.layer_norm_bias = np.zeros(c.hidden_size, self.dtype)
        if weights is not None:
            self.load_state_dict(weights)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Weights under Hugging Face's names (``word_embeddings.weight``, ``LayerNorm.weight``, ...)."""
        return {
            "word_embeddings.weight": self.word_embeddings,
            "position_embeddings.weight": self.position_embeddings,
            "token_type_embeddings.weight": self.token_type_embeddings,
            "LayerNorm.weight": self.layer_norm_weight,
            "LayerNorm.bias": self.layer_norm_bias,
        }

    def load_state_dict(self, state: dict) -> None:
        """Loads Hugging Face's embedding names (optionally under ``embeddings.``).

        Raises:
            ValueError: listing missing or mis-shaped tensors; nothing is changed then.
        """
        state = {k.removeprefix("embeddings."): v for k, v in _rename_hf(dict(state)).items()}
        current = self.state_dict()
        problems = [k for k in current if k not in state]
        problems += [f"{k}: expected {current[k].shape}, got {np.shape(state[k])}" for k in current
                     if k in state and np.shape(state[k]) != current[k].shape]
        if problems:
            raise ValueError(f"BertEmbeddings.load_state_dict refused: {problems}")
        self.word_embeddings = np.ascontiguousarray(state["word_embeddings.weight"], self.dtype)
        self.position_embeddings = np.ascontiguousarray(state["position_embeddings.weight"], self.dtype)
        self.token_type_embeddings = np.ascontiguousarray(state["token_type_embeddings.weight"], self.dtype)
        self.layer_norm_weight = np.ascontiguousarray(state["LayerNorm.weight"], self.dtype)
        self.layer_norm_bias = np.ascontiguousarray(state["LayerNorm.bias"], self.dtype)

    @classmethod
    def from_model(cls, model: BertModel) -> "BertEmbeddings":
        """The embeddings of a loaded :class:`BertModel` (a copy of its weights)."""
        sd = {k: v for k, v in model.state_dict().items() if k.startswith("embeddings.")}
        return cls(model.config, model.dtype, weights=sd)

    def __call__(self, input_ids, token_type_ids=None) -> np.ndarray:
        """``input_ids (N, L)`` -> ``(N, L, H)`` embeddings.

        Raises:
            ValueError: ids outside the vocabulary, L > max_position_embeddings.
        """
        from .functional import layer_norm

        ids = as_ids(input_ids, "input_ids")
        c = self.config
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"input_ids: expected ids in [0, {c.vocab_size}), got range [{ids.min()}, {ids.max()}]")
        if ids.shape[1] > c.max_position_embeddings:
            raise ValueError(f"input_ids: sequence length {ids.shape[1]} exceeds max_position_embeddings "
                             f"({c.max_position_embeddings})")
        tt = np.zeros_like(ids) if token_type_ids is None else as_ids(token_type_ids, "token_type_ids")
        if tt.shape != ids.shape:
            raise ValueError(f"token_type_ids: expected shape {ids.shape}, got {tt.shape}")
        if tt.min() < 0 or tt.max() >= c.type_vocab_size:
            raise ValueError(f"token_type_ids: expected ids in [0, {c.type_vocab_size})")
        # [N, L, H] = word[ids] + position[0..L) + token_type[tt]
        x = self.word_embeddings[ids] + self.position_embeddings[: ids.shape[1]][None] + self.token_type_embeddings[tt]
        return layer_norm(x, self.layer_norm_weight, self.layer_norm_bias, c.layer_norm_eps)
