"""GPT-2 (Radford et al. 2019): decoder-only, pre-LN, learned positions, tanh GELU, LM head tied to
the token embedding; the tutorials' "BERT vs GPT". The shared decoder stack (:mod:`.decoder`) with
GPT-2's config and weight names; Hugging Face checkpoints load without torch.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import numpy as np

from ._runtime import core as _core
from ._validation import (
    activation,
    check_bool,
    check_config_fields,
    check_eps,
    check_mapping,
    config_token_ids,
    described,
    hf_config_fields,
)
from .checkpoints import json_value
from .decoder import CausalLM, CausalLMOutput, DecoderModel, _load_tied_head, _rename_known
from .hub import (
    ConfigRule,
    LayerRule,
    check_config_against_weights,
    load_weights_into,
    read_config,
    read_generation_config,
    resolve_model_dir,
    stored_tensors,
)
from .kv_cache import KVCache
from .module import check_dropout

__all__ = ["GPT2Config", "GPT2Model", "GPT2LMHeadModel", "KVCache", "CausalLMOutput"]

# Buffers of HF checkpoints that are not weights.
_IGNORED = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")
# HF's Conv1D weights, stored (in, out): the transpose of nn.Linear's (out, in) that the C++ layers use.
_CONV1D = re.compile(r"(^|\.)(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


#: Keys of a ``config.json`` that ``GPT2Config.extra`` does not keep: those ``to_dict`` writes itself
#: (``n_ctx`` = ``n_positions``) and those that describe the file read (the dtype of its weights, the
#: library that wrote it), not the one ``save_pretrained`` writes.
_NOT_KEPT = frozenset({"model_type", "architectures", "n_ctx", "transformers_version", "torch_dtype", "dtype"})


#: transformers' ``GPT2Config.attribute_map``: the generic names a config.json may use for GPT-2's fields.
_HF_ALIASES = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
               "max_position_embeddings": "n_positions"}


def _refuse_unsupported_options(options, name) -> None:
    """TypeError / ValueError, naming ``name(key)`` and the value given, for the options of
    transformers' ``GPT2Config`` this model does not compute (``scale_attn_weights`` false,
    ``scale_attn_by_inverse_layer_idx`` or ``add_cross_attention`` true) or that are not bools
    (numpy's accepted; None, 0 and 1 refused, as transformers refuses them), in the mapping
    ``options`` (a config.json dict, or ``GPT2Config.extra``)."""
    scale = options.get("scale_attn_weights", True)
    if not isinstance(scale, (bool, np.bool_)) or not scale:  # only scaled attention is computed
        error = ValueError if isinstance(scale, (bool, np.bool_)) else TypeError
        raise error(f"{name('scale_attn_weights')}: expected true (only scaled attention is supported), "
                    f"got {described(scale)}")
    for key, what in (("scale_attn_by_inverse_layer_idx", "scaling by the layer index"),
                      ("add_cross_attention", "cross-attention")):
        value = options.get(key, False)
        if not isinstance(value, (bool, np.bool_)) or value:  # a bool, and false: as transformers checks it
            error = ValueError if isinstance(value, (bool, np.bool_)) else TypeError
            raise error(f"{name(key)}: expected false ({what} is not supported), got {described(value)}")
    if "reorder_and_upcast_attn" in options:
        check_bool(options["reorder_and_upcast_attn"], name("reorder_and_upcast_attn"))


@dataclass
class GPT2Config:
    """The fields of a Hugging Face ``GPT2Config`` that the forward pass needs (``config.json``).

    Sizes are checked when the model is built (ValueError naming the field)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = 50256
    #: fills the sequences that ``generate`` has finished (Hugging Face's GPT-2 has none by default:
    #: then the first end id does).
    pad_token_id: int | None = None
    #: dropout of training forwards (Hugging Face's defaults are 0.1; 0 here unless a config sets
    #: them): on every residual branch (resid_pdrop), on the embeddings (embd_pdrop) and on the
    #: attention probabilities (attn_pdrop).
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    #: Hugging Face's default; not used here (``generate`` starts from the prompt given), kept so
    #: that ``save_pretrained`` writes it back.
    bos_token_id: int | None = 50256
    #: the other keys of the ``config.json`` read (``from_dict``), written back by ``to_dict`` so
    #: that a saved model's config reloads as it was (not kept: ``transformers_version``,
    #: ``torch_dtype`` and ``dtype``, which describe the file read, not the one written, and the keys
    #: ``to_dict`` writes itself: ``model_type``, ``architectures``, ``n_ctx``). A
    #: ``tie_word_embeddings`` kept here is a bool; False (an LM head of its own) loads into
    #: :class:`GPT2Model` only (:class:`GPT2LMHeadModel` refuses it).
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> "GPT2Config":
        """Reads a ``config.json`` dict; the keys that are not fields go to ``extra``.

        Raises:
            TypeError: ``d`` not a dict. ValueError: a ``model_type`` other than ``"gpt2"`` (the
            only one of Hugging Face's ``GPT2Config``; a config without one is read as GPT-2's),
            whose fields would otherwise be dropped for GPT-2's defaults; options this
            implementation does not support (``scale_attn_weights=False``,
            ``scale_attn_by_inverse_layer_idx=True``, ``add_cross_attention=True``, an activation
            outside the library's table); a field given under both names of Hugging Face's
            ``attribute_map`` (``num_attention_heads`` and ``n_head``, ...) with two values.
            TypeError: a ``tie_word_embeddings``, ``scale_attn_weights``,
            ``scale_attn_by_inverse_layer_idx``, ``add_cross_attention`` or
            ``reorder_and_upcast_attn`` that is not a bool (numpy's accepted; None, 0 and 1
            refused, as transformers' ``GPT2Config`` refuses them). Each message names the value
            given.

        ``tie_word_embeddings`` is kept in ``extra``: False (an untied ``lm_head.weight``) is read
        here, for :class:`GPT2Model`, which drops that head as transformers' ``GPT2Model`` does;
        :class:`GPT2LMHeadModel` refuses such a config (its LM head is always ``wte``).

        Hugging Face's generic names (``hidden_size``, ``num_attention_heads``,
        ``num_hidden_layers``, ``max_position_embeddings``: its ``GPT2Config.attribute_map``) are read
        as the fields they stand for, as transformers reads them. ``reorder_and_upcast_attn`` is read
        and kept in ``extra``: it moves the scaling and upcasts under mixed precision, and changes no
        value in float32 or float64.
        """
        check_mapping(d, "config")
        d, read_as = dict(d), {}
        for alias, name in _HF_ALIASES.items():
            if alias in d:
                value = d.pop(alias)
                if name in d and d[name] != value:
                    raise ValueError(f"config.json: {alias}={value!r} and {name}={d[name]!r} disagree (transformers "
                                     f"reads {alias} as {name}): give one of them")
                d[name], read_as[name] = value, alias
        model_type = d.get("model_type", "gpt2")
        if model_type != "gpt2":
            raise ValueError(f"config.json: model_type {model_type!r} is not supported here (expected 'gpt2')")
        _refuse_unsupported_options(d, lambda key: f"config.json: {key}")
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "extra"}
        extra = {k: copy.deepcopy(v) for k, v in d.items() if k not in cls.__dataclass_fields__ and k not in _NOT_KEPT}
        config = cls(**fields, extra=extra)
        try:
            config.check()
        except (TypeError, ValueError) as e:  # a field the file gave under its generic name: named so
            name = str(e).partition(":")[0]
            if name in read_as:
                raise type(e)(f"{read_as[name]} (read as {e})") from None
            raise
        return config

    #: The C++ decoder's names of the fields (in its errors) -> GPT-2's.
    _CORE_NAMES = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                   "intermediate_size": "n_inner", "max_position_embeddings": "n_positions",
                   "norm_eps": "layer_norm_epsilon", "embed_dim": "n_embd", "num_heads": "n_head",
                   "head_dim": "n_embd / n_head"}

    def check(self) -> "GPT2Config":
        """Checks every field's type and range, naming the field: sizes are ints >= 1 (``n_layer``
        >= 0, ``n_inner`` None or >= 0: 0/None = 4 · n_embd), ``layer_norm_epsilon`` a finite number
        >= 0, ``activation_function`` a name of the library's table, ``eos_token_id`` None, an id or a
        list of ids (``bos_token_id`` and ``pad_token_id`` too; a negative id is read as none, as
        Hugging Face reads it, and dropped from a list), ``resid_pdrop``, ``embd_pdrop`` and
        ``attn_pdrop`` probabilities in [0, 1), ``extra`` a dict (its ``tie_word_embeddings`` and ``use_cache``,
        when there, bools; the options :meth:`from_dict` refuses are refused there too, naming
        ``extra['key']``). Sizes too large for this machine are the C++ model's to refuse.

        Raises:
            TypeError / ValueError: naming the field.
        """
        check_config_fields(self, ints=("vocab_size", "n_positions", "n_embd", "n_head"),
                            nonnegative_ints=("n_layer",), optional_ints=("n_inner",), eps=("layer_norm_epsilon",))
        activation(self.activation_function, "activation_function")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # a negative id: none, as in Hugging Face
            setattr(self, name, config_token_ids(getattr(self, name), name))
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            check_dropout(getattr(self, name), name)
        check_mapping(self.extra, "extra")
        for key in ("tie_word_embeddings", "use_cache"):  # kept in extra, read by the model: bools
            if key in self.extra:
                check_bool(self.extra[key], key)
        # kept in extra (not fields): a config built or edited here is refused as config.json's is
        _refuse_unsupported_options(self.extra, lambda key: f"extra[{key!r}]")
        generic = sorted(set(_HF_ALIASES) & set(self.extra))
        if generic:  # saved beside the field, transformers would read it instead (its attribute_map)
            raise ValueError(f"extra: {generic[0]!r} is transformers' name of {_HF_ALIASES[generic[0]]!r} (its "
                             f"GPT2Config.attribute_map): set the field instead of keeping the name in extra")
        return self

    def to_dict(self) -> dict:
        """The ``config.json`` object Hugging Face's ``GPT2Config`` reads: ``extra``'s keys (copies,
        numpy scalars as Python numbers), then the fields. An ``n_inner`` of 0 (the default, as
        None) is written as null: Hugging Face reads only null as 4 · n_embd, and 0 as a width of 0.

        Raises:
            TypeError: an ``extra`` value that JSON cannot write (an array, a set, an object),
                naming it: ``config.extra['key']`` (:func:`~transformer_core.checkpoints.json_value`).
        """
        d = {k: json_value(v, f"config.extra[{k!r}]") for k, v in self.extra.items() if k not in _NOT_KEPT}
        d.update(hf_config_fields({k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}))
        if d["n_inner"] == 0:  # our default, as None (check() accepts both)
            d["n_inner"] = None
        d.update(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_ctx=self.n_positions)
        return d

    @property
    def num_layers(self) -> int:
        """``n_layer`` (the decoder stack's common name)."""
        return self.n_layer

    @property
    def num_kv_heads(self) -> int:
        """``n_head``: GPT-2 has as many key/value heads as query heads."""
        return self.n_head

    def _to_core(self):
        self.check()
        c = _core.GPT2Config()
        c.vocab_size, c.n_positions, c.n_embd = self.vocab_size, self.n_positions, self.n_embd
        c.n_layer, c.n_head, c.n_inner = self.n_layer, self.n_head, self.n_inner or 0
        c.activation_function = activation(self.activation_function, "activation_function")
        c.layer_norm_epsilon = check_eps(self.layer_norm_epsilon, "layer_norm_epsilon")
        return c


