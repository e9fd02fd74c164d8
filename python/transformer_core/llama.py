"""Llama (Touvron et al. 2023) — SmolLM2 is one: decoder-only with RMSNorm, rotary positions (RoPE),
grouped-query attention and a SwiGLU feed-forward; the tutorials' modern variants (RoPE, GQA/MQA,
KV cache). The shared decoder stack (:mod:`.decoder`) with Llama's config and weight names;
checkpoints load from a Hugging Face directory (safetensors) or a GGUF file, without torch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._runtime import core as _core
from ._validation import (
    activation,
    check_bool,
    check_config_fields,
    check_eps,
    check_int,
    check_mapping,
    config_token_ids,
    hf_config_fields,
    resolve_dtype,
)
from .checkpoints import json_value
from .decoder import CausalLM, DecoderModel, _load_tied_head, _rename_known
from .hub import ConfigRule, LayerRule, check_config_against_weights, load_weights_into, weights_file_label
from .module import check_dropout

__all__ = ["LlamaConfig", "LlamaModel", "LlamaForCausalLM"]

#: Keys of a ``config.json`` that ``LlamaConfig.extra`` does not keep: those ``to_dict`` writes
#: itself (``model_type``, ``architectures``; ``rope_theta`` stands for ``rope_scaling`` /
#: ``rope_parameters``, whose only other content ``from_dict`` accepts is the "default" type),
#: and those that describe the file read (the dtype of its weights, the library that wrote it).
_NOT_KEPT = frozenset({"model_type", "architectures", "rope_scaling", "rope_parameters", "transformers_version",
                       "torch_dtype", "dtype"})


def _same_bits(a: np.ndarray, b: np.ndarray, rows: int = 4096) -> bool:
    """Whether two tables hold the same values bit for bit (NaN equal to itself), compared ``rows``
    rows at a time: no temporary the size of a vocabulary-sized table."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = np.dtype(f"u{a.dtype.itemsize}")  # the values' bit patterns: NaN == NaN, -0.0 != 0.0
    a2 = np.ascontiguousarray(a.reshape(a.shape[0], -1)).view(bits)
    b2 = np.ascontiguousarray(b.reshape(b.shape[0], -1)).view(bits)
    return all(np.array_equal(a2[i:i + rows], b2[i:i + rows]) for i in range(0, a2.shape[0], rows))


