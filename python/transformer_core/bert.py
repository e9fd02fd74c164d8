"""BERT (Devlin et al. 2019): encoder-only; the encoder tutorial ("Positional Embeddings", "Encoder") and
the tutorials' "BERT vs GPT". Weights load from a Hugging Face directory without torch.

    embeddings = LayerNorm(word[input_ids] + position[0..L) + token_type[token_type_ids])
    hidden     = post-LN encoder layer (GELU) x num_hidden_layers
    pooler     = tanh(dense(hidden[:, 0]))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ._runtime import core as _core
from ._validation import (
    activation,
    as_bool,
    as_float,
    as_ids,
    check_config_fields,
    check_int,
    check_mapping,
    described,
    hf_config_fields,
    ids_shape,
    physical_memory_bytes,
    to_numpy,
    unconverted,
)
from .hub import (
    DEFAULT_MODEL,
    ConfigRule,
    LayerRule,
    check_config_against_weights,
    load_weights_into,
    read_config,
    resolve_model_dir,
    stored_tensors,
)
from .module import Module, check_dropout
from .nn import _check_feedforward_activations, _feedforward_fits
from .positional import _check_embedding_tables

__all__ = ["BertConfig", "BertEmbeddings", "BertModel", "BertOutput"]

# Buffers some checkpoints carry in their embeddings that are not weights.
_IGNORED_KEYS = re.compile(r"^(bert\.)?(embeddings\.)?(position_ids|token_type_ids)$")


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
    #: dropout of training forwards (Hugging Face's defaults 0.1; 0 here unless a config sets them):
    #: hidden_dropout_prob on the embeddings and on both residual branches of every layer,
    #: attention_probs_dropout_prob on every layer's attention probabilities.
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        """Reads the known fields of a ``config.json`` dict; unknown fields are ignored.

        Raises:
            TypeError: ``d`` not a mapping; a field of the wrong type (named); an ``is_decoder`` or
                ``add_cross_attention`` that is not a bool (numpy's accepted; None, 0 and 1 refused,
                as transformers' ``BertConfig`` refuses them).
            ValueError: a ``model_type`` other than "bert" (absent is read as BERT; RoBERTa and its
                kin have the same weight names but other positions); ``is_decoder`` or
                ``add_cross_attention`` true (a causal or cross-attending BERT, which this encoder
                does not compute); an unsupported ``hidden_act`` or ``position_embedding_type``; a
                size, ``layer_norm_eps`` or dropout probability out of range (named).
        """
        check_mapping(d, "config")
        model_type = d.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"config.json: model_type {model_type!r} is not supported here (expected 'bert')")
        for key in ("is_decoder", "add_cross_attention"):
            value = d.get(key, False)
            if not isinstance(value, (bool, np.bool_)) or value:  # a bool, and false: as transformers checks it
                error = ValueError if isinstance(value, (bool, np.bool_)) else TypeError
                raise error(f"config.json: {key}: expected false (only a bidirectional encoder without "
                            f"cross-attention is supported), got {described(value)}")
        activation(d.get("hidden_act", "gelu"), "hidden_act")  # one table of names, in C++
        pe = d.get("position_embedding_type", "absolute")
        if pe != "absolute":
            raise ValueError(f"config.json: position_embedding_type {pe!r} is not supported (absolute)")
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        config = cls(**fields)
        config.check()
        return config

    def check(self) -> "BertConfig":
        """Checks every field's type and range, naming the field: sizes are ints >= 1
        (``num_hidden_layers`` >= 0), ``layer_norm_eps`` a finite number >= 0, ``add_pooling_layer``
        a bool, ``pad_token_id`` None or an id in ``[0, vocab_size)``, ``hidden_act`` a name of the
        library's table, ``hidden_dropout_prob`` and ``attention_probs_dropout_prob`` numbers in
        ``[0, 1)``. Sizes too large for this machine are the C++ model's to refuse (checked
        64-bit products against memory, before it allocates).

        Raises:
            TypeError / ValueError: naming the field.
        """
        check_config_fields(self, ints=("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size",
                                        "max_position_embeddings", "type_vocab_size"),
                            nonnegative_ints=("num_hidden_layers",), eps=("layer_norm_eps",),
                            bools=("add_pooling_layer",))
        if self.pad_token_id is not None:  # the embedding row that gets no gradient (torch's padding_idx)
            check_int(self.pad_token_id, "pad_token_id", 0, self.vocab_size - 1)
        activation(self.hidden_act, "hidden_act")
        check_dropout(self.hidden_dropout_prob, "hidden_dropout_prob")
        check_dropout(self.attention_probs_dropout_prob, "attention_probs_dropout_prob")
        return self

    def to_dict(self) -> dict:
        """The ``config.json`` object of Hugging Face's ``BertConfig`` for this config: every field
        that :meth:`from_dict` reads back, ``model_type`` ``"bert"``, ``architectures``
        ``["BertModel"]`` and ``position_embedding_type`` ``"absolute"``; not
        ``add_pooling_layer``, which is no field of transformers' config but an argument of its
        model (a ``config.json`` key of that name would take ``from_pretrained(...,
        add_pooling_layer=False)``'s argument as a config attribute, and the model would get a
        pooler): whether a saved model has a pooler is told by its weights, as
        :meth:`BertModel.from_pretrained` reads it. So ``BertConfig.from_dict(config.to_dict())``
        equals ``config`` except for ``add_pooling_layer`` (the default, True)."""
        d = hf_config_fields({k: getattr(self, k) for k in self.__dataclass_fields__ if k != "add_pooling_layer"})
        d.update(model_type="bert", architectures=["BertModel"], position_embedding_type="absolute")
        return d

    def _to_core(self):
        """The C++ ``BertConfig``, after :meth:`check`."""
        self.check()
        c = _core.BertConfig()
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "add_pooling_layer"):
            setattr(c, name, getattr(self, name))
        c.hidden_act = activation(self.hidden_act, "hidden_act")
        c.pad_token_id = -1 if self.pad_token_id is None else int(self.pad_token_id)
        return c


@dataclass
class BertOutput:
    """What ``BertModel`` returns.

    Attributes:
        last_hidden_state: ``(N, L, H)`` float array, the last layer's hidden states.
        pooler_output: ``(N, H)`` ``tanh(dense(last_hidden_state[:, 0]))``, or None without a pooler.
    """

    last_hidden_state: np.ndarray
    pooler_output: np.ndarray | None


def _check_config_against_weights(model_dir, config: BertConfig, state: dict) -> None:
    """ValueError naming ``config.json`` and each field its weights contradict (see
    :func:`transformer_core.hub.check_config_against_weights`), checked on the file's names."""
    c, p = config, r"^(?:bert\.)?"
    emb = p + r"embeddings\."
    rules = [
        ConfigRule(f"vocab_size = {c.vocab_size}", c.vocab_size, emb + r"word_embeddings\.weight$", 0),
        ConfigRule(f"max_position_embeddings = {c.max_position_embeddings}", c.max_position_embeddings,
                   emb + r"position_embeddings\.weight$", 0),
        ConfigRule(f"type_vocab_size = {c.type_vocab_size}", c.type_vocab_size,
                   emb + r"token_type_embeddings\.weight$", 0),
        ConfigRule(f"hidden_size = {c.hidden_size}", c.hidden_size,
                   (emb + r"word_embeddings\.weight$", emb + r"(?:position|token_type)_embeddings\.weight$",
                    emb + r"LayerNorm\.(?:weight|gamma)$"), -1),
        ConfigRule(f"intermediate_size = {c.intermediate_size}", c.intermediate_size,
                   p + r"encoder\.layer\.\d+\.intermediate\.dense\.weight$", 0),
    ]
    layers = LayerRule(f"num_hidden_layers = {c.num_hidden_layers}", c.num_hidden_layers,
                       p + r"encoder\.layer\.(\d+)\.")
    check_config_against_weights(model_dir, {k: v.shape for k, v in state.items()}, rules, layers)


