"""Reading a GGUF checkpoint (llama.cpp's single-file format) into numpy, with no torch.

A GGUF file is a header (magic ``b"GGUF"``, version, tensor count, metadata count), typed key/value
metadata (the model's hyper-parameters under ``<arch>.*``, its tokenizer under ``tokenizer.*``),
a table of tensor descriptors (name, dims fastest-first, ggml type, offset) and the tensor data,
aligned to ``general.alignment`` (32) bytes. Quantized tensors are stored as blocks along each row:
Q4_0 / Q4_1 / Q8_0 pack 32 weights per block (an fp16 scale, Q4_1 also an fp16 minimum, then 4- or
8-bit codes), so a row of ``in_features`` weights is ``in_features / 32`` blocks.

This module reads the header itself, checking every read against the file's bounds (a corrupt or
truncated file is a ``ValueError`` naming it), maps the file read-only and gives each tensor as a
zero-copy view of the map; long metadata arrays (the tokenizer's vocabulary and merges) are
checked when the file is opened but turned into Python lists only when asked for, so a model that
only needs the tensors costs neither the time nor the memory of ~100k Python strings. The ``gguf``
package (llama.cpp's own Python code) dequantizes the blocks and names the ggml types this module
does not know. It maps llama.cpp's tensor names to Hugging Face's ``LlamaForCausalLM`` state_dict
names and undoes the row permutation llama.cpp's converter applies to the query/key projections (see
:func:`rope_row_permutation`).

The file stays memory-mapped, as llama.cpp keeps its model files mapped: while a checkpoint, a raw
view of it, its undecoded metadata or a model built on its blocks (``LlamaForCausalLM.from_pretrained``
of a ``.gguf`` with the default ``dtype=None``) is alive, do not truncate or overwrite the file in
place (``open(path, "w")``, ``cp new.gguf path``, a download tool rewriting it): reading a page that
is no longer in the file ends the whole process with SIGBUS, which no Python exception can catch,
and a page rewritten in place silently changes the weights. Replacing the file by a rename
(``os.replace``, ``mv``) is safe: the old file stays mapped until the last reference goes.

    ckpt = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ckpt.config["num_key_value_heads"]           # 3
    w = ckpt.tensor("model.layers.0.self_attn.q_proj.weight")      # (576, 576) float32
    info = ckpt.tensor_info("model.layers.0.mlp.up_proj.weight")   # ggml type Q4_1, raw blocks
    info.raw.shape                               # (1536, 360) uint8: 18 blocks of 20 bytes per row
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._validation import check_allocatable, check_int, described, resolve_dtype

__all__ = ["GGUFCheckpoint", "GGUFTensorInfo", "read_gguf", "read_gguf_metadata", "rope_row_permutation",
           "SUPPORTED_GGML_TYPES", "SUPPORTED_ARCHITECTURES"]

#: ggml tensor types this module dequantizes (name -> ggml type id).
SUPPORTED_GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "BF16": 30}
#: ``general.architecture`` values this module maps to Hugging Face names.
SUPPORTED_ARCHITECTURES = ("llama",)

_GGUF_MAGIC = b"GGUF"
_GGUF_VERSIONS = (2, 3)  # version 1 counted with 32-bit integers; llama.cpp dropped it
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS

# GGUF metadata value types: id -> (name, fixed byte size or None for string/array).
_VALUE_TYPES = {
    0: ("UINT8", 1), 1: ("INT8", 1), 2: ("UINT16", 2), 3: ("INT16", 2), 4: ("UINT32", 4), 5: ("INT32", 4),
    6: ("FLOAT32", 4), 7: ("BOOL", 1), 8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", 8),
    11: ("INT64", 8), 12: ("FLOAT64", 8),
}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_SCALAR_FORMATS = {"UINT8": "<B", "INT8": "<b", "UINT16": "<H", "INT16": "<h", "UINT32": "<I", "INT32": "<i",
                   "FLOAT32": "<f", "BOOL": "<?", "UINT64": "<Q", "INT64": "<q", "FLOAT64": "<d"}
#: Arrays longer than this are checked at open and decoded when first read (see _Metadata).
_LAZY_ARRAY_LENGTH = 256
#: ggml types whose names and sizes this module knows without the gguf package:
#: id -> (name, values per block, bytes per block), as ggml's GGML_QUANT_SIZES.
_GGML_SIZES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34),
               30: ("BF16", 1, 2)}
#: The fp16 fields of a block that scale its codes, and their byte offsets in the block (ggml-common.h:
#: ``block_q8_0 {d; qs[32]}``, ``block_q4_0 {d; qs[16]}``, ``block_q4_1 {d; m; qs[16]}``).
_BLOCK_SCALES = {"Q8_0": (("d", 0),), "Q4_0": (("d", 0),), "Q4_1": (("d", 0), ("m", 2))}


def _check_block_scales(raw: np.ndarray, type_name: str, row_values: int, what: str,
                        row_permutation: np.ndarray | None = None) -> None:
    """ValueError naming ``what`` when a block of ``raw`` has a NaN or inf fp16 scale ``d`` (or, for
    Q4_1, offset ``m``): every value of the block would dequantize to NaN or inf, and every product
    with its row to NaN or inf. Nothing is checked for the other types (F32, F16, BF16: no scales).

    One strided pass over the scale bytes: ``raw`` viewed as ``(blocks, bytes per block)``, each
    scale's two bytes read as a little-endian float16. No copy of ``raw`` (a bool per block).

    Args:
        raw: the blocks, a C-contiguous uint8 array of any shape (a whole number of blocks).
        type_name: the ggml type, ``"Q8_0"``, ``"Q4_0"``, ``"Q4_1"`` (others: nothing to check).
        row_values: values per row (``in_features``), to say which row the block is in.
        what: the tensor, for the message (``"weights['weight']: blocks"``).
        row_permutation: where ``what`` names rows in another order than the blocks' (a query or
            key projection read under its Hugging Face name: ``hf_rows = raw_rows[row_permutation]``),
            that index; the message then gives the row in the named order. None: the blocks' rows.
    """
    fields = _BLOCK_SCALES.get(type_name)
    if fields is None:
        return
    block_size, block_bytes = next((size, nbytes) for name, size, nbytes in _GGML_SIZES.values()
                                   if name == type_name)
    by_block = raw.reshape(-1, block_bytes)  # a view: raw is C-contiguous
    row_blocks = row_values // block_size
    for field, offset in fields:
        scales = by_block[:, offset:offset + 2].view("<f2")[:, 0]  # strided: one fp16 a block
        finite = np.isfinite(scales)
        if not finite.all():
            bad, first = int(finite.size - np.count_nonzero(finite)), int(np.argmin(finite))
            row = first // row_blocks
            if row_permutation is not None:  # the named order's row that holds the blocks' row `row`
                row = int(np.flatnonzero(row_permutation == row)[0])
            raise ValueError(f"{what}: {bad} block{'s have' if bad > 1 else ' has'} a NaN or inf scale {field} "
                             f"(of {finite.size} blocks; first: block {first}, in row {row}: "
                             f"{scales[first]}), expected finite fp16 scales (the values of such a block, and "
                             f"every product with its row, would be NaN or inf)")


# --------------------------------------------------------------------------------------------------
# Structural check of the file, before the gguf package reads it
# --------------------------------------------------------------------------------------------------
class _FileError(Exception):
    """A problem found while scanning; turned into a ValueError that names the file."""


@dataclass(frozen=True)
class _TensorEntry:
    name: str
    dims: tuple  # ggml order: fastest-moving first
    ggml_type: int
    offset: int  # from the start of the data section


class _Scanner:
    """Walks the header and metadata with bounds checks on every read (no allocation from counts)."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        """Checks that ``n`` bytes remain at the read position (ValueError naming ``what`` otherwise)."""
        if n < 0 or self.pos + n > self.size:
            raise _FileError(f"truncated GGUF file: {what} needs {n} bytes at offset {self.pos}, "
                             f"but the file ends at {self.size}")

    def unpack(self, fmt: str, what: str):
        """Reads the little-endian ``struct`` format ``fmt`` (one value, or a tuple), after ``need``."""
        n = struct.calcsize(fmt)
        self.need(n, what)
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return values if len(values) > 1 else values[0]

    def string(self, what: str, decode: bool = True):
        """Reads a GGUF string (uint64 length, then UTF-8 bytes): a str, or None with ``decode=False``
        (skipped). ValueError naming ``what`` when truncated or not UTF-8."""
        length = self.unpack("<Q", f"the length of {what}")
        self.need(length, what)
        start = self.pos
        self.pos += length
        if not decode:
            return None
        try:
            return bytes(self.buf[start:start + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise _FileError(f"corrupt GGUF header: {what} is not valid UTF-8") from None

    def value(self, value_type: int, what: str, depth: int = 0):
        """Checks one metadata value and returns it as a Python value (int, float, bool, str, list),
        or, for an array longer than _LAZY_ARRAY_LENGTH (at any depth), as a _LazyArray to decode
        when read (its strings are checked to be UTF-8 here, so decoding it later cannot fail):
        _Metadata decodes those, nested ones included, the first time their key is read."""
        if value_type not in _VALUE_TYPES:
            raise _FileError(f"corrupt GGUF header: {what} has unknown value type {value_type}")
        name, width = _VALUE_TYPES[value_type]
        if width is not None:
            self.need(width, what)
            return self.unpack(_SCALAR_FORMATS[name], what)
        if value_type == _STRING:
            return self.string(what)
        if depth > 2:
            raise _FileError(f"corrupt GGUF header: {what} nests arrays more than 3 deep")
        element_type, count = self.unpack("<IQ", f"the array header of {what}")
        if element_type not in _VALUE_TYPES:
            raise _FileError(f"corrupt GGUF header: {what} is an array of unknown value type {element_type}")
        element_width = _VALUE_TYPES[element_type][1]
        minimum = element_width if element_width is not None else (8 if element_type == _STRING else 12)
        if count * minimum > self.size - self.pos:
            raise _FileError(f"truncated GGUF file: {what} declares {count} elements, more than the "
                             f"{self.size - self.pos} bytes left in the file can hold")
        start = self.pos
        if element_width is not None:
            self.pos += count * element_width
        elif element_type == _STRING:
            for i in range(count):
                self.string(f"{what}[{i}]")  # checked (UTF-8) and dropped
        else:
            return [self.value(element_type, f"{what}[{i}]", depth + 1) for i in range(count)]
        lazy = _LazyArray(element_type, count, start)
        return lazy if count > _LAZY_ARRAY_LENGTH else lazy.decode(self.buf)


class _LazyArray(NamedTuple):
    """A metadata array of scalars or strings at byte ``pos`` of the file, checked, not decoded yet."""

    element_type: int
    count: int
    pos: int

    def decode(self, buf) -> list:
        """The array's ``count`` elements read from ``buf`` at ``pos`` (numbers, bools or strings)."""
        name, width = _VALUE_TYPES[self.element_type]
        if width is not None:
            dtype = np.dtype(_SCALAR_FORMATS[name].replace("?", "u1")).newbyteorder("<")
            values = np.frombuffer(buf, dtype=dtype, count=self.count, offset=self.pos).tolist()
            return [bool(v) for v in values] if name == "BOOL" else values
        out, pos = [], self.pos
        for _ in range(self.count):
            (length,) = struct.unpack_from("<Q", buf, pos)
            out.append(bytes(buf[pos + 8:pos + 8 + length]).decode("utf-8"))
            pos += 8 + length
        return out