@dataclass
class LlamaConfig:
    """The fields of a Hugging Face ``LlamaConfig`` that the forward pass needs (``config.json``).

    Sizes are checked when the model is built (ValueError naming the field).

    Unlike transformers: ``max_position_embeddings`` is the context length here, which ``forward``,
    ``loss``, ``generate`` and the KV cache enforce (past + new length, and ``position_ids``, below
    it; a ValueError naming ``input_ids``, ``position_ids`` or, for ``generate``, ``max_new_tokens``
    otherwise). transformers' Llama computes RoPE past it (there it is only the pre-training
    length, read by RoPE scalings, which are refused here), so a longer input gives logits there
    and a ValueError here."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    #: the context length, enforced (see the class doc; transformers does not enforce it)
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
    #: dropout on the attention probabilities in training forwards (Hugging Face's default 0);
    #: Llama has no other dropout.
    attention_dropout: float = 0.0
    #: the other keys of the ``config.json`` read (``from_dict``: ``use_cache``,
    #: ``initializer_range``, ...), written back by ``to_dict`` so that a saved model's config
    #: reloads as it was, as ``GPT2Config.extra`` (not kept: ``transformers_version``,
    #: ``torch_dtype`` and ``dtype``, which describe the file read, not the one written, and the keys
    #: ``to_dict`` writes itself or stands for: ``model_type``, ``architectures``, ``rope_scaling``,
    #: ``rope_parameters``).
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """Reads a ``config.json`` dict (Hugging Face 4.x ``rope_theta`` or 5.x ``rope_parameters``);
        the keys that are not fields go to ``extra``.

        Raises:
            TypeError: ``d`` not a dict. ValueError: a ``model_type`` other than llama, or RoPE
            scaling (a ``rope_type`` other than "default" in ``rope_scaling`` or in
            ``rope_parameters``, each checked), which this implementation does not compute.
        """
        check_mapping(d, "config")
        model_type = d.get("model_type", "llama")
        if model_type != "llama":
            raise ValueError(f"config.json: model_type {model_type!r} is not supported here (expected 'llama')")
        for key in ("rope_scaling", "rope_parameters"):  # a scaling in either is refused, not ignored
            rope = d.get(key)
            if rope is None:
                continue
            if not isinstance(rope, dict):
                raise ValueError(f"config.json: {key}: expected an object, got {rope!r}")
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise ValueError(f"config.json: {key}: rope_type {rope_type!r} (RoPE scaling) is not supported, "
                                 "only 'default'")
        # Hugging Face reads a non-empty rope_scaling in place of rope_parameters (rope_theta included)
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "extra"}
        if "rope_theta" in rope:
            fields["rope_theta"] = rope["rope_theta"]
        extra = {k: copy.deepcopy(v) for k, v in d.items() if k not in cls.__dataclass_fields__ and k not in _NOT_KEPT}
        config = cls(**fields, extra=extra)
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
        of ids, ``attention_dropout`` a probability in [0, 1). Sizes too large for this machine are
        the C++ model's to refuse. ``extra`` is a dict (its ``use_cache``, when there, a bool: the
        forward's default).

        A negative ``bos_token_id`` / ``eos_token_id`` means none, as in Hugging Face: the field is
        set to None, and a list's negative ids are dropped (``_validation.config_token_ids``).
        ``pad_token_id`` is None or an int in ``[-vocab_size, vocab_size)``, kept as given (so
        :meth:`to_dict` writes it back): the token embedding's row that gets no gradient and starts
        at zero, as torch's ``padding_idx`` (Hugging Face builds ``nn.Embedding(vocab_size,
        hidden_size, padding_idx=pad_token_id)``). A negative id counts from the end: the
        ``"pad_token_id": -1`` of the configs ``transformers`` 4.27/4.28 converted is row
        ``vocab_size - 1``, a real token (``generate`` reads it as no pad id).

        Raises:
            TypeError / ValueError: naming the field (``pad_token_id``: not an int; outside
                ``[-vocab_size, vocab_size)``, which torch refuses too).
        """
        check_config_fields(self, ints=("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                        "max_position_embeddings"),
                            nonnegative_ints=("num_hidden_layers",), optional_ints=("num_key_value_heads", "head_dim"),
                            eps=("rms_norm_eps",), floats_positive=("rope_theta",),
                            bools=("attention_bias", "mlp_bias", "tie_word_embeddings"))
        activation(self.hidden_act, "hidden_act")
        for name in ("bos_token_id", "eos_token_id"):
            setattr(self, name, config_token_ids(getattr(self, name), name))
        if self.pad_token_id is not None:  # torch's padding_idx: -1 is row vocab_size - 1
            self.pad_token_id = check_int(self.pad_token_id, "pad_token_id", -self.vocab_size, self.vocab_size - 1)
        check_dropout(self.attention_dropout, "attention_dropout")
        check_mapping(self.extra, "extra")
        if "use_cache" in self.extra:  # kept in extra, read by forward (its default): a bool, as transformers checks
            check_bool(self.extra["use_cache"], "use_cache")
        return self

    def to_dict(self) -> dict:
        """The ``config.json`` object Hugging Face's ``LlamaConfig`` reads: ``extra``'s keys
        (copies, numpy scalars as Python numbers), then the fields. A ``num_key_value_heads`` or
        ``head_dim`` of 0 (the default, as None) is written as null: Hugging Face reads only null
        as the default, and 0 as a size of 0.

        Raises:
            TypeError: an ``extra`` value that JSON cannot write (an array, a set, an object),
                naming it: ``config.extra['key']`` (:func:`~transformer_core.checkpoints.json_value`).
        """
        d = {k: json_value(v, f"config.extra[{k!r}]") for k, v in self.extra.items() if k not in _NOT_KEPT}
        d.update(hf_config_fields({k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}))
        for key in ("num_key_value_heads", "head_dim"):
            if d[key] == 0:  # our default, as None (check() accepts both)
                d[key] = None
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

    def _padding_row(self) -> int | None:
        """The token embedding's row of ``pad_token_id`` (``pad_token_id % vocab_size``, as torch
        reads ``padding_idx``), or None; after :meth:`check`."""
        return None if self.pad_token_id is None else self.pad_token_id % self.vocab_size

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
        row = self._padding_row()
        c.pad_token_id = -1 if row is None else row
        c.hidden_act = activation(self.hidden_act, "hidden_act")
        return c


class LlamaModel(DecoderModel):
    """The Llama transformer: token embedding, RMSNorm pre-norm blocks (GQA attention with RoPE,
    SwiGLU MLP), final norm.

    Weights: Hugging Face's ``LlamaModel`` names — ``embed_tokens.weight (V, E)``,
    ``layers.{i}.input_layernorm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
    ``layers.{i}.post_attention_layernorm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
    ``norm.weight``; a ``model.`` prefix is accepted when loading (an ``lm_head.weight`` is
    ignored: hidden states need no head); unknown keys are reported under the names given.
    :meth:`from_pretrained` also leaves out the ``score.*`` head of a
    ``LlamaForSequenceClassification`` / ``...ForTokenClassification`` folder, as transformers'
    ``LlamaModel.from_pretrained`` does. The context is ``config.max_position_embeddings``
    positions (past + new), enforced here unlike in transformers (see :class:`LlamaConfig`).

    Args:
        config: :class:`LlamaConfig` or a ``config.json`` dict.
        dtype: ``np.float32`` or ``np.float64``.
        rope_layout: how the model holds its q/k projection rows inside each head, and so which
            pairs RoPE rotates: ``"half"`` (Hugging Face's rotate-half order, the default) or
            ``"interleaved"`` (Meta's original order, which llama.cpp's GGUF files keep: a GGUF
            model's q/k blocks are then used in place). The results are the same up to float32
            rounding; ``state_dict``/``load_state_dict``, ``gradients()`` and the optimizer moments
            that ``training.save_checkpoint`` writes always speak Hugging Face's order. The
            zero-copy ``named_parameters()`` views (and an optimizer's in-memory state) hold the
            model's own order: their ``row_permutation`` maps it (as does the KV cache's keys).

    Raises:
        ValueError: an unknown ``rope_layout``.
    """

    config_class = LlamaConfig
    _core_class = "LlamaModel"
    #: Task heads a checkpoint folder may hold that :meth:`from_pretrained` leaves out (a
    #: sequence or token classifier's).
    _checkpoint_heads = frozenset({"score.weight", "score.bias"})

    def __init__(self, config, dtype=np.float32, *, rope_layout: str = "half"):
        if rope_layout not in ("half", "interleaved"):
            raise ValueError(f"rope_layout: expected 'half' or 'interleaved', got {rope_layout!r}")
        self.rope_layout = rope_layout
        super().__init__(config, dtype)

    def _core_config(self):
        c = self.config._to_core()
        c.rope_layout = self.rope_layout
        return c

    def _padding_rows(self) -> dict[str, int]:
        """The :class:`~transformer_core.module.Module` hook: the ``pad_token_id`` row of
        ``embed_tokens`` starts at zero, as in Hugging Face's ``_init_weights``."""
        row = self.config._padding_row()
        return {} if row is None else {"embed_tokens.weight": row}

    # ---- q/k rows: the model's order <-> Hugging Face's (see rope_layout) ------------------------
    def _qk_heads(self, name: str) -> int | None:
        """Heads of a q/k projection weight or bias named ``name`` (checkpoint name), else None."""
        if ".self_attn.q_proj." in name:
            return self.config.num_attention_heads
        if ".self_attn.k_proj." in name:
            return self.config.num_kv_heads
        return None

    def _qk_permutation(self, name: str):
        """For an interleaved model's q/k weight/bias ``name``: the index ``p`` with
        ``hf_rows = our_rows[p]`` (:func:`~transformer_core.gguf_file.rope_row_permutation`)."""
        heads = self._qk_heads(name) if self.rope_layout == "interleaved" else None
        if heads is None:
            return None
        from .gguf_file import rope_row_permutation

        return rope_row_permutation(heads, self.head_dim)

    @property
    def _key_order(self):
        """The KV cache's ``key_order``: an interleaved model's keys hold each head's dims in
        llama.cpp's order (:func:`~transformer_core.gguf_file.rope_row_permutation` of one head)."""
        if self.rope_layout != "interleaved":
            return None
        from .gguf_file import rope_row_permutation

        return rope_row_permutation(1, self.head_dim)

    def _row_permutation(self, name: str):
        """The :class:`~transformer_core.module.Module` hook: an interleaved model's q/k rows map
        to Hugging Face's by :meth:`_qk_permutation`, so ``state_dict``, ``load_state_dict``,
        ``gradients`` and the saved optimizer moments all speak Hugging Face's order."""
        return self._qk_permutation(name)

    _public_name_of_core_name_only = True  # the names below hang on the core name alone

    def _public_name(self, core_name: str) -> str | None:
        return None if core_name == "lm_head.weight" else core_name  # hidden states need no head

    def _rename_state_dict(self, state: dict) -> dict:
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq") and k != "lm_head.weight"}
        return _rename_known(state, self.parameter_shapes(), lambda k: k.removeprefix("model."))

    @classmethod
    def from_pretrained(cls, name_or_path, dtype=None, *, quantize_activations: bool = False):
        """Loads a Hugging Face Llama directory (``config.json`` + ``model.safetensors`` or a
        sharded ``model.safetensors.index.json``; float16/bfloat16 tensors converted to ``dtype``)
        or a ``.gguf`` file (see :func:`transformer_core.gguf_file.read_gguf`), or the embedded
        ``"SmolLM2-135M-Instruct"`` (a GGUF file: Q4_1 layers, a Q8_0 token embedding).
        ``model.source`` keeps the checkpoint (a ``GGUFCheckpoint`` or the directory), and
        ``model.generation_config`` a directory's ``generation_config.json`` (None without one, and
        for a GGUF file), whose end and padding ids ``generate`` and chat use in place of
        ``config.json``'s (:func:`transformer_core.hub.read_generation_config`).

        A GGUF file's ``Q8_0``/``Q4_0``/``Q4_1`` matrices stay in their blocks by default
        (``dtype=None``): every weight is read in place from the memory-mapped file (no copy: the
        model keeps llama.cpp's q/k row order, ``rope_layout="interleaved"``, and the packed
        ``[q; k; v]`` and ``[gate; up]`` matrices are runs of rows in the file) and every product
        computes on the blocks (:mod:`transformer_core.quantization`); the token embedding decodes
        the rows it looks up, and a tied LM head multiplies by its blocks. F32/F16/BF16 tensors
        (norms) are float32. The model is then about the size of the file in memory, not 5x it;
        the file stays mapped while the model lives.

        Args:
            name_or_path: a directory, a ``.gguf`` file or an embedded model's name.
            dtype: None (default): GGUF blocks kept (float32 for everything else, and for a Hugging
                Face directory); ``np.float32`` / ``np.float64``: every weight dequantized to that
                dtype (the GGUF blocks with the ``gguf`` package's values).
            quantize_activations: GGUF blocks only (a ``.gguf`` file or embedded model loaded with
                ``dtype=None``): multiply with Q8 activation blocks and integer dots, as llama.cpp
                (see :func:`transformer_core.quantization.set_quantize_activations`); the default
                keeps activations in float32. True for any other load (a Hugging Face directory, or
                a ``dtype`` given: float weights) is a ValueError, not ignored.

        Raises:
            FileNotFoundError: nothing at ``name_or_path``.
            ValueError: an unsupported or malformed checkpoint (named; a directory's
                ``generation_config.json`` too); a folder whose save was interrupted during its
                final renames (its ``.save-in-progress`` marker: the files may be of two saves; the
                message says how to go on, :func:`transformer_core.hub.resolve_model_dir`); a
                directory's
                ``config.json`` whose sizes (``vocab_size``, ``hidden_size``, ``intermediate_size``,
                ``num_hidden_layers``, the heads times ``head_dim``) or ``tie_word_embeddings`` the
                weights contradict (naming the file and the fields, before the model is built); a
                missing, unknown or mis-shaped tensor (listed, naming ``model.safetensors``, a sharded
                checkpoint's index or the GGUF file); a GGUF block whose fp16 scale is NaN or inf
                (naming the file, the weight and the block: its values would be NaN or inf, with
                any ``dtype``); ``quantize_activations=True`` for a load without GGUF blocks
                (naming it, before anything is read).
            TypeError: ``dtype`` not None, float32 or float64; ``quantize_activations`` not a bool
                (``"False"`` or 0 included).
        """
        from .checkpoints import _llama_checkpoint, build_for_checkpoint
        from .hub import read_generation_config, resolve_model_path

        quantize_activations = check_bool(quantize_activations, "quantize_activations")

        if dtype is None:
            location = resolve_model_path(name_or_path)
            if location.is_file():
                from .gguf_file import read_gguf

                return cls._from_gguf_blocks(read_gguf(location), quantize_activations)
            why = f"{str(name_or_path)!r} is a Hugging Face directory"
            dtype = np.float32
        else:
            dtype = resolve_dtype(dtype)  # a bad dtype is named first
            why = f"dtype={dtype.__name__} dequantizes every weight"
        if quantize_activations:  # float weights: no block products for it to change; refused, not ignored
            raise ValueError(f"quantize_activations: applies to GGUF block weights only (a .gguf file or embedded "
                             f"model loaded with dtype=None); this load has float weights ({why})")
        config, state, source = _llama_checkpoint(name_or_path, dtype)
        state = {k: v for k, v in state.items() if k not in cls._checkpoint_heads}
        generation_config = None
        if isinstance(source, Path):  # a Hugging Face directory (not a GGUF file): config.json against its weights
            cls._check_config_against_weights(source, config, state)  # before the model is built
            generation_config = read_generation_config(source)
        model = build_for_checkpoint(cls, config, dtype, source / "config.json" if isinstance(source, Path)
                                     else source.path)  # the file, also for an embedded model's name
        if isinstance(source, Path):  # every weight (a missing one raises, naming the file)
            load_weights_into(model, state, source)
        else:  # a GGUF file
            load_weights_into(model, state, source.path, "its metadata")
        model.source = source
        model.generation_config = generation_config
        return model

    @classmethod
    def _check_config_against_weights(cls, model_dir, config: LlamaConfig, state: dict) -> None:
        """ValueError naming ``config.json`` and each field the directory's weights contradict (see
        :func:`transformer_core.hub.check_config_against_weights`), on the file's names; with an LM
        head (:class:`LlamaForCausalLM`), ``tie_word_embeddings`` too: false without an
        ``lm_head.weight`` in the file, or true with one that differs from the token embedding
        (an untied head, which a tied model cannot hold)."""
        c, p = config, r"^(?:model\.)?"
        attn = p + r"layers\.\d+\.self_attn\."
        rules = [
            ConfigRule(f"vocab_size = {c.vocab_size}", c.vocab_size, (p + r"embed_tokens\.weight$", r"^lm_head\.weight$"),
                       0),
            ConfigRule(f"hidden_size = {c.hidden_size}", c.hidden_size,
                       (p + r"embed_tokens\.weight$", p + r"norm\.weight$", r"^lm_head\.weight$"), -1),
            ConfigRule(f"intermediate_size = {c.intermediate_size}", c.intermediate_size,
                       p + r"layers\.\d+\.mlp\.(?:gate|up)_proj\.weight$", 0),
        ]
        if c.head_dim or c.hidden_size % c.num_attention_heads == 0:  # else the model's constructor refuses it
            d = c.head_dim or c.hidden_size // c.num_attention_heads
            head_dim = f"head_dim = {c.head_dim}" if c.head_dim else f"head_dim = hidden_size / num_attention_heads = {d}"
            rules.append(ConfigRule(f"num_attention_heads = {c.num_attention_heads} with {head_dim} (q_proj's "
                                    f"{c.num_attention_heads * d} rows)", c.num_attention_heads * d,
                                    attn + r"q_proj\.weight$", 0))
            kv = (f"num_key_value_heads = {c.num_key_value_heads}" if c.num_key_value_heads
                  else f"num_key_value_heads = {c.num_key_value_heads} (= num_attention_heads)")
            rules.append(ConfigRule(f"{kv} with {head_dim} (k_proj's and v_proj's {c.num_kv_heads * d} rows)",
                                    c.num_kv_heads * d, attn + r"[kv]_proj\.weight$", 0))
        layers = LayerRule(f"num_hidden_layers = {c.num_hidden_layers}", c.num_hidden_layers,
                           p + r"layers\.(\d+)\.")
        more = []
        if issubclass(cls, CausalLM):
            weights, plural = weights_file_label(model_dir)
            head = state.get("lm_head.weight")
            embed = next((state[k] for k in ("model.embed_tokens.weight", "embed_tokens.weight") if k in state), None)
            if not c.tie_word_embeddings and head is None and embed is not None:
                more.append(f"tie_word_embeddings = False (an LM head of its own), but {weights} "
                            f"{'hold' if plural else 'holds'} no lm_head.weight")
            elif (c.tie_word_embeddings and head is not None and embed is not None  # (StoredTensors: read here)
                  and not _same_bits(np.asarray(head), np.asarray(embed))):
                more.append(f"tie_word_embeddings = True, but lm_head.weight in {weights} differs from the token "
                            f"embedding (an untied head, which a tied model cannot hold)")
        check_config_against_weights(model_dir, {k: v.shape for k, v in state.items()}, rules, layers, more)

    @classmethod
    def _from_gguf_blocks(cls, checkpoint, quantize_activations: bool):
        """The model of a GGUF checkpoint with its block-format matrices kept as they are stored."""
        from .checkpoints import build_for_checkpoint, config_from_file
        from .quantization import GGML_TYPES, _linear_weight_groups, set_gguf_weights, set_quantize_activations

        # every weight loaded or replaced below; errors name the file, as the float32 path's
        config = config_from_file(LlamaConfig, checkpoint.config, checkpoint.path)
        model = build_for_checkpoint(cls, config, np.float32, checkpoint.path, rope_layout="interleaved")
        slots = model._slots()
        names = model._rename_state_dict({name: name for name in checkpoint.tensor_names})  # ours -> file's
        missing = [n for n in slots if n not in names]
        unknown = [n for n in names if n not in slots]
        if missing or unknown:
            raise ValueError(f"{checkpoint.path}: cannot load into {cls.__name__}: missing {missing}, unknown {unknown}")
        infos = {name: checkpoint.tensor_info(file_name) for name, file_name in names.items()}
        in_blocks = {name for name, info in infos.items() if info.ggml_type in GGML_TYPES and len(info.shape) == 2}
        # A packed matrix ([q; k; v], [gate; up]) keeps blocks only if all its parts are blocks;
        # one part stored F16/F32 makes the whole matrix float32.
        group_of = _linear_weight_groups(model)
        blocks, dense = {}, []
        for name, file_name in names.items():
            info, slot = infos[name], slots[name]
            if all(n in in_blocks for n in group_of.get(name, [name])):
                blocks[name] = (info.ggml_type, info.raw)  # the file's rows, in place
            else:
                value = checkpoint.tensor(file_name, np.float32)  # q/k rows in Hugging Face's order ...
                if info.row_permutation is not None:  # ... back to the file's (a q/k bias)
                    value = np.ascontiguousarray(value[np.argsort(info.row_permutation)])
                dense.append((slot, value))
        try:  # the blocks' scales are checked there, once (a NaN or inf one: the weight, block and row named)
            set_gguf_weights(model, blocks)
        except ValueError as e:
            raise ValueError(f"{checkpoint.path}: {e}") from None
        for slot, value in dense:
            slot.impl.set_parameter(slot.core_name, value)
        if quantize_activations:
            set_quantize_activations(model, True)
        model.source = checkpoint
        model.generation_config = None  # a GGUF file has none
        return model


class LlamaForCausalLM(LlamaModel, CausalLM):
    """Llama with its language-model head (tied to ``embed_tokens`` or ``lm_head.weight``):
    next-token logits, KV-cache decoding, ``generate`` and training (``loss`` / ``backward``, see
    :class:`~transformer_core.decoder.CausalLM`; tied, the head's gradient adds into
    ``model.embed_tokens.weight``'s), as Hugging Face's ``LlamaForCausalLM``.

    Weights: ``model.*`` (the :class:`LlamaModel` names) and, untied, ``lm_head.weight (V, E)``.
    Loading also accepts the :class:`LlamaModel` names without ``model.``; tied
    (``tie_word_embeddings=True``), an ``lm_head.weight`` is ``model.embed_tokens.weight`` (as Hugging
    Face's tied parameter): given beside it, it must equal it (a different one raises ValueError,
    naming it, as GPT-2's), and given without it, it loads into it (which is then not among
    ``missing_keys``; torch lists the key there while loading the tensor through the head). Unknown
    keys are reported under the names given.
    """

    _checkpoint_heads = frozenset()  # a classifier's head beside an LM is reported, not dropped

    def _dropout_probs(self) -> tuple[float, float, float]:
        """Llama's one dropout, the config's attention_dropout (checked): no residual or embedding dropout."""
        return 0.0, 0.0, check_dropout(self.config.attention_dropout, "attention_dropout")

    _public_name_of_core_name_only = True  # the names below hang on the core name alone

    def _public_name(self, core_name: str) -> str:
        return core_name if core_name == "lm_head.weight" else "model." + core_name

    def _rename_state_dict(self, state: dict) -> dict:
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        tied_head = self.config.tie_word_embeddings and "lm_head.weight" in state
        head = state.pop("lm_head.weight") if tied_head else None
        shapes = self.parameter_shapes()
        out = _rename_known(state, shapes, lambda k: "model." + k)
        if tied_head:  # the head is the token embedding: loaded into it without one, else checked equal to it
            _load_tied_head(out, head, "model.embed_tokens.weight", shapes["model.embed_tokens.weight"],
                            untied="an untied head, while tie_word_embeddings=True; load it into a model of "
                                   "tie_word_embeddings=False")
        return out