def _untied(config: GPT2Config) -> bool:
    """Whether ``config`` (checked: a bool, or none) says ``tie_word_embeddings=False``: an LM head
    of its own."""
    return not config.extra.get("tie_word_embeddings", True)


def _check_config_against_weights(model_dir, config: GPT2Config, state: dict) -> None:
    """ValueError naming ``config.json`` and each field its weights contradict (see
    :func:`transformer_core.hub.check_config_against_weights`), checked on the file's names
    (Conv1D weights are ``(in, out)``)."""
    c, p = config, r"^(?:transformer\.)?"
    inner = c.n_inner or 4 * c.n_embd
    inner_setting = f"n_inner = {c.n_inner}" if c.n_inner else f"n_inner = {c.n_inner} (4 * n_embd = {inner})"
    rules = [
        ConfigRule(f"vocab_size = {c.vocab_size}", c.vocab_size, p + r"wte\.weight$", 0),
        ConfigRule(f"n_positions = {c.n_positions}", c.n_positions, p + r"wpe\.weight$", 0),
        ConfigRule(f"n_embd = {c.n_embd}", c.n_embd,
                   (p + r"wte\.weight$", p + r"wpe\.weight$", p + r"ln_f\.(?:weight|bias)$"), -1),
        ConfigRule(inner_setting, inner, (p + r"h\.\d+\.mlp\.c_fc\.weight$", p + r"h\.\d+\.mlp\.c_fc\.bias$"), -1),
    ]
    layers = LayerRule(f"n_layer = {c.n_layer}", c.n_layer, p + r"h\.(\d+)\.")
    check_config_against_weights(model_dir, {k: v.shape for k, v in state.items()}, rules, layers)


