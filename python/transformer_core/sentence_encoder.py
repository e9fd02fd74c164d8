"""Sentence embeddings from a BERT encoder, as sentence-transformers (6.x) computes them
(all-MiniLM-L6-v2: mean pooling over the attention mask, then L2 normalisation; other
sentence-transformers folders: the pooling and normalisation their ``modules.json`` and
``1_Pooling/config.json`` name, and the prompts their ``config_sentence_transformers.json`` names;
a plain Hugging Face folder, without ``modules.json``: mean pooling, not normalised)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np

from ._runtime import core
from ._validation import (
    as_bool,
    as_float,
    check_allocatable,
    check_bool,
    check_choice,
    check_int,
    compute_dtype,
    resolve_dtype,
    unconverted,
)
from .bert import BertModel
from .hub import DEFAULT_MODEL, expand_home, read_json_file
from .tokenizer import (
    Tokenizer,
    _check_room_for_special_tokens,
    _check_sentence_bert_config,
    _texts_to_tokenize,
    check_unicode,
)

__all__ = ["SentenceEncoder", "mean_pool", "cosine_similarity", "read_pooling", "read_prompts",
           "transformer_folder"]

#: Pooling modes :class:`SentenceEncoder` computes, by the legacy flag of each in a pooling
#: ``config.json`` (sentence-transformers <= 5's ``pooling_mode_<x>_token(s)``; 6.x writes
#: ``"pooling_mode": "mean"`` instead, read first: see :func:`read_pooling`).
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_max_tokens": "max"}
#: The modules.json classes :class:`SentenceEncoder` supports (see :func:`_st_module_class`).
_ST_MODULE_CLASSES = ("Transformer", "Pooling", "Normalize")


def _st_module_class(kind) -> str | None:
    """The class name (``"Transformer"``, ``"Pooling"`` or ``"Normalize"``) of a ``modules.json``
    module ``type``, or None for a type :class:`SentenceEncoder` does not support. Both spellings
    sentence-transformers loads are taken: ``sentence_transformers.models.<Class>`` (what versions
    <= 5 write) and a path with ``modules`` inside the package, ``sentence_transformers.<...>.modules
    [.<file>].<Class>`` (what 6.x writes: ``sentence_transformers.base.modules.transformer.Transformer``,
    ``sentence_transformers.sentence_transformer.modules.pooling.Pooling``,
    ``sentence_transformers.base.modules.normalize.Normalize``)."""
    if not isinstance(kind, str):
        return None
    parts = kind.split(".")
    if (len(parts) < 3 or parts[0] != "sentence_transformers" or parts[-1] not in _ST_MODULE_CLASSES
            or not all(part.isidentifier() for part in parts)):
        return None
    middle = parts[1:-1]
    return parts[-1] if middle == ["models"] or "modules" in middle[1:] else None


def _pooling_config(model_dir: Path) -> tuple[list, Path | None, dict | None, Path]:
    """``(module kinds, pooling config path, pooling config, Transformer folder)`` of a
    sentence-transformers folder (``([], None, None, model_dir)`` without ``modules.json``), the
    modules' order checked (see :func:`read_pooling`). The Transformer folder is ``model_dir``
    itself when the module's ``path`` is ``""`` (today's layout), else ``model_dir / path`` (the
    older layout: the model in ``0_Transformer/``)."""
    path = model_dir / "modules.json"
    if not path.is_file():
        return [], None, None, model_dir
    modules = read_json_file(path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{path}: expected a JSON list of module objects, got {type(modules).__name__}")
    kinds = []
    pooling_dir = None
    transformer_dir = model_dir
    for i, m in enumerate(modules):
        kind = m.get("type")
        short = _st_module_class(kind)
        if short is None:
            raise ValueError(f"{path}: module {i} has type {kind!r}; SentenceEncoder supports only "
                             f"sentence_transformers.models.Transformer, Pooling and Normalize (or the same "
                             f"classes under sentence-transformers 6's sentence_transformers.*.modules.*)")
        kinds.append(short)
        if short == "Transformer":
            transformer_dir = _transformer_folder(model_dir, path, i, m.get("path", ""))
        if short == "Pooling":
            sub = m.get("path")
            if not isinstance(sub, str):
                raise ValueError(f"{path}: module {i} (Pooling): expected a str 'path', got {sub!r}")
            pooling_dir = model_dir / sub
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise ValueError(f"{path}: expected the modules Transformer, Pooling and optionally Normalize, in that "
                         f"order, got {kinds}")
    cpath = pooling_dir / "config.json"
    if not cpath.is_file():
        raise FileNotFoundError(f"{cpath}: not found (the Pooling module's config, listed in {path})")
    config = read_json_file(cpath)
    if not isinstance(config, dict):
        raise ValueError(f"{cpath}: expected a JSON object, got {type(config).__name__}")
    return kinds, cpath, config, transformer_dir


def _transformer_folder(model_dir: Path, modules_path: Path, i: int, sub) -> Path:
    """The folder of the Transformer module ``i`` of ``modules_path``, whose ``path`` is ``sub``:
    ``model_dir`` for ``""`` (or ``"."``), else ``model_dir / sub``, which must be a folder inside
    ``model_dir`` (judged by the path as written: a link inside it to a folder elsewhere, as a Hub
    cache makes, is fine).

    Raises:
        ValueError: ``sub`` not a str, absolute, or leading out of ``model_dir`` (``..``).
        FileNotFoundError: no such folder (both name ``modules.json`` and the path).
    """
    if not isinstance(sub, str):
        raise ValueError(f"{modules_path}: module {i} (Transformer): expected a str 'path', got {sub!r}")
    norm = os.path.normpath(sub) if sub else "."
    if norm == ".":
        return model_dir
    if os.path.isabs(norm) or norm == os.pardir or norm.startswith(os.pardir + os.sep):
        raise ValueError(f"{modules_path}: module {i} (Transformer): path {sub!r} is outside the model folder "
                         f"{model_dir}; expected a folder inside it (or \"\" for the folder itself)")
    folder = model_dir / norm
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not found (the Transformer module's folder, path {sub!r} in "
                                f"{modules_path})")
    return folder


def transformer_folder(model_dir) -> Path:
    """The folder holding the model and tokenizer files of a model folder ``model_dir``: the
    Transformer module's ``path`` in ``modules.json`` (``0_Transformer/`` in the older
    sentence-transformers layout), or ``model_dir`` itself (``path`` ``""``, or no
    ``modules.json``). A leading ``~`` is expanded.

    Raises:
        TypeError: ``model_dir`` not a str or os.PathLike (of str).
        NotADirectoryError: ``model_dir`` is not a folder (naming it).
        ValueError, FileNotFoundError: as :func:`read_pooling` for ``modules.json``, and a
            Transformer ``path`` that is not a str, leads outside ``model_dir`` or is no folder
            (naming ``modules.json`` and the path).
    """
    return _pooling_config(_model_folder(model_dir))[3]


def _model_folder(model_dir) -> Path:
    """``model_dir``, the argument of :func:`transformer_folder`, :func:`read_pooling` and
    :func:`read_prompts`, as a Path to an existing folder (a leading ``~`` expanded).

    Raises:
        TypeError: not a str or os.PathLike (of str). NotADirectoryError: not a folder (missing, or
            a file). FileNotFoundError: a ``~user`` of no known user. All name ``model_dir``.
    """
    if not isinstance(model_dir, (str, os.PathLike)) or isinstance(os.fspath(model_dir), bytes):
        raise TypeError(f"model_dir: expected a str or os.PathLike, got {type(model_dir).__name__}")
    folder = expand_home(model_dir, "model_dir")
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "no such folder"
        raise NotADirectoryError(f"model_dir: expected a model folder, got {str(model_dir)!r} ({what})")
    return folder


def read_pooling(model_dir) -> dict:
    """The pooling and normalisation of a sentence-transformers folder, read from its plain JSON
    (no torch): ``{"pooling": "mean" | "cls" | "max", "normalize": bool}``.

    ``modules.json`` must list a ``Transformer`` module, one ``Pooling`` module and at most a
    ``Normalize`` module after it (listed: ``normalize`` true), each by the class path of
    sentence-transformers <= 5 (``sentence_transformers.models.Pooling``) or of 6.x
    (``sentence_transformers.sentence_transformer.modules.pooling.Pooling``, and the same class
    under any ``sentence_transformers.*.modules.*`` path). The Pooling folder's ``config.json``
    names the mode as sentence-transformers 6's ``Pooling.load_config`` reads it: its
    ``pooling_mode`` (``"mean"``, ``"cls"`` or ``"max"``, or a list of one of them), which 6.x
    writes; only when that key is absent, the legacy flags of versions <= 5, exactly one of
    ``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``, ``pooling_mode_max_tokens`` true
    (sentence-transformers drops them when ``pooling_mode`` is there, and so do we). A config with
    neither is refused (sentence-transformers 6 falls back to mean pooling there). The width
    (``word_embedding_dimension``, 6.x's ``embedding_dimension``) is not read: the model's
    ``hidden_size`` is the width.

    A folder without ``modules.json`` (a plain Hugging Face BERT folder) gets ``{"pooling": "mean",
    "normalize": False}``: mean pooling and no normalisation, as sentence-transformers'
    ``_load_auto_model`` builds it (``encode(..., normalize=True)`` for unit vectors). A leading
    ``~`` of ``model_dir`` is expanded. (The prompts, and the pooling config's ``include_prompt``, are
    :func:`read_prompts`'.)

    Raises:
        TypeError: ``model_dir`` not a str or os.PathLike (of str).
        NotADirectoryError: ``model_dir`` is not a folder (missing, or a file; naming it).
        ValueError: a ``modules.json`` or pooling ``config.json`` that is not valid JSON of that
            shape; a module type other than Transformer, Pooling and Normalize (e.g. Dense); a
            ``pooling_mode`` other than ``"mean"``, ``"cls"``, ``"max"`` or a list of one of them
            (several modes, ``"lasttoken"``, ...); without ``pooling_mode``, a legacy flag that is
            not a JSON bool (or 0/1: ``"false"`` is refused, not read as true), a flag of another
            mode true, several true, or none (each naming the file and the key).
        FileNotFoundError: a listed Pooling module whose ``config.json`` is missing; a ``~user`` of
            no known user in ``model_dir``.
    """
    kinds, cpath, config, _ = _pooling_config(_model_folder(model_dir))
    if cpath is None:
        return {"pooling": "mean", "normalize": False}
    if "pooling_mode" in config:  # sentence-transformers 6's key; the legacy flags are then ignored
        mode = config["pooling_mode"]
        if isinstance(mode, list) and len(mode) == 1:
            mode = mode[0]
        if not isinstance(mode, str) or mode not in POOLING_MODES.values():
            raise ValueError(f"{cpath}: pooling_mode: expected 'mean', 'cls' or 'max' (or a list of one of them): "
                             f"SentenceEncoder computes no other pooling, nor several at once; got {mode!r}")
        return {"pooling": mode, "normalize": kinds[-1] == "Normalize"}
    flags = {k: v for k, v in config.items() if k.startswith("pooling_mode_")}
    for k, v in flags.items():  # JSON true/false (1/0 too, which sentence-transformers sums); "false" is not false
        if not (isinstance(v, bool) or (type(v) is int and v in (0, 1))):
            raise ValueError(f"{cpath}: {k}: expected true or false, got {type(v).__name__} {v!r}")
    on = [k for k, v in flags.items() if v]
    unsupported = [k for k in on if k not in POOLING_MODES]
    if unsupported:
        raise ValueError(f"{cpath}: {unsupported[0]} is {config[unsupported[0]]!r}; SentenceEncoder supports only "
                         f"{', '.join(POOLING_MODES)}")
    if len(on) != 1:
        raise ValueError(f"{cpath}: expected a pooling_mode, or exactly one of {', '.join(POOLING_MODES)} true, "
                         f"got {on or 'none'}")
    return {"pooling": POOLING_MODES[on[0]], "normalize": kinds[-1] == "Normalize"}


def read_prompts(model_dir) -> dict:
    """The prompts of a sentence-transformers folder, as ``SentenceTransformer`` loads them (no
    torch): ``{"prompts": {name: text}, "default_prompt_name": str | None, "include_prompt": bool}``.

    ``prompts`` and ``default_prompt_name`` come from ``config_sentence_transformers.json`` (both
    optional; a folder without the file has none: ``{}`` and None); ``include_prompt`` from the
    Pooling module's ``config.json`` (default true: the prompt's tokens are pooled with the text's;
    false: they are left out of the pooling, as sentence-transformers' ``Pooling`` does for
    INSTRUCTOR-style models). Other keys of either file (``__version__``, ``similarity_fn_name``,
    ...) are ignored. A leading ``~`` of ``model_dir`` is expanded.

    Raises:
        TypeError: ``model_dir`` not a str or os.PathLike (of str).
        NotADirectoryError: ``model_dir`` is not a folder (missing, or a file; naming it).
        ValueError: naming the file: ``config_sentence_transformers.json`` not valid JSON, not an
            object, ``prompts`` not an object of str -> str, ``default_prompt_name`` neither null nor
            a str naming one of ``prompts`` (sentence-transformers refuses it too); a pooling
            ``config.json`` whose ``include_prompt`` is not a bool; as :func:`read_pooling` for
            ``modules.json``.
        FileNotFoundError: a ``~user`` of no known user in ``model_dir``.
    """
    model_dir = _model_folder(model_dir)
    out = {"prompts": {}, "default_prompt_name": None, "include_prompt": True}
    path = model_dir / "config_sentence_transformers.json"
    if path.is_file():
        config = read_json_file(path)
        if not isinstance(config, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
        prompts = config.get("prompts")
        prompts = {} if prompts is None else prompts
        if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
            raise ValueError(f"{path}: prompts: expected an object of prompt name -> str, got {prompts!r}")
        for name, text in prompts.items():
            check_unicode(text, f"{path}: prompts[{name!r}]")
        default = config.get("default_prompt_name")
        if default is not None and (not isinstance(default, str) or default not in prompts):
            raise ValueError(f"{path}: default_prompt_name: expected null or one of the prompts' names "
                             f"{list(prompts)}, got {default!r}")
        out["prompts"], out["default_prompt_name"] = dict(prompts), default
    _, cpath, pooling, _ = _pooling_config(model_dir)
    if cpath is not None:
        include = pooling.get("include_prompt", True)
        if not isinstance(include, bool):
            raise ValueError(f"{cpath}: include_prompt: expected true or false, got {include!r}")
        out["include_prompt"] = include
    return out


def mean_pool(last_hidden_state: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean of the token vectors over real tokens: ``Σ_l mask[n, l] h[n, l] / Σ_l mask[n, l]``: the
    pooling of sentence-transformers' ``Pooling(pooling_mode_mean_tokens=True)`` (Reimers & Gurevych
    2019, "Sentence-BERT", section 3), all-MiniLM-L6-v2's.

    Args:
        last_hidden_state: ``(N, L, H)``.
        attention_mask: ``(N, L)``, 1 = real token.

    Returns:
        ``(N, H)``, dtype of ``last_hidden_state`` (float32 unless float64). A row with no real token
        gives zeros. Non-finite values give sentence-transformers' results (its
        ``(h · mask).sum(1) / mask.sum(1)``), with no numpy warning: a NaN or inf in a padded
        position makes that feature NaN (``inf · 0``), as does NaN among the real tokens. A sum
        whose partial sums (numpy's pairwise order) pass the dtype's max is inf, where torch's
        order may stay finite (values near 1e37 in float32: no model's hidden states).

    Raises:
        TypeError: non-numeric ``last_hidden_state``; a mask neither bool nor 0/1 numbers.
        ValueError: wrong ranks, shapes that disagree, empty input, mask values other than 0/1.
    """
    hidden = unconverted(last_hidden_state, "last_hidden_state", ndim=3)
    mask = as_bool(attention_mask, "attention_mask", allow_float=True)  # a broadcast view stays one
    if mask.shape != hidden.shape[:2]:
        raise ValueError(f"attention_mask: expected shape {hidden.shape[:2]} (last_hidden_state's N, L), "
                         f"got {mask.shape}")
    last_hidden_state = as_float(hidden, "last_hidden_state", ndim=3)  # the shapes agree: now its copy
    m = mask.astype(last_hidden_state.dtype)[..., None]                         # (N, L, 1)
    with np.errstate(invalid="ignore", over="ignore"):  # inf · 0 is NaN, a sum past the dtype's max inf: as torch's
        summed = (last_hidden_state * m).sum(axis=1)                            # (N, H)
    counts = np.maximum(m.sum(axis=1), 1e-9)                                     # (N, 1)
    return summed / counts


def cosine_similarity(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Cosine similarity matrix ``(N, M)`` between rows of ``a (N, H)`` and ``b (M, H)`` (``b = a``
    by default): ``a_n · b_m / (‖a_n‖ ‖b_m‖)``, as sentence-transformers' ``util.cos_sim``. A zero
    row has similarity 0 with everything.

    Returns:
        ``(N, M)``, float64 if ``a`` (or ``b``) is float64, else float32.

    Raises:
        TypeError: non-numeric arrays. ValueError: not 2-D, empty, widths that differ, an
            ``(N, M)`` result larger than this machine's memory.
    """
    a_in = unconverted(a, "a", ndim=2)  # the shapes and the result's size checked before any copy
    b_in = a_in if b is None else unconverted(b, "b", ndim=2)
    if b_in.shape[1] != a_in.shape[1]:
        raise ValueError(f"b: expected rows of width {a_in.shape[1]} (a's), got shape {b_in.shape}")
    dtype = np.float64 if np.float64 in (compute_dtype(a_in, "a"), compute_dtype(b_in, "b")) else np.float32
    check_allocatable((a_in.shape[0], b_in.shape[0]), np.dtype(dtype).itemsize, "a, b: the (N, M) similarity matrix")
    a = as_float(a_in, "a", ndim=2)
    b = a if b is None else as_float(b_in, "b", ndim=2)
    if a.dtype != b.dtype:
        a, b = a.astype(np.float64), b.astype(np.float64)
    return _unit_rows(a) @ _unit_rows(b).T


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """``x / max(|x|, 1e-12)`` row by row, ``|x|`` taken without overflow: a row with an entry above
    1 is scaled by its largest entry first (the norm of a float32 row of entries near 1e19 is inf,
    which made the row zeros)."""
    big = np.max(np.abs(x), axis=1, keepdims=True)
    scale = np.where(big > 1, big, 1).astype(x.dtype)
    with np.errstate(invalid="ignore"):  # a row holding inf: inf / inf is NaN, as torch's result (no warning)
        y = x / scale
    norm = np.linalg.norm(y, axis=1, keepdims=True)  # the row's norm / scale
    with np.errstate(over="ignore"):  # norm · scale may overflow: the row is then not tiny either
        tiny = norm * scale < 1e-12
    out = np.divide(y, np.where(norm > 0, norm, 1))
    np.divide(x, x.dtype.type(1e-12), out=out, where=tiny)  # only the tiny rows (large ones would overflow)
    return out


def _check_pooling(pooling) -> str:
    """``pooling`` checked: one of ``"mean"``, ``"cls"``, ``"max"`` (TypeError for a non-str,
    ValueError for another str)."""
    return check_choice(pooling, "pooling", ("mean", "cls", "max"))


def _check_truncation(max_length, model: BertModel, name: str) -> None:
    """ValueError naming ``name`` unless ``max_length`` (a tokenizer's truncation length) is an int
    of at most ``model``'s ``max_position_embeddings``: longer sequences would reach positions the
    model has no embedding for."""
    positions = model.config.max_position_embeddings
    if max_length is not None and max_length <= positions:
        return
    if name == "max_seq_length":
        raise ValueError(f"max_seq_length: expected at most {positions} (the model's max_position_embeddings), "
                         f"got {max_length}")
    raise ValueError(f"{name}: expected an encoder tokenizer truncating to at most {positions} tokens (the model's "
                     f"max_position_embeddings), got max_length={max_length}")


class SentenceEncoder:
    """Sentence embeddings: tokenizer -> :class:`BertModel` -> pooling -> L2 normalisation (by default).

    Args:
        model: a loaded :class:`BertModel`.
        tokenizer: its :class:`Tokenizer` (an encoder tokenizer: ``max_length`` at most the model's
            ``max_position_embeddings``).
        pooling: ``"mean"`` (over real tokens, default), ``"cls"`` (the first token's vector) or
            ``"max"`` (per feature, over real tokens).
        normalize: the default of :meth:`encode`'s ``normalize`` (L2-normalise each embedding).
        prompts: named prompts (``{name: text}``, sentence-transformers' ``prompts``) that
            :meth:`encode`'s ``prompt_name`` picks from; None = none.
        default_prompt_name: the prompt :meth:`encode` puts before every text when given neither
            ``prompt_name`` nor ``prompt`` (sentence-transformers' ``default_prompt_name``); None =
            no prompt by default.
        include_prompt: pool the prompt's tokens with the text's (True, default), or leave them out
            of the pooling (False: sentence-transformers' Pooling ``include_prompt``; ``"cls"``
            pooling then takes the first token after the prompt, as sentence-transformers 6 does;
            versions <= 4 took ``[CLS]`` either way).

    Every argument is also a property (:attr:`model`, :attr:`tokenizer`, :attr:`pooling`,
    :attr:`normalize`, :attr:`prompts`, :attr:`default_prompt_name`, :attr:`include_prompt`, and
    :attr:`max_seq_length`, the tokenizer's truncation length): assigning one later is checked as
    the constructor checks it, and a refused value leaves the setting as it was
    (``enc.pooling = "CLS"`` raises, it does not fall back to mean pooling; ``enc.include_prompt
    = "no"`` raises, it is not read as true).

    Raises:
        TypeError: ``model`` or ``tokenizer`` of another class, ``pooling`` not a str,
            ``normalize`` or ``include_prompt`` not a bool, ``prompts`` not a dict of str -> str,
            ``default_prompt_name`` not a str.
        ValueError: a tokenizer that would let sequences longer than the model's positions
            through; an unknown ``pooling``; a ``default_prompt_name`` that is not in ``prompts``;
            a prompt that is not valid Unicode.
    """

    def __init__(self, model: BertModel, tokenizer: Tokenizer, pooling: str = "mean", normalize: bool = True,
                 prompts: dict | None = None, default_prompt_name: str | None = None, include_prompt: bool = True):
        # Each setter checks its value (the order matters: tokenizer is checked against model,
        # default_prompt_name against prompts); a bad argument raises before the next is looked at.
        self._default_prompt_name = None
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.prompts = prompts
        self.default_prompt_name = default_prompt_name
        self.include_prompt = include_prompt

    @classmethod
    def from_pretrained(cls, name_or_path=DEFAULT_MODEL, dtype=np.float32, quantize: str | None = None
                        ) -> "SentenceEncoder":
        """Loads model and tokenizer from a Hugging Face directory or an embedded model name, with the
        pooling and normalisation of a sentence-transformers folder (:func:`read_pooling`: its
        ``modules.json`` and ``1_Pooling/config.json``, as sentence-transformers <= 5 or 6.x writes
        them; without ``modules.json``, mean pooling and no normalisation, as sentence-transformers
        loads a plain Hugging Face folder) and its prompts (:func:`read_prompts`:
        ``config_sentence_transformers.json``'s ``prompts`` and ``default_prompt_name``, which
        :meth:`encode` puts before every text as ``SentenceTransformer.encode`` does, and the
        pooling config's ``include_prompt``). The
        model and tokenizer files are read from the folder of ``modules.json``'s Transformer
        module (:func:`transformer_folder`): the folder itself, or ``0_Transformer/`` in the older
        sentence-transformers layout. That folder's ``sentence_bert_config.json`` gives the
        tokenizer its ``max_seq_length``, ``do_lower_case`` (a ``Lowercase()`` normalizer prepended,
        as sentence-transformers 6 does), ``processor_kwargs`` (``model_max_length``, which wins
        over ``max_seq_length``, BERT's ``do_lower_case`` and ``truncation_side``) and
        ``processing_kwargs`` (the ``max_length`` of its ``"text"`` / ``"common"``, which wins over
        both): see :meth:`Tokenizer.from_pretrained`. All of that file is checked before any
        model weight is read.

        Args:
            name_or_path: a directory or an embedded model's name (default all-MiniLM-L6-v2).
            dtype: ``np.float32`` or ``np.float64``.
            quantize: None, or ``"int8"``: every linear layer of the encoder int8 per output
                channel (:func:`transformer_core.quantize`; attention, norms, softmax and pooling
                stay float32). Needs ``dtype=np.float32``. What was measured, on all-MiniLM-L6-v2
                (samples, not bounds): the cosine of the int8 embedding to the float32 one was
                0.994 at least and 0.997 on average over the 66 sentences of
                ``bench/sentences.txt`` (and over 1000 texts made of them and their pairs); very
                short texts lose more: over the 490 distinct words of those sentences, each as a
                text, minimum 0.978 (``"Please"``), mean 0.993; over 79 everyday one-to-three-word
                texts, minimum 0.967 (``"Thanks"``; ``"Thank you"`` 0.968, ``"Thanks!"`` 0.969),
                mean 0.983. An int8 row also depends slightly on its batch-mates (:meth:`encode`).

        Raises:
            ``dtype`` and ``quantize`` are checked first, before any file is read:
            TypeError: ``dtype`` not float32 or float64; ``quantize`` neither None nor a str.
            ValueError: an unknown ``quantize`` format, or ``quantize`` with ``dtype`` float64.
            FileNotFoundError, ValueError: as :meth:`BertModel.from_pretrained`,
                :func:`read_pooling` (a pooling mode or module that is not supported),
                :func:`transformer_folder` (a Transformer ``path`` outside the folder or missing),
                :func:`read_prompts` (a malformed ``config_sentence_transformers.json``, named) and
                :meth:`Tokenizer.from_pretrained` (``sentence_bert_config.json``'s ``max_seq_length``,
                ``do_lower_case``, ``processor_kwargs`` and ``processing_kwargs``; these before
                the model is read). ValueError naming
                ``sentence_bert_config.json`` and the key: a ``model_kwargs`` / ``config_kwargs``
                (or ``model_args`` / ``config_args``) that is not empty (sentence-transformers
                passes them to transformers' model and config; not applied here), but for the keys
                sentence-transformers overwrites itself (``cache_dir``, ``revision``, ``token``,
                ``subfolder``, ``local_files_only``, ``trust_remote_code``).
        """
        from .hub import resolve_model_dir
        from .quantization import QUANTIZED_FORMATS

        dtype = resolve_dtype(dtype)
        if quantize is not None:
            check_choice(quantize, "quantize", QUANTIZED_FORMATS)
            if dtype is not np.float32:
                raise ValueError(f"quantize, dtype: quantize={quantize!r} computes in float32, expected "
                                 f"dtype=np.float32, got {np.dtype(dtype).name}")
        model_dir = resolve_model_dir(name_or_path)
        settings = {**read_pooling(model_dir), **read_prompts(model_dir)}
        # the model and tokenizer files: the folder itself, or the older layout's 0_Transformer/
        folder = transformer_folder(model_dir)
        source = name_or_path if folder == model_dir else str(folder)
        # sentence_bert_config.json (model/config arguments: none applied here; the tokenizer's keys),
        # checked before any weight is read
        _check_sentence_bert_config(folder)
        model = BertModel.from_pretrained(source, dtype=dtype)
        if quantize is not None:
            from .quantization import quantize as _quantize

            model = _quantize(model, quantize, inplace=True)
        return cls(model, Tokenizer.from_pretrained(source), **settings)

    @property
    def dim(self) -> int:
        """Embedding width H (384 for all-MiniLM-L6-v2)."""
        return self.model.config.hidden_size

    @property
    def model(self) -> BertModel:
        """The :class:`BertModel` that computes the token vectors.

        Raises (on assignment):
            TypeError: not a :class:`BertModel`.
        """
        return self._model

    @model.setter
    def model(self, value: BertModel) -> None:
        """Sets the model of later :meth:`encode` calls, checked (see the getter for the errors).
        Its positions are checked against the tokenizer's truncation by :meth:`encode`."""
        if not isinstance(value, BertModel):
            raise TypeError(f"model: expected a transformer_core.BertModel, got {type(value).__name__}")
        self._model = value

    @property
    def tokenizer(self) -> Tokenizer:
        """The :class:`Tokenizer` of the texts: an encoder tokenizer whose ``max_length`` is at most
        the model's ``max_position_embeddings``.

        Raises (on assignment):
            TypeError: not a :class:`Tokenizer`.
            ValueError: a tokenizer that does not truncate (a causal-LM one) or truncates to more
                tokens than the model has positions.
        """
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Tokenizer) -> None:
        """Sets the tokenizer of later :meth:`encode` calls, checked (see the getter for the errors)."""
        if not isinstance(value, Tokenizer):
            raise TypeError(f"tokenizer: expected a transformer_core.Tokenizer, got {type(value).__name__}")
        _check_truncation(value.max_length, self.model, "tokenizer")
        self._tokenizer = value

    @property
    def pooling(self) -> str:
        """``"mean"``, ``"cls"`` or ``"max"``: how :meth:`encode` pools the token vectors.

        Raises (on assignment):
            TypeError: not a str. ValueError: another str (``"CLS"`` included).
        """
        return self._pooling

    @pooling.setter
    def pooling(self, value: str) -> None:
        """Sets the pooling of later :meth:`encode` calls, checked (see the getter for the errors)."""
        self._pooling = _check_pooling(value)

    @property
    def normalize(self) -> bool:
        """The default of :meth:`encode`'s ``normalize``: L2-normalise each embedding.

        Raises (on assignment):
            TypeError: not a bool (``"no"``, 0 and 1 included).
        """
        return self._normalize

    @normalize.setter
    def normalize(self, value: bool) -> None:
        """Sets :meth:`encode`'s default ``normalize``, checked (see the getter for the errors)."""
        self._normalize = check_bool(value, "normalize")

    @property
    def prompts(self) -> MappingProxyType:
        """The named prompts (``{name: text}``, sentence-transformers' ``prompts``) that
        :meth:`encode`'s ``prompt_name`` picks from: a read-only view (a ``MappingProxyType``,
        which json, pickle and copy do not take: ``dict(enc.prompts)`` is a plain copy). To change
        them, assign a new dict (``enc.prompts = {**enc.prompts, "query": "query: "}``), which is
        checked.

        Raises (on assignment):
            TypeError: neither None (no prompts) nor a dict (or other mapping) of str -> str.
            ValueError: a prompt that is not valid Unicode; prompts without the current
                :attr:`default_prompt_name` (assign ``default_prompt_name = None`` first).
        """
        return MappingProxyType(self._prompts)

    @prompts.setter
    def prompts(self, value: dict | None) -> None:
        """Sets the prompts (None: none), checked (see the getter for the errors); a copy is kept."""
        value = {} if value is None else value
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            raise TypeError(f"prompts: expected None or a dict of prompt name (str) -> prompt (str), got {value!r}")
        for name, text in value.items():
            check_unicode(text, f"prompts[{name!r}]")
        if self._default_prompt_name is not None and self._default_prompt_name not in value:
            raise ValueError(f"prompts: expected prompts that include the default_prompt_name "
                             f"{self._default_prompt_name!r}, got the names {list(value)}; assign "
                             f"default_prompt_name = None first")
        self._prompts = dict(value)

    @property
    def default_prompt_name(self) -> str | None:
        """The name of the prompt :meth:`encode` puts before every text when given neither
        ``prompt_name`` nor ``prompt`` (sentence-transformers' ``default_prompt_name``); None = no
        prompt by default.

        Raises (on assignment):
            TypeError: neither None nor a str.
            ValueError: a name that is not one of :attr:`prompts` (they are listed).
        """
        return self._default_prompt_name

    @default_prompt_name.setter
    def default_prompt_name(self, value: str | None) -> None:
        """Sets the default prompt's name, checked (see the getter for the errors)."""
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(f"default_prompt_name: expected None or a str, got {type(value).__name__}")
            if value not in self._prompts:
                raise ValueError(f"default_prompt_name: expected None or one of the prompts' names "
                                 f"{list(self._prompts)}, got {value!r}")
        self._default_prompt_name = value

    @property
    def include_prompt(self) -> bool:
        """Whether the prompt's tokens are pooled with the text's (True), or left out of the pooling
        (False: sentence-transformers' Pooling ``include_prompt``): the mean or max over the text's
        tokens, and for ``"cls"`` pooling the first token after the prompt (as sentence-transformers
        6's Pooling, which takes the first position of the mask the prompt is removed from;
        versions <= 4 took ``[CLS]`` either way). An empty prompt is no prompt (see :meth:`encode`).

        Raises (on assignment):
            TypeError: not a bool (``"no"``, 0 and 1 included).
        """
        return self._include_prompt

    @include_prompt.setter
    def include_prompt(self, value: bool) -> None:
        """Sets :attr:`include_prompt`, checked (see the getter for the errors)."""
        self._include_prompt = check_bool(value, "include_prompt")

    @property
    def max_seq_length(self) -> int:
        """The number of tokens (``[CLS]`` and ``[SEP]`` included) a text is truncated to:
        sentence-transformers' ``max_seq_length`` (256 for all-MiniLM-L6-v2, from its
        ``sentence_bert_config.json``). It is the tokenizer's :attr:`Tokenizer.max_length`; assigning
        it (``enc.max_seq_length = 512``) truncates every later :meth:`encode` call to the new
        length (a call already running keeps the length it started with).

        Unlike sentence-transformers 6 for a folder whose ``sentence_bert_config.json`` has a
        ``processing_kwargs`` ``max_length`` (the length :meth:`Tokenizer.from_pretrained`
        truncates to, over ``max_seq_length``): this reads that length, and assigning replaces it.
        sentence-transformers' ``max_seq_length`` reads the module's own (``max_seq_length``, the
        tokenizer's ``model_max_length``) and, once assigned, keeps truncating at
        ``processing_kwargs``' ``max_length``, which it passes on every tokenizer call. Right after
        loading, both truncate alike; after an assignment, to the assigned length here and still
        to ``processing_kwargs``' there.

        Raises (on assignment):
            TypeError: not an int.
            ValueError: above the model's ``max_position_embeddings`` (512 for BERT), below 1 or
                below the number of special tokens the tokenizer adds (2: ``[CLS]`` and ``[SEP]``).
        """
        return self.tokenizer.max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        """Sets the tokenizer's truncation length, checked against the model (see the getter)."""
        value = check_int(value, "max_seq_length", 1)
        _check_truncation(value, self.model, "max_seq_length")
        _check_room_for_special_tokens(self.tokenizer._tok, value, "max_seq_length")
        self.tokenizer.max_length = value

    def encode(self, sentences, *, batch_size: int = 32, normalize: bool | None = None,
               progress: bool | None = None, prompt_name: str | None = None,
               prompt: str | None = None, normalize_embeddings: bool | None = None,
               show_progress_bar: bool | None = None) -> np.ndarray:
        """Embeds sentences.

        Every argument after ``sentences`` is keyword-only: sentence-transformers' ``encode`` takes
        some of them by position (``inputs, prompt_name, prompt, batch_size, ...``), in an order
        this method does not follow, so a positional call raises Python's TypeError rather than
        reading ``enc.encode(texts, "query")`` one way or the other.

        A prompt is put before every text, as sentence-transformers' ``SentenceTransformer.encode``
        does: ``prompt`` if given, else ``prompts[prompt_name]``, else the encoder's default prompt
        (``prompts[default_prompt_name]``, from the folder's ``config_sentence_transformers.json``);
        the embedding of ``"query: " + text`` for a default prompt ``"query: "``. With
        ``include_prompt`` false the prompt's positions (``[CLS]`` and the prompt's tokens: the
        first ``len(prompt's ids) - 1``, sentence-transformers' ``prompt_length``) are left out of
        the pooling, though still attended to: the mean or max is over the text's tokens, and
        ``"cls"`` pooling takes the first token after the prompt (position ``prompt_length``; 0
        when the prompt fills the whole row), as sentence-transformers 6's Pooling does (versions
        <= 4 took ``[CLS]``); a row the prompt fills has nothing to pool for ``"mean"`` and
        ``"max"``: zeros (sentence-transformers' max gives -inf there). An empty prompt (``prompt=""``, or an empty named or default prompt)
        is no prompt: the texts are encoded alone and every real token is pooled, as in
        sentence-transformers 6 (``if prompt:``; 5.x tested ``prompt is not None and len(prompt) >
        0``, while 2.x to 4.x tested ``prompt is not None`` and left ``[CLS]`` out of the pooling
        for an empty prompt).

        The sentences are sorted by length (characters, longest first, as sentence-transformers'
        ``SentenceTransformer.encode`` does) before they are cut into batches, so that each batch
        holds sentences of similar length and padding costs little; the rows come back in the
        order given. In float32 or float64 a row does not depend on the other sentences of its
        batch beyond float rounding (a few 1e-7). With ``quantize="int8"`` it does, slightly: the
        padding width changes the float rounding before each int8 activation quantization, which
        can flip a rounding step; measured on all-MiniLM-L6-v2 (the 1000 benchmark sentences and
        one-token texts, batch sizes 1 to 128): up to 0.015 per element, cosine >= 0.996 between
        the same text's rows from different batches.

        A text is truncated to :attr:`max_seq_length` tokens. One far longer than that (more than 16
        characters per token kept) is given to the tokenizer as a prefix cut at a space, when the
        tokenizer's pipeline provably gives the prefix the same first tokens (BERT's, and
        pipelines like it: see ``_splits_at_spaces``) and the prefix has more tokens than are
        kept; otherwise whole. The ids, and so the embeddings, are bitwise the same either way;
        the prefix only saves the memory (about 140 MB per MB of text) and time of tokenizing
        what truncation drops.

        The model computes as in eval mode (no dropout) even when it is in training mode, as
        sentence-transformers' ``encode`` (which calls ``eval()``), but its mode is left as it is and
        a training forward's state awaiting its backward is kept.

        The encoder's settings (``model``, ``tokenizer``, ``pooling``, ``include_prompt``,
        ``normalize``, ``prompts``, ``default_prompt_name``, and the tokenizer's own, such as
        :attr:`max_seq_length`) are read once, when the call starts, before ``sentences`` is
        iterated: a setter called during the call (from another thread, from the iterator of
        ``sentences``, or a hook the tokenizer or model runs) applies from the next call.

        Args:
            sentences: a list (or any iterable) of str, or one str (a str, or a 0-d numpy array
                holding one).
            batch_size: sentences per forward pass; each batch is padded to its longest member.
            normalize: L2-normalise each embedding (cosine similarity = dot product); None = the
                encoder's ``normalize`` (from :meth:`from_pretrained`: true iff the folder lists a
                Normalize module; a folder without ``modules.json`` is not normalised).
            progress: show a tqdm bar (on stderr) when True; None or False = no bar.
                (sentence-transformers shows one for None only when its logger is at INFO or
                DEBUG; this method shows none unless asked.)
            prompt_name: the name of one of the encoder's ``prompts`` to put before every text;
                None = the default prompt (if any).
            prompt: a prompt text to put before every text; None = ``prompt_name``'s or the
                default. At most one of ``prompt_name`` and ``prompt``.
            normalize_embeddings: sentence-transformers' name for normalising, with its meaning:
                True = ``normalize=True``; False = ``normalize=None`` (the encoder's own setting:
                in sentence-transformers False does not undo a folder's Normalize module, so
                all-MiniLM-L6-v2's embeddings stay unit vectors); None = not given.
            show_progress_bar: sentence-transformers' name for ``progress`` (the same values: a bar
                only for True).

        ``normalize`` and ``normalize_embeddings``, or ``progress`` and ``show_progress_bar``, may be
        given together only when they ask for the same thing.

        Returns:
            ``(N, H)`` for a list (or other iterable) of N texts, row ``i`` the embedding of
            ``sentences[i]``; ``(H,)`` for one str (or 0-d array), as sentence-transformers returns
            it (pass ``[text]`` for ``(1, H)``). In the model's dtype (float32 by default; ``H = 384``
            for all-MiniLM-L6-v2).

        Raises:
            TypeError: ``sentences`` not str or an iterable of str (the first offending index is
                named); an argument after ``sentences`` given by position (Python's own error);
                ``batch_size`` not an int; ``normalize`` not a bool or None; ``progress`` not a
                bool or None; ``prompt_name`` or ``prompt`` neither None nor a str;
                ``normalize_embeddings`` or ``show_progress_bar`` not a bool or None; both names of
                one option given with settings that differ (both names are named).
            ValueError: ``batch_size`` < 1, or a batch of more than one text whose padded arrays
                or forward pass need more than this machine's memory (checked for each batch before
                its work; the first holds the longest texts); a sentence or ``prompt`` that is not
                valid Unicode (a lone surrogate, from bytes that were not UTF-8; its index and
                position are named); a ``prompt_name`` not in the encoder's ``prompts``; both
                ``prompt_name`` and ``prompt`` given; a token id of the tokenizer that the model
                has no embedding row for (a tokenizer of another vocabulary: ``tokenizer`` and the
                sentence are named, at the batch that holds it).
        """
        # the settings of this call, read once, before `sentences` is iterated: a setter called
        # meanwhile (from another thread, from `sentences`' own iterator, or a hook run by the
        # tokenizer or the model) changes later calls only, never part of this one
        model, tokenizer, pooling, include_prompt = self.model, self.tokenizer, self.pooling, self.include_prompt
        own_normalize, prompts, default_prompt_name = self.normalize, self.prompts, self.default_prompt_name
        tokenizer = _tokenizer_as_now(tokenizer)  # its max_length (max_seq_length) as it is now
        if isinstance(sentences, np.ndarray) and sentences.ndim == 0:  # np.array("text"): one text
            if sentences.dtype.kind != "U" and not isinstance(sentences.item(), str):
                raise TypeError(f"sentences: expected a str or an iterable of str, got a 0-d numpy array of "
                                f"{sentences.dtype}")
            sentences = str(sentences.item())
        single = isinstance(sentences, str)  # one text: one (H,) row back, as sentence-transformers
        if single:
            sentences = [sentences]
        elif sentences is None or isinstance(sentences, (bytes, bytearray, dict)) or not hasattr(sentences, "__iter__"):
            raise TypeError(f"sentences: expected a str or an iterable of str, got {type(sentences).__name__}")
        sentences = list(sentences)
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise TypeError(f"sentences: expected a list of str, got {type(s).__name__} at index {i}")
            check_unicode(s, "sentences", i)
        batch_size = check_int(batch_size, "batch_size", 1)
        normalize = _normalize_setting(normalize, normalize_embeddings, own_normalize)
        progress = bool(_one_of_two_names(progress, "progress", show_progress_bar, "show_progress_bar"))
        prompt = _prompt(prompt_name, prompt, prompts, default_prompt_name)
        # the tokenizer (or its max_length) may have been replaced since __init__
        _check_truncation(tokenizer.max_length, model, "tokenizer")
        skip = 0  # leading positions left out of the pooling: [CLS] and the prompt's tokens
        if prompt:  # as sentence-transformers 6: an empty prompt is no prompt
            sentences = [prompt + s for s in sentences]
            if not include_prompt:
                skip = len(tokenizer.encode(prompt)) - 1  # sentence-transformers' prompt_length
        out = np.zeros((len(sentences), model.config.hidden_size), dtype=model.dtype)
        if not sentences:
            return out
        # Longest first (a stable sort: equal lengths keep their order); out[order[j]] is the j-th sorted.
        order = np.argsort([-len(s) for s in sentences], kind="stable")
        starts = range(0, len(sentences), batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encode", unit="batch")
        # a text far longer than max_seq_length tokens is tokenized from a prefix that gives the
        # same tokens (_texts_to_tokenize): memory bounded by the prefix, not the text
        batches = tokenizer.encode_batches(_texts_to_tokenize(tokenizer, [sentences[i] for i in order]), batch_size)
        # One packing of each weight for all the batches (the same bits as packing it per batch).
        with core.PackedWeightScope():
            for start in starts:
                rows = order[start:start + batch_size]
                enc = None
                try:  # the padding's and the forward's memory checks, before their work, name batch_size
                    enc = next(batches)
                    _check_ids_fit_model(enc["input_ids"], model.config.vocab_size, rows)
                    mask = enc["attention_mask"] == 1  # (N, L) bool, True = a real token
                    # eval mode's forward whatever the model's mode (as sentence-transformers' encode,
                    # which calls eval()), without switching it: no dropout, a pending training state kept
                    hidden = model._forward_eval(enc["input_ids"], mask, enc["token_type_ids"],
                                                 pooler=False).last_hidden_state
                except ValueError as e:
                    _raise_if_batch_too_large(e, len(rows), None if enc is None else enc["input_ids"].shape[1])
                    raise
                pooled = mask
                if skip:  # include_prompt false: the prompt attended to, not pooled
                    pooled = mask.copy()
                    pooled[:, :skip] = False
                if pooling == "cls":
                    # sentence-transformers 6: the first position of the pooled mask (argmax; 0 when
                    # the prompt leaves none): [CLS] without a prompt, else the first token after it
                    first = pooled.argmax(axis=1) if skip else np.zeros(len(rows), dtype=np.intp)
                    out[rows] = hidden[np.arange(len(rows)), first]            # (N, H)
                elif pooling == "max":
                    # sentence-transformers 6: what is not pooled set to -inf, then the max over L; a
                    # row with nothing pooled (a prompt filling it) is zeros here, as mean pooling's
                    # (sentence-transformers gives -inf there, NaN once normalized)
                    best = np.where(pooled[..., None], hidden, hidden.dtype.type(-np.inf)).max(axis=1)
                    best[~pooled.any(axis=1)] = 0
                    out[rows] = best
                elif skip:
                    out[rows] = mean_pool(hidden, pooled)
                else:
                    # mean_pool's sum: the model's hidden states at padding positions are zeros, so
                    # the plain sum over L is the masked sum (the same values added in the same order)
                    counts = np.maximum(mask.sum(axis=1, keepdims=True), 1).astype(hidden.dtype)
                    out[rows] = hidden.sum(axis=1) / counts
        if normalize:
            # np.linalg.norm's own arithmetic for a real array (the same bits), without its dispatch
            out /= np.maximum(np.sqrt(np.add.reduce(out * out, axis=1, keepdims=True)), 1e-12)
        return out[0] if single else out


def _check_ids_fit_model(ids: np.ndarray, vocab_size: int, rows: np.ndarray) -> None:
    """Raises a ValueError naming the tokenizer when it gave an id the model has no embedding row
    for (a tokenizer and a model of different vocabularies: the forward would name its
    ``input_ids``, which the caller never passed); ``rows``: the batch's indices in ``sentences``."""
    if ids.size and int(ids.max()) >= vocab_size:
        r, c = np.argwhere(ids >= vocab_size)[0]
        raise ValueError(f"tokenizer: sentences[{rows[r]}] gives token id {ids[r, c]}, but the model's embedding has "
                         f"{vocab_size} rows (config vocab_size): expected a tokenizer of the model's vocabulary "
                         f"(ids below {vocab_size})")


def _raise_if_batch_too_large(error: ValueError, n: int, width: int | None) -> None:
    """Raises a ValueError naming ``batch_size`` when ``error`` is a memory check of a batch of
    ``n > 1`` texts (``width``: its padded length, None before it is tokenized), from the
    tokenizer's padding or the model's forward (which name their own ``texts[a:b]`` or
    ``input_ids``): fewer texts a batch need less. A batch of one text, or any other error, is left
    as it is."""
    if n > 1 and "more than this machine's memory" in str(error):
        padded = "" if width is None else f" padded to {width} tokens"
        raise ValueError(f"batch_size: a batch of {n} texts{padded} is too large for this machine's memory; use a "
                         f"smaller batch_size (the default is 32). What was checked: {error}") from None


def _normalize_setting(normalize, normalize_embeddings, own: bool) -> bool:
    """Whether :meth:`SentenceEncoder.encode` normalises, from its ``normalize`` and
    sentence-transformers' ``normalize_embeddings`` (True: normalise; False: the encoder's own
    setting, ``own``, read when the call started)."""
    if normalize is not None:
        normalize = check_bool(normalize, "normalize")
    if normalize_embeddings is None:
        return own if normalize is None else normalize
    st = check_bool(normalize_embeddings, "normalize_embeddings")
    meant = True if st else own
    if normalize is not None and normalize != meant:
        raise TypeError(f"normalize, normalize_embeddings: expected one of the two names, or settings that "
                        f"agree, got normalize={normalize} and normalize_embeddings={st} (which means "
                        f"normalize={meant}: False keeps the encoder's own normalize, as in "
                        f"sentence-transformers)")
    return meant


def _prompt(prompt_name, prompt, prompts, default_prompt_name) -> str | None:
    """The prompt :meth:`SentenceEncoder.encode` puts before each text, from its arguments and the
    encoder's ``prompts`` and ``default_prompt_name`` (read when the call started): None for none,
    or a str ("" included, which ``encode`` treats as no prompt, as sentence-transformers 6)."""
    if prompt is not None:
        if prompt_name is not None:
            raise ValueError(f"prompt_name, prompt: expected at most one, got prompt_name={prompt_name!r} and "
                             f"prompt={prompt!r}")
        if not isinstance(prompt, str):
            raise TypeError(f"prompt: expected None or a str, got {type(prompt).__name__}")
        check_unicode(prompt, "prompt")
        return prompt
    if prompt_name is not None:
        if not isinstance(prompt_name, str):
            raise TypeError(f"prompt_name: expected None or a str, got {type(prompt_name).__name__}")
        if prompt_name not in prompts:
            raise ValueError(f"prompt_name: expected one of the encoder's prompts {list(prompts)}, got "
                             f"{prompt_name!r}")
        return prompts[prompt_name]
    return None if default_prompt_name is None else prompts[default_prompt_name]


def _tokenizer_as_now(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` as it is now, for one :meth:`SentenceEncoder.encode` call: a Tokenizer object
    of its own holding the same backend and settings. A setter of ``tokenizer`` (``max_length``,
    which ``max_seq_length`` sets, ``truncation_side``, ``pad_token``, ``do_lower_case``, ...)
    swaps in a new backend or value and never changes the backend in use (see
    :class:`Tokenizer`), so this one keeps encoding as ``tokenizer`` did when it was made. Unlike
    ``copy.copy``, it leaves ``tokenizer`` as it was (no backend marked as shared, so copied later)."""
    tokenizer._unpadded_backend()  # kept on tokenizer, where the next call's view finds it (30-50 µs a copy)
    view = object.__new__(type(tokenizer))
    view.__dict__.update(tokenizer.__dict__)
    view._special = dict(tokenizer._special)  # the one dict a setter changes in place
    return view


def _one_of_two_names(value, name: str, alias, alias_name: str) -> bool | None:
    """The bool-or-None option given as ``name`` or as its sentence-transformers spelling
    ``alias_name`` (None: not given); TypeError naming both when both are given and differ."""
    value = None if value is None else check_bool(value, name)
    alias = None if alias is None else check_bool(alias, alias_name)
    if value is not None and alias is not None and value != alias:
        raise TypeError(f"{name}, {alias_name}: expected one of the two names (the same option), or the same "
                        f"value under both, got {name}={value} and {alias_name}={alias}")
    return alias if value is None else value