def _hf_name(key: str, drop_prefix: str = "") -> str:
    """Our name of the checkpoint key ``key``: a leading ``bert.`` (``BertFor*`` checkpoints) and
    then ``drop_prefix`` dropped, old ``gamma``/``beta`` LayerNorm names read as
    ``weight``/``bias``."""
    name = key.removeprefix("bert.")
    name = name.removeprefix(drop_prefix) if drop_prefix else name
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    return re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)


def _rename_hf(state: dict, names, *, drop_prefix: str = "") -> dict:
    """Checkpoint names -> ours (:func:`_hf_name`) for each key that names one of the module's
    weights ``names`` that way; every other key kept as given, so that ``load_state_dict`` reports
    an unknown key under the caller's own name (``"bert.foo"``, not ``"foo"``), as torch's. The
    embeddings' buffers (``position_ids``, ``token_type_ids``) are dropped.

    Raises:
        ValueError: two keys that name the same weight (``pooler.dense.weight`` and
            ``bert.pooler.dense.weight``, ``LayerNorm.gamma`` and ``LayerNorm.weight``), both named.
    """
    out, source = {}, {}
    for key, value in state.items():
        if _IGNORED_KEYS.search(key):
            continue
        name = _hf_name(key, drop_prefix)
        if name not in names:
            name = key
        if name in out:
            raise ValueError(f"state_dict: keys {source[name]!r} and {key!r} both name the weight {name!r}; "
                             f"expected one")
        out[name], source[name] = value, key
    return out