class GPT2Model(DecoderModel):
    """The GPT-2 transformer: token + position embeddings, pre-LN blocks, final ``ln_f``.

    Weights: Hugging Face's ``GPT2Model`` names (``wte.weight``, ``wpe.weight``,
    ``h.{i}.attn.c_attn.weight (E, 3E)`` — Conv1D, ``(in, out)`` —, ``h.{i}.ln_1.*``,
    ``h.{i}.mlp.c_fc.*``, ``ln_f.*``, ...). A ``transformer.`` prefix and a tied ``lm_head.weight``
    are accepted when loading: the head is ``wte.weight`` (as Hugging Face's tied parameter), so
    given beside it, it must equal it (a different one raises ValueError, naming it), and given
    without it, it loads into ``wte.weight`` (which is then not among ``missing_keys``; torch
    lists the key there while loading the tensor through the head). Unknown keys are reported
    under the names given. With ``tie_word_embeddings=False`` (in the config's ``extra``) an
    ``lm_head.weight`` is the head of its own of a ``GPT2LMHeadModel`` of transformers, and is
    ignored (hidden states need no head), as transformers' ``GPT2Model`` and
    :class:`~transformer_core.llama.LlamaModel` ignore it. :meth:`from_pretrained` also leaves out
    the ``score.weight`` head of a ``GPT2ForSequenceClassification`` folder, as transformers'
    ``GPT2Model.from_pretrained`` does.

    Args:
        config: :class:`GPT2Config` or a ``config.json`` dict.
        dtype: ``np.float32`` or ``np.float64``.
    """

    config_class = GPT2Config
    _core_class = "GPT2Model"
    _context_field = "n_positions"
    #: ``forward(..., use_cache=False)`` returns None even with ``past_key_values`` given (which is
    #: still updated), as Hugging Face's ``GPT2Model``.
    _returns_given_cache = False
    #: Task heads a checkpoint folder may hold that :meth:`from_pretrained` leaves out (a sequence
    #: classifier's).
    _checkpoint_heads = frozenset({"score.weight"})

    @classmethod
    def _check_head(cls, config: GPT2Config) -> None:
        """ValueError when this class cannot hold ``config``'s LM head; GPT2Model has none."""

    def _ffn_width(self) -> tuple[int, str]:
        """GPT-2's feed-forward: one hidden activation of n_inner values a row (None or 0: 4 · n_embd)."""
        return (int(self.config.n_inner), "n_inner") if self.config.n_inner else (4 * int(self.config.n_embd),
                                                                                  "4 · n_embd")

    def _transposed(self, name: str) -> bool:
        return _CONV1D.search(name) is not None

    def _rename_state_dict(self, state: dict) -> dict:
        state = {k: v for k, v in state.items() if not _IGNORED.search(k)}  # buffers
        if _untied(self.config):  # a head of its own: not ours to load
            state.pop("lm_head.weight", None)
        has_head = "lm_head.weight" in state
        head = state.pop("lm_head.weight", None)
        shapes = self.parameter_shapes()
        out = _rename_known(state, shapes, lambda k: k.removeprefix("transformer."))
        if has_head:  # the head is wte: loaded into it without one, else checked equal to it
            _load_tied_head(out, head, "wte.weight", shapes["wte.weight"],
                            untied="an untied head; only an LM head tied to the token embedding is supported")
        return out

    @classmethod
    def from_pretrained(cls, name_or_path, dtype=np.float32):
        """Loads a Hugging Face GPT-2 directory (``config.json`` + ``model.safetensors``) with the
        ``safetensors`` package: no torch. The tensors are read in ``dtype`` (``np.float32`` or
        ``np.float64``; None is float32, transformers' default): a float64 checkpoint loads bit for
        bit with ``dtype=np.float64``. :class:`GPT2Model` also loads a ``GPT2LMHeadModel`` folder of
        ``tie_word_embeddings=False`` (its ``lm_head.weight`` ignored) and a
        ``GPT2ForSequenceClassification`` one (its ``score.weight`` ignored), as transformers'.
        ``model.generation_config`` keeps the directory's ``generation_config.json`` (None without
        one), whose end and padding ids ``generate`` uses in place of ``config.json``'s
        (:func:`transformer_core.hub.read_generation_config`).

        Raises:
            FileNotFoundError: no directory, ``config.json`` or ``model.safetensors``.
            ValueError: a ``config.json`` field of the wrong type or out of range (naming the
                file); a ``config.json`` whose sizes (``vocab_size``, ``n_embd``, ``n_positions``,
                ``n_inner``, ``n_layer``) the weights contradict (naming the file and the fields,
                before the model is built); a missing, unknown or mis-shaped tensor (listed, naming
                ``model.safetensors`` or a sharded checkpoint's index); an
                unsupported config (e.g. ``tie_word_embeddings=False`` for
                :class:`GPT2LMHeadModel`, before the weights are read) or a tied ``lm_head.weight``
                other than ``wte.weight``; a malformed ``generation_config.json`` (named);
                a folder whose save was interrupted during its final renames (its
                ``.save-in-progress`` marker: the files may be of two saves; the message says how
                to go on, :func:`transformer_core.hub.resolve_model_dir`).
            TypeError: ``dtype`` not None, float32 or float64.
        """
        from .checkpoints import build_for_checkpoint, config_from_file

        if dtype is None:  # transformers' default, as LlamaForCausalLM.from_pretrained's
            dtype = np.float32
        model_dir = resolve_model_dir(name_or_path)
        config = config_from_file(GPT2Config, read_config(model_dir), model_dir / "config.json")
        try:
            cls._check_head(config)
        except ValueError as e:
            raise ValueError(f"{model_dir / 'config.json'}: {e}") from None
        # the tensors' names and shapes, read one at a time into the model once it is built and every
        # check passed (float64 read as float64: not rounded through float32)
        state = stored_tensors(model_dir, dtype)
        state = {k: v for k, v in state.items() if k not in cls._checkpoint_heads}
        _check_config_against_weights(model_dir, config, state)  # before the model of that config is built
        generation_config = read_generation_config(model_dir)
        model = build_for_checkpoint(cls, config, dtype, model_dir / "config.json")
        load_weights_into(model, state, model_dir)  # every weight (a missing one raises, naming the file)
        model.generation_config = generation_config
        return model


