"""Llama (Touvron et al. 2023) — SmolLM2 is one: decoder-only with RMSNorm, rotary positions (RoPE),
grouped-query attention and a SwiGLU feed-forward; the tutorials' modern variants (RoPE, GQA/MQA,
KV cache). The shared decoder stack (:mod:`.decoder`) with Llama's config and weight names;
checkpoints load from a Hugging Face directory (safetensors) or a GGUF file, without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._runtime import core as _core
from ._validation import activation, check_config_fields, check_eps, check_mapping, check_token_ids
from .decoder import CausalLM, DecoderModel

__all__ = ["LlamaConfig", "LlamaModel", "LlamaForCausalLM"]


@dataclass
class LlamaConfig:
    """The fields of a Hugging Face ``LlamaConfig`` that the forward pass needs (``config.json``).

    Sizes are checked when the model is built (ValueError naming the field)."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = 1
    eos_token_id: int | list | None = 2
    pad_token_id: int | None = None
    #: dropout on the attention probabilities in training (Hugging Face's default 0): NOT applied (a
    #: warning says so when it is > 0); Llama has no other dropout.
    attention_dropout: float = 0.0
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """Reads a ``config.json`` dict (Hugging Face 4.x ``rope_theta`` or 5.x ``rope_parameters``).

        Raises:
            TypeError: ``d`` not a dict. ValueError: a ``model_type`` other than llama, or RoPE
            scaling (``rope_scaling`` / a ``rope_type`` other than "default"), which this
            implementation does not compute.
        """
        check_mapping(d, "config")
        model_type = d.get("model_type", "llama")
        if model_type != "llama":
            raise ValueError(f"config.json: model_type {model_type!r} is not supported here (expected 'llama')")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ValueError(f"config.json: rope_parameters: expected an object, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"config.json: rope_type {rope_type!r} (RoPE scaling) is not supported, only 'default'")
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "extra"}
        if "rope_theta" in rope:
            fields["rope_theta"] = rope["rope_theta"]
        config = cls(**fields)
        config.check()
        return config

    #: The C++ decoder's names of the fields (in its errors) -> Llama's.
    _CORE_NAMES = {"norm_eps": "rms_norm_eps", "embed_dim": "hidden_size", "num_heads": "num_attention_heads",
                   "num_kv_heads": "num_key_value_heads"}

    def check(self) -> "LlamaConfig":
        """Checks every field's type and range, naming the field: sizes are ints >= 1
        (``num_hidden_layers`` >= 0; ``num_key_value_heads``, ``head_dim`` None or >= 0: the
        defaults), ``rms_norm_eps`` a finite number >= 0, ``rope_theta`` a finite number > 0, the
        flags bools, ``hidden_act`` a name of the library's table, the token ids None, ids or lists
        of ids. Sizes too large for this machine are the C++ model's to refuse.

        Raises:
            TypeError / ValueError: naming the field.
        """
        check_config_fields(self, ints=("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                        "max_position_embeddings"),
                            nonnegative_ints=("num_hidden_layers",), optional_ints=("num_key_value_heads", "head_dim"),
                            eps=("rms_norm_eps",), floats_positive=("rope_theta",),
                            bools=("attention_bias", "mlp_bias", "tie_word_embeddings"))
        activation(self.hidden_act, "hidden_act")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            check_token_ids(getattr(self, name), name)
        return self

    def to_dict(self) -> dict:
        """The ``config.json`` object Hugging Face's ``LlamaConfig`` reads."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        d.update(model_type="llama", architectures=["LlamaForCausalLM"])
        return d

    @property
    def num_layers(self) -> int:
        """``num_hidden_layers`` (the decoder stack's common name)."""
        return self.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        """``num_key_value_heads``, or ``num_attention_heads`` when unset (no GQA)."""
        return self.num_key_value_heads or self.num_attention_heads

    def _to_core(self):
        self.check()
        c = _core.LlamaConfig()
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"):
            setattr(c, name, getattr(self, name))
        c.num_key_value_heads = self.num_key_value_heads or 0
        c.head_dim = self.head_dim or 0
        c.rms_norm_eps = check_eps(self.rms_norm_eps, "rms_norm_eps")
        c.rope_theta = float(self.rope_theta)
        c.attention_bias, c.mlp_bias = bool(self.attention_bias), bool(self.mlp_bias)
        c.tie_word_embeddings = bool(self.tie_word_embeddings)
        pad = self.pad_token_id
        c.pad_token_id = pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else -1
        c.hidden_act = activation(self.hidden_act, "hidden_act")
        return c


class LlamaModel(DecoderModel):
    """The Llama transformer: token embedding, RMSNorm pre-norm blocks (GQA attention with RoPE,
    SwiGLU MLP), final norm.

    Weights: Hugging Face's ``LlamaModel`` names — ``embed_tokens.weight (V, E)``,
    ``layers.{i}.input_layernorm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
    ``layers.{i}.post_attention_layernorm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
    ``norm.weight``; a ``model.`` prefix is accepted when loading.

    Args:
        config: :class:`LlamaConfig` or a ``config.json`` dict.
        dtype: ``np.float32`` or ``np.float64``.
    """

    config_class = LlamaConfig
    _core_class = "LlamaModel"

    def _public_name(self, core_name: str) -> str | None:
        return None if core_name == "lm_head.weight" else core_name  # hidden states need no head

    def _rename_state_dict(self, state: dict) -> dict:
        return {k.removeprefix("model."): v for k, v in state.items()
                if not k.endswith("rotary_emb.inv_freq") and k != "lm_head.weight"}

    @classmethod
    def from_pretrained(cls, name_or_path, dtype=np.float32):
        """Loads a Hugging Face Llama directory (``config.json`` + ``model.safetensors`` or a
        sharded ``model.safetensors.index.json``; float16/bfloat16 tensors converted to ``dtype``)
        or a ``.gguf`` file (see :func:`transformer_core.gguf_file.read_gguf`; Q4_0, Q4_1, Q8_0,
        F16, BF16 blocks dequantized to ``dtype``), or the embedded ``"SmolLM2-135M-Instruct"``.
        ``model.source`` keeps the checkpoint (a ``GGUFCheckpoint`` or the directory).

        Raises:
            FileNotFoundError: nothing at ``name_or_path``.
            ValueError: an unsupported or malformed checkpoint (named), a missing, unknown or
                mis-shaped tensor (listed).
        """
        from .checkpoints import load_llama_checkpoint

        config, state, source = load_llama_checkpoint(name_or_path, dtype)
        model = cls(config, dtype=dtype)
        model.load_state_dict(state)
        model.source = source
        return model


class LlamaForCausalLM(LlamaModel, CausalLM):
    """Llama with its language-model head (tied to ``embed_tokens`` or ``lm_head.weight``):
    next-token logits, KV-cache decoding, ``generate`` and training (``loss`` / ``backward``, see
    :class:`~transformer_core.decoder.CausalLM`; tied, the head's gradient adds into
    ``model.embed_tokens.weight``'s), as Hugging Face's ``LlamaForCausalLM``.

    Weights: ``model.*`` (the :class:`LlamaModel` names) and, untied, ``lm_head.weight (V, E)``.
    """

    def _dropout_probs(self) -> tuple[float, float]:
        from .module import check_dropout

        if check_dropout(self.config.attention_dropout, "attention_dropout") > 0:
            import warnings

            warnings.warn("attention_dropout: dropout on the attention probabilities is not implemented; it is not "
                          "applied", stacklevel=3)
        return 0.0, 0.0

    def _public_name(self, core_name: str) -> str:
        return core_name if core_name == "lm_head.weight" else "model." + core_name

    def _rename_state_dict(self, state: dict) -> dict:
        out = {}
        for name, value in state.items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # tied to model.embed_tokens.weight
            out[name if name.startswith("model.") or name == "lm_head.weight" else "model." + name] = value
        return out