def _has_lazy(value) -> bool:
    """Whether ``value`` is, or holds at any depth of nested arrays, a _LazyArray."""
    return isinstance(value, _LazyArray) or (isinstance(value, list) and any(
        isinstance(v, (list, _LazyArray)) and _has_lazy(v) for v in value))


def _decoded(value, buf):
    """``value`` with every _LazyArray in it, at any depth of nested arrays, decoded from ``buf``:
    plain lists all the way down."""
    if isinstance(value, _LazyArray):
        return value.decode(buf)
    if isinstance(value, list) and _has_lazy(value):
        return [_decoded(v, buf) for v in value]
    return value


class _Metadata(Mapping):
    """A GGUF file's metadata, key -> Python value, read-only: long arrays (a tokenizer's tokens and
    merges, or long arrays inside an array of arrays) are decoded from the file's map the first
    time their key is read, then kept."""

    def __init__(self, values: dict, buf):
        self._values, self._buf = values, buf
        self._lazy = {key for key, value in values.items() if _has_lazy(value)}  # keys not decoded yet

    def __getitem__(self, key):
        value = self._values[key]
        if key in self._lazy:
            value = self._values[key] = _decoded(value, self._buf)
            self._lazy.discard(key)
        return value

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"<GGUF metadata: {len(self)} keys>"