class GPT2LMHeadModel(GPT2Model, CausalLM):
    """GPT-2 with its language-model head (tied to ``wte``): next-token logits, KV-cache decoding,
    ``generate`` and training (``loss`` / ``backward``, see :class:`~transformer_core.decoder.CausalLM`;
    the head's gradient adds into ``wte.weight``'s), as Hugging Face's ``GPT2LMHeadModel``. Weights:
    :class:`GPT2Model`'s names; ``save_pretrained`` writes them with Hugging Face's ``transformer.``
    prefix. Training uses the config's ``resid_pdrop`` and ``embd_pdrop``.

    Raises:
        ValueError: a config of ``tie_word_embeddings=False`` (in ``extra``: an LM head of its own,
            which this model, whose head is always ``wte``, cannot hold; :class:`GPT2Model` loads
            such a checkpoint without its head), before any weight is allocated.
    """

    _checkpoint_heads = frozenset()  # a classifier's head beside an LM is reported, not dropped

    @classmethod
    def _check_head(cls, config: GPT2Config) -> None:
        if _untied(config):
            raise ValueError("tie_word_embeddings=False is not supported by GPT2LMHeadModel: its LM head is always "
                             "the token embedding (wte), GPT-2's; GPT2Model loads such a checkpoint without its head")

    def _core_config(self):
        core_config = super()._core_config()  # the config's own checks first
        self._check_head(self.config)
        return core_config

    def _dropout_probs(self) -> tuple[float, float, float]:
        """(resid_pdrop, embd_pdrop, attn_pdrop) of the config, each checked."""
        c = self.config
        return (check_dropout(c.resid_pdrop, "resid_pdrop"), check_dropout(c.embd_pdrop, "embd_pdrop"),
                check_dropout(c.attn_pdrop, "attn_pdrop"))

    def _checkpoint_state(self) -> dict:
        """The weights under the checkpoint's names (Hugging Face's ``transformer.`` prefix), as views
        to write (:meth:`_checkpoint_tensors`)."""
        return {"transformer." + k: v for k, v in self._checkpoint_tensors().items()}