def _feedforward_rows(mask: np.ndarray, pool: bool) -> int:
    """The rows of the widest feed-forward call of the C++ eval forward given ``attention_mask``
    (``(N, L)`` bool), as ``BertModel::forward`` (cpp/src/models/bert.cpp) chooses them: the
    real tokens run packed, one call of their count (all ``N · L`` rows when every token is real);
    with the pooler (``pool``), the sequences whose position 0 is padding but that hold a real
    token run padded instead, ``M`` of them in one call of ``M · L`` rows."""
    real = np.count_nonzero(mask, axis=1)  # per sequence
    run_padded = ~mask[:, 0] & (real > 0) if pool else np.zeros(len(real), bool)
    return max(int(real[~run_padded].sum()), int(run_padded.sum()) * mask.shape[1])


class BertModel(Module):
    """BERT encoder (embeddings + post-LN encoder stack + optional pooler), weights named as Hugging
    Face's ``BertModel`` state_dict.

    Args:
        config: a :class:`BertConfig` (or a ``config.json`` dict).
        dtype: ``np.float32`` (default) or ``np.float64``.

    Use :meth:`from_pretrained` to load a checkpoint, :meth:`save_pretrained` to write one.

    Raises:
        TypeError: ``config`` neither a :class:`BertConfig` nor a mapping; a field of the wrong type
            (naming the field); ``dtype`` not float32 or float64.
        ValueError: a field out of range or sizes the model refuses together (``hidden_size`` not
            a multiple of ``num_attention_heads``, ...), naming the fields; weights that would
            exceed this machine's memory (naming the sizes), before any is allocated.
    """

    def __init__(self, config, dtype=np.float32):
        sfx = self._init_dtype(dtype)
        self.config = config if isinstance(config, BertConfig) else BertConfig.from_dict(config)
        self._impl = getattr(_core, "BertModel" + sfx)(self.config._to_core())
        self._init_weights()

    def _padding_rows(self) -> dict[str, int]:
        """The :class:`~transformer_core.module.Module` hook: the ``pad_token_id`` row of the word
        embeddings starts at zero, as in Hugging Face's ``_init_weights``."""
        pad = self.config.pad_token_id
        return {} if pad is None else {"embeddings.word_embeddings.weight": int(pad)}

    def _rename_state_dict(self, state: dict) -> dict:
        # Drop classification heads of BertFor* checkpoints (cls.*) only when loading from a file.
        return _rename_hf(state, self.parameter_shapes())

    @classmethod
    def from_pretrained(cls, name_or_path=DEFAULT_MODEL, dtype=np.float32) -> "BertModel":
        """Loads a Hugging Face BERT directory (``config.json`` + ``model.safetensors``) or an
        embedded model by name (``"all-MiniLM-L6-v2"``, the default: ``hub.DEFAULT_MODEL``, as
        :meth:`SentenceEncoder.from_pretrained`), with the ``safetensors`` package's numpy API: no
        torch. The tensors are read in ``dtype`` (``np.float32`` or ``np.float64``; None is float32,
        transformers' default).

        A ``bert.`` prefix (``BertFor*`` checkpoints) and old ``gamma``/``beta`` names are accepted;
        heads other than the pooler are ignored: with the prefix every tensor outside ``bert.*``
        (``cls.*``, ``classifier.*``, ``qa_outputs.*``), without it ``cls.*``. The model has a
        pooler iff the checkpoint holds its weights (``pooler.dense.*``), whatever ``config.json``'s
        ``add_pooling_layer`` says (as transformers, where that is a constructor argument).

        Raises:
            FileNotFoundError: no such directory/model, or no ``config.json``/``model.safetensors``.
            ValueError: a ``config.json`` whose sizes (``vocab_size``, ``hidden_size``,
                ``max_position_embeddings``, ``type_vocab_size``, ``intermediate_size``,
                ``num_hidden_layers``) the weights contradict (naming the file and the fields,
                before the model is built); a missing, unknown or mis-shaped tensor (listed, naming
                ``model.safetensors`` or a sharded checkpoint's index); an
                unsupported config, a field of the wrong type or out of range, or sizes the model
                refuses together (each naming the ``config.json`` and the field:
                :func:`~transformer_core.checkpoints.config_from_file`); a folder whose save was
                interrupted during its final renames (its ``.save-in-progress`` marker: the files
                may be of two saves; the message says how to go on,
                :func:`transformer_core.hub.resolve_model_dir`).
            TypeError: ``dtype`` not None, float32 or float64.
        """
        from .checkpoints import build_for_checkpoint, config_from_file

        if dtype is None:  # transformers' default, as LlamaForCausalLM.from_pretrained's
            dtype = np.float32
        model_dir = resolve_model_dir(name_or_path)
        config = config_from_file(BertConfig, read_config(model_dir), model_dir / "config.json")
        # the tensors' names and shapes, read one at a time into the model once it is built and every
        # check passed (float64 read as float64: not rounded through float32)
        raw = stored_tensors(model_dir, dtype)
        _check_config_against_weights(model_dir, config, raw)  # before the model of that config is built
        if any(k.startswith("bert.") for k in raw):  # a BertFor* checkpoint: its heads lie outside bert.*
            raw = {k: v for k, v in raw.items() if k.startswith("bert.")}
        # (under the file's names: the model's load_state_dict renames them, and names a bad one as the file does)
        state = {k: v for k, v in raw.items() if not _hf_name(k).startswith("cls.")}
        # The weights decide whether there is a pooler: transformers' add_pooling_layer is a
        # constructor argument, and a config.json key of that name does not stop it loading one.
        config.add_pooling_layer = any(_hf_name(k).startswith("pooler.") for k in state)
        model = build_for_checkpoint(cls, config, dtype, model_dir / "config.json")
        load_weights_into(model, state, model_dir)  # every weight (a missing one raises, naming the file)
        model.name_or_path = str(name_or_path)
        return model

    def save_pretrained(self, directory) -> None:
        """Writes a Hugging Face directory: ``config.json`` (:meth:`BertConfig.to_dict`) and
        ``model.safetensors`` (:meth:`state_dict`: transformers' ``BertModel`` names, in the
        model's dtype), which ``transformers.BertModel.from_pretrained`` loads (a model without a
        pooler: with ``add_pooling_layer=False``, else transformers draws one) and so does
        :meth:`from_pretrained`, bit for bit.

        The save is all or nothing, as a causal LM's
        (:func:`transformer_core.checkpoints.save_pretrained_files`): a save that fails leaves the
        directory's previous files as they were; an earlier sharded save's index and shard files
        are removed in the same step.

        Raises:
            OSError: the directory or a file cannot be written (naming it; the cause chained).
            TypeError: ``directory`` not a str or path; a config value that JSON cannot write
                (naming it, before anything is written:
                :func:`~transformer_core.checkpoints.json_value`).
        """
        from .checkpoints import save_pretrained_files

        save_pretrained_files(directory, self.config.to_dict(), self._checkpoint_tensors())

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> BertOutput:
        """Runs BERT.

        Args:
            input_ids: ``(N, L)`` integer token ids in ``[0, vocab_size)``,
                ``L <= max_position_embeddings``; or ``(L,)``, one sequence, read as ``(1, L)``.
            attention_mask: ``(N, L)`` (``(L,)`` as ``(1, L)`` too), 1/True = a real token, 0 =
                padding (Hugging Face's convention); None = all real.
            token_type_ids: ``(N, L)`` (``(L,)`` as ``(1, L)`` too) segment ids in
                ``[0, type_vocab_size)``; None = zeros.

        Returns:
            :class:`BertOutput` with ``last_hidden_state (N, L, H)`` and ``pooler_output (N, H)``
            (None without a pooler), in ``self.dtype``. A 1-D ``(L,)`` ``input_ids`` keeps its
            batch dim N = 1 in the outputs: ``(1, L, H)`` and ``(1, H)`` (not the ``nn`` layers'
            unbatched ``(L, E) -> (L, E)``). With padding, the layers run on the real
            tokens only and the hidden states of padding positions are zeros (as torch's
            nested-tensor encoder returns them); real tokens match Hugging Face's. The pooler reads
            position 0's state as Hugging Face computes it even where that position is padding
            (left padding, a mask with a hole there: its attention over the sequence's real tokens),
            in eval and training mode alike (:meth:`backward` carries the pooler's gradient into
            that state). A row of padding only has no state: its hidden states are zeros and its
            pooler output ``tanh(pooler.dense.bias)`` (Hugging Face's eager and SDPA attentions give
            two other values there); in training its pooler gradient reaches
            ``pooler.dense.bias`` only.

        Raises:
            ValueError: ids out of range, L > max_position_embeddings, shapes that disagree,
                empty input; more rows (``N · L``, or the real tokens with ``attention_mask`` in eval
                mode) than the feed-forward's hidden activations, ``rows × intermediate_size``
                values, can hold in this machine's memory, or an output ``(N, L, hidden_size)`` that
                with the inputs' int64 / bool copies would not fit (naming ``input_ids``, before any
                copy or work). TypeError: ids neither integers nor whole-number floats (bool,
                complex, non-integral or non-finite floats; a float array of whole numbers is taken).
        """
        ids, mask, tt = self._check_inputs(input_ids, attention_mask, token_type_ids, packed=not self.training,
                                           pool=self.config.add_pooling_layer)
        if self.training:
            p = check_dropout(self.config.hidden_dropout_prob, "hidden_dropout_prob")
            attn = check_dropout(self.config.attention_probs_dropout_prob, "attention_probs_dropout_prob")
            hidden, pooled = self._impl.forward_train(ids, mask, tt, p, self._dropout_seed(max(p, attn)), attn)
            self._saved = ids.shape
        else:
            hidden, pooled = self._impl.forward(ids, mask, tt)
        return BertOutput(last_hidden_state=hidden, pooler_output=pooled)

    def _forward_eval(self, input_ids, attention_mask=None, token_type_ids=None, *, pooler: bool = True) -> BertOutput:
        """:meth:`forward` as in eval mode whatever the mode: no dropout, nothing kept; a training
        forward's state awaiting its backward stays (inference inside a training loop, e.g.
        :meth:`SentenceEncoder.encode`). With ``pooler`` false the pooler's product is skipped and
        ``pooler_output`` is None (a sentence encoder pools the hidden states itself: 20-50 µs of
        a 7-token sentence's 1.2 ms on the CI machine). The hidden states are then the same bits,
        except in rows whose position 0 is padding (left padding): those run on the packed
        tokens instead of at full length, as without a pooler (other rounding, ~1e-6 in fp32)."""
        ids, mask, tt = self._check_inputs(input_ids, attention_mask, token_type_ids, packed=True,
                                           pool=bool(pooler) and self.config.add_pooling_layer)
        hidden, pooled = self._impl.forward(ids, mask, tt, pooler=pooler)
        return BertOutput(last_hidden_state=hidden, pooler_output=pooled)

    def _check_inputs(self, input_ids, attention_mask, token_type_ids, *, packed: bool, pool: bool):
        """forward's arguments checked: ``(ids, mask or None, token_type_ids or None)``, ``(N, L)``
        int64 / bool arrays (the value ranges are the C++ forward's to check), and the call's
        activations against memory (:meth:`_check_activations`; ``packed``, ``pool`` as there).
        What needs only the shape is checked before any input is copied: the length, the output
        and the copies of the inputs together, the activations of every position."""
        shape = ids_shape(input_ids, "input_ids")
        N, L = shape
        if L > self.config.max_position_embeddings:
            raise ValueError(f"input_ids: sequence length {L} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        # the (N, L, H) output (a model of no layers too) and the int64 / bool copies of the inputs
        H, itemsize = self.config.hidden_size, np.dtype(self.dtype).itemsize
        per_position = H * itemsize + 8 + (8 if token_type_ids is not None else 0) + (attention_mask is not None)
        need, limit = N * L * per_position, physical_memory_bytes()
        if need > limit:
            raise ValueError(f"input_ids: shape {shape} needs {need} bytes for the output ({N}, {L}, {H}) "
                             f"(hidden_size) and the inputs' copies, more than this machine's memory ({limit} bytes)")
        if attention_mask is None or not packed:  # every position runs: no mask to read first
            self._check_activations(shape, None, packed=False, pool=pool)
        # the other inputs' shapes (and the token types' dtype) before the ids' copy
        if attention_mask is not None:
            given = to_numpy(attention_mask, "attention_mask").shape  # an array or a tensor: no copy
            if (given if len(given) != 1 else (1, *given)) != shape:
                raise ValueError(f"attention_mask: expected shape {shape} (input_ids'), got "
                                 f"{given if len(given) != 1 else (1, *given)}")
        if token_type_ids is not None:
            ids_shape(token_type_ids, "token_type_ids", shape=shape, shape_of="input_ids'")
        ids = as_ids(input_ids, "input_ids")
        mask = None
        if attention_mask is not None:
            mask = as_bool(attention_mask, "attention_mask", allow_float=True)  # a broadcast view stays one
            if mask.ndim == 1:
                mask = mask[None]
            if mask.shape != ids.shape:
                raise ValueError(f"attention_mask: expected shape {ids.shape} (input_ids'), got {mask.shape}")
            mask = np.ascontiguousarray(mask, dtype=np.bool_)  # the size of input_ids': checked
        tt = None
        if token_type_ids is not None:
            tt = as_ids(token_type_ids, "token_type_ids")
            if tt.shape != ids.shape:
                raise ValueError(f"token_type_ids: expected shape {ids.shape} (input_ids'), got {tt.shape}")
        if mask is not None and packed:
            self._check_activations(shape, mask, packed=True, pool=pool)
        return ids, mask, tt

    def _check_activations(self, shape: tuple, mask: np.ndarray | None, *, packed: bool, pool: bool) -> None:
        """ValueError naming ``input_ids`` when the feed-forward's hidden activations of this call,
        ``(rows, intermediate_size)`` values, would exceed this machine's memory: checked before any
        work (the C++ forward checks them in its first layer, after the embeddings and the
        attention's O(L²) work, naming its own ``x``).

        The rows are the C++ forward's: ``N · L``, unless the eval forward (``packed``) runs the
        real tokens of ``mask`` packed (:func:`_feedforward_rows`; ``pool``: the pooler is
        computed). Those are counted only when ``N · L`` rows would not fit: a call that fits costs
        a few integer products, and a call the C++ forward would run is never refused.
        """
        c = self.config
        if c.num_hidden_layers == 0:  # no layer, no feed-forward
            return
        rows, note = shape[0] * shape[1], ""
        if packed and mask is not None and not _feedforward_fits(rows, c.intermediate_size, self.dtype):
            rows, note = _feedforward_rows(mask, pool), " with attention_mask"
        _check_feedforward_activations(rows, c.intermediate_size, self.dtype, "input_ids", shape,
                                       "intermediate_size", note)

    def backward(self, grad_last_hidden_state, grad_pooler_output=None) -> None:
        """Fine-tuning's backward pass: given the gradients of a loss with respect to the last
        training forward's outputs, adds every parameter's gradient (``named_parameters()``,
        ``gradients()``). A task head (a classifier on ``pooler_output``, a token tagger on
        ``last_hidden_state``) is the caller's: e.g. ``tc.nn.Linear`` with its own ``backward``.

        In training mode the forward runs on the padded batch (no packing) and returns padding
        positions as zeros, as in eval mode: their gradients in ``grad_last_hidden_state`` are
        ignored (the outputs are constants). ``grad_pooler_output`` reaches position 0's state even
        where that position is padding (the pooler reads it, as Hugging Face's), except in a row
        of padding only (its pooler input is zeros).

        Args:
            grad_last_hidden_state: ``(N, L, H)``.
            grad_pooler_output: ``(N, H)`` or None (the pooler then gets no gradient).

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: gradients of the wrong shape; ``grad_pooler_output`` without a pooler.
        """
        from .module import NoTrainingStateError

        shape = self._saved
        if shape is None or not self._impl.has_training_state:
            raise NoTrainingStateError("BertModel.backward: no training forward to differentiate (call model.train(), "
                                       "then the model; each forward has one backward)")
        N, L = shape
        H = self.config.hidden_size
        g = unconverted(grad_last_hidden_state, "grad_last_hidden_state")  # both shapes checked before a copy
        if g.shape != (N, L, H):
            raise ValueError(f"grad_last_hidden_state: expected shape {(N, L, H)} (last_hidden_state's), got {g.shape}")
        gp = None
        if grad_pooler_output is not None:
            if not self.config.add_pooling_layer:
                raise ValueError("grad_pooler_output: this model has no pooler (add_pooling_layer=False)")
            gp = unconverted(grad_pooler_output, "grad_pooler_output")
            if gp.shape != (N, H):
                raise ValueError(f"grad_pooler_output: expected shape {(N, H)} (pooler_output's), got {gp.shape}")
            gp = as_float(gp, "grad_pooler_output", self.dtype)
        g = as_float(g, "grad_last_hidden_state", self.dtype)
        self._saved = None
        self._impl.backward(g, gp)


class BertEmbeddings(Module):
    """BERT's input embeddings (the encoder tutorial's ``Embeddings`` with token types): word +
    learned position + token type, then LayerNorm (eps from the config, 1e-12 for BERT). Dropout
    (``hidden_dropout_prob``, after the LayerNorm, as Hugging Face's) applies in training mode only;
    in eval mode it is the identity. The same C++ ``Embeddings`` layer as inside :class:`BertModel`.

    Args:
        config: :class:`BertConfig` or a ``config.json`` dict.
        dtype: ``np.float32`` or ``np.float64``.
        weights: optional state dict to load (Hugging Face's names, with or without ``embeddings.``).

    Raises:
        TypeError / ValueError: a config field of the wrong type or range (named); tables larger than
            this machine's memory (naming the config fields and the table), before any is allocated.

    Weights (Hugging Face's names): ``word_embeddings.weight (V, H)``,
    ``position_embeddings.weight (P, H)``, ``token_type_embeddings.weight (T, H)``,
    ``LayerNorm.weight (H)``, ``LayerNorm.bias (H)``.
    """

    def __init__(self, config, dtype=np.float32, *, weights: dict | None = None):
        sfx = self._init_dtype(dtype)
        self.config = config if isinstance(config, BertConfig) else BertConfig.from_dict(config)
        c = self.config.check()
        _check_embedding_tables(c.vocab_size, c.hidden_size, c.max_position_embeddings, c.type_vocab_size, self.dtype)
        ec = _core.EmbeddingsConfig()
        ec.vocab_size, ec.hidden_size = c.vocab_size, c.hidden_size
        ec.max_position_embeddings, ec.type_vocab_size = c.max_position_embeddings, c.type_vocab_size
        ec.layer_norm, ec.layer_norm_eps = True, c.layer_norm_eps
        ec.padding_idx = -1 if c.pad_token_id is None else int(c.pad_token_id)
        self._impl = getattr(_core, "Embeddings" + sfx)(ec)
        self._init_weights()
        if weights is not None:
            self.load_state_dict(weights)

    def _padding_rows(self) -> dict[str, int]:
        """The :class:`~transformer_core.module.Module` hook: the ``pad_token_id`` row of the word
        embeddings starts at zero, as in Hugging Face's ``_init_weights``."""
        pad = self.config.pad_token_id
        return {} if pad is None else {"word_embeddings.weight": int(pad)}

    def _rename_state_dict(self, state: dict) -> dict:
        return _rename_hf(state, self.parameter_shapes(), drop_prefix="embeddings.")

    @classmethod
    def from_model(cls, model: BertModel) -> "BertEmbeddings":
        """The embeddings of a loaded :class:`BertModel` (a copy of its weights)."""
        sd = {k: v for k, v in model.state_dict().items() if k.startswith("embeddings.")}
        return cls(model.config, model.dtype, weights=sd)

    def forward(self, input_ids, token_type_ids=None) -> np.ndarray:
        """``input_ids (N, L)`` -> ``(N, L, H)`` embeddings of ``self.dtype``; a 1-D ``(L,)`` is read as
        ``(1, L)`` and gives ``(1, L, H)``.

        Args:
            input_ids: ``(N, L)`` (or ``(L,)``) ids in ``[0, vocab_size)``, ``L <= max_position_embeddings``.
            token_type_ids: ``(N, L)`` segment ids in ``[0, type_vocab_size)``; None = zeros.

        Raises:
            ValueError: ids outside their tables, L > max_position_embeddings, shapes that disagree.
            TypeError: ids neither integers nor whole-number floats (bool, complex, non-integral or
                non-finite floats; a float array of whole numbers is taken).
        """
        N, L = ids_shape(input_ids, "input_ids")
        c = self.config
        if L > c.max_position_embeddings:  # before the ids' int64 copy
            raise ValueError(f"input_ids: sequence length {L} exceeds max_position_embeddings "
                             f"({c.max_position_embeddings})")
        if token_type_ids is not None:  # its dtype and shape before either copy
            ids_shape(token_type_ids, "token_type_ids", shape=(N, L), shape_of="input_ids'")
        ids = as_ids(input_ids, "input_ids")
        tt = None
        if token_type_ids is not None:
            tt = as_ids(token_type_ids, "token_type_ids").ravel()
        positions = np.ascontiguousarray(np.broadcast_to(np.arange(L, dtype=np.int64), (N, L)).ravel())
        if self.training:  # the C++ layer keeps pointers to the ids until backward
            flat = ids.ravel().copy()
            tt = None if tt is None else tt.copy()
            p = check_dropout(c.hidden_dropout_prob, "hidden_dropout_prob")
            self._saved = (flat, positions, tt, (N, L))
            out = self._impl.forward_train(flat, positions, tt, p, self._dropout_seed(p))
            return out.reshape(N, L, c.hidden_size)
        return self._impl.forward(ids.ravel(), positions, tt).reshape(N, L, c.hidden_size)

    def backward(self, grad_output) -> None:
        """Adds the gradients of the last training forward's tables and LayerNorm, given
        ``grad_output (N, L, hidden_size)`` (``pad_token_id``'s word row gets none, as Hugging Face's).
        Returns None.

        Raises:
            NoTrainingStateError: no training forward since the last backward.
            ValueError: ``grad_output`` not of the output's shape.
        """
        *_, (N, L) = self._peek_saved()
        H = self.config.hidden_size
        g = unconverted(grad_output, "grad_output")  # its shape checked before its copy
        if g.shape != (N, L, H):
            raise ValueError(f"grad_output: expected shape {(N, L, H)} (the forward's output), got {g.shape}")
        g = as_float(g, "grad_output", self.dtype)
        self._take_saved()  # checked: now consumed
        self._impl.backward(g.reshape(N * L, H))