class _PrefixView(Mapping):
    """The keys of a mapping that start with ``prefix``, without it (values read through)."""

    def __init__(self, mapping: Mapping, prefix: str):
        self._mapping, self._prefix = mapping, prefix
        self._keys = [k[len(prefix):] for k in mapping if k.startswith(prefix)]

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._mapping[self._prefix + key]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def _gguf_package_version() -> str:
    """The installed gguf package's version, for messages ("unknown" when its metadata is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"


def _ggml_sizes(type_id: int):
    """(name, block_size, type_size) of a ggml type id known to the gguf package, or None."""
    if type_id in _GGML_SIZES:
        return _GGML_SIZES[type_id]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        return None
    if qtype not in GGML_QUANT_SIZES:
        return None
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return qtype.name, block_size, type_size


def _scan(buf, size: int, check_tensors: bool = True) -> tuple[int, list[_TensorEntry], dict]:
    """Checks the layout; returns (data section start, tensor entries, metadata: key -> value or
    _LazyArray). Raises _FileError.

    The header, the metadata and the tensor table (names, dimension counts, dimensions, type ids,
    offsets) are always read with bounds checks. With ``check_tensors`` the tensors themselves are
    checked too: a ggml type known to the gguf package, rows a whole number of blocks, aligned
    offsets, data inside the file and not overlapping. A metadata-only read leaves that out, so a
    tensor of a ggml type newer than the installed gguf package does not hide the metadata."""
    s = _Scanner(buf, size)
    if size < 4 or bytes(buf[:4]) != _GGUF_MAGIC:
        head = bytes(buf[:min(size, 4)])
        raise _FileError(f"not a GGUF file: it starts with {head!r}, expected the magic {_GGUF_MAGIC!r}")
    s.pos = 4
    version = s.unpack("<I", "the version")
    if version & 0xFFFF == 0 and version != 0:
        raise _FileError("big-endian GGUF files are not supported")
    if version not in _GGUF_VERSIONS:
        raise _FileError(f"unsupported GGUF version {version} (supported: {list(_GGUF_VERSIONS)})")
    tensor_count, kv_count = s.unpack("<QQ", "the tensor and metadata counts")
    if kv_count * 13 > size - s.pos:  # the smallest entry: 8-byte key length, 1-byte key, type, 1 byte
        raise _FileError(f"truncated or corrupt GGUF header: {kv_count} metadata entries cannot fit in a {size}-byte file")
    if tensor_count * 29 > size - s.pos:  # 8 + 1 (name) + 4 + 8 (one dim) + 4 + 8
        raise _FileError(f"truncated or corrupt GGUF header: {tensor_count} tensors cannot fit in a {size}-byte file")
    alignment = _DEFAULT_ALIGNMENT
    keys = set()
    metadata = {}
    for i in range(kv_count):
        key = s.string(f"the key of metadata entry {i}")
        if key in keys:
            raise _FileError(f"corrupt GGUF header: metadata key {key!r} appears twice")
        keys.add(key)
        value_type = s.unpack("<I", f"the value type of metadata key {key!r}")
        value = metadata[key] = s.value(value_type, f"metadata key {key!r}")
        if key == "general.alignment":
            if value_type != _UINT32 or value == 0 or value & (value - 1):
                raise _FileError(f"corrupt GGUF header: general.alignment must be a power-of-two uint32, "
                                 f"got {value!r} (value type {value_type})")
            alignment = value
    entries, names = [], set()
    for i in range(tensor_count):
        name = s.string(f"the name of tensor {i}")
        if name in names:
            raise _FileError(f"corrupt GGUF header: tensor {name!r} appears twice")
        names.add(name)
        n_dims = s.unpack("<I", f"the dimension count of tensor {name!r}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise _FileError(f"corrupt GGUF header: tensor {name!r} has {n_dims} dimensions (expected 1..{_MAX_DIMS})")
        dims = s.unpack(f"<{n_dims}Q", f"the dimensions of tensor {name!r}")
        dims = (dims,) if n_dims == 1 else tuple(dims)
        if any(d == 0 or d > 2**40 for d in dims):
            raise _FileError(f"corrupt GGUF header: tensor {name!r} has dimensions {list(dims)}")
        type_id, offset = s.unpack("<IQ", f"the type and offset of tensor {name!r}")
        entries.append(_TensorEntry(name, dims, type_id, offset))
    data_start = -(-s.pos // alignment) * alignment
    if not check_tensors:
        return data_start, entries, metadata
    spans = []
    for e in entries:
        sizes = _ggml_sizes(e.ggml_type)
        if sizes is None:  # a ggml type newer than the gguf package (or a damaged byte: no telling which)
            raise _FileError(f"tensor {e.name!r}: ggml type id {e.ggml_type} is unknown to the installed gguf "
                             f"package (version {_gguf_package_version()}); a newer gguf package may know it")
        type_name, block_size, type_size = sizes
        if e.dims[0] % block_size:
            raise _FileError(f"corrupt GGUF header: tensor {e.name!r} ({type_name}) has rows of {e.dims[0]} "
                             f"elements, not a multiple of its block size {block_size}")
        if e.offset % alignment:
            raise _FileError(f"corrupt GGUF header: tensor {e.name!r} starts at offset {e.offset}, "
                             f"not a multiple of the alignment {alignment}")
        n_bytes = int(np.prod(e.dims, dtype=object)) // block_size * type_size
        end = data_start + e.offset + n_bytes
        if end > size:
            raise _FileError(f"truncated GGUF file: tensor {e.name!r} needs bytes up to offset {end}, "
                             f"but the file ends at {size}")
        spans.append((e.offset, e.offset + n_bytes, e.name))
    spans.sort()
    for (_, end0, a), (begin1, _, b) in zip(spans, spans[1:]):
        if begin1 < end0:
            raise _FileError(f"corrupt GGUF header: the data of tensors {a!r} and {b!r} overlap")
    return data_start, entries, metadata


# --------------------------------------------------------------------------------------------------
# llama.cpp names -> Hugging Face names, and the RoPE row permutation
# --------------------------------------------------------------------------------------------------
# GGUF leaf name inside ``blk.{i}.`` -> Hugging Face name inside ``model.layers.{i}.``
_LLAMA_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LLAMA_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


#: The most rows :func:`rope_row_permutation` indexes (its result: 8 bytes a row).
_MAX_ROPE_ROWS = 2**32


def rope_row_permutation(num_heads: int, head_dim: int) -> np.ndarray:
    """Row indices that undo llama.cpp's query/key permutation: ``hf_rows = gguf_rows[perm]``.

    Hugging Face's Llama applies RoPE in the "rotate half" layout: inside each head of ``head_dim``
    output rows, row ``i`` is rotated together with row ``i + head_dim/2``. ggml's rotary kernel
    (its "normal" mode) rotates adjacent pairs ``(2i, 2i+1)`` instead, so llama.cpp's converter
    reorders each head's rows from ``[0, 1, .., d/2-1 | d/2, .., d-1]`` to ``[0, d/2, 1, d/2+1, ..]``
    (its ``permute``: reshape ``(heads, 2, d/2, ...)``, swap axes 1 and 2). The inverse, read off the
    GGUF rows as ``(heads, d/2, 2)`` and swapping the last two axes, is this index: GGUF row
    ``h*d + 2i + j`` is Hugging Face row ``h*d + j*d/2 + i``. It only moves whole rows, so it applies
    to quantized rows (blocks run along a row) as well as to dequantized ones.

    Args:
        num_heads: heads of the projection (``num_attention_heads`` for q, ``num_key_value_heads``
            for k).
        head_dim: rows per head (even).

    Returns:
        ``(num_heads * head_dim,)`` int64.

    Raises:
        TypeError: ``num_heads`` or ``head_dim`` not an int (a bool or a float included).
        ValueError: ``head_dim`` odd or below 2, ``num_heads`` below 1, more than ``2**32``
            rows in all (``num_heads * head_dim``: no projection has as many), or a result (8 bytes
            a row) larger than this machine's memory.
    """
    num_heads = check_int(num_heads, "num_heads", 1, _MAX_ROPE_ROWS)
    head_dim = check_int(head_dim, "head_dim", 2, _MAX_ROPE_ROWS)
    if head_dim % 2:
        raise ValueError(f"head_dim: expected an even int (RoPE rotates pairs of rows), got {head_dim}")
    if num_heads * head_dim > _MAX_ROPE_ROWS:
        raise ValueError(f"num_heads, head_dim: expected at most {_MAX_ROPE_ROWS} rows in all (num_heads * head_dim), "
                         f"got {num_heads} * {head_dim} = {num_heads * head_dim}")
    half = head_dim // 2
    check_allocatable((num_heads * head_dim,), 8, "num_heads, head_dim")  # the result (the other arrays: H + d/2)
    # perm[h, j, i] = h·head_dim + 2i + j: each head's even rows, then its odd rows
    perm = np.empty((num_heads, 2, half), np.int64)
    starts, evens = np.arange(num_heads, dtype=np.int64) * head_dim, 2 * np.arange(half, dtype=np.int64)
    np.add.outer(starts, evens, out=perm[:, 0, :])
    np.add.outer(starts + 1, evens, out=perm[:, 1, :])  # not perm[:, 0] + 1: numpy would copy the overlapping view
    return perm.reshape(-1)


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF checkpoint as stored, under its Hugging Face name.

    Attributes:
        name: the Hugging Face ``LlamaForCausalLM`` state_dict name.
        gguf_name: llama.cpp's name (``blk.0.attn_q.weight``).
        ggml_type: the storage type's name (``"Q4_1"``, ``"Q8_0"``, ``"F32"``, ...).
        ggml_type_id: its ggml type id (3 for Q4_1).
        shape: the logical shape in torch order, ``(out_features, in_features)`` for a projection,
            ``(vocab_size, hidden_size)`` for the embedding, ``(hidden_size,)`` for a norm.
        block_size: weights per block along the last dim (32 for Q4_0/Q4_1/Q8_0, 1 for floats).
        block_bytes: bytes per block (Q4_0: 18, Q4_1: 20, Q8_0: 34, F32: 4, F16/BF16: 2).
        raw: the stored bytes, a read-only zero-copy view of the memory-mapped file, uint8 of shape
            ``shape[:-1] + (shape[-1] // block_size * block_bytes,)``: one row of blocks per output
            row, in the file's row order. It keeps the map alive: truncating or overwriting the file
            in place while it lives ends the process with SIGBUS when it is read (see the module doc).
        file_offset: where ``raw`` starts in the file (bytes from its beginning; a multiple of the
            file's alignment, 32 by default).
        row_permutation: for the query/key projections, the ``(shape[0],)`` int64 index with
            ``hf_rows = raw_rows[row_permutation]`` (see :func:`rope_row_permutation`), where
            ``raw_rows = raw.reshape(shape[0], -1)``: for a weight, its rows of blocks; for a bias
            (1-D, ``attention_bias=True``), each value's bytes (4 for F32: a bias's rows are single
            values). ``None`` for every other tensor (its rows are already in Hugging Face order).
    """

    name: str
    gguf_name: str
    ggml_type: str
    ggml_type_id: int
    shape: tuple
    block_size: int
    block_bytes: int
    raw: np.ndarray
    file_offset: int
    row_permutation: np.ndarray | None

    @property
    def row_bytes(self) -> int:
        """Bytes per row of ``raw``."""
        return self.shape[-1] // self.block_size * self.block_bytes

    def raw_hf_rows(self) -> np.ndarray:
        """``raw`` with its rows in Hugging Face order: uint8 of ``raw.shape``, a new array for the
        query/key projections (weights and biases), the zero-copy view ``raw`` for every other tensor.

        The rows moved are ``raw.reshape(shape[0], -1)``'s (see ``row_permutation``), so the bytes of
        a row, or of one value of a 1-D bias, stay together: ``raw_hf_rows().view("<f4")`` of an F32
        query bias is Hugging Face's bias.

        Raises:
            ValueError: a 1-D query/key tensor stored in blocks of several values (Q4_0, Q4_1, Q8_0;
                llama.cpp stores biases as F32): its rows are single values inside the blocks, which
                cannot be moved as bytes (:meth:`GGUFCheckpoint.tensor` dequantizes and reorders it).
        """
        if self.row_permutation is None:
            return self.raw
        rows = self.shape[0]
        if len(self.shape) == 1 and self.block_size != 1:
            raise ValueError(f"{self.name} ({self.gguf_name}): a 1-D {self.ggml_type} tensor with a row permutation: "
                             f"its {rows} rows are single values inside blocks of {self.block_size}, which cannot "
                             f"be reordered as raw bytes; use GGUFCheckpoint.tensor() for its values")
        by_row = self.raw.reshape(rows, -1)  # one row of bytes per Hugging Face row (a bias: per value)
        return by_row[self.row_permutation].reshape(self.raw.shape)


# --------------------------------------------------------------------------------------------------
# The checkpoint
# --------------------------------------------------------------------------------------------------
class GGUFCheckpoint:
    """A validated GGUF checkpoint of a Llama-architecture model: metadata, a Hugging Face config,
    the tokenizer metadata, the chat template and the tensors under Hugging Face names.

    Opening it reads the header and maps the file; tensors are dequantized only when asked for
    (:meth:`tensor`, :meth:`state_dict`). Everything in the header (magic, version, bounds,
    metadata, the architecture, every tensor's name, shape and type) is checked when opening. The
    blocks' fp16 scales, which lie all through the tensor data, are checked when a tensor is read
    (:meth:`tensor`; ``LlamaForCausalLM.from_pretrained``, by ``set_gguf_weights``, for a model
    built on the blocks): a NaN or inf scale is a ValueError naming the tensor and the block, and
    opening stays a read of the header only.

    The file stays memory-mapped while the checkpoint (or a raw view, or a model using its blocks)
    lives: truncating or overwriting it in place meanwhile ends the process with SIGBUS, as it does
    llama.cpp's (replacing it by a rename is safe; see the module doc).

    Use :func:`read_gguf` to open one.

    Attributes:
        path: the file.
        architecture: ``general.architecture`` (``"llama"``).
        metadata: a read-only mapping, every metadata key -> Python value (str, int, float, bool or
            list); the header's version/counts are not included. Long arrays (the tokenizer's) are
            decoded the first time they are read.
        config: a Hugging Face ``LlamaConfig``-style dict: ``architectures``, ``model_type``
            ("llama"), ``vocab_size``, ``hidden_size``, ``intermediate_size``,
            ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
            ``max_position_embeddings``, ``rms_norm_eps`` (the file's float32 value, as a float),
            ``rope_theta``, ``rope_scaling`` (None), ``hidden_act`` ("silu"), ``attention_bias``,
            ``attention_dropout`` (0.0), ``mlp_bias``, ``tie_word_embeddings`` (True when the file
            has no ``output.weight``), ``bos_token_id``, ``eos_token_id``, ``pad_token_id``.
        chat_template: ``tokenizer.chat_template`` (a Jinja2 string) or ``None``.
        tokenizer_metadata: a read-only mapping of the ``tokenizer.ggml.*`` keys with that prefix
            removed (``tokens``, ``merges``, ``token_type``, ``model``, ``pre``, ``bos_token_id``, ...).
    """

    def __init__(self, path, _map, metadata: Mapping, infos: dict, config: dict):
        self.path = Path(path)
        self._map = _map
        self.metadata = metadata
        self.architecture = metadata["general.architecture"]
        self._infos = infos
        self.config = config
        self.chat_template = metadata.get("tokenizer.chat_template")
        self.tokenizer_metadata = _PrefixView(metadata, "tokenizer.ggml.")

    def __repr__(self) -> str:
        return (f"GGUFCheckpoint({str(self.path)!r}, architecture={self.architecture!r}, "
                f"tensors={len(self._infos)}, types={sorted({i.ggml_type for i in self._infos.values()})})")

    @property
    def tensor_names(self) -> list[str]:
        """Hugging Face names of every tensor, in file order (``lm_head.weight`` only if untied)."""
        return list(self._infos)

    def tensor_info(self, name: str) -> GGUFTensorInfo:
        """The stored form of tensor ``name`` (Hugging Face name): type, shape, raw blocks.

        Raises:
            TypeError: ``name`` not a str. KeyError: no such tensor (the message lists the names).
        """
        if not isinstance(name, str):
            raise TypeError(f"name: expected a str, got {type(name).__name__}")
        if name not in self._infos:
            raise KeyError(f"name: no tensor {name!r} in {self.path} (tensors: {self.tensor_names})")
        return self._infos[name]

    def tensor(self, name: str, dtype=np.float32) -> np.ndarray:
        """Tensor ``name`` dequantized to ``dtype``, rows in Hugging Face order.

        Dequantization is the ``gguf`` package's (``gguf.quants.dequantize``: ``scale * code`` for
        Q4_0/Q8_0, ``scale * code + min`` for Q4_1, computed in float32); F16 and BF16 are widened
        exactly (without the gguf package); float64 is the exact widening of the float32 result.

        Args:
            name: a Hugging Face name (see :attr:`tensor_names`).
            dtype: ``np.float32`` (default) or ``np.float64``.

        Returns:
            A new, writable C-contiguous array of ``tensor_info(name).shape``.

        Raises:
            KeyError: no such tensor. TypeError: ``name`` not a str, ``dtype`` not float32/float64.
            ValueError: a block with a NaN or inf fp16 scale (``d``, or Q4_1's ``m``), naming the file,
                the tensor and the block, checked before anything is dequantized.
        """
        dtype = resolve_dtype(dtype)
        info = self.tensor_info(name)
        self._check_scales(info)
        return self._dequantized(info, dtype)

    def _dequantized(self, info: GGUFTensorInfo, dtype) -> np.ndarray:
        """:meth:`tensor` of ``info``, its scales already checked."""
        if info.ggml_type == "F32":
            values = info.raw.view("<f4")
        elif info.ggml_type == "F16":
            values = info.raw.view("<f2").astype(np.float32)
        elif info.ggml_type == "BF16":  # the top half of a float32
            values = (info.raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize

            values = dequantize(info.raw, GGMLQuantizationType(info.ggml_type_id))
        values = np.asarray(values, dtype=np.float32).reshape(info.shape)
        if info.row_permutation is not None:
            values = values[info.row_permutation]
        return np.array(values, dtype=dtype, order="C", copy=True)

    def _check_scales(self, info: GGUFTensorInfo) -> None:
        """ValueError naming this file and the tensor when a block of ``info`` has a NaN or inf scale
        (:func:`_check_block_scales`; its row in the Hugging Face order the tensor is read in)."""
        _check_block_scales(info.raw, info.ggml_type, info.shape[-1],
                            f"{self.path}: tensor {info.gguf_name!r} ({info.name}, {info.ggml_type})",
                            info.row_permutation)

    def state_dict(self, dtype=np.float32) -> dict[str, np.ndarray]:
        """Every tensor, dequantized (see :meth:`tensor`), under Hugging Face ``LlamaForCausalLM``
        names: ``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
        ``model.layers.{i}.mlp.{gate,up,down}_proj.weight``,
        ``model.layers.{i}.{input,post_attention}_layernorm.weight``, ``model.norm.weight`` and
        ``lm_head.weight`` only when the file has its own output matrix (``tie_word_embeddings`` is
        False).

        Raises:
            TypeError: ``dtype`` not float32/float64.
            ValueError: a block with a NaN or inf fp16 scale (as :meth:`tensor`), found before any
                tensor is dequantized.
        """
        dtype = resolve_dtype(dtype)
        infos = {name: self.tensor_info(name) for name in self._infos}
        for info in infos.values():  # every tensor's scales first: nothing dequantized for a bad file
            self._check_scales(info)
        return {name: self._dequantized(info, dtype) for name, info in infos.items()}

    def close(self) -> None:
        """Drops the checkpoint's reference to the memory map (raw views taken before, and metadata
        arrays not read yet, keep it alive while referenced)."""
        self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_gguf(path) -> GGUFCheckpoint:
    """Opens and validates a GGUF checkpoint of a Llama-architecture model.

    Metadata read: ``general.architecture``, ``general.alignment``, ``llama.block_count``,
    ``llama.embedding_length``, ``llama.feed_forward_length``, ``llama.attention.head_count``,
    ``llama.attention.head_count_kv``, ``llama.attention.layer_norm_rms_epsilon``,
    ``llama.context_length``, ``llama.rope.freq_base``, ``llama.rope.dimension_count``,
    ``llama.attention.key_length`` / ``value_length``, ``llama.vocab_size``, ``llama.rope.scaling.type``,
    ``llama.rope.scaling.factor`` / ``llama.rope.scale_linear``, ``llama.rope.scaling.attn_factor``,
    ``tokenizer.ggml.{bos,eos,padding,unknown}_token_id`` (each checked to be in the vocabulary; the
    unknown token's id is not part of the config), ``tokenizer.ggml.tokens`` (vocabulary size) and
    ``tokenizer.chat_template``.

    RoPE scaling is not computed, so it is refused, never ignored: a ``llama.rope.scaling.type`` other
    than "none", and, without a type (which llama.cpp reads as linear), a
    ``llama.rope.scaling.factor`` (or, where that key is absent, ``llama.rope.scale_linear``) other
    than 0 or 1 (both: no scaling). With the type "none" the factor is ignored, as llama.cpp does.
    A ``llama.rope.scaling.attn_factor`` other than 1 is refused too, whatever the type: llama.cpp
    multiplies the rotated queries and keys by it.

    The file is memory-mapped, not read: the checkpoint's tensors are views of the map (and so are
    the weights of a model built on its blocks), its long metadata arrays are decoded from the map
    when first read. While any of them is alive, do not truncate or overwrite the file in place:
    reading a page cut off the file ends the process with SIGBUS (no exception; llama.cpp behaves
    the same), and rewritten pages change the weights silently. Replace the file by a rename
    (``os.replace``, ``mv``) instead, which is safe.

    Only the header is read: the blocks' fp16 scales, spread through the tensor data, are checked
    when a tensor is read (a NaN or inf scale: see :meth:`GGUFCheckpoint.tensor`).

    Args:
        path: a ``.gguf`` file (str or path).

    Returns:
        A :class:`GGUFCheckpoint`.

    Raises:
        TypeError: ``path`` not a str or path.
        FileNotFoundError: no such file.
        ValueError: naming the file, if it is not a GGUF file (magic), is truncated, has a corrupt
            header or metadata, is of another architecture than llama (which one is said), holds a
            tensor of a ggml type id the installed ``gguf`` package does not know (said so, with the
            package's version) or of an unsupported ggml type (named; supported: F32, F16, BF16,
            Q4_0, Q4_1, Q8_0), misses tensors, has unknown ones or one of the wrong shape, has a
            config value out of range (naming the key: e.g. ``layer_norm_rms_epsilon`` /
            ``rope.freq_base`` not finite and > 0, a size or count (``context_length``,
            ``embedding_length``, ``block_count``, ``feed_forward_length``, ``attention.head_count``,
            ``attention.head_count_kv``, ``attention.key_length`` / ``value_length``,
            ``rope.dimension_count``, ``vocab_size``) outside [1, 2**63 - 1], a special token id outside
            the vocabulary, an odd ``attention.key_length``, a ``tokenizer.chat_template`` that is
            not a string), or has a config this loader does not support (RoPE scaling, partial
            rotary dims, biases on some projections only).
    """
    path, buf, metadata, data_start, entries = _open(path)
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path}: corrupt GGUF metadata: general.architecture missing or not a string "
                         f"(got {arch!r})")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    config = _llama_config(path, metadata, {e.name: e for e in entries})
    template = metadata.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        got = f"an array of {len(template)} values" if isinstance(template, list) else \
            described(template)
        raise ValueError(f"{path}: GGUF metadata tokenizer.chat_template: expected a string (a Jinja2 template), "
                         f"got {got}")
    infos = _llama_tensor_infos(path, config, entries, buf, data_start)
    return GGUFCheckpoint(path, buf, metadata, infos, config)


def read_gguf_metadata(path) -> Mapping:
    """The metadata of a GGUF file of any architecture (a read-only mapping, key -> Python value;
    arrays, nested ones included, as lists), after the checks of :func:`read_gguf` on the header
    and metadata (magic, version, bounds, value types).

    Only the metadata is checked, not the tensors: the tensor table after it is walked with bounds
    checks (names, dimension counts, dimensions), but the tensors' ggml type ids are not looked up
    and their sizes and data are not checked, so a file holding a tensor of a ggml type that the
    installed ``gguf`` package does not know yet, or whose tensor data is cut off, still gives its
    metadata. Nothing is read past the end of the file, and no size the file claims is allocated
    before it is checked against the file's size.

    Long arrays are decoded from a memory map of the file the first time their key is read: as for
    :func:`read_gguf`, truncating the file in place before then ends the process with SIGBUS.

    Raises:
        TypeError: ``path`` not a str or path. FileNotFoundError: no such file.
        ValueError: naming the file: not a GGUF file, truncated before the end of its tensor table,
            or a corrupt header, metadata or tensor table.
    """
    return _open(path, check_tensors=False)[2]


def _open(path, check_tensors: bool = True):
    """``(path, read-only memory map, metadata, data start, tensor entries)`` of a checked file
    (the tensors' types and data checked too with ``check_tensors``: see :func:`_scan`)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no GGUF file at {path}")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            if size == 0:
                raise _FileError("not a GGUF file: it is empty")
            # the scan reads the header through a map of its own, closed after it: the pages it
            # touched (the tokenizer's arrays) do not stay in this process
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as scan_buf:
                data_start, entries, values = _scan(scan_buf, size, check_tensors)
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # tensors and lazy metadata
    except _FileError as e:
        raise ValueError(f"{path}: {e}") from None
    return path, buf, _Metadata(values, buf), data_start, entries


def _get(path, metadata: dict, key: str, kind, default=None, *, required: bool = False):
    value = metadata.get(key, default)
    if value is None:
        if required:
            raise ValueError(f"{path}: GGUF metadata misses {key!r}")
        return None
    ok = (isinstance(value, int) and not isinstance(value, bool)) if kind is int else (
        isinstance(value, (int, float)) and not isinstance(value, bool)) if kind is float else isinstance(value, kind)
    if not ok:
        raise ValueError(f"{path}: GGUF metadata {key!r}: expected {kind.__name__}, got {value!r}")
    if kind is int and value < 0:
        raise ValueError(f"{path}: GGUF metadata {key!r}: expected a non-negative int, got {value}")
    return kind(value)


#: The largest size or count a GGUF key may give: a uint64 key can hold up to 2**64 - 1, but sizes are
#: int64 here (numpy shapes, the C++ core's config, torch).
_MAX_SIZE = 2**63 - 1


def _get_size(path, metadata: dict, key: str, default=None, *, required: bool = False) -> int | None:
    """:func:`_get` of an int key that is a size or a count (``llama.context_length``,
    ``llama.embedding_length``, ...): ValueError naming the file and the key unless it is in
    ``[1, 2**63 - 1]``."""
    value = _get(path, metadata, key, int, default, required=required)
    if value is not None and not 1 <= value <= _MAX_SIZE:
        raise ValueError(f"{path}: GGUF metadata {key!r}: expected an int in [1, 2**63 - 1], got {value}")
    return value


def _llama_config(path, md: dict, entries: dict) -> dict:
    """The Hugging Face ``LlamaConfig`` fields from llama.cpp's ``llama.*`` metadata keys."""
    a = "llama"
    hidden = _get_size(path, md, f"{a}.embedding_length", required=True)
    layers = _get_size(path, md, f"{a}.block_count", required=True)
    inter = _get_size(path, md, f"{a}.feed_forward_length", required=True)
    heads = _get_size(path, md, f"{a}.attention.head_count", required=True)
    kv_heads = _get_size(path, md, f"{a}.attention.head_count_kv", heads)
    if layers > len(entries):  # a layer has tensors; checked before any loop over the layers
        raise ValueError(f"{path}: GGUF metadata '{a}.block_count' = {layers}, but the file holds only "
                         f"{len(entries)} tensors")
    if heads % kv_heads:
        raise ValueError(f"{path}: GGUF metadata: attention.head_count {heads} is not a multiple of "
                         f"attention.head_count_kv {kv_heads}")
    head_dim = _get_size(path, md, f"{a}.attention.key_length")
    rope_dim = _get_size(path, md, f"{a}.rope.dimension_count")
    value_dim = _get_size(path, md, f"{a}.attention.value_length")
    key_length = head_dim
    if head_dim is None and hidden % heads == 0:  # llama.cpp's default: embedding_length / head_count
        head_dim = hidden // heads
    if head_dim is None or head_dim < 2 or head_dim % 2:
        raise ValueError(f"{path}: GGUF metadata: cannot find an even head_dim >= 2 (attention.key_length "
                         f"{'absent' if key_length is None else key_length}, rope.dimension_count {rope_dim}, "
                         f"embedding_length {hidden}, head_count {heads})")
    if rope_dim is not None and rope_dim != head_dim:
        raise ValueError(f"{path}: GGUF metadata: partial rotary embeddings (rope.dimension_count {rope_dim} "
                         f"!= head_dim {head_dim}) are not supported")
    if value_dim is not None and value_dim != head_dim:
        raise ValueError(f"{path}: GGUF metadata: attention.value_length {value_dim} != key_length {head_dim} "
                         f"is not supported")
    scaling = _get(path, md, f"{a}.rope.scaling.type", str, None)
    if scaling is not None and scaling != "none":
        raise ValueError(f"{path}: GGUF metadata: RoPE scaling {scaling!r} ({a}.rope.scaling.type) is not supported")
    if scaling is None:
        # llama.cpp reads a missing scaling type as linear, with the factor of rope.scaling.factor, or
        # of the older rope.scale_linear when that key is absent; a factor of 0 or 1 scales nothing.
        # (An explicit type "none" never scales, whatever the factor.)
        for key in (f"{a}.rope.scaling.factor", f"{a}.rope.scale_linear"):
            factor = _get(path, md, key, float, None)
            if factor is None:
                continue
            if factor not in (0, 1):
                raise ValueError(f"{path}: GGUF metadata {key!r}: linear RoPE scaling (factor {factor}) "
                                 f"is not supported: expected no factor, 0 or 1")
            break
    # llama.cpp multiplies the rotated queries and keys by rope.scaling.attn_factor (YaRN's mscale),
    # whatever the scaling type: a factor other than 1 changes every attention score
    attn_factor = _get(path, md, f"{a}.rope.scaling.attn_factor", float, None)
    if attn_factor is not None and attn_factor != 1:
        raise ValueError(f"{path}: GGUF metadata '{a}.rope.scaling.attn_factor': {attn_factor} is not supported "
                         f"(llama.cpp scales the rotated queries and keys by it): expected 1 or no such key")
    eps = _get(path, md, f"{a}.attention.layer_norm_rms_epsilon", float, required=True)
    theta = _get(path, md, f"{a}.rope.freq_base", float, 10000.0)
    for key, v in (("attention.layer_norm_rms_epsilon", eps), ("rope.freq_base", theta)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{path}: GGUF metadata '{a}.{key}': expected a finite number > 0, got {v}")
    context = _get_size(path, md, f"{a}.context_length", required=True)
    vocab = _get_size(path, md, f"{a}.vocab_size")
    if vocab is None:  # the tokenizer's vocabulary: its length, without decoding its strings
        tokens = md._values.get("tokenizer.ggml.tokens") if isinstance(md, _Metadata) else md.get("tokenizer.ggml.tokens")
        if isinstance(tokens, (list, _LazyArray)):
            vocab = tokens.count if isinstance(tokens, _LazyArray) else len(tokens)
    if vocab is None and "token_embd.weight" in entries:
        vocab = entries["token_embd.weight"].dims[-1]
    if not vocab:
        raise ValueError(f"{path}: GGUF metadata: cannot find the vocabulary size")

    def has_bias(leaf: str) -> bool:
        """Whether every layer has ``blk.i.<leaf>.bias`` (ValueError when only some do)."""
        present = [f"blk.{i}.{leaf}.bias" in entries for i in range(layers)]
        if any(present) and not all(present):
            raise ValueError(f"{path}: {leaf}.bias is present in some layers only")
        return all(present)

    attn_bias = [has_bias(leaf) for leaf in ("attn_q", "attn_k", "attn_v", "attn_output")]
    mlp_bias = [has_bias(leaf) for leaf in ("ffn_gate", "ffn_up", "ffn_down")]
    if len(set(attn_bias)) > 1 or len(set(mlp_bias)) > 1:
        raise ValueError(f"{path}: biases on some projections only (attention {attn_bias}, mlp {mlp_bias}) are "
                         f"not supported: Llama's attention_bias/mlp_bias cover all of them")
    token_ids = {}
    for hf, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("pad_token_id", "padding_token_id"), (None, "unknown_token_id")):
        token_id = _get(path, md, f"tokenizer.ggml.{key}", int, None)
        if token_id is not None and token_id >= vocab:
            raise ValueError(f"{path}: GGUF metadata tokenizer.ggml.{key} = {token_id} is outside the "
                             f"vocabulary of {vocab}")
        if hf is not None:  # LlamaConfig has no unknown token: it is checked only
            token_ids[hf] = token_id
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": context,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": attn_bias[0],
        "attention_dropout": 0.0,
        "mlp_bias": mlp_bias[0],
        "tie_word_embeddings": "output.weight" not in entries,
        **token_ids,
    }


def _llama_expected(config: dict) -> dict:
    """GGUF name -> (Hugging Face name, torch-order shape, RoPE heads or None) of every tensor."""
    h, v, inter = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    out = {"token_embd.weight": ("model.embed_tokens.weight", (v, h), None),
           "output_norm.weight": ("model.norm.weight", (h,), None)}
    if not config["tie_word_embeddings"]:
        out["output.weight"] = ("lm_head.weight", (v, h), None)
    shapes = {"attn_norm": (h,), "attn_q": (q_rows, h), "attn_k": (kv_rows, h), "attn_v": (kv_rows, h),
              "attn_output": (h, q_rows), "ffn_norm": (h,), "ffn_gate": (inter, h), "ffn_up": (inter, h),
              "ffn_down": (h, inter)}
    rope = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for i in range(config["num_hidden_layers"]):
        for leaf, hf in _LLAMA_LAYER_NAMES.items():
            out[f"blk.{i}.{leaf}.weight"] = (f"model.layers.{i}.{hf}.weight", shapes[leaf], rope.get(leaf))
            bias = (leaf.startswith("attn_") and leaf != "attn_norm" and config["attention_bias"]) or (
                leaf.startswith("ffn_") and leaf != "ffn_norm" and config["mlp_bias"])
            if bias:
                out[f"blk.{i}.{leaf}.bias"] = (f"model.layers.{i}.{hf}.bias", shapes[leaf][:1], rope.get(leaf))
    return out


def _llama_tensor_infos(path, config: dict, entries: list, buf, data_start: int) -> dict:
    expected = _llama_expected(config)
    names = [e.name for e in entries]
    present = set(names)
    missing = [n for n in expected if n not in present]
    unknown = [n for n in names if n not in expected]
    problems = []
    if missing:
        problems.append(f"missing tensors {missing[:10]}{' ...' if len(missing) > 10 else ''} ({len(missing)})")
    if unknown:
        problems.append(f"unknown tensors {unknown[:10]}{' ...' if len(unknown) > 10 else ''} ({len(unknown)})")
    unsupported, misshaped = [], []
    for e in entries:
        if e.name not in expected:
            continue
        shape = tuple(reversed(e.dims))
        if shape != expected[e.name][1]:
            misshaped.append(f"{e.name}: expected {expected[e.name][1]}, got {shape}")
        type_name = _ggml_sizes(e.ggml_type)[0]
        if type_name not in SUPPORTED_GGML_TYPES:
            unsupported.append(f"{e.name} is {type_name}")
    if misshaped:
        problems.append("tensors of the wrong shape (torch order): " + "; ".join(misshaped[:10]))
    if unsupported:
        problems.append(f"unsupported ggml types ({'; '.join(unsupported[:10])}"
                        f"{' ...' if len(unsupported) > 10 else ''}; supported: {', '.join(SUPPORTED_GGML_TYPES)})")
    if problems:
        raise ValueError(f"{path}: cannot load this GGUF as a Llama model: " + "; ".join(problems))
    infos = {}
    perms = {}
    for e in entries:
        hf_name, shape, rope_heads = expected[e.name]
        type_name, block_size, type_size = _ggml_sizes(e.ggml_type)
        # a read-only view of the map (its base is the mmap itself)
        raw = np.ndarray((*shape[:-1], shape[-1] // block_size * type_size), np.uint8, buffer=buf,
                         offset=data_start + e.offset)
        perm = None
        if rope_heads is not None:
            key = (rope_heads, config["head_dim"])
            perm = perms.get(key)
            if perm is None:
                perm = perms[key] = rope_row_permutation(*key)
                perm.setflags(write=False)
        infos[hf_name] = GGUFTensorInfo(hf_name, e.name, type_name, e.ggml_type, shape, block_size, type_size,
                                        raw, data_start + e.offset, perm)
    return infos
