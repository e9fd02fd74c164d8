r"""Embedding a corpus: files of any size, written in chunks, resumable, searchable.

The pieces, in the order a run uses them:

* **Sources** (:func:`open_source`): the texts of a file, streamed in input order (never read into
  one list). Formats: ``text`` (one text per line; a line ends at ``\n``, ``\r\n`` or a lone
  ``\r``, as in Python's universal newlines, so a file of classic-Mac ``\r`` line ends is read line
  by line too; blank lines skipped; surrounding whitespace stripped), ``jsonl`` (one JSON object per line, the text in ``text_field``), ``csv`` (a header
  row, blank lines before it skipped, the text in the column ``text_field``, which the header must
  name once; JSONL and CSV lines end at ``\n`` or ``\r\n``, and a
  file of lone ``\r`` line ends is refused as such) and ``parquet`` (the string column ``text_field``,
  read in record batches with pyarrow). ``text_field`` defaults to ``"text"``. A record that
  cannot be read (invalid UTF-8, invalid JSON, a missing or non-string field) is an error naming
  its line (row) number, or is skipped with ``errors="skip"``. Ids are the positions of the texts
  kept, ``0 .. N-1``, in input order. A blank text (a JSONL field, a CSV or Parquet value: ``""``,
  ``"   "``) is such a bad record too, as text input skips blank lines and :func:`search` refuses
  such a query: it would embed to ``[CLS] [SEP]`` alone, the same vector for every one of them.
  Blank means nothing is left once whitespace and the characters that carry no text are removed:
  those BERT's normalizer drops (its ``clean_text`` and, after NFD, ``strip_accents``), the
  Unicode categories Cc, Cf, Co and Mn (control characters such as ``\x00``, format characters
  such as the zero-width space U+200B or a byte-order mark U+FEFF, private-use characters such as
  U+E000, combining marks such as U+0301 with no letter to combine with) and the replacement
  character U+FFFD (what a lossy decode leaves). Unassigned code points (Cn) are not blank (the
  tokenizer makes them ``[UNK]``), and a lone surrogate (Cs) is refused as invalid Unicode. The
  text kept is the value as stored (only text input strips it).
* **Chunks**: the texts cut into consecutive runs of ``chunk_size``; chunk ``i`` holds ids
  ``[i * chunk_size, (i + 1) * chunk_size)``. Memory is bounded by one chunk (its texts, its
  embeddings, one batch's activations), whatever the size of the input. A long text costs its own
  size, not more: only its first ``max_seq_length`` tokens are kept, and
  :meth:`SentenceEncoder.encode` gives a BERT-style tokenizer only a prefix of it, cut at a space,
  that yields those same tokens (bitwise the same embedding). A text with no such prefix (no space
  in it but near its end, e.g. a long line of Chinese or Japanese, or a base64 blob), or a tokenizer
  of another kind, is tokenized whole, as the tokenizers package does it: about 140 MB of memory
  per MB of that one text.
* **Outputs**: ``OUT.npy`` (one ``(N, dim)`` float32 array, its disk space reserved when it is
  created, each chunk's rows written with ``os.pwrite``, and the texts in ``OUT.npy.texts.jsonl``,
  one JSON string per line) or ``OUT.parquet`` (a directory
  dataset, one file per chunk, ``part-00000.parquet``, with columns ``id`` int64, ``text`` string
  and ``embedding`` fixed_size_list<float32>[dim]). Until every chunk is done the data lives at
  ``OUT.npy.partial`` / ``OUT.parquet.partial``, so that nothing at ``OUT`` ever looks complete
  while it is not; the last step renames it to ``OUT``. The output is never the input: a path
  that is the input file (or a link to it, or a directory holding it) is refused before anything
  is removed.
* **Runs**: every run (a new one, and each resumption) draws a run id, recorded in the manifest
  (``"run"``) and, for Parquet, as a hidden marker file ``.run-<id>`` in ``OUT.parquet.partial``.
  A part is renamed into the dataset only through a handle on the directory that holds its run's
  marker (checked again just before the rename), so a writer of a run that was interrupted and
  replaced (a cancelled Dask task that was already running, a second process) can never put its
  rows into another run's output: it fails with ESTALE instead. Each part also records the run
  that wrote it (the Parquet key-value metadata ``transformer_core.run``), and the manifest the
  runs of its output (``"runs"``: the first and each resumption): a resumed run and the last step
  refuse a part of any other run (a ValueError naming it), so an output never mixes two runs'
  rows. The last step keeps only the parts of the manifest's chunks (anything else in the
  directory is removed) and the marker goes.
  A run holds an exclusive lock of its output (``flock`` on a hidden ``.OUT.npy.lock`` /
  ``.OUT.parquet.lock`` beside it) from its start to its end, in the process that records it
  (the client of a distributed run; its workers only write parts): a second run of the same
  output (another process, or another job in this one, even with ``--overwrite``) is refused
  with a ValueError instead of replacing the files or the manifest the first is writing; the
  kernel releases the lock of a killed process, so ``--resume`` then goes on. Where there are no
  locks (no ``fcntl``, a file system without ``flock``), a run that another replaced fails at its
  next write, commit or finish with ESTALE (the manifest records another run, the file at
  ``OUT.npy.partial`` is not the one it opened, the Parquet directory holds another run's
  marker), never marking the other's output complete; only there can a commit that passed its
  check just before another run started still save its manifest over the other's, and then the
  run ids of the parts make a later ``--resume`` refuse the mixture instead of accepting it.
* **The manifest** ``OUT.npy.manifest.json`` / ``OUT.parquet.manifest.json`` beside the output: the model's identity (name and a
  fingerprint of its config, tokenizer and whole weight file), dim, dtype, the input's identity
  (path, size, mtime, SHA-256 of the whole file (``"sha256"``) and of its first and last MiB, format,
  field, error mode, the rule for blank texts: ``"blank_rule"``), the chunk size
  and the chunks completed (as ``[first, stop)`` ranges, so that its size does not grow with the
  number of chunks). It is replaced atomically (temp file + ``os.replace``) after a chunk's
  data is on disk (``.npy``: the rows and the texts fsynced; ``.parquet``: the
  part written to a temp name, fsynced and renamed), so a kill at any moment never marks unwritten
  rows as done. ``resume=True`` (``--resume``) checks model and input against it (an input edited
  anywhere, even to the same size, is refused; a file only touched is not; a manifest of an
  earlier version, without ``"sha256"``, resumes only when the size, the first and last MiB and
  the mtime are the same; one without ``"blank_rule"``, whose rule kept texts this one skips, such
  as U+FFFD, only when the input counts as many texts now), then computes
  only the chunks not done; a chunk computed twice (a kill between its data and the manifest) is
  overwritten with the same rows, never appended. An input edited while a run reads it is refused
  too, before the run's last chunk and again before the output is marked complete
  (:meth:`EmbedJob.pending`: text, JSONL and CSV by the SHA-256 of the bytes read, every input by
  its size and mtime), so a complete output holds the texts of the file its manifest records.
* **Search** (:func:`search`): exact top-k by cosine similarity over the stored embeddings,
  block by block (memory-mapped ``.npy`` rows, or one Parquet part at a time). Every score is one
  fixed accumulation (:func:`transformer_core.functional.linear` with the queries, at most 32 at a
  time, as the rows: its streaming path computes each dot product the same way whatever the
  number of stored rows beside it), so scores and rankings are bitwise the same for any
  ``block_rows``, and for a ``.npy`` and a ``.parquet`` output of the same rows.
* **Bits**: an output holds ``SentenceEncoder.encode``'s rows for the chunk's texts, in batches of
  ``batch_size``; an embedding depends on the other texts of its batch by float rounding (a few
  1e-7 per element: the padding changes the order of some sums), so another
  ``batch_size`` or ``chunk_size`` (the chunks are cut into batches separately) changes the last
  bits. The same settings give the same bits, whether one process or a Dask cluster runs them.

The distributed version of the same job (the same chunks as Dask tasks, the same Parquet layout
and manifest) is :func:`transformer_core.distributed.embed_corpus`.

pyarrow is needed for Parquet input, Parquet output and searching a Parquet output (``pip install
transformer_core[parquet]``); text, JSONL, CSV and ``.npy`` need only numpy.
"""

from __future__ import annotations

import codecs
import copy
import csv
import ctypes
import dataclasses
import errno
import glob
import hashlib
import itertools
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
import unicodedata
import uuid
import warnings
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

try:
    import fcntl
except ImportError:  # Windows: runs are not locked (the checks of commit/finish and the parts' run ids remain)
    fcntl = None

from ._validation import (
    MAX_SIZE,
    _contiguous,
    check_bool,
    check_choice,
    check_int,
    check_optional_int,
    check_positive_int,
    described,
    physical_memory_bytes,
)
from .hub import DEFAULT_MODEL, JSON_ERRORS, _clip_path, json_problem, read_config, resolve_model_dir
from .tokenizer import check_unicode

__all__ = [
    "TextsMissingWarning",
    "PART_RUN_KEY",
    "INPUT_FORMATS",
    "DEFAULT_CHUNK_SIZE",
    "TextSource",
    "ListSource",
    "open_source",
    "model_identity",
    "EmbedJob",
    "EmbedResult",
    "embed_file",
    "embed_summary",
    "write_parquet_part",
    "Hit",
    "search",
    "read_manifest",
    "completed_chunks",
    "manifest_path",
]

#: Input formats, by name; ``open_source`` picks one from the file's extension when not given.
INPUT_FORMATS = ("text", "jsonl", "csv", "parquet")
#: Texts per chunk by default: a few MB of embeddings, a few seconds of work per chunk.
DEFAULT_CHUNK_SIZE = 1000
#: Manifest format tag and version. (The input's ``"sha256"``, the hash of the whole file, is an
#: optional field of version 1: a manifest without it, written before, is still read, and resumed
#: only when the input's mtime is the same as well; see the module docstring.)
MANIFEST_FORMAT = "transformer_core.embeddings"
MANIFEST_VERSION = 1
#: How :func:`model_identity` fingerprints a model, recorded beside the fingerprint (a manifest's
#: ``model.fingerprint_version``). 2: the SHA-256 of the whole weight file. A manifest without the
#: field was written by an earlier version, whose fingerprint hashed only the safetensors header and
#: the first and last MiB of the weights (a fine-tune changing only middle tensors kept it): it is
#: never taken for this version's, and a resumed run or a search with ``model=`` refuses it as such.
FINGERPRINT_VERSION = 2
#: The rule for blank texts (:func:`_blank_kind`) a file was read with, recorded in a manifest's
#: ``input.blank_rule``. 2: whitespace and every character BERT's normalizer drops (U+FFFD and
#: private-use characters among them). A manifest without the field was written by an earlier
#: version, whose rule (categories Cc, Cf and Mn only) kept the texts of U+FFFD or private-use
#: characters that this one skips: a resumed run counts its input again and refuses it, before
#: anything is embedded, when the count differs (the rows already made would not line up).
BLANK_RULE_VERSION = 2
#: The embeddings are stored as float32.
DTYPE = np.dtype(np.float32)

_EXTENSIONS = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
               ".parquet": "parquet", ".pq": "parquet"}
_SNIFF_BYTES = 8192          # bytes read to tell a binary file from text
_HASH_BYTES = 1 << 20        # bytes hashed at the head and the tail of the input
_MAX_SKIPPED_KEPT = 20       # skipped records listed in the manifest (the count is always kept)
_LONE_CR = re.compile(r"\r(?!\n)")  # a carriage return that is not the start of a \r\n line end
# The largest csv.field_size_limit: it takes a C long (32 bits on Windows, where sys.maxsize is not).
_CSV_FIELD_LIMIT = min(sys.maxsize, 2 ** (8 * ctypes.sizeof(ctypes.c_long) - 1) - 1)
_CSV_LIMIT_LOCK = threading.Lock()


# Characters that carry no text: those BERT's normalizer (the tokenizers package's BertNormalizer)
# drops, whitespace aside. clean_text drops U+0000, U+FFFD and its "other" characters: control (Cc:
# \x00, \x7f, ...), format (Cf: the zero-width space U+200B, the byte-order mark U+FEFF, ...) and
# private use (Co: U+E000, ...); not unassigned code points (Cn, made [UNK]); surrogates (Cs) cannot
# reach it (check_unicode refuses them). strip_accents (lowercasing models) drops nonspacing marks
# (Mn: U+0301, ...) after NFD. Checked on every code point with all-MiniLM-L6-v2's tokenizer: these
# are all it reduces to [CLS] [SEP], with U+1734, a nonspacing mark in its Unicode tables (Mc since
# Unicode 14). Marks and format characters newer than its tables (about 400, e.g. U+0898) it keeps as
# [UNK]; they count as blank here all the same.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Mn"})
_INVISIBLE_CHARS = frozenset("\ufffd\u1734")
_INVISIBLE = ("characters that carry no text (control, zero-width or format characters, combining marks, "
              "private-use characters, the replacement character U+FFFD)")


def _no_text(c: str) -> bool:
    """True when the character ``c`` is whitespace or carries no text (see ``_INVISIBLE_CATEGORIES``)."""
    return c.isspace() or c in _INVISIBLE_CHARS or unicodedata.category(c) in _INVISIBLE_CATEGORIES


def _blank_kind(text: str) -> str | None:
    """None when ``text`` has something to embed, else why it is blank: ``"empty"``,
    ``"whitespace"`` (only whitespace) or ``"invisible"`` (nothing left once whitespace, the
    Unicode categories Cc, Cf, Co and Mn and U+FFFD are removed: what BERT's normalizer drops).
    A blank text would embed to ``[CLS] [SEP]`` alone, the same vector for every one of them;
    every reader and :func:`search` use this one rule. Costs one look at the first visible
    character for ordinary text."""
    if not text:
        return "empty"
    stripped = text.strip()
    if not stripped:
        return "whitespace"
    # ordinary text: decided at its first character
    return None if any(not _no_text(c) for c in stripped) else "invisible"


def _blank_text_phrase(kind: str, noun: str) -> str:
    """``"an empty query"``, ``"an all-whitespace query"``, ``"a query of only invisible ..."``."""
    if kind == "invisible":
        return f"a {noun} of only {_INVISIBLE}"
    return f"{'an empty' if kind == 'empty' else 'an all-whitespace'} {noun}"


def _need_pyarrow(what: str):
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} needs pyarrow: pip install 'transformer_core[parquet]'") from None
    return pyarrow


# =========================================================================================== sources
class ListSource:
    """Texts given in memory (the CLI's positional sentences, or a list passed as ``input``), as a
    source.

    Args:
        texts: a list of str, kept as given (no stripping, nothing skipped).
        arg_name: what its errors name: ``"texts"`` (this argument, and the CLI's sentences), or
            the caller's own argument (``"input"`` for a list given to :func:`embed_file` and its kin).
        what: how messages describe the texts (:meth:`describe`); None: the CLI's
            ``"3 sentences given as arguments"``.

    Raises:
        TypeError: not a list of str. ValueError: a blank text (empty, or only whitespace and
        characters that carry no text: Unicode categories Cc, Cf, Co and Mn, U+FFFD), which would
        embed to ``[CLS] [SEP]`` alone: every file reader refuses such a record, and :func:`search`
        such a query), or a text that is not valid Unicode (a lone surrogate); its index (and position)
        named (as ``arg_name``), found here, before anything is written.
    """

    format = "list"
    path = None
    errors = "strict"

    def __init__(self, texts, arg_name: str = "texts", what: str | None = None):
        self.arg_name = arg_name
        self.what = what
        if isinstance(texts, str) or not hasattr(texts, "__iter__"):
            raise TypeError(f"{arg_name}: expected a list of str, got {type(texts).__name__}")
        self.texts = list(texts)
        for i, t in enumerate(self.texts):
            if not isinstance(t, str):
                raise TypeError(f"{arg_name}: expected a list of str, got {type(t).__name__} at index {i}")
            blank = _blank_kind(t)  # as a file reader's blank record and search's blank query
            if blank:
                raise ValueError(f"{arg_name}: expected some text, got {_blank_text_phrase(blank, 'text')} "
                                 f"at index {i}")
            check_unicode(t, arg_name, i)
        self.skipped: list[tuple[int, str]] = []
        self.num_skipped = 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts)

    def identity(self) -> dict:
        """What a resumed run compares: the number of texts and a hash of all of them."""
        h = hashlib.sha256()
        for t in self.texts:
            h.update(t.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        return {"format": "list", "count": len(self.texts), "sha256": h.hexdigest()}

    def describe(self) -> str:
        """What the texts are, for messages: ``what``, or the CLI's ``"3 sentences given as arguments"``."""
        return self.what if self.what is not None else f"{len(self.texts)} sentences given as arguments"


class TextSource:
    """The texts of one file, streamed in input order; see the module docstring for the formats.

    Use :func:`open_source` to make one (it checks its arguments). Iterating yields the texts
    (str); each pass starts from the beginning of the file and records the records it skipped in
    ``skipped`` (the first 20 ``(line, reason)`` pairs) and ``num_skipped``.
    """

    #: what an error about the file's content names: the argument of :func:`embed_file` and its
    #: kin, or the CLI's flag (``--file``)
    arg_name = "input"

    def __init__(self, path: Path, fmt: str, text_field: str | None, errors: str):
        self.path = path
        self.format = fmt
        self.text_field = text_field
        self.errors = errors
        self.skipped: list[tuple[int, str]] = []
        self.num_skipped = 0

    def describe(self) -> str:
        """What the texts are, for messages: the path, its format and the text field."""
        field = f", field {self.text_field!r}" if self.text_field else ""
        return f"{self.path} ({self.format}{field})"

    # ---------------------------------------------------------------------------------- identity
    def identity(self) -> dict:
        """Path, size, mtime, SHA-256 of the first and last MiB and of the whole file (``"sha256"``),
        and how the file is read: what a resumed run compares (all but path and mtime) to be sure
        it reads the same texts. The whole file is read once (about 0.6 s per GB of SHA-256, less
        than the pass that counts its records)."""
        st = self.path.stat()
        whole = hashlib.sha256()
        with open(self.path, "rb") as f:
            head = f.read(_HASH_BYTES)
            whole.update(head)
            for block in iter(lambda: f.read(_HASH_BYTES), b""):
                whole.update(block)
            f.seek(max(0, st.st_size - _HASH_BYTES))
            tail = hashlib.sha256(f.read(_HASH_BYTES)).hexdigest()
        identity = {"format": self.format, "path": str(self.path.resolve()), "text_field": self.text_field,
                    "errors": self.errors, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "head_sha256": hashlib.sha256(head).hexdigest(), "tail_sha256": tail, "sha256": whole.hexdigest()}
        if self.format == "text":  # lines end at \n, \r\n or a lone \r (earlier versions: \n only)
            identity["newlines"] = "universal"
        identity["blank_rule"] = BLANK_RULE_VERSION  # earlier versions: none, their rule kept more texts
        return identity

    def splits_inside_lines(self) -> bool:
        r"""Whether the file holds a ``\r`` followed by a character other than ``\r`` or ``\n``: a
        line end for the text reader since it splits lines as universal newlines, a character
        inside a line for the versions before (a run started by one of them reads other texts)."""
        lone = re.compile(rb"\r[^\r\n]")
        with open(self.path, "rb") as f:
            carry = b""
            for block in iter(lambda: f.read(_HASH_BYTES), b""):
                data = carry + block
                if lone.search(data):
                    return True
                carry = data[-1:]  # a \r that ends the block meets its next byte in the next one
        return False

    # ---------------------------------------------------------------------------------- reading
    def _bad(self, where: str, reason: str) -> None:
        if self.errors == "strict":
            raise ValueError(f"{self.path}, {where}: {reason} (--errors skip / errors='skip' skips such records)")
        self.num_skipped += 1
        if len(self.skipped) < _MAX_SKIPPED_KEPT:
            self.skipped.append((where, reason))

    def __iter__(self) -> Iterator[str]:
        return self._iter()

    def _iter(self, hasher=None) -> Iterator[str]:
        """One pass over the texts, as iterating does; with ``hasher`` (a hashlib object:
        :meth:`EmbedJob.pending`), every byte this pass reads (text, JSONL and CSV input) is fed
        to it, in order. The hasher is this pass's alone: another pass over the same source, at
        the same time, feeds it nothing."""
        self.skipped, self.num_skipped = [], 0
        if self.format == "parquet":
            return self._iter_parquet()
        reader = {"text": self._iter_text, "jsonl": self._iter_jsonl, "csv": self._iter_csv}[self.format]
        return reader(hasher)

    def _lines(self, universal: bool = False, hasher=None) -> Iterator[tuple[int, bytes]]:
        r"""(line number, raw line) of the file, the UTF-8 byte-order mark dropped. A line ends at
        ``\n``; with ``universal`` (text input) at ``\n``, ``\r\n`` (one line end) or a lone ``\r``,
        as Python's universal newlines, and the line numbers count those lines. Streamed either way
        (a file of ``\r`` line ends is not read as one line); the bytes of a line are the file's.
        With ``hasher`` (a hashlib object, :meth:`_iter`), every byte read is fed to it, in order."""
        # latin-1 maps each byte to one character and back: newline="" splits on \n, \r\n and \r
        # (a \r\n across two reads included) and leaves the line ends in place
        with (open(self.path, encoding="latin-1", newline="") if universal else open(self.path, "rb")) as f:
            lines = (line.encode("latin-1") for line in f) if universal else f
            for lineno, raw in enumerate(lines, 1):
                if hasher is not None:
                    hasher.update(raw)
                if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8):]
                yield lineno, raw

    def _decode(self, lineno: int, raw: bytes) -> str | None:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self._bad(f"line {lineno}", f"invalid UTF-8 (byte {e.start + 1} of the line: {raw[e.start:e.start + 1]!r})")
            return None

    def _cr_line_ends(self) -> bool:
        r"""Whether the file's line ends are lone ``\r`` (classic Mac OS): a ``\r`` not followed by
        ``\n`` comes before the first ``\n`` (or, in a file with no ``\n``, anywhere, a ``\r``
        that ends the file included). JSONL and CSV input split lines at ``\n`` only, so such a
        file reads as one line; asked only once that line failed to parse. The first line's own
        ``\r\n`` is its line end, not a lone ``\r``, even when the block read ends between the two."""
        lone_cr = re.compile(rb"\r(?!\n)")
        with open(self.path, "rb") as f:
            carry = b""
            while True:
                block = f.read(_HASH_BYTES)
                data = carry + block
                newline = data.find(b"\n")
                if newline >= 0:  # the first line, its \n included (a \r\n there is not lone)
                    return lone_cr.search(data, 0, newline + 1) is not None
                if not block:     # the end of a file with no \n: a \r left at its end is lone
                    return lone_cr.search(data) is not None
                # a \r that ends the block may be the start of a \r\n: the next block decides
                if lone_cr.search(data, 0, len(data) - 1) is not None:
                    return True
                carry = data[-1:]

    def _cr_error(self) -> ValueError:
        r"""The error of a JSONL or CSV file whose line ends are lone ``\r`` (the whole file one line)."""
        return ValueError(f"{self.path}: its line ends are lone \\r (carriage returns, as classic Mac OS wrote "
                          f"them), which {self.format} input does not split lines at; convert them to \\n or "
                          f"\\r\\n")

    def _iter_text(self, hasher=None) -> Iterator[str]:
        for lineno, raw in self._lines(universal=True, hasher=hasher):
            line = self._decode(lineno, raw)
            if line is not None:
                text = line.strip()
                if not _blank_kind(text):  # a blank line, or one of only invisible characters
                    yield text

    def _valid_text(self, where: str, value) -> bool:
        if not isinstance(value, str):
            self._bad(where, f"field {self.text_field!r} is {_json_type(value)}, expected a string")
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            self._bad(where, f"field {self.text_field!r} holds a lone surrogate (not valid Unicode text)")
            return False
        return self._not_blank(where, value, "field")

    def _not_blank(self, where: str, text: str, what: str) -> bool:
        """False (a bad record) for a blank text (:func:`_blank_kind`), as text input skips blank
        lines and :func:`search` refuses such a query."""
        blank = _blank_kind(text)
        if not blank:
            return True
        state = {"empty": "empty", "whitespace": "only whitespace", "invisible": f"only {_INVISIBLE}"}[blank]
        self._bad(where, f"{what} {self.text_field!r} is {state} (it would embed to [CLS] [SEP] alone)")
        return False

    def _iter_jsonl(self, hasher=None) -> Iterator[str]:
        field = self.text_field
        for lineno, raw in self._lines(hasher=hasher):
            line = self._decode(lineno, raw)
            if line is None or not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                if lineno == 1 and self._cr_line_ends():
                    raise self._cr_error() from None
                cr = "; the line holds a lone \\r, not a line end here (\\n or \\r\\n)" if _LONE_CR.search(line) else ""
                self._bad(f"line {lineno}", f"not valid JSON ({e.msg}, column {e.colno}){cr}")
                continue
            except RecursionError:
                self._bad(f"line {lineno}", "not valid JSON (nested too deeply)")
                continue
            except ValueError as e:  # e.g. an integer of more than 4,300 digits (Python's limit)
                self._bad(f"line {lineno}", f"not valid JSON ({e})")
                continue
            if not isinstance(obj, dict):
                self._bad(f"line {lineno}", f"expected a JSON object, got {_json_type(obj)}")
                continue
            if field not in obj:
                keys = ", ".join(repr(k) for k in list(obj)[:8])
                self._bad(f"line {lineno}", f"no field {field!r} (fields: {keys or 'none'}; --text-field picks one)")
                continue
            if self._valid_text(f"line {lineno}", obj[field]):
                yield obj[field]

    def _iter_csv(self, hasher=None) -> Iterator[str]:
        # Lines are decoded one by one (with surrogateescape, so that the CSV parser sees every line
        # and quoted multi-line fields stay intact); a field holding undecodable bytes is reported
        # with the line where its record ends.
        lines = (raw.decode("utf-8", "surrogateescape") for _, raw in self._lines(hasher=hasher))
        # strict: a quote left open (which would swallow every later record into one field) or text
        # after a closing quote is an error of that record, not a text
        reader = csv.reader(lines, strict=True)
        try:
            header = _next_csv_row(reader)
            while header == []:  # blank lines before the header: the header is the first record
                header = _next_csv_row(reader)
            if header is None:
                return
            field = self.text_field
            if field not in header:
                raise ValueError(f"{self.path}: no column {field!r} in the CSV header (columns: "
                                 f"{', '.join(repr(h) for h in header[:12])}); --text-field picks one")
            if header.count(field) > 1:  # as Parquet input: which of them holds the text is anyone's guess
                raise ValueError(f"{self.path}: column {field!r} appears {header.count(field)} times in the CSV "
                                 f"header (line {reader.line_num}); expected one")
            col = header.index(field)
            while True:
                start = reader.line_num + 1
                try:
                    row = _next_csv_row(reader)
                except csv.Error as e:
                    # strict: raises; skip: the next record
                    self._bad(f"line {start}", f"not valid CSV ({_csv_problem(e)})")
                    continue
                if row is None:
                    break
                where = f"line {reader.line_num}"
                if not row:
                    continue  # a blank line
                if col >= len(row):
                    self._bad(where, f"the record has {len(row)} fields, no value in column {field!r}")
                    continue
                text = row[col]
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    self._bad(where, f"invalid UTF-8 in column {field!r}")
                    continue
                if self._not_blank(where, text, "column"):
                    yield text
        except csv.Error as e:
            if reader.line_num <= 1 and self._cr_line_ends():
                raise self._cr_error() from None
            raise ValueError(f"{self.path}, line {reader.line_num}: not valid CSV ({_csv_problem(e)})") from None

    def _iter_parquet(self) -> Iterator[str]:
        pa = _need_pyarrow("Parquet input")
        import pyarrow.parquet as pq

        # Arrow's own local file, opened by the path's bytes, never the path string: pyarrow takes
        # a string for a URI, so a name such as "in-12:30.parquet" or "hdfs:/x" would be refused or
        # sent to another filesystem. (Not a Python file object either: see _read_part.)
        with pa.OSFile(os.fsencode(self.path)) as f:
            try:
                pf = pq.ParquetFile(f)
            except (pa.ArrowException, OSError) as e:
                raise ValueError(f"{self.path}: not a readable Parquet file ({e})") from None
            field = self.text_field
            schema = pf.schema_arrow
            if field not in schema.names:
                raise ValueError(f"{self.path}: no column {field!r} (columns: "
                                 f"{', '.join(repr(n) for n in schema.names[:12])}); --text-field picks one")
            if schema.names.count(field) > 1:
                raise ValueError(f"{self.path}: column {field!r} appears {schema.names.count(field)} times; expected one")
            ftype = schema.field(field).type
            # A dictionary-encoded column (a pandas categorical) is read through its dictionary.
            vtype = ftype.value_type if pa.types.is_dictionary(ftype) else ftype
            if not _is_text_type(pa, vtype):
                raise ValueError(f"{self.path}: column {field!r} has type {ftype}, expected a string column "
                                 f"(or a dictionary-encoded one)")
            row = 0
            for batch in _parquet_batches(pf, field, self.path, lambda: row):
                column = batch.column(0)
                if pa.types.is_dictionary(column.type):
                    column = column.dictionary_decode()
                # As bytes, decoded here: invalid UTF-8 is reported with its row, never passed on.
                for value in column.cast(pa.large_binary()).to_pylist():
                    row += 1
                    if value is None:
                        self._bad(f"row {row}", f"column {field!r} is null")
                        continue
                    try:
                        text = value.decode("utf-8")
                    except UnicodeDecodeError as e:
                        self._bad(f"row {row}", f"invalid UTF-8 in column {field!r} (byte {e.start + 1})")
                        continue
                    if self._not_blank(f"row {row}", text, "column"):
                        yield text


def _sha256_of_file(path: Path) -> str:
    """The SHA-256 of the whole file (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_HASH_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def _is_text_type(pa, t) -> bool:
    """Whether a Parquet column of Arrow type ``t`` holds text: string, large_string, string_view
    (pyarrow >= 16 writes it, its schema stored) or their binary forms (decoded as UTF-8 by row)."""
    checks = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary,
              getattr(pa.types, "is_string_view", None), getattr(pa.types, "is_binary_view", None))
    return any(check is not None and check(t) for check in checks)


def _parquet_batches(pf, field: str, path, rows_read):
    """``pf.iter_batches`` of one column, its read errors (a damaged page) a ValueError naming the
    file and the rows read so far."""
    import pyarrow as pa

    batches = pf.iter_batches(batch_size=4096, columns=[field])
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"{path}, after row {rows_read()}: not a readable Parquet file ({e})") from None
        if batch is None:
            return
        yield batch


def _csv_problem(error: Exception) -> str:
    r"""A ``csv.Error``'s message, its hint about universal-newline mode (about a lone ``\r`` in an
    unquoted field, where a file opened by the csv module's rules never has one) said plainly."""
    text = str(error)
    if text.startswith("new-line character seen in unquoted field"):
        return "a lone \\r in an unquoted field; a line ends at \\n or \\r\\n"
    return text


def _next_csv_row(reader) -> list[str] | None:
    """The next record of a ``csv.reader`` (None at the end), with no limit on a field's length.

    The csv module refuses a field longer than its ``field_size_limit`` (131072 characters by
    default), a setting of the whole process: a valid text may be longer. The limit is raised to
    the largest the module takes for the one record, under a lock, and put back before returning,
    so that no other code (another thread's reader, a caller's) sees it changed.
    """
    with _CSV_LIMIT_LOCK:
        previous = csv.field_size_limit(_CSV_FIELD_LIMIT)
        try:
            return next(reader, None)
        finally:
            csv.field_size_limit(previous)


def _json_type(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def open_source(path, input_format: str | None = None, text_field: str | None = None,
                errors: str = "strict") -> TextSource:
    """A file's texts as a :class:`TextSource` (streamed; see the module docstring).

    Args:
        path: the input file (a leading ``~`` is the home directory).
        input_format: one of ``INPUT_FORMATS``; None = from the extension (``.jsonl``/``.ndjson``,
            ``.csv``, ``.parquet``/``.pq``; anything else is text, one per line).
        text_field: the JSON field or column holding the text (jsonl, csv, parquet); default ``"text"``.
        errors: ``"strict"`` (a bad record is an error naming its line) or ``"skip"``.

    Raises:
        TypeError: ``path`` not a str or path. FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a directory. ValueError: ``path`` holding a NUL character,
        or naming something that is not a regular file (a pipe, a FIFO, a device: the input is read
        more than once); an unknown format or error mode, ``text_field`` for text input, or a
        text/JSONL/CSV file that is binary (a NUL byte in its first 8 KiB).
        The errors about the path name ``path``.
    """
    return _open_source(path, input_format, text_field, errors, "path")


def _open_source(path, input_format, text_field, errors, name: str, text_field_name: str = "text_field") -> TextSource:
    """:func:`open_source`, its errors about the path naming the argument ``name`` (``"input"``
    for :func:`embed_file` and ``embed_corpus``, ``"--file"`` for the CLI, whose sources then name
    it in their content's errors too) and those about ``text_field`` ``text_field_name``."""
    _check_path_type(path, name)
    if errors not in ("strict", "skip"):
        raise ValueError(f"errors: expected 'strict' or 'skip', got {errors!r}")
    p = _user_path(path, name)
    if input_format is None:
        input_format = _EXTENSIONS.get(p.suffix.lower(), "text")
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format: expected one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
    if input_format == "text":
        if text_field is not None:
            raise ValueError(f"{text_field_name}: only for jsonl, csv and parquet input; {p} is read as text, one "
                             "per line")
    elif text_field is None:
        text_field = "text"
    elif not isinstance(text_field, str) or not text_field:
        raise ValueError(f"{text_field_name}: expected a non-empty str, got {text_field!r}")
    if name == "--file" and os.fspath(path) == "-" and not p.exists():  # the usual name of standard input
        raise ValueError(f"{name}: - (standard input) is not a regular file; the input is read more than once "
                         f"(to check it, to resume): save it to a file first")
    if not p.exists():
        raise FileNotFoundError(f"{name}: {p}: no such file")
    if p.is_dir():
        raise IsADirectoryError(f"{name}: {p} is a directory, expected a file")
    if not stat.S_ISREG(p.stat().st_mode):  # a pipe, /dev/stdin, a FIFO: read once, it loses what was read
        raise ValueError(f"{name}: {p} is not a regular file (a pipe or a device); the input is read more than "
                         f"once (to check it, to resume): save it to a file first")
    if input_format != "parquet":
        with open(p, "rb") as f:
            head = f.read(_SNIFF_BYTES)
        nul = head.find(b"\0")
        if nul >= 0:
            raise ValueError(f"{name}: {p} looks like a binary file (a NUL byte at offset {nul}), expected UTF-8 "
                             f"text ({input_format}); a UTF-16 file must be converted to UTF-8 first")
    source = TextSource(p, input_format, text_field, errors)
    if name == "--file":  # the CLI's: its errors about the content name the flag too
        source.arg_name = name
    return source


def _check_path_type(value, name: str) -> None:
    """Refuses a path argument that is not a str or ``os.PathLike`` (None, a number), or that holds
    a NUL character (which no file name can: the OS call would fail with "embedded null byte",
    naming nothing), naming it.

    Raises:
        TypeError: not a str or path. ValueError: a NUL in it.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a str or os.PathLike, got {type(value).__name__}")
    path = os.fspath(value)
    if (b"\0" if isinstance(path, bytes) else "\0") in path:
        raise ValueError(f"{name}: expected a path, got {path!r}, which holds a NUL character (no file name can)")


def _user_path(path, name: str | None = None) -> Path:
    """``path`` as a Path, a leading ``~`` or ``~user`` expanded as :func:`os.path.expanduser` does
    (as ``--model`` is; the shell does not expand ``--out=~/x``). A ``~user`` with no such user
    stays as written. With ``name`` (the argument), a path too long for the file system is refused
    (:func:`_check_name_fits`)."""
    p = Path(os.path.expanduser(path))
    if name is not None:
        _check_name_fits(p, name)
    return p


def _check_name_fits(path: Path, name: str, longest: Path | None = None) -> None:
    """Refuses a path the file system cannot name (ENAMETOOLONG: a file name longer than its
    limit, usually 255 bytes, or a whole path longer than 4096), as the OS would refuse it at the
    first use but with the argument ``name`` and a shortened path in the message, not the whole
    name. ``longest``: the longest name a run makes from it (an output's temporary manifest), checked
    too. Any other outcome (the file exists or not) is left to the caller.

    Raises:
        ValueError: naming ``name`` and the path (cut to about 120 characters).
    """
    for p in (path,) if longest is None else (path, longest):
        try:
            os.stat(p)
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                continue
            how = "" if p is path else (f" once a run adds the suffixes of its own files (the longest, a temporary "
                                        f"manifest, is named with {len(os.fsencode(p.name))} bytes)")
            raise ValueError(f"{name}: {_clip_path(path)}: the name is too long for the file system{how} "
                             f"({os.strerror(e.errno)})") from None


def _chunks(texts: Iterable[str], chunk_size: int) -> Iterator[tuple[int, int, list[str]]]:
    """``(index, start, texts)`` of consecutive chunks of ``chunk_size`` texts (the last shorter)."""
    it = iter(texts)
    for index in itertools.count():
        chunk = list(itertools.islice(it, chunk_size))
        if not chunk:
            return
        yield index, index * chunk_size, chunk


# ===================================================================================== model identity
def model_identity(name_or_path=DEFAULT_MODEL, quantize: str | None = None) -> dict:
    """Name, width and a fingerprint of a model, read from its files without loading it.

    The fingerprint is a SHA-256 over ``config.json``, the tokenizer files and the SHA-256 of the
    whole weight file ``model.safetensors`` (read in 1 MiB blocks: about 0.5 s per GB), so two
    models that differ in architecture, tokenizer or any weight differ: a fine-tune of the same
    size and shapes (a merged LoRA update of a middle layer) included. ``quantize`` (``"int8"``:
    the encoder's linear layers int8, :func:`transformer_core.quantize`)
    enters the fingerprint too, so an output embedded in int8 is not resumed or searched in float32.
    So does a sentence-transformers folder's pooling (:func:`transformer_core.sentence_encoder.read_pooling`)
    when it is not all-MiniLM-L6-v2's mean pooling + Normalize (a folder without ``modules.json``
    counts as that: the rows' normalisation is the manifest's ``normalize``, not the model's),
    so a CLS-pooled output is not resumed or searched with a mean-pooled model; and a folder's
    default prompt (``config_sentence_transformers.json``'s ``default_prompt_name``, put before
    every text, and whether the pooling includes it), when it has a non-empty one.

    Two rules of sentence-transformers 6 changed some folders' embeddings without changing their
    files, so their fingerprints changed too (``fingerprint_version`` stays the same; every other
    model's fingerprint is what earlier versions computed): an empty default prompt with
    ``include_prompt`` false is no prompt ([CLS] pooled; earlier versions hashed it and left [CLS]
    out), and cls pooling with ``include_prompt`` false and a non-empty default prompt takes the
    first token after the prompt (earlier versions: [CLS]; a ``cls=after-prompt`` term is hashed).
    A resumed run or a search of an output made before with such a folder is refused, saying so.

    Earlier versions hashed only the safetensors header, the file's size and its first and last
    MiB (their manifests hold no ``"fingerprint_version"``): such a fingerprint never equals one
    of this version, and a run or search that compares them says so (``FINGERPRINT_VERSION``).

    Returns:
        ``{"name", "fingerprint", "fingerprint_version", "dim"}`` (``dim`` = ``config.json``'s
        ``hidden_size``; ``fingerprint_version`` = ``FINGERPRINT_VERSION``), and ``"quantize"``
        when given. ``name``: an existing path (a leading ``~`` expanded) as an absolute,
        resolved path (so a manifest's model is found from any working directory and by any
        user), else the embedded model's name.

    Raises:
        TypeError: ``quantize`` neither None nor a str. ValueError: ``quantize`` not one of
            :data:`transformer_core.quantization.QUANTIZED_FORMATS` (``"int8"``).
        FileNotFoundError: no such model, or no ``config.json`` / ``model.safetensors``.
        ValueError: ``config.json`` without ``hidden_size``, a weight file that is not safetensors
            (its header length impossible for its size), or a pooling setup
            :class:`SentenceEncoder` does not support.
    """
    from .sentence_encoder import read_pooling, read_prompts, transformer_folder

    _check_quantize(quantize)
    model_dir = resolve_model_dir(name_or_path)
    pooling = read_pooling(model_dir)
    # the model and tokenizer files, where SentenceEncoder reads them: the folder itself, or the
    # older sentence-transformers layout's 0_Transformer/ (modules.json's Transformer path)
    files = transformer_folder(model_dir)
    config = read_config(files)
    dim = config.get("hidden_size")
    if not isinstance(dim, int) or dim < 1:
        raise ValueError(f"config.json: expected an int hidden_size, got {dim!r} ({files})")
    h = hashlib.sha256()
    for fname in ("config.json", "tokenizer.json", "tokenizer_config.json", "sentence_bert_config.json",
                  "special_tokens_map.json"):
        f = files / fname
        if f.is_file():
            h.update(fname.encode() + b"\0" + f.read_bytes() + b"\0")
    weights = files / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"model.safetensors: not found in model directory {files}")
    whole = hashlib.sha256()
    with open(weights, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little")
        if len(head) < 8 or not 0 < n <= min(size - 8, 100 << 20):
            raise ValueError(f"model.safetensors: not a safetensors file (header length {n}, file size {size}) "
                             f"({files})")
        whole.update(head)
        for block in iter(lambda: f.read(_HASH_BYTES), b""):
            whole.update(block)
    h.update(b"model.safetensors sha256=" + whole.hexdigest().encode())
    if quantize is not None:
        h.update(b"quantize=" + quantize.encode())
    # A folder without modules.json (a plain Hugging Face folder: mean pooling, not normalised by
    # default) hashes as all-MiniLM-L6-v2's mean + Normalize, as it always has: an output's rows are
    # normalised as its manifest's "normalize" says, whatever the model's default.
    if pooling != {"pooling": "mean", "normalize": True} and (model_dir / "modules.json").is_file():
        h.update(f"pooling={pooling['pooling']};normalize={pooling['normalize']}".encode())
    prompts = read_prompts(model_dir)
    prompt = None if prompts["default_prompt_name"] is None else prompts["prompts"][prompts["default_prompt_name"]]
    include = prompts["include_prompt"]
    term = f"prompt={json.dumps(prompt)};include_prompt={include}".encode()
    # The fingerprint the versions before sentence-transformers 6's rules made of these files: an
    # empty default prompt hashed when include_prompt is false, no cls term (see _EARLIER_RULES).
    earlier = h.copy()
    if prompt is not None and (prompt or not include):
        earlier.update(term)
    # A default prompt changes the embeddings when it has tokens (an empty one is no prompt, as in
    # sentence-transformers 6: SentenceEncoder.encode).
    if prompt:
        h.update(term)
    # cls pooling with include_prompt false pools the first token after the prompt (earlier
    # versions: [CLS]), so such a folder's rows changed: only its fingerprint gets the term.
    if prompt and not include and pooling["pooling"] == "cls":
        h.update(b"cls=after-prompt")
    path = Path(os.path.expanduser(name_or_path))  # "~/dir" too (the shell leaves --model=~/dir as it is)
    name = str(path.resolve()) if path.exists() else str(name_or_path)
    out = {"name": name, "fingerprint": h.hexdigest()[:32], "fingerprint_version": FINGERPRINT_VERSION, "dim": dim}
    if quantize is not None:
        out["quantize"] = quantize
    if earlier.hexdigest()[:32] != out["fingerprint"]:
        if not prompt:
            why = ("its empty default prompt is no prompt now (as in sentence-transformers 6): [CLS] is pooled "
                   "with the text, no longer left out")
        else:
            why = ("its cls pooling without the prompt (include_prompt false) takes the first token after the "
                   "prompt now (as sentence-transformers 6), no longer [CLS]")
        _EARLIER_RULES[out["fingerprint"]] = (earlier.hexdigest()[:32], why)
    return out


#: The fingerprint the versions before sentence-transformers 6's rules computed (of the same
#: files, the same fingerprint version) and why this version embeds differently, by this version's
#: fingerprint, for the models whose embeddings those rules changed; filled by
#: :func:`model_identity`, read by :func:`_embedding_rule_change`.
_EARLIER_RULES: dict[str, tuple[str, str]] = {}


def _embedding_rule_change(model: dict, recorded: str) -> str | None:
    """Why this version embeds differently with the very files ``model`` (a :func:`model_identity`
    dict) was fingerprinted from, when ``recorded`` (a manifest's fingerprint) is the fingerprint an
    earlier version computed from them; else None (other files, or another model). A ``model``
    not made by :func:`model_identity` in this process is fingerprinted again (its name)."""
    if model["fingerprint"] not in _EARLIER_RULES:
        try:
            model_identity(model["name"], model.get("quantize"))
        except (OSError, ValueError, TypeError):
            return None
    earlier, why = _EARLIER_RULES.get(model["fingerprint"], (None, None))
    return why if earlier == recorded else None


def _fingerprint_kind(model: dict) -> str:
    """What a manifest's model fingerprint hashes, for messages (see ``FINGERPRINT_VERSION``)."""
    version = model.get("fingerprint_version", 1)
    if version == 1:
        return ("the fingerprint of an earlier version (of the weights' header and first and last MiB only, "
                "not the whole file)")
    return f"a fingerprint of version {version} (this version makes version {FINGERPRINT_VERSION})"


# ========================================================================================= manifest
def manifest_path(out) -> Path:
    """The manifest beside an output: the output's path with ``.manifest.json`` appended
    (``OUT.npy.manifest.json``, ``OUT.parquet.manifest.json``); a leading ``~`` is expanded.

    Raises:
        TypeError: ``out`` not a str or path. ValueError: a NUL character in it.
    """
    _check_path_type(out, "out")
    return Path(f"{_user_path(out)}.manifest.json")


def _partial_path(out) -> Path:
    return Path(f"{out}.partial")


def _texts_path(out) -> Path:
    return Path(f"{out}.texts.jsonl")


def _temp_name(path: Path, pid: int | None = None) -> Path:
    """A unique temporary name beside ``path``, hidden (leading dot: dataset readers skip it), with
    this process's id (``pid``: another, e.g. the longest one, to size the names a run makes)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid() if pid is None else pid}-{uuid.uuid4().hex[:8]}")


def _remove_temps(directory: Path, name: str) -> None:
    """Removes the temporaries of ``name`` that a killed process left in ``directory``."""
    for tmp in directory.glob(f".{glob.escape(name)}.tmp-*"):
        tmp.unlink(missing_ok=True)


def _atomic_write(path: Path, data: bytes, hint: str | None = None) -> None:
    """Writes ``data`` to ``path`` all or nothing: a temp file, fsynced, then ``os.replace``.

    Raises:
        OSError: the disk refused the write (``ENOSPC``, ...): the error of the OS, naming ``path``
        (not the temp file, which is removed; ``write`` and ``fsync`` name no file), with ``hint``
        (what to do about it) after its message.
    """
    tmp = _temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        strerror = e.strerror or str(e)
        raise OSError(e.errno, f"{strerror} ({hint})" if hint else strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_manifest(out) -> dict:
    """The manifest of an output (``OUT.npy.manifest.json`` / ``OUT.parquet.manifest.json``) as a dict, its structure checked.

    Raises:
        TypeError: ``out`` not a str or path.
        FileNotFoundError: no manifest. ValueError: not a manifest of this package, or a damaged
        one (the file and the first bad field are named): a field missing or of the wrong type,
        ``num_chunks`` that does not match ``num_rows`` and ``chunk_size``, ``completed`` ranges
        not sorted, overlapping, touching or outside ``[0, num_chunks]``, or ``complete`` with
        chunks not done.
    """
    _check_path_type(out, "out")
    path = manifest_path(out)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (not an output of `embed --out`, or never started)")
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except JSON_ERRORS as e:
        raise ValueError(f"{path}: not a valid manifest ({json_problem(e)})") from None
    if not isinstance(man, dict) or man.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: not a manifest of transformer_core embeddings")
    if man.get("version") != MANIFEST_VERSION:
        raise ValueError(f"{path}: manifest version {man.get('version')!r}, this version reads {MANIFEST_VERSION}")
    _check_manifest(man, path)
    return man


_MISSING = object()


def _is_int(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _are_ranges(value, num_chunks: int) -> bool:
    """Whether ``value`` is ``[[first, stop), ...]`` as :func:`_add_to_ranges` keeps them: sorted,
    disjoint and never touching (touching ones are merged), within ``[0, num_chunks]``."""
    if not isinstance(value, list):
        return False
    previous_stop = -1
    for r in value:
        if not (isinstance(r, list) and len(r) == 2 and _is_int(r[0], 0) and _is_int(r[1], 0)):
            return False
        if not previous_stop < r[0] < r[1] <= num_chunks:
            return False
        previous_stop = r[1]
    return True


def _check_manifest(man: dict, path: Path) -> None:
    """Checks every field that runs and searches read, once, so that a damaged or hand-edited
    manifest is one error naming the file and the field, not a KeyError or an IndexError later."""

    def field(obj: dict, name: str, expected: str, ok, prefix: str = ""):
        """``obj[name]`` if present and ``ok(value)``; else a ValueError naming the manifest file and
        the field (``prefix + name``) with ``expected`` and what it holds."""
        value = obj.get(name, _MISSING)
        if value is _MISSING:
            raise ValueError(f"{path}: a damaged manifest: no field {prefix + name!r} (expected {expected}); "
                             f"`embed --overwrite` starts over")
        if not ok(value):
            got = repr(value)
            got = got if len(got) <= 80 else got[:77] + "..."
            raise ValueError(f"{path}: a damaged manifest: {prefix + name}: expected {expected}, got {got}; "
                             f"`embed --overwrite` starts over")
        return value

    field(man, "kind", "'npy' or 'parquet'", lambda v: v in ("npy", "parquet"))
    field(man, "dtype", repr(DTYPE.name), lambda v: v == DTYPE.name)
    model = field(man, "model", "an object", lambda v: isinstance(v, dict))
    for name in ("name", "fingerprint"):
        field(model, name, "a str", lambda v: isinstance(v, str), "model.")
    field(model, "dim", "an int >= 1", lambda v: _is_int(v, 1), "model.")
    if "fingerprint_version" in model:  # absent: an earlier version's fingerprint (see FINGERPRINT_VERSION)
        field(model, "fingerprint_version", "an int >= 1", lambda v: _is_int(v, 1), "model.")
    if "quantize" in model:
        from .quantization import QUANTIZED_FORMATS

        field(model, "quantize", f"one of {', '.join(repr(f) for f in QUANTIZED_FORMATS)}",
              lambda v: v in QUANTIZED_FORMATS, "model.")
    field(man, "input", "an object", lambda v: isinstance(v, dict))
    rows = field(man, "num_rows", "an int >= 1", lambda v: _is_int(v, 1))
    size = field(man, "chunk_size", "an int >= 1", lambda v: _is_int(v, 1))
    chunks = -(-rows // size)
    field(man, "num_chunks", f"{chunks} (num_rows {rows} / chunk_size {size}, rounded up)",
          lambda v: _is_int(v, 1) and v == chunks)
    field(man, "part_width", "an int >= 1", lambda v: _is_int(v, 1))
    complete = field(man, "complete", "true or false", lambda v: isinstance(v, bool))
    field(man, "completed", f"sorted, disjoint, non-touching [first, stop) chunk ranges within [0, {chunks}] "
          f"(num_chunks)", lambda v: _are_ranges(v, chunks))
    if complete:
        field(man, "completed", f"[[0, {chunks}]] (every chunk: complete is true)", lambda v: v == [[0, chunks]])
    for name in ("texts_bytes", "num_skipped"):
        if name in man:
            field(man, name, "an int >= 0", lambda v: _is_int(v, 0))
    if "batch_size" in man:
        field(man, "batch_size", "an int >= 1", lambda v: _is_int(v, 1))
    if "run" in man:
        field(man, "run", "a run id (hex digits)", lambda v: isinstance(v, str) and v.isalnum() and len(v) <= 64)
    if "runs" in man:
        field(man, "runs", "a list of run ids (hex digits)",
              lambda v: isinstance(v, list) and all(isinstance(r, str) and r.isalnum() and len(r) <= 64 for r in v))
    if "normalize" in man:
        field(man, "normalize", "true or false", lambda v: isinstance(v, bool))
    if "skipped" in man:
        field(man, "skipped", "a list of [where, reason] pairs",
              lambda v: isinstance(v, list) and all(isinstance(x, list) and len(x) == 2 for x in v))


_SET_BYTES_PER_INDEX = 60  # a Python set of ints: its hash table (~2 slots of 16 bytes) and the ints (28)


def completed_chunks(manifest: dict) -> set[int]:
    """The chunk indices a manifest records as done (stored as ``[first, stop)`` ranges).

    Args:
        manifest: a manifest, as :func:`read_manifest` returns it (a dict whose ``"completed"`` is
            a list of sorted, disjoint, non-touching ``[first, stop)`` ranges of ints >= 0, as
            the runs keep them: ``[[0, 2], [2, 3]]`` is written ``[[0, 3]]``).

    Returns:
        The set of indices ``i`` with ``first <= i < stop`` for one of the ranges.

    Raises:
        TypeError: ``manifest`` not a dict. ValueError: ``manifest`` without ``"completed"``, or
            whose ``"completed"`` is not such a list of ranges (within ``num_chunks`` when the
            manifest has it), or holds more indices than this machine's memory takes as a set (all
            naming ``manifest``).
    """
    if not isinstance(manifest, dict):
        raise TypeError(f"manifest: expected a dict (as read_manifest returns), got {type(manifest).__name__}")
    ranges = manifest.get("completed", _MISSING)
    if ranges is _MISSING:
        raise ValueError(f"manifest: expected a dict with a 'completed' list of [first, stop) chunk ranges (as "
                         f"read_manifest returns), got one with the keys {sorted(map(str, manifest))}")
    chunks = manifest.get("num_chunks")
    bound = chunks if _is_int(chunks, 0) else MAX_SIZE  # within the manifest's chunks, when it says
    if not _are_ranges(ranges, bound):
        raise ValueError(f"manifest: expected 'completed' a list of sorted, disjoint, non-touching [first, stop) "
                         f"chunk ranges (ints, 0 <= first < stop <= {'num_chunks, ' if bound is chunks else ''}"
                         f"{bound}), got {described(ranges)}")
    count = sum(b - a for a, b in ranges)  # a set takes about 60 bytes an index (its table and the ints)
    if count * _SET_BYTES_PER_INDEX > physical_memory_bytes():
        raise ValueError(f"manifest: its completed ranges hold {count} chunk indices, a set of them more than this "
                         f"machine's memory ({physical_memory_bytes()} bytes)")
    return {i for a, b in ranges for i in range(a, b)}


def _num_completed(manifest: dict) -> int:
    return sum(b - a for a, b in manifest["completed"])


def _add_to_ranges(ranges: list, i: int) -> None:
    """Adds ``i`` to sorted, disjoint, non-adjacent ``[a, b)`` ranges, in place, merging neighbours."""
    k = 0
    while k < len(ranges) and ranges[k][1] < i:
        k += 1
    if k < len(ranges) and ranges[k][0] <= i < ranges[k][1]:
        return  # already there
    if k < len(ranges) and ranges[k][1] == i:       # extends ranges[k] to the right
        ranges[k][1] = i + 1
        if k + 1 < len(ranges) and ranges[k + 1][0] == i + 1:
            ranges[k][1] = ranges.pop(k + 1)[1]
    elif k < len(ranges) and ranges[k][0] == i + 1:  # extends ranges[k] to the left
        ranges[k][0] = i
    else:
        ranges.insert(k, [i, i + 1])


def _output_kind(out, name: str = "out") -> str:
    """``"npy"`` or ``"parquet"``, from the suffix of the output path ``out`` (the argument ``name``).

    Raises:
        TypeError: not a str or path. ValueError: another suffix; a path too long for the file
        system, or one that the suffixes of the run's own files make too long (:func:`_check_name_fits`).
    """
    _check_path_type(out, name)
    suffix = Path(out).suffix.lower()
    if suffix in (".npy", ".parquet"):
        path = _user_path(out)
        # sized with Linux's largest pid (2**22), so that a process of a longer pid also fits
        _check_name_fits(path, name, _temp_name(manifest_path(path), pid=2**22))
        return suffix[1:]
    if Path(out).name.lower() in (".npy", ".parquet"):  # a hidden name, no suffix: Path(".npy").suffix == ""
        raise ValueError(f"{name}: expected a file name before the extension (such as embeddings"
                         f"{Path(out).name.lower()}), got {_clip_path(out)}")
    raise ValueError(f"{name}: expected a path ending in .npy or .parquet, got {_clip_path(out)}")


def _part_name(index: int, width: int) -> str:
    return f"part-{index:0{width}d}.parquet"


def _run_marker(run: str) -> str:
    """The hidden file that marks a Parquet dataset directory as the data of run ``run``."""
    return f".run-{run}"


def _new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def _lock_path(out) -> Path:
    """The hidden lock file of an output's run, beside it: ``.OUT.npy.lock`` / ``.OUT.parquet.lock``."""
    out = Path(out)
    return out.with_name(f".{out.name}.lock")


def _held_by_another_run(out: Path) -> ValueError:
    return ValueError(f"out: another run holds {out} (it is writing it now: {_lock_path(out)} is locked); wait "
                      f"for it to end or stop it, then run again (--resume continues what it saved)")


# Errors of flock on a file system that has no locks: the run goes on unlocked.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _lock_run(out: Path) -> int | None:
    """Takes the exclusive lock of an output for one run: ``flock`` on :func:`_lock_path`,
    held until :func:`_unlock_run` (which removes the file) or the end of the process (the kernel
    releases it; the file left is taken by the next run). A second run of the same output (another
    process, or another :class:`EmbedJob` of this one) is refused instead of replacing the files
    the first is writing. Returns the lock's descriptor; None where there are no locks (no
    ``fcntl``, or a file system without them).

    Raises:
        ValueError: another run holds the lock (naming ``out``).
    """
    if fcntl is None:
        return None
    path = _lock_path(out)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _held_by_another_run(out) from None
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_LOCKS:
                return None
            raise
        try:
            # the holder may have removed the file (ending its run) between our open and flock:
            # then the lock is on a removed file, and the next run would take a new one
            now = os.stat(path)
            mine = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _unlock_run(fd: int | None, out: Path) -> None:
    """Ends :func:`_lock_run`'s lock: the file removed (while still held), then closed."""
    if fd is None:
        return
    try:
        _lock_path(out).unlink(missing_ok=True)
    finally:
        os.close(fd)


def _check_not_locked(out: Path) -> None:
    """Raises :func:`_held_by_another_run` if a run holds ``out``'s lock now; creates nothing."""
    if fcntl is None:
        return
    try:
        fd = os.open(_lock_path(out), os.O_RDONLY)
    except OSError:
        return  # no lock file: no run (or one that cannot lock)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _held_by_another_run(out) from None
    except OSError:
        pass
    finally:
        os.close(fd)  # also releases the shared lock


# ========================================================================================= arguments
def _check_quantize(quantize) -> None:
    """None (fp32) or one of the quantized formats."""
    from .quantization import QUANTIZED_FORMATS

    if quantize is not None:
        check_choice(quantize, "quantize", QUANTIZED_FORMATS)


def _check_model(model) -> Path:
    """The directory of a run's ``model`` argument (:func:`resolve_model_dir`), its errors naming
    ``model`` (the argument of :func:`embed_file`, :func:`embed_summary`, :func:`search` and
    ``distributed.embed_corpus``).

    Raises:
        TypeError: not a str or path. ValueError: an empty string. FileNotFoundError: no such model.
    """
    return resolve_model_dir(model, "model")


def _check_model_identity(model) -> None:
    """Refuses a ``model`` argument of :meth:`EmbedJob.prepare` that is not a :func:`model_identity`
    dict: every field a run reads or records (in the manifest, which :func:`read_manifest` checks
    the same way) must be there, of its type.

    Raises:
        TypeError: ``model`` not a dict. ValueError: a field missing, or of the wrong type or
            value, naming ``model`` and the field.
    """
    from .quantization import QUANTIZED_FORMATS

    if not isinstance(model, dict):
        raise TypeError(f"model: expected the dict of model_identity() (model_identity(name) makes it), got "
                        f"{type(model).__name__}")
    fields = (("name", "a str", lambda v: isinstance(v, str)),
              ("fingerprint", "a str", lambda v: isinstance(v, str)),
              ("fingerprint_version", "an int >= 1", lambda v: _is_int(v, 1)),
              ("dim", "an int >= 1", lambda v: _is_int(v, 1)))
    for key, expected, ok in fields:
        if key not in model:
            raise ValueError(f"model: expected a dict from model_identity(), with {key!r} ({expected}); got one "
                             f"with the keys {sorted(map(str, model))}")
        if not ok(model[key]):
            raise ValueError(f"model: expected {key!r} {expected}, got {described(model[key])}")
    if "quantize" in model and model["quantize"] not in QUANTIZED_FORMATS:
        raise ValueError(f"model: expected 'quantize' one of {', '.join(map(repr, QUANTIZED_FORMATS))} (or no such "
                         f"key), got {described(model['quantize'])}")


def _model_identity(model, quantize: str | None = None) -> dict:
    """:func:`model_identity` of a run's ``model`` argument, a bad one named ``model``
    (:func:`_check_model`)."""
    _check_model(model)
    return model_identity(model, quantize)


def _check_run_arguments(batch_size, resume, overwrite, progress, quantize=None) -> None:
    """The arguments of a run that :meth:`EmbedJob.prepare` does not see, checked before it (and so
    before anything is written or removed)."""
    check_positive_int(batch_size, "batch_size")
    for name, value in (("resume", resume), ("overwrite", overwrite), ("progress", progress)):
        check_bool(value, name)
    _check_quantize(quantize)


def _check_not_input(source, out: Path) -> None:
    """Refuses an output whose paths (``OUT``, ``OUT.partial``, the manifest, the texts sidecar) are
    the input file (the same path, a link to it, another hard link of it) or a directory holding it:
    a run removes them before it reads the input.

    Raises:
        ValueError: naming ``out`` (``--out``) and the input.
    """
    path = getattr(source, "path", None)
    if path is None:
        return
    path = Path(path)
    try:
        resolved = path.resolve()
    except OSError:
        return  # a link loop: open_source has refused it already
    # the input as written, made absolute but not resolved: a path that goes through the output
    # directory (OUT/link-to-elsewhere, OUT/../in.txt) stops existing when OUT is removed
    spelled_parts = (path if path.is_absolute() else Path.cwd() / path).parts  # ".." kept, links not followed
    for p in (out, _partial_path(out), manifest_path(out), _texts_path(out), _lock_path(out)):
        try:
            rp = p.resolve()
            same = rp == resolved or (p.exists() and path.exists() and os.path.samefile(p, path))
        except OSError:
            continue
        ap = Path(os.path.abspath(p)).parts
        through = len(spelled_parts) > len(ap) and spelled_parts[:len(ap)] == ap
        if same or rp in resolved.parents or through:
            how = "is" if same else "holds"
            raise ValueError(f"out: {p} {how} the input {path}: an output never replaces its input (a run "
                             f"removes the output's paths before it reads the input); write it elsewhere "
                             f"(another out / --out)")


# ============================================================================================ writers
def write_parquet_part(directory, index: int, width: int, start: int, texts: list[str],
                       embeddings: np.ndarray, *, run: str | None = None) -> Path:
    """Writes one chunk as ``directory/part-<index>.parquet``, atomically (a hidden temp file,
    fsynced, then renamed): a reader sees the whole part or none of it, and writing the same chunk
    twice (a retried task) leaves one file with the same rows.

    Args:
        directory: the dataset directory (must exist).
        index: chunk index, an int >= 0; ``width``: digits of the part number, an int in
            ``[1, 19]`` (the number is zero-padded to it: ``part-00007.parquet`` for 7 and 5).
        start: id of the chunk's first text, an int >= 0 (ids are ``start .. start + len(texts) - 1``).
        texts: the chunk's texts, a non-empty list of str (valid Unicode).
        embeddings: ``(len(texts), dim)`` floats, ``dim >= 1``, stored as float32.
        run: the run id (the manifest's ``"run"``) the part belongs to: the part is written only
            into a directory holding that run's marker, checked through one handle on the directory
            before the temp file is made and again just before the rename, so that a writer of a
            run that was replaced (its directory removed, another made at the same path) or
            resumed by another run never puts its rows there. None: no check. The part records
            it in its key-value metadata (``transformer_core.run``, :data:`PART_RUN_KEY`), which
            a resumed run and the last step check against the manifest's runs.

    Returns:
        The part's path.
    Raises:
        Every argument is checked before anything is written:
        TypeError: ``directory`` not a str or path; ``index``, ``width`` or ``start`` not an int;
        ``texts`` not a list of str; ``embeddings`` not an array of floats; ``run`` neither None
        nor a str. ValueError: ``index`` or ``start`` < 0, ``width`` outside ``[1, 19]``, no
        texts, a text that is not valid Unicode, ``embeddings`` not 2-D, with another number of
        rows than ``texts`` or with no columns, or holding a finite value beyond float32's range
        (``|v| ≥ 3.4028235677973366e38``, float64: stored as float32 it would be inf; an inf or NaN given
        is stored as it is); a ``run`` that is not a run id (letters and digits, at most 64).
        FileNotFoundError / NotADirectoryError: ``directory`` does not exist (``run`` None) / is
        not a directory (named).
        OSError: the disk refused the write (the error names the part, not the temp file, which
        is removed); with errno ESTALE: ``directory`` is not (or no longer) the data of ``run``,
        or is gone while ``run`` is given (nothing written).
    """
    _check_path_type(directory, "directory")
    index = check_int(index, "index", 0)
    width = check_int(width, "width", 1, 19)
    start = check_int(start, "start", 0)
    if not isinstance(texts, (list, tuple)):
        raise TypeError(f"texts: expected a list of str, got {type(texts).__name__}")
    if not texts:
        raise ValueError("texts: expected at least one text (a chunk is never empty), got none")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts: expected a list of str, got {type(t).__name__} at index {i}")
        check_unicode(t, "texts", i)
    emb = np.asarray(embeddings)
    if emb.dtype.kind != "f":
        raise TypeError(f"embeddings: expected an array of floats, got dtype {emb.dtype}")
    if emb.ndim != 2 or emb.shape[0] != len(texts) or emb.shape[1] < 1:
        raise ValueError(f"embeddings: expected shape ({len(texts)}, dim) with dim >= 1 (one row per text), "
                         f"got {emb.shape}")
    if run is not None:
        if not isinstance(run, str):
            raise TypeError(f"run: expected None or a run id (str), got {type(run).__name__}")
        if not (run.isascii() and run.isalnum() and len(run) <= 64):
            raise ValueError(f"run: expected a run id (letters and digits, at most 64), got {run!r}")
    directory = Path(directory)
    if not directory.is_dir():
        if directory.exists():
            raise NotADirectoryError(f"directory: {directory} is not a directory")
        if run is not None:  # removed by another run (--overwrite, or one that finished and renamed it)
            raise _stale(directory / _part_name(index, width), run, f"its directory {directory} is gone")
        raise FileNotFoundError(f"directory: {directory} does not exist")
    # as float32 (after every other check: a copy), a finite value beyond its range refused (the
    # cast would store inf)
    emb = _contiguous(emb, DTYPE, "embeddings")
    pa = _need_pyarrow("Parquet output")
    import pyarrow.parquet as pq

    n, dim = emb.shape
    table = pa.table({
        "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "text": pa.array(texts, type=pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim),
    })
    if run is not None:  # which run wrote it: see EmbedJob._check_parts_are_of_this_output
        table = table.replace_schema_metadata({PART_RUN_KEY: run.encode("ascii")})
    path = directory / _part_name(index, width)
    if run is None or not _DIR_FD:
        if run is not None:
            _check_run(None, directory, run, path)
        tmp = _temp_name(path)
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f)
                f.flush()
                os.fsync(f.fileno())
            if run is not None:
                _check_run(None, directory, run, path)
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise _naming(e, path) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path
    # Every step through one handle on the directory: if the run's directory is removed meanwhile
    # (and another made at its path), the part goes into the removed one, never into the new one.
    try:
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError:
        raise _stale(path, run, "its directory is gone") from None
    tmp = _temp_name(path).name
    made = False
    try:
        _check_run(dir_fd, directory, run, path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=dir_fd)
        made = True
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        _check_run(dir_fd, directory, run, path)
        os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        made = False
    except OSError as e:
        raise _naming(e, path) from None
    finally:
        if made:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
        os.close(dir_fd)
    return path


#: The key of a Parquet part's key-value metadata that names the run which wrote it.
PART_RUN_KEY = b"transformer_core.run"


def _part_run(path: Path) -> str | None:
    """The run id recorded in the Parquet part ``path`` (:data:`PART_RUN_KEY`), or None for a part
    that records none (written by an earlier version, or by :func:`write_parquet_part` without
    ``run``). Reads only the file's footer.

    Raises:
        ValueError: ``path`` is not a readable Parquet file (named).
    """
    pa = _need_pyarrow("Parquet output")
    import pyarrow.parquet as pq

    try:
        with pa.OSFile(os.fsencode(path)) as f:  # by its bytes, as _read_part opens a part
            meta = pq.read_metadata(f).metadata or {}
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"out: {path} is not a readable Parquet part ({e}); --overwrite starts over") from None
    run = meta.get(PART_RUN_KEY)
    return None if run is None else run.decode("ascii", "replace")


def _naming(error: OSError, path: Path) -> OSError:
    """``error`` of writing the part ``path`` (through a temp file), naming ``path``: not the temp
    file (a name the caller never gave, and removed), nor nothing (``write`` and ``fsync`` name no
    file). An error that already names another file (a run marker's ESTALE) is kept."""
    if error.strerror is None:
        return error
    named = error.filename
    if named is None or Path(named).name.startswith(f".{path.name}.tmp-"):
        return OSError(error.errno, error.strerror, str(path))
    return error


# Whether files can be made, checked and renamed through a handle on their directory (POSIX).
_DIR_FD = {os.open, os.stat, os.rename, os.unlink} <= os.supports_dir_fd


def _stale(path: Path, run: str, why: str) -> OSError:
    return OSError(errno.ESTALE, f"not written: {why}, it is no longer the data of run {run} (another run "
                                 f"replaced, resumed or finished it)", str(path))


def _check_run(dir_fd: int | None, directory: Path, run: str, path: Path) -> None:
    """Raises :func:`_stale`'s OSError unless the directory (``dir_fd``, or ``directory`` by path when
    None) holds the marker of ``run``."""
    try:
        if dir_fd is None:
            os.stat(directory / _run_marker(run))
        else:
            os.stat(_run_marker(run), dir_fd=dir_fd)
    except FileNotFoundError:
        raise _stale(path, run, f"{directory} holds no marker {_run_marker(run)}") from None


def _create_npy(path: Path, shape: tuple[int, int]) -> None:
    """Creates ``path``: a ``.npy`` header for ``shape`` float32, and the disk space of every row
    reserved (``posix_fallocate``), so that a disk too small for the output fails now, before any
    row is computed or written. Where the file system cannot reserve space, the file is left
    sparse: the rows' ``pwrite`` then reports a full disk.

    Raises:
        OSError: the file cannot be created, or the disk cannot hold it (ENOSPC).
    """
    header = {"descr": np.lib.format.dtype_to_descr(DTYPE), "fortran_order": False, "shape": shape}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        size = f.tell() + shape[0] * shape[1] * DTYPE.itemsize
        f.flush()
        fallocate = getattr(os, "posix_fallocate", None)
        try:
            if fallocate is None:
                raise OSError(errno.EOPNOTSUPP, "posix_fallocate is not available")
            fallocate(f.fileno(), 0, size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise OSError(e.errno, f"{e.strerror} (reserving {size:,} bytes for {shape[0]} x {shape[1]} "
                                       f"float32 embeddings)", str(path)) from None
            f.truncate(size)


class _NpyWriter:
    """Rows into the preallocated ``.npy`` with ``os.pwrite``, fsynced; texts appended to the JSONL
    sidecar (fsynced). Chunks come in order, each once (``write`` refuses any other ``start``, so
    that a text is always on its row's line); the sidecar is cut back to the manifest's length on
    resume.

    Not through a memory map: a store into a mapped page the file system cannot back (a full disk,
    a sparse file) is a SIGBUS that kills the process without a message, where ``pwrite`` raises
    OSError, reported as any other error, with the manifest still holding only the chunks written.
    """

    def __init__(self, job: "EmbedJob"):
        self.path = job.data_path
        self.dim = job.dim
        self.run = job.run
        whole = _map_npy(self.path, "out")  # reads the header; maps, touches nothing
        shape, dtype, self.offset = whole.shape, whole.dtype, whole.offset
        del whole
        if shape != (job.num_rows, job.dim) or dtype != DTYPE:
            raise ValueError(f"{self.path}: expected a ({job.num_rows}, {job.dim}) float32 array, got "
                             f"{shape} {dtype}; --overwrite starts over")
        self.texts_path = _texts_path(job.out)
        kept = job.manifest.get("texts_bytes", 0)  # what the chunks already written put there
        have = self.texts_path.stat().st_size if self.texts_path.exists() else 0
        if have < kept:  # deleted or cut: truncate() would pad it with NUL bytes, the texts off by rows
            raise ValueError(f"{self.texts_path}: holds {have} of the {kept} bytes the finished chunks wrote "
                             f"(deleted or truncated); --overwrite starts over")
        ranges = job.manifest["completed"]
        if len(ranges) > 1 or (ranges and ranges[0][0] != 0):  # written out of order by an earlier version
            raise ValueError(f"{self.texts_path}: the chunks done ({ranges}) are not the first ones, so its texts "
                             f"are not on their rows' lines; --overwrite starts over")
        self.next_row: int | None = job.rows_done()  # the row of the sidecar's next line; None: unknown
        self.fd = os.open(self.path, os.O_WRONLY)
        self.failed = False  # a write failed (and was reported): close() drops what it left buffered
        self.texts = open(self.texts_path, "r+b" if self.texts_path.exists() else "w+b")
        self.texts.truncate(kept)
        self.texts.seek(0, os.SEEK_END)

    def write(self, start: int, texts: list[str], emb: np.ndarray) -> dict:
        """Writes one chunk: ``emb`` (``(len(texts), dim)`` float32) into rows ``start ...`` of the
        ``.npy``, and ``texts`` appended to the JSONL sidecar, both fsynced. The chunks go in
        order, each once: ``start`` must be the row after the last one written (or, for a new
        writer, after the chunks done).

        Returns:
            the manifest fields this chunk updates: ``{"texts_bytes": <sidecar length>}``.
        Raises:
            ValueError: ``start`` not the next row (a chunk out of order, or one written again: a
            chunk whose commit failed needs only the commit again), or a write of the texts by
            this writer failed before (a new writer cuts the sidecar back to the chunks done);
            ``emb`` of another shape, or holding a finite value beyond float32's range (float64:
            stored as float32 it would be inf); nothing written.
            OSError: the disk refused the write (the file is named; the manifest is then not
            updated, and a resumed run writes the chunk again); ESTALE: the ``.npy`` at its path is
            no longer the one this writer opened (another run replaced it; nothing written).
        """
        if self.next_row is None:
            raise ValueError(f"{self.texts_path}: a write of this writer to it failed, so its next line is not "
                             f"known: make a new writer (EmbedJob.writer()), which cuts it back to the chunks done")
        if start != self.next_row:
            raise ValueError(f"start: expected the next row {self.next_row}, got {start} (a .npy output's chunks "
                             f"are written in order, each once: their texts are appended to {self.texts_path})")
        rows = np.asarray(emb)
        if rows.shape != (len(texts), self.dim):
            raise ValueError(f"emb: expected shape ({len(texts)}, {self.dim}), got {rows.shape}")
        rows = _contiguous(rows, DTYPE, "emb")  # a finite value beyond float32's range refused, not stored as inf
        data = memoryview(rows).cast("B")
        offset = self.offset + start * self.dim * DTYPE.itemsize
        try:
            mine, now = os.fstat(self.fd), os.stat(self.path)
        except FileNotFoundError:
            now = None
        if now is None or (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino):
            raise _stale(self.path, self.run, f"{self.path} is no longer the file this writer opened")
        try:
            while data:  # pwrite may write less than asked
                written = os.pwrite(self.fd, data, offset)
                data, offset = data[written:], offset + written
            os.fsync(self.fd)
        except OSError as e:
            self.failed = True
            raise _with_filename(e, self.path) from None
        try:
            self.texts.write("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts).encode("utf-8"))
            self.texts.flush()
            os.fsync(self.texts.fileno())
        except OSError as e:
            self.failed = True
            self.next_row = None  # some of the texts may be in the sidecar (or its buffer)
            raise _with_filename(e, self.texts_path) from None
        self.next_row += len(texts)
        return {"texts_bytes": self.texts.tell()}

    def close(self) -> None:
        """Closes the ``.npy`` and the sidecar (twice is harmless). After a failed write, the bytes
        it left in the sidecar's buffer are dropped: flushing them would fail again (a full disk) and
        hide the error that named the file; a resumed run cuts the sidecar to the manifest's length.

        Raises:
            OSError: the sidecar's last bytes could not be written (named), when no write failed.
        """
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            self.texts.close()
        except OSError as e:
            if not self.failed:
                raise _with_filename(e, self.texts_path) from None


def _file_id(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _with_filename(error: OSError, path: Path) -> OSError:
    """``error`` naming ``path`` (an OSError of ``write`` or ``fsync`` names no file)."""
    if error.filename is not None or error.strerror is None:
        return error
    return OSError(error.errno, error.strerror, str(path))


class _ParquetWriter:
    def __init__(self, job: "EmbedJob"):
        self.directory = job.data_path
        self.width = job.manifest["part_width"]
        self.chunk_size = job.chunk_size
        self.run = job.run

    def write(self, start: int, texts: list[str], emb: np.ndarray) -> dict:
        """Writes one chunk (``emb``: ``(len(texts), dim)`` float32, rows from ``start``) as its own
        Parquet part, atomically (:func:`write_parquet_part`), into this run's directory only.

        Returns:
            ``{}``: a Parquet chunk adds no manifest field.
        Raises:
            OSError: the disk refused the write (no part is left behind); ESTALE: another run
            replaced this one's directory.
        """
        write_parquet_part(self.directory, start // self.chunk_size, self.width, start, texts, emb, run=self.run)
        return {}

    def close(self) -> None:
        """Nothing to close: every part is a complete file once written."""


# ================================================================================================ job
@dataclasses.dataclass
class EmbedResult:
    """What a run did.

    Attributes:
        out: the output path. kind: ``"npy"`` or ``"parquet"``. rows: texts in the output.
        dim: embedding width. chunks: chunks in the output. chunks_computed / rows_computed: the
        part this run computed (less than all when resumed). seconds: wall time of this run.
        num_skipped: records skipped (``errors="skip"``). skipped: the first of them, ``(where, why)``.
    """

    out: Path
    kind: str
    rows: int
    dim: int
    chunks: int
    chunks_computed: int
    rows_computed: int
    seconds: float
    num_skipped: int = 0
    skipped: list = dataclasses.field(default_factory=list)

    @property
    def sentences_per_second(self) -> float:
        """Rows this run computed per second of its wall time (NaN for a run of 0 s)."""
        return self.rows_computed / self.seconds if self.seconds > 0 else float("nan")


def _check_count_of_blank_rule(source: "TextSource", out: Path, then: int) -> None:
    """A resumed run of ``out``, whose manifest was made with another rule for blank texts
    (``input.blank_rule``: an earlier version): counts ``source``'s texts, as a new run does, with
    this version's rule and every record the strict reading would refuse skipped.

    Raises:
        ValueError: the count is not ``then`` (the manifest's): this version skips texts that the
        earlier one embedded, so the rows already made would not line up with the texts; nothing
        is embedded or written. ``--overwrite`` starts over.
    """
    counter = copy.copy(source)  # the same file, read with skip: a record refused now is one fewer
    counter.errors = "skip"
    now = sum(1 for _ in counter)
    if now != then:
        strict = source.errors == "strict" and source.format != "text"  # strict text input skips blank lines too
        raise ValueError(f"resume: {out} was started by an earlier version, whose rule for blank texts differs: "
                         f"this one {'refuses' if strict else 'skips'} the texts of only characters that carry no "
                         f"text (such as U+FFFD or private-use characters), which that one embedded ({then} texts "
                         f"then, {now} now), so the rows already made would not line up with the texts; "
                         f"--overwrite starts over" + (" (with --errors skip / errors='skip', which skips them)" if strict else ""))


class EmbedJob:
    """One embedding run's plan and state: the output, its manifest, the chunks left.

    Made by :meth:`prepare` (checks, and for a new run a first pass over the input to count and
    validate it; nothing is written), then :meth:`start` (creates or reopens the output), then for
    every chunk of :meth:`pending` the data is written (:meth:`writer`) and :meth:`commit` records
    it; :meth:`finish` renames the data to its final name and marks the manifest complete. A
    ``.npy`` output's chunks are written in the order :meth:`pending` gives them, each once (its
    texts are appended to one file); a Parquet output's in any order. :func:`embed_file` runs
    the chunks in this process, :func:`transformer_core.distributed.embed_corpus` on Dask workers.

    Attributes:
        out: the output's final path (a ``Path``, ``~`` expanded); the data is written beside it
            (:attr:`data_path`) until :meth:`finish`.
        kind: ``"npy"`` or ``"parquet"``, from ``out``'s suffix.
        manifest: the manifest as a dict (``OUT.manifest.json``, :func:`manifest_path`), the
            record the properties below read.
        source: the input, the :class:`TextSource` or :class:`ListSource` given to :meth:`prepare`.
        num_rows, num_chunks, chunk_size, dim, complete, run: read-only properties of the
            manifest (each documented below).
    """

    def __init__(self, out: Path, kind: str, manifest: dict, source):
        self.out = out
        self.kind = kind
        self.manifest = manifest
        self.source = source
        self._started = False
        self._resumed = False
        self._overwrite = False
        self._lock: int | None = None
        self._data_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the .npy data this run writes
        self._prepared_state = (manifest.get("run"), json.dumps(manifest.get("completed")), manifest.get("complete"))
        # the input as prepare read it (a resumed run: read again then; its mtime may be newer than
        # the manifest's, its content the same): what pending and finish check the file against
        self._input_seen = dict(manifest.get("input") or {})

    # ------------------------------------------------------------------------------ properties
    num_rows = property(lambda self: self.manifest["num_rows"], doc="Texts in the whole input (the output's rows).")
    num_chunks = property(lambda self: self.manifest["num_chunks"], doc="Chunks the input is cut into.")
    chunk_size = property(lambda self: self.manifest["chunk_size"], doc="Texts per chunk (the last may hold fewer).")
    dim = property(lambda self: self.manifest["model"]["dim"], doc="The embedding width (the model's hidden size).")
    complete = property(lambda self: bool(self.manifest["complete"]),
                        doc="Whether every chunk is done and the output is at its final name.")
    run = property(lambda self: self.manifest.get("run"), doc="This run's id (new at every start and resume).")

    @property
    def data_path(self) -> Path:
        """Where the data is: ``OUT.partial`` while incomplete, ``OUT`` once complete."""
        return self.out if self.complete else _partial_path(self.out)

    @property
    def completed(self) -> set[int]:
        """The chunks done."""
        return completed_chunks(self.manifest)

    @property
    def num_completed(self) -> int:
        """How many chunks are done (from the manifest's completed ranges)."""
        return _num_completed(self.manifest)

    def rows_done(self) -> int:
        """Texts in the chunks done."""
        ranges = self.manifest["completed"]
        last_done = bool(ranges) and ranges[-1][1] == self.num_chunks
        return self.num_completed * self.chunk_size - (self.num_chunks * self.chunk_size - self.num_rows
                                                        if last_done else 0)

    # ------------------------------------------------------------------------------ prepare
    @classmethod
    def prepare(cls, source, out, model: dict, *, chunk_size: int | None = None, resume: bool = False,
                overwrite: bool = False, normalize: bool | None = None, batch_size: int | None = None,
                float32_only: bool = False) -> "EmbedJob":
        """Checks the output path and, for ``resume``, the manifest against this input and model;
        for a new run reads the input once (counting and validating every record). Writes nothing,
        removes nothing.

        Args:
            source: a :class:`TextSource` (:func:`open_source`) or :class:`ListSource`.
            out: ``*.npy`` or ``*.parquet`` (a leading ``~`` is the home directory); its directory
                must exist.
            model: :func:`model_identity` of the model that will embed: a dict with ``"name"`` and
                ``"fingerprint"`` (str), ``"fingerprint_version"`` and ``"dim"`` (ints >= 1), and
                optionally ``"quantize"`` (one of ``QUANTIZED_FORMATS``).
            chunk_size: texts per chunk (default ``DEFAULT_CHUNK_SIZE``; a resumed run keeps its own).
            resume: continue the run whose manifest is ``OUT.npy.manifest.json`` / ``OUT.parquet.manifest.json``.
            overwrite: replace an existing output (removed only when :meth:`start` runs).
            normalize: whether the rows are L2-normalised, recorded in the manifest (the caller
                encodes with it: :func:`embed_file` reads ``manifest["normalize"]``). None
                (default): True for a new run, the run's own for a resumed one, which refuses
                another value (its rows would mix normalised and unnormalised ones).
            batch_size: texts per forward pass, recorded: a resumed run must use the same (a batch
                rounds each text by its shape, about 1e-7, so another would not give the bits an
                uninterrupted run gives). None: not recorded, not checked.
            float32_only: the caller cannot quantize (:func:`transformer_core.distributed.embed_corpus`):
                resuming an output made with ``--quantize`` is refused with a message that sends
                the user to a single-machine run, not to ``--quantize``.

        Raises:
            Every argument is checked first, before the input is read:
            TypeError: ``source`` neither a TextSource nor a ListSource; ``model`` not a dict;
                ``chunk_size`` or ``batch_size`` neither None nor an int; ``resume``, ``overwrite``
                or ``float32_only`` not a bool, ``normalize`` neither None nor a bool (0 and 1 included); ``out`` not a
                str or path.
            ValueError: a bad ``out`` suffix; ``model`` without one of its fields, or with one of
                the wrong type or value (named); ``chunk_size`` or ``batch_size`` outside
                ``[1, 2**63 - 1]``; both ``resume`` and ``overwrite``; ``out``
                that is the input file (or holds it: see :func:`_check_not_input`); a resumed run
                whose model, quantize setting or input differ (or that an earlier version made with
                a model this version embeds differently: :func:`model_identity`, or with a rule for
                blank texts under which the input held another number of texts: ``BLANK_RULE_VERSION``;
                the input is counted again for such a manifest), whose chunk size,
                batch size or ``normalize`` differ (the argument named), or whose manifest is
                damaged; an input with no text; a bad record (strict mode); another run holding the
                output now (its lock, see :meth:`start`).
            FileNotFoundError: ``out``'s directory does not exist; ``resume`` with no manifest, or
                with its data gone. NotADirectoryError: ``out``'s directory is a file (or below one).
            FileExistsError: the output exists and neither ``resume`` nor ``overwrite`` was given.
        """
        if not isinstance(source, (TextSource, ListSource)):
            raise TypeError(f"source: expected a TextSource (open_source) or a ListSource, got "
                            f"{type(source).__name__}")
        kind = _output_kind(out)
        out = _user_path(out)
        _check_model_identity(model)
        if chunk_size is not None:  # bounded as batch_size: a larger one would fail only when a chunk is cut
            chunk_size = check_int(chunk_size, "chunk_size", 1)
        batch_size = check_optional_int(batch_size, "batch_size", 1)
        resume = check_bool(resume, "resume")
        overwrite = check_bool(overwrite, "overwrite")
        float32_only = check_bool(float32_only, "float32_only")
        normalize = None if normalize is None else check_bool(normalize, "normalize")
        if resume and overwrite:
            raise ValueError("resume and overwrite: give one or the other")
        _check_not_input(source, out)
        parent = out.parent
        if not parent.is_dir():
            existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
            if existing is not None and not existing.is_dir():  # afile/x.npy, afile/sub/x.npy
                raise NotADirectoryError(f"out: {existing} is not a directory (for {out})")
            raise FileNotFoundError(f"out: the directory {parent} does not exist (for {out})")
        _check_not_locked(out)
        if resume:
            return cls._prepare_resume(source, out, kind, model, chunk_size, batch_size, normalize, float32_only)
        existing = [p for p in (out, _partial_path(out), manifest_path(out)) if p.exists()]
        if existing and not overwrite:
            try:
                man = read_manifest(out)
                state = ("complete" if man["complete"] else
                         f"an interrupted run, {_num_completed(man)} of {man['num_chunks']} chunks done; "
                         f"--resume continues it")
            except (OSError, ValueError, KeyError):
                state = "without a manifest of this package"
            raise FileExistsError(f"out: {existing[0]} already exists ({state}); --overwrite replaces it")
        chunk_size = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        identity = source.identity()
        n = sum(1 for _ in source)  # the first pass: counts and validates every record
        if n == 0:
            raise ValueError(f"{getattr(source, 'arg_name', 'input')}: {source.describe()} has no text to embed ({_why_empty(source, identity)})")
        num_chunks = -(-n // chunk_size)
        manifest = {
            "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "kind": kind,
            "model": model, "dtype": DTYPE.name, "normalize": True if normalize is None else normalize,
            "input": identity, "num_rows": n, "chunk_size": chunk_size, "num_chunks": num_chunks,
            "part_width": max(5, len(str(num_chunks - 1))), "run": _new_run_id(), "completed": [], "texts_bytes": 0,
            "complete": False, "num_skipped": source.num_skipped,
            "skipped": [list(s) for s in source.skipped],
        }
        manifest["runs"] = [manifest["run"]]  # this output's runs: the first, then each resumption
        if batch_size is not None:
            manifest["batch_size"] = batch_size
        job = cls(out, kind, manifest, source)
        job._overwrite = overwrite
        return job

    @classmethod
    def _prepare_resume(cls, source, out: Path, kind: str, model: dict, chunk_size, batch_size,
                        normalize, float32_only: bool = False) -> "EmbedJob":
        try:
            man = read_manifest(out)
        except FileNotFoundError:
            raise FileNotFoundError(f"resume: nothing to resume, {manifest_path(out)} does not exist "
                                    f"(run without --resume to start)") from None
        try:
            if man["kind"] != kind:
                raise ValueError(f"resume: {out} was started as {man['kind']}, not {kind}")
            old_model = man["model"]
            old_q, new_q = old_model.get("quantize"), model.get("quantize")
            if old_q != new_q and old_model["name"] == model["name"]:
                # The quantize setting enters the fingerprint: the same model, not the same embeddings.
                if float32_only and old_q:  # the distributed job: --quantize is not an option there
                    raise ValueError(f"resume: {out} was embedded {_quantized(old_q)}, and the distributed job "
                                     f"(--workers/--scheduler) embeds in float32 only; a single-machine run "
                                     f"continues it (embed_file(..., quantize={old_q!r}), or the embed command "
                                     f"with --quantize {old_q} and without --workers/--scheduler), "
                                     f"--overwrite starts over")
                raise ValueError(f"resume: {out} was embedded {_quantized(old_q)}, this run {_quantized(new_q)}; "
                                 f"{'--quantize ' + old_q if old_q else 'leaving out --quantize'} continues it, "
                                 f"--overwrite starts over")
            if old_model.get("fingerprint_version", 1) != model["fingerprint_version"]:
                raise ValueError(f"resume: {out} was made by another model or with an older fingerprint: its "
                                 f"manifest holds {_fingerprint_kind(old_model)}, which cannot be compared with "
                                 f"the fingerprint of {model['name']!r}; --overwrite starts over")
            why = (None if old_model["fingerprint"] == model["fingerprint"]
                   else _embedding_rule_change(model, old_model["fingerprint"]))
            if why is not None:
                # the same files, embedded otherwise by this version: restoring them cannot help
                raise ValueError(f"resume: {out} was made by an earlier version with the model at "
                                 f"{old_model['name']!r}; the model's files are unchanged, but this version embeds "
                                 f"with it differently: {why}, so its rows would not match the ones already "
                                 f"made; --overwrite makes the output again")
            if old_model["fingerprint"] != model["fingerprint"] and old_model["name"] == model["name"]:
                # the same name, other files (a fine-tune saved over it): naming it again cannot help
                raise ValueError(f"resume: {out} was made by the model at {model['name']!r}, whose files have "
                                 f"changed since the run started (fingerprint {old_model['fingerprint'][:12]} "
                                 f"then, {model['fingerprint'][:12]} now); --overwrite starts over with it, or "
                                 f"restoring its original files continues the run")
            if old_model["fingerprint"] != model["fingerprint"]:
                raise ValueError(f"resume: {out} was made by another model: {old_model['name']!r} (fingerprint "
                                 f"{old_model['fingerprint'][:12]}), not {model['name']!r} (fingerprint "
                                 f"{model['fingerprint'][:12]}); --model {old_model['name']} continues it, "
                                 f"--overwrite starts over")
            old_in, new_in = man["input"], source.identity()
            if (new_in.get("newlines") and not old_in.get("newlines") and old_in.get("format") == "text"
                    and source.splits_inside_lines()):
                raise ValueError(f"resume: {out} was started by an earlier version, which split {source.path}'s "
                                 f"lines at \\n only; the file holds a carriage return inside a line, a line end "
                                 f"now, so the texts would not line up with the saved rows; --overwrite starts over")
            keys = ["format", "text_field", "errors", "size", "head_sha256", "tail_sha256", "count", "sha256"]
            if "size" in old_in and "sha256" not in old_in:
                # A file's manifest of an earlier version, which hashed only the first and last MiB:
                # the same mtime as well is the only sign left that the middle was not edited.
                keys[keys.index("sha256")] = "mtime_ns"
            for key in keys:
                if old_in.get(key) != new_in.get(key) and old_in.get("format") == new_in.get("format") == "list":
                    # texts given in memory (the CLI's sentences, a list as input): no file to speak of
                    then_now = (f"{old_in.get(key)} texts then, {new_in.get(key)} now" if key == "count" else
                                f"SHA-256 of all the texts {str(old_in.get(key))[:12]} then, "
                                f"{str(new_in.get(key))[:12]} now")
                    raise ValueError(f"resume: the texts given differ from the ones {out} was started from "
                                     f"({then_now}); --overwrite starts over")
                if old_in.get(key) != new_in.get(key):
                    what = {"head_sha256": "content (first MiB)", "tail_sha256": "content (last MiB)",
                            "sha256": "content (SHA-256 of the whole file)",
                            "mtime_ns": "modification time (the manifest, of an earlier version, holds no hash of "
                                        "the whole file to compare instead)"}.get(key, key)
                    raise ValueError(f"resume: the input is not the one {out} was started from: its {what} "
                                     f"differs ({old_in.get('path') or 'arguments'}: {old_in.get(key)!r}, now "
                                     f"{new_in.get(key)!r}); --overwrite starts over")
            if chunk_size is not None and chunk_size != man["chunk_size"]:
                raise ValueError(f"chunk_size: {out} was started with chunk size {man['chunk_size']}, got "
                                 f"{chunk_size}; leave it out to continue")
            if batch_size is not None and man.get("batch_size", batch_size) != batch_size:
                raise ValueError(f"batch_size: {out} was started with batch size {man['batch_size']}, got "
                                 f"{batch_size}; pass {man['batch_size']} (--batch-size {man['batch_size']}) to "
                                 f"continue it with the bits of an uninterrupted run")
            if normalize is not None and normalize != man.get("normalize", True):
                raise ValueError(f"normalize: {out} was started with normalize={man.get('normalize', True)}, got "
                                 f"{normalize}; leave it out to continue (its rows would mix normalised and "
                                 f"unnormalised ones)")
            if (isinstance(source, TextSource) and not man["complete"]
                    and old_in.get("blank_rule") != new_in["blank_rule"]):
                _check_count_of_blank_rule(source, out, man["num_rows"])
                man["input"]["blank_rule"] = new_in["blank_rule"]  # the same texts: counted once
        except KeyError as e:
            raise ValueError(f"{manifest_path(out)}: a manifest without {e}") from None
        job = cls(out, kind, man, source)
        job._input_seen = new_in
        if not man["complete"] and not _partial_path(out).exists():
            all_done = _num_completed(man) == man["num_chunks"]
            if not (all_done and out.exists()):
                raise FileNotFoundError(f"resume: the data of the interrupted run, {_partial_path(out)}, is gone; "
                                        f"--overwrite starts over")
        job._resumed = True
        return job

    # ------------------------------------------------------------------------------ run
    def start(self) -> None:
        """Creates the output for a new run (removing an old one when ``overwrite``): the data at
        ``OUT.partial`` (``.npy``: ``(N, dim)`` float32, its disk space reserved up front;
        ``.parquet``: an empty directory holding this run's marker) and the manifest with no chunk
        done. A resumed run takes the output over: a new run id in the manifest and, for Parquet,
        its marker in place of the interrupted run's (whose writers are then refused).

        The run holds an exclusive lock of the output (``.npy`` and Parquet alike) from here until
        :meth:`finish` or :meth:`close` (or the end of its process): another run of it is refused at
        its :meth:`prepare` or :meth:`start`, never left to replace the files or the manifest this
        one writes. (A distributed run's lock is its client's, which calls this; its workers only
        write parts, guarded by the run marker.) What :meth:`prepare` saw is checked again here,
        under the lock; a resumed Parquet run checks that every part recorded done was written by
        one of the output's runs.

        Raises:
            OSError: the output cannot be created, e.g. the disk cannot hold the whole ``.npy``
            (ENOSPC, ``OUT.partial`` named); nothing of this run is then left behind.
            ValueError: another run holds the output (``out`` named), or (after :meth:`prepare`)
            another run resumed, advanced or finished the output this one was to resume, or a part
            recorded done was written by another run (named: a run that replaced this output
            where there were no locks). FileExistsError: another run created the output since
            :meth:`prepare` (not ``overwrite``). Nothing is changed then.
        """
        if self._started:
            return
        if self._lock is None:
            self._lock = _lock_run(self.out)
        try:
            self._check_unchanged_since_prepare()
            if self._resumed:
                self._take_over()
            else:
                self._create()
        except BaseException:
            self.close()
            raise
        self._started = True

    def _check_unchanged_since_prepare(self) -> None:
        """Refuses to start when another run changed the output between :meth:`prepare` and now."""
        out = self.out
        if not self._resumed:
            existing = [p for p in (out, _partial_path(out), manifest_path(out)) if p.exists()]
            if existing and not self._overwrite:
                raise FileExistsError(f"out: {existing[0]} was created by another run since this one was "
                                      f"prepared; --resume continues it, --overwrite replaces it")
            return
        try:
            man = json.loads(manifest_path(out).read_text(encoding="utf-8"))
            now = (man.get("run"), json.dumps(man.get("completed")), man.get("complete"))
        except (OSError, *JSON_ERRORS, AttributeError):
            now = None
        if now != self._prepared_state:
            raise ValueError(f"out: another run resumed, advanced or finished {out} since this one was prepared "
                             f"(its manifest {manifest_path(out)} changed); run again")

    def _create(self) -> None:
        """A new run's start: the old output removed, the data and the manifest created."""
        paths = (self.out, _partial_path(self.out), manifest_path(self.out), _texts_path(self.out))
        _remove(paths)
        _remove_old_trash(self.out)
        _remove_old_trash(_partial_path(self.out))
        data = _partial_path(self.out)
        try:
            if self.kind == "npy":
                _create_npy(data, (self.num_rows, self.dim))
                _texts_path(self.out).write_bytes(b"")
                self._data_id = _file_id(data)
            else:
                _need_pyarrow("Parquet output")
                data.mkdir()
                (data / _run_marker(self.run)).touch()
            self._save(new_run=True)
        except BaseException:
            _remove(paths)
            raise

    def _take_over(self) -> None:
        """A resumed run's start: the parts recorded done checked (:meth:`_check_parts_are_of_this_output`),
        then a new run id, added to the output's runs; the Parquet directory's markers replaced by its own."""
        data = _partial_path(self.out)
        if self.kind == "parquet":
            stored = data if data.is_dir() else self.out
            if stored.is_dir():
                self._check_parts_are_of_this_output(stored, sorted(self.completed))
        # a manifest of an earlier version records no runs: its parts record none either
        runs = list(self.manifest.get("runs", [self.manifest["run"]] if self.manifest.get("run") else []))
        self.manifest["run"] = _new_run_id()
        self.manifest["runs"] = [*runs, self.manifest["run"]]
        if self.kind == "parquet" and data.is_dir():
            for marker in data.glob(".run-*"):
                marker.unlink(missing_ok=True)
            (data / _run_marker(self.run)).touch()
        if self.kind == "npy" and data.is_file():
            self._data_id = _file_id(data)
        self._save()

    def pending(self) -> Iterator[tuple[int, int, list[str]]]:
        """``(index, start, texts)`` of every chunk not yet done, in order, streamed from the
        input (done chunks are read past, not kept).

        The input is checked against what :meth:`prepare` read, so that an input edited during the
        run is never embedded half old, half new under the manifest's identity: before each chunk
        is handed out, the file's size and mtime (a change of them alone, a file only touched, is
        let through when the SHA-256 of the whole file is still the same); and before the last
        one, once the input is read to its end, the number of texts and (text, JSONL and CSV
        input) the SHA-256 of every byte this pass read. A resumed ``.npy`` output's texts file is
        checked too: its lines of the first chunks done must be their texts, row by row.

        Raises:
            ValueError: the input now holds a different number of texts than the manifest says, or
            its content changed since :meth:`prepare` (``--overwrite`` starts over); raised before
            the chunk that would show it is handed out, and in any case before the last, so that
            :meth:`finish` never marks such an output complete. (``.npy``) a line of the texts file
            that is not the text of its row (an earlier version's writer given the chunks out of
            order), or the file ends before the rows of the first chunks done: raised before the
            first chunk not done is handed out; ``--overwrite`` starts over.
        """
        done = self.completed
        source = self.source
        hashed = isinstance(source, TextSource) and source.format != "parquet"  # read through _lines
        hasher = hashlib.sha256() if hashed else None  # this pass's own: other passes feed it nothing
        it = source._iter(hasher) if hashed else iter(source)
        total = 0
        # .npy: the sidecar's lines of the first chunks done, compared with their texts (an earlier
        # version's writer appended the texts of chunks written out of order in that order)
        lines = None
        if self.kind == "npy" and 0 in done and not self.complete:
            try:
                lines = open(_texts_path(self.out), "rb")
            except FileNotFoundError:
                pass  # the writer reports it (its texts file shorter than the manifest records)
        try:
            for index in range(self.num_chunks):
                start = index * self.chunk_size
                texts = list(itertools.islice(it, self.chunk_size))
                total = start + len(texts)
                last = index == self.num_chunks - 1
                if last or len(texts) < self.chunk_size:  # the input read to its end
                    total += sum(1 for _ in it)
                    if total != self.num_rows:
                        raise ValueError(f"{source.arg_name}: {source.describe()} changed during the run: it now "
                                         f"holds {total} texts, the manifest says {self.num_rows}; --overwrite "
                                         f"starts over")
                    if hasher is not None:
                        self._check_input_unchanged(hasher.hexdigest())
                if index in done:
                    if lines is not None:
                        self._check_texts_on_their_rows(lines, start, texts)
                    continue
                if lines is not None:  # the first chunk not done: the sidecar holds no more of the done ones
                    lines.close()
                    lines = None
                self._check_input_unchanged()
                yield index, start, texts
        finally:
            if lines is not None:
                lines.close()

    def _check_texts_on_their_rows(self, lines, start: int, texts: list[str]) -> None:
        """Refuses a ``.npy`` output whose texts file, read on from ``lines`` (an open binary file at
        row ``start``'s line), does not hold ``texts`` (a chunk done) line by line.

        Raises:
            ValueError: a line that is not the text of its row, naming the file and the line: the
            texts of an earlier version's writer given the chunks out of order (or a damaged
            file); or the file ends before it. ``--overwrite`` starts over.
        """
        path = _texts_path(self.out)
        for row, text in enumerate(texts, start):
            line = lines.readline()
            if not line:
                raise ValueError(f"{path}: ends at line {row}, before the rows of the chunks done (deleted or "
                                 f"truncated); --overwrite starts over")
            try:
                stored = json.loads(line)
            except JSON_ERRORS:
                stored = None
            if stored != text:
                held = repr(_short(stored, 40)) if isinstance(stored, str) else "no JSON string"
                raise ValueError(f"{path}, line {row + 1}: holds {held}, not the text of row {row} "
                                 f"({_short(text, 40)!r}): the texts of the chunks done are not on their rows' "
                                 f"lines (written out of order by an earlier version, or the file was edited); "
                                 f"--overwrite starts over")

    def _check_input_unchanged(self, read_sha256: str | None = None) -> None:
        """Refuses an input file that is no longer the one :meth:`prepare` read: ``read_sha256``
        (the hash of what a pass read) differs from its SHA-256, or its size or mtime differ and
        so does the SHA-256 of the whole file now (when it does not, the file was only touched: its
        new size and mtime are what later checks compare). Nothing for a list of texts.

        Raises:
            ValueError: naming the input; the output is left incomplete (``--overwrite``).
        """
        path = getattr(self.source, "path", None)
        seen = self._input_seen
        if path is None or "sha256" not in seen:
            return
        now = read_sha256
        if now is None:
            try:
                st = os.stat(path)
            except OSError as e:
                raise ValueError(f"{self.source.arg_name}: {path} changed during the run: it cannot be read "
                                 f"now ({e.strerror}); --overwrite starts over") from None
            if (st.st_size, st.st_mtime_ns) == (seen.get("size"), seen.get("mtime_ns")):
                return
            now = _sha256_of_file(path)
            if now == seen["sha256"]:  # only touched: the same bytes
                seen["size"], seen["mtime_ns"] = st.st_size, st.st_mtime_ns
                return
        if now != seen["sha256"]:
            raise ValueError(f"{self.source.arg_name}: {path} changed during the run: its content (SHA-256 "
                             f"{now[:12]}) is not the one the run started from ({seen['sha256'][:12]}), so the "
                             f"rows already embedded may not be its texts; the output is left incomplete: "
                             f"--overwrite starts over")

    def writer(self):
        """The writer of this output's chunks (``write(start, texts, embeddings) -> manifest
        extras``; ``close()``).

        A ``.npy`` output's writer takes the chunks in the order :meth:`pending` gives them, each
        once (its texts are appended to ``OUT.npy.texts.jsonl``, one line per row): ``write``
        refuses any other ``start`` with a ValueError naming it, before anything is written. A
        Parquet output's writer takes them in any order (one part per chunk).

        Raises:
            ValueError: (``.npy``) the array is not of the manifest's shape and dtype, its texts
            file is shorter than the manifest records, or the chunks done are not the first ones
            (written out of order by an earlier version); ``--overwrite`` starts over. An earlier
            version's output whose chunks done are the first ones but were written out of order
            is refused by :meth:`pending` (their texts compared with the texts file's lines).
        """
        return _NpyWriter(self) if self.kind == "npy" else _ParquetWriter(self)

    def commit(self, index: int, **extra) -> None:
        """Records chunk ``index`` as done (its data must already be on disk), atomically. The
        manifest in memory changes only once the one on disk has: an error or an interrupt
        (Ctrl-C) inside the save leaves it as it was, so that :meth:`interrupted_message` counts
        what is saved.

        Raises:
            OSError: ESTALE: the manifest on disk is another run's (this run was replaced, resumed
            or finished by another); nothing is recorded. As :meth:`_save` (a full disk).
        """
        self._check_still_current()
        before = self.manifest
        self.manifest = {**before, "completed": [list(r) for r in before["completed"]]}
        _add_to_ranges(self.manifest["completed"], index)
        self.manifest.update(extra)
        try:
            self._save()
        except BaseException:
            self.manifest = before
            raise

    def finish(self) -> None:
        """Every chunk done: the data is renamed to ``OUT``, the manifest marked complete, and
        temporaries left by killed processes are removed. A Parquet dataset keeps exactly the
        parts of its chunks: anything else in its directory (temporaries, the run marker, a part
        that is not one of the manifest's) is removed first.

        Raises:
            ValueError: a chunk is not done; a Parquet part written by another run (named); the
            input file changed since :meth:`prepare` read it (its size or mtime, and then its
            SHA-256: a file only touched is accepted; see :meth:`pending`), the output then left
            incomplete.
            FileNotFoundError: the part of a chunk recorded done is missing.
            OSError: ESTALE: another run replaced or took over this run's directory.
        """
        if self.num_completed != self.num_chunks:
            missing = sorted(set(range(self.num_chunks)) - self.completed)
            raise ValueError(f"out: {len(missing)} chunks not done (first: {missing[0]}); cannot finish")
        self._check_input_unchanged()
        self._check_still_current()
        partial = _partial_path(self.out)
        if self.kind == "npy" and self._data_id is not None and partial.exists():
            st = partial.stat()
            if (st.st_dev, st.st_ino) != self._data_id:
                raise _stale(partial, self.run, f"{partial} is not the file this run created or resumed")
        data = partial if partial.exists() else self.out
        if self.kind == "parquet" and data.is_dir():
            self._keep_only_the_parts(data)
        if partial.exists():
            os.replace(partial, self.out)
        self.manifest["complete"] = True
        self._save()
        _remove_temps(self.out.parent, manifest_path(self.out).name)
        self.close()

    def close(self) -> None:
        """Releases the output's lock (:meth:`start`) without finishing: what is saved stays,
        for a later ``resume``. :meth:`finish` calls it; twice is harmless. A job that is not
        finished should be closed (:func:`embed_file` does), else its lock is held until it is
        garbage-collected or its process ends."""
        lock, self._lock = self._lock, None
        _unlock_run(lock, self.out)

    def __del__(self):
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:  # the file stays (another run may be taking it): closing releases the lock
            try:
                os.close(lock)
            except Exception:  # at interpreter shutdown
                pass

    def _check_still_current(self) -> None:
        """Raises :func:`_stale`'s OSError unless the manifest on disk records this run."""
        if not self._started or self.run is None:
            return
        path = manifest_path(self.out)
        try:
            on_disk = json.loads(path.read_text(encoding="utf-8")).get("run")
        except (OSError, *JSON_ERRORS, AttributeError):
            on_disk = None
        if on_disk != self.run:
            raise _stale(path, self.run, f"the manifest records run {on_disk}")

    def _check_parts_are_of_this_output(self, data: Path, chunks) -> None:
        """Checks that the part of each chunk in ``chunks`` found in ``data`` was written by one of
        this output's runs (the manifest's ``"runs"``; its ``"run"`` alone in a manifest that has
        none), by the run id it records (:func:`_part_run`). A part that records none (an earlier
        version's) is accepted; a missing part is left to the caller.

        Raises:
            ValueError: a part written by another run (a run that replaced this output where there
            were no locks, whose manifest this one's then replaced), named with its chunk and run.
        """
        runs = set(self.manifest.get("runs", [self.manifest.get("run")]))
        width = self.manifest["part_width"]
        for i in chunks:
            part = data / _part_name(i, width)
            if not part.is_file():
                continue
            run = _part_run(part)
            if run is not None and run not in runs:
                raise ValueError(f"out: {part}, the part of chunk {i} that the manifest {manifest_path(self.out)} "
                                 f"records as done, was written by run {run}, not by a run of this output "
                                 f"({', '.join(sorted(runs))}): another run of the same output replaced it; "
                                 f"--overwrite starts over")

    def _keep_only_the_parts(self, data: Path) -> None:
        """Checks that ``data`` holds this run's marker (unless finished already) and every chunk's
        part, each written by one of this output's runs (:meth:`_check_parts_are_of_this_output`),
        then removes everything else in it."""
        keep = {_part_name(i, self.manifest["part_width"]) for i in range(self.num_chunks)}
        marker = data / _run_marker(self.run) if self.run else None
        if data != self.out and marker is not None and not marker.exists():
            raise _stale(data, self.run, f"{data} holds no marker {marker.name}")
        for i in range(self.num_chunks):
            part = data / _part_name(i, self.manifest["part_width"])
            if not part.is_file():
                raise FileNotFoundError(f"out: {part}, the part of chunk {i} that the manifest "
                                        f"{manifest_path(self.out)} records as done, is missing; "
                                        f"--overwrite starts over")
        self._check_parts_are_of_this_output(data, range(self.num_chunks))
        for entry in data.iterdir():
            if entry.name not in keep:
                _remove([entry])

    def interrupted_message(self) -> str:
        """The one line the CLI prints after Ctrl-C / SIGTERM: what is saved and how to go on."""
        done = self.num_completed
        return (f"interrupted: {done} of {self.num_chunks} chunks ({self.rows_done()} of {self.num_rows} texts) "
                f"are saved in {_partial_path(self.out)}; the same command with --resume finishes the rest")

    def _save(self, new_run: bool = False) -> None:
        """Writes the manifest, atomically. An OSError (a full disk) names the manifest and says how
        to go on: run again (``new_run``: nothing was kept) or ``--resume`` (the chunks recorded
        before are kept, the manifest on disk is the one before this save)."""
        if new_run:
            hint = "writing the manifest of a new run, nothing was kept: free some space and run again"
        else:
            hint = ("writing the manifest; what it recorded before is kept: free some space, then the same "
                    "command with --resume goes on")
        _atomic_write(manifest_path(self.out), json.dumps(self.manifest, indent=1).encode("utf-8"), hint)


def _remove(paths) -> None:
    """Removes files and directory trees. A directory is first renamed to a hidden name beside it
    (so its path is free at once, and a writer still holding a handle on it writes into the renamed
    one), then removed; what a writer adds meanwhile is removed by a later run."""
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            trash = p.with_name(f".{p.name}.trash-{uuid.uuid4().hex[:8]}")
            os.rename(p, trash)
            _remove_trash(trash)
        elif p.exists() or p.is_symlink():
            p.unlink()


def _remove_old_trash(path: Path) -> None:
    """Removes what :func:`_remove` could not remove of ``path`` earlier."""
    for trash in path.parent.glob(f".{glob.escape(path.name)}.trash-*"):
        _remove_trash(trash)


def _remove_trash(trash: Path) -> None:
    """Removes a renamed directory. A writer of a replaced run adding or renaming a file in it
    meanwhile (ENOTEMPTY, ENOENT) is waited out a few times, then what it added is left to a later
    run (the name is hidden); any other error (a permission) is raised."""
    for attempt in range(4):
        try:
            shutil.rmtree(trash)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.ENOENT):
                raise
            if not trash.exists():
                return
        time.sleep(0.05 * (attempt + 1))


def _quantized(quantize: str | None) -> str:
    """How a model's linear layers ran, for messages: ``"in float32 (no --quantize)"``."""
    return "in float32 (no --quantize)" if quantize is None else f"with --quantize {quantize}"


def _why_empty(source, identity: dict) -> str:
    if isinstance(source, ListSource):
        return "no sentences given" if source.what is None else "it is empty"
    if source.num_skipped:
        return f"all {source.num_skipped} records were skipped; the first: {source.skipped[0][0]}: {source.skipped[0][1]}"
    if identity.get("size") == 0:
        return "the file is empty"
    return "only blank lines" if source.format == "text" else "no records"


def _progress_bar(progress: bool, total: int, initial: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not progress, unit=" sentences", desc=desc,
                file=sys.stderr, dynamic_ncols=True, smoothing=0.1)


def embed_file(input, out, *, model=DEFAULT_MODEL, input_format: str | None = None, text_field: str | None = None,
               errors: str = "strict", chunk_size: int | None = None, batch_size: int = 32, resume: bool = False,
               overwrite: bool = False, progress: bool = False, quantize: str | None = None) -> EmbedResult:
    """Embeds every text of a file (or a list) into ``out`` (``.npy`` or ``.parquet``), chunk by
    chunk, in this process; see the module docstring for the layout and the manifest.

    Args:
        input: a path (read with :func:`open_source`), a :class:`TextSource` or a list of str.
        out: ``*.npy`` or ``*.parquet``. In both paths a leading ``~`` is the home directory.
        model: model directory or embedded name (default all-MiniLM-L6-v2).
        input_format, text_field, errors: as :func:`open_source`, for a path input (``errors`` is
            checked whatever the input; a :class:`TextSource` keeps the settings it was opened with).
        chunk_size: texts per chunk (default 1000; a resumed run keeps its own).
        batch_size: texts per forward pass (:meth:`SentenceEncoder.encode`).
        resume: continue an interrupted run (checks model and input first).
        overwrite: replace an existing output.
        progress: a tqdm bar on stderr (sentences/s, ETA).
        quantize: None, or ``"int8"``: the encoder's linear layers int8
            (``SentenceEncoder.from_pretrained(..., quantize=)``); recorded in the manifest's model.

    Returns:
        :class:`EmbedResult`. Row ``i`` of the output is ``SentenceEncoder.encode`` of text ``i``
        (L2-normalised whatever the model's own setting, float32), computed with the other texts
        of its chunk in batches of ``batch_size``: another batch or chunk size changes the last
        bits (a few 1e-7 per element; see the module docstring), the same ones give the same bits.

    Raises:
        Every argument is checked before anything is written or removed (an existing output that
        ``overwrite`` would replace is kept when an argument is bad):
        TypeError: ``batch_size`` or ``chunk_size`` not an int; ``resume``, ``overwrite`` or
        ``progress`` not a bool; ``model`` or ``out`` not a str or path.
        ValueError: ``batch_size`` or ``chunk_size`` outside ``[1, 2**63 - 1]``; ``quantize`` not
        None or ``"int8"``; ``out`` that is the input (or a link to it, or holds it);
        ``input_format`` or ``text_field`` given with an input that is not a path (a list or a
        :class:`TextSource`, read as given or as it was opened); ``errors`` not ``"strict"`` or
        ``"skip"`` (whatever the input); an empty or whitespace-only text in a list (as
        :class:`ListSource`); and as :func:`open_source` (its errors about the path naming
        ``input``), :meth:`EmbedJob.prepare` and ``SentenceEncoder.from_pretrained``; the input
        edited during the run (:meth:`EmbedJob.pending`; the output is left incomplete).
        FileNotFoundError: no such ``model`` (named ``model``).
        NotADirectoryError: ``out``'s directory is a regular file.
        OSError: the disk cannot hold the output (a ``.npy`` fails before its first chunk, its
        space being reserved up front; the manifest records only the chunks written);
        KeyboardInterrupt with a message saying what is saved and how to resume.
    """
    from .sentence_encoder import SentenceEncoder

    t0 = time.perf_counter()
    _check_run_arguments(batch_size, resume, overwrite, progress, quantize)
    source = _as_source(input, input_format, text_field, errors)
    job = EmbedJob.prepare(source, out, _model_identity(model, quantize), chunk_size=chunk_size, resume=resume,
                           overwrite=overwrite, batch_size=batch_size)
    encoder = SentenceEncoder.from_pretrained(model, quantize=quantize)
    if job.complete:
        return _result(job, 0, 0, time.perf_counter() - t0)
    normalize = job.manifest.get("normalize", True)
    job.start()
    writer = None
    rows_computed = chunks_computed = 0
    bar = _progress_bar(progress, job.num_rows, job.rows_done(), "embed")
    try:
        for index, start, texts in job.pending():
            emb = encoder.encode(texts, batch_size=batch_size, normalize=normalize, progress=False)
            writer = writer or job.writer()
            extra = writer.write(start, texts, emb)
            job.commit(index, **extra)
            rows_computed += len(texts)
            chunks_computed += 1
            bar.update(len(texts))
        if writer is not None:
            writer.close()
        job.finish()
    except KeyboardInterrupt:
        raise KeyboardInterrupt(job.interrupted_message()) from None
    finally:
        if writer is not None:
            writer.close()
        bar.close()
        job.close()  # the lock, when the run did not finish
    return _result(job, chunks_computed, rows_computed, time.perf_counter() - t0)


def _as_source(input, input_format, text_field, errors):
    """The source of a run's ``input`` (a path, a :class:`TextSource`, a list of str), every reader
    argument checked: ``errors`` always (``"skip"`` refused with a TextSource opened strict: it is
    read as it was opened), and ``input_format``/``text_field`` refused unless the input is a path
    they apply to (as the CLI refuses ``--format``/``--text-field`` without ``--file``)."""
    if not isinstance(input, (TextSource, ListSource, list, tuple)):
        return _open_source(input, input_format, text_field, errors, "input")
    if errors not in ("strict", "skip"):
        raise ValueError(f"errors: expected 'strict' or 'skip', got {errors!r}")
    if isinstance(input, TextSource) and errors == "skip" and input.errors != "skip":
        raise ValueError(f"errors: 'skip' with a TextSource opened with errors={input.errors!r}, which is read as "
                         f"it was opened: open it with open_source(..., errors='skip')")
    what = ("a TextSource (read as it was opened)" if isinstance(input, TextSource)
            else "texts given as a list (read as given)")
    for name, value in (("input_format", input_format), ("text_field", text_field)):
        if value is not None:
            raise ValueError(f"{name}: only for a path input, got {value!r} with {what}")
    if isinstance(input, (TextSource, ListSource)):
        return input
    return ListSource(input, "input", "the list given as input")


def _result(job: EmbedJob, chunks_computed: int, rows_computed: int, seconds: float) -> EmbedResult:
    m = job.manifest
    return EmbedResult(out=job.out, kind=job.kind, rows=job.num_rows, dim=job.dim, chunks=job.num_chunks,
                       chunks_computed=chunks_computed, rows_computed=rows_computed, seconds=seconds,
                       num_skipped=m.get("num_skipped", 0), skipped=[tuple(s) for s in m.get("skipped", [])])


@dataclasses.dataclass
class EmbedSummary:
    """What :func:`embed_summary` saw: either the embeddings of a few texts (``texts`` and
    ``embeddings (N, dim)``, N <= ``limit``) or, beyond that, only statistics: ``count``, ``dim``,
    ``mean_cosine`` (the mean cosine similarity over all pairs i != j), ``seconds``; and the
    records skipped (``errors="skip"``): ``num_skipped``, and the first of them, ``(where, why)``,
    in ``skipped``."""

    count: int
    dim: int
    seconds: float
    texts: list | None = None
    embeddings: np.ndarray | None = None
    mean_cosine: float | None = None
    num_skipped: int = 0
    skipped: list = dataclasses.field(default_factory=list)


def embed_summary(input, *, model=DEFAULT_MODEL, limit: int = 20, input_format=None, text_field=None,
                  errors="strict", chunk_size: int = DEFAULT_CHUNK_SIZE, batch_size: int = 32,
                  progress: bool = False, quantize: str | None = None) -> EmbedSummary:
    """Embeds a source without saving: up to ``limit`` texts are returned with their embeddings;
    a longer input is streamed chunk by chunk (memory bounded by a chunk) and summarised.

    The mean pairwise cosine is exact and needs no N x N matrix: for unit rows ``e_i``,
    ``sum_{i != j} e_i . e_j = |sum_i e_i|^2 - sum_i |e_i|^2``. ``quantize``: as :func:`embed_file`.

    Raises:
        TypeError: ``limit``, ``chunk_size`` or ``batch_size`` not an int, ``progress`` not a bool.
        ValueError: ``limit``, ``chunk_size`` or ``batch_size`` < 1, ``quantize`` not None or
        ``"int8"``; no text; ``input_format``, ``text_field``, ``errors`` and a list's texts as
        :func:`embed_file`; and as :func:`open_source` (naming ``input``) and
        ``SentenceEncoder.from_pretrained``.
    """
    from .sentence_encoder import SentenceEncoder

    t0 = time.perf_counter()
    # Python ints from here on (a numpy int64 limit of 2**63 - 1 would wrap around at limit + 1)
    limit, chunk_size, batch_size = (check_positive_int(value, name) for name, value in (
        ("limit", limit), ("chunk_size", chunk_size), ("batch_size", batch_size)))
    check_bool(progress, "progress")
    _check_quantize(quantize)
    _check_model(model)
    source = _as_source(input, input_format, text_field, errors)
    encoder = SentenceEncoder.from_pretrained(model, quantize=quantize)
    it = iter(source)
    # one text past the limit tells a longer source; islice stops at sys.maxsize (2**63 - 1, the
    # largest limit), and no source holds more texts than that
    head = list(itertools.islice(it, min(limit + 1, sys.maxsize)))
    if not head:
        identity = source.identity() if isinstance(source, TextSource) else {}
        raise ValueError(f"{getattr(source, 'arg_name', 'input')}: {source.describe()} has no text to embed ({_why_empty(source, identity)})")
    if len(head) <= limit:
        emb = encoder.encode(head, batch_size=batch_size, normalize=True, progress=False)
        return EmbedSummary(count=len(head), dim=encoder.dim, seconds=time.perf_counter() - t0, texts=head,
                            embeddings=emb, num_skipped=source.num_skipped, skipped=list(source.skipped))
    total = np.zeros(encoder.dim, np.float64)
    sq = 0.0
    count = 0
    bar = _progress_bar(progress, None, 0, "embed")
    try:
        for _, _, texts in _chunks(itertools.chain(head, it), chunk_size):
            emb = encoder.encode(texts, batch_size=batch_size, normalize=True, progress=False).astype(np.float64)
            total += emb.sum(axis=0)
            sq += float((emb * emb).sum())
            count += len(texts)
            bar.update(len(texts))
    finally:
        bar.close()
    mean_cos = (float(total @ total) - sq) / (count * (count - 1))
    return EmbedSummary(count=count, dim=encoder.dim, seconds=time.perf_counter() - t0, mean_cosine=mean_cos,
                        num_skipped=source.num_skipped, skipped=list(source.skipped))


# ============================================================================================ search
@dataclasses.dataclass(frozen=True)
class Hit:
    """One search result: the text's ``id`` (its row), cosine ``score``, and the ``text``."""

    id: int
    score: float
    text: str | None


def _merge_topk(best_s: np.ndarray, best_i: np.ndarray, s: np.ndarray, ids: np.ndarray, k: int):
    """The k best of the union of (best_s, best_i) and (s, ids): highest score first, ties by lower
    id (so the result does not depend on how the rows were cut into blocks)."""
    if len(s) > k:
        kth = np.partition(s, len(s) - k)[len(s) - k]  # the k-th largest score
        keep = s >= kth                                 # ties at the boundary all kept
        s, ids = s[keep], ids[keep]
    s = np.concatenate([best_s, s])
    ids = np.concatenate([best_i, ids])
    order = np.lexsort((ids, -s))[:k]
    return s[order], ids[order]


#: Queries per product in :func:`_cosine_scores`: ``functional.linear``'s streaming path takes up
#: to 32 rows (more rows take the GEMM, whose tiles round differently by the number of rows).
_QUERY_GROUP = 32


def _cosine_scores(q: np.ndarray, emb: np.ndarray) -> np.ndarray:
    """``(Q, B)`` cosines of unit queries ``q`` (Q, dim) with the rows of ``emb`` (B, dim), float32.

    Each dot product ``q_j . e_i`` and each ``|e_i|^2`` is one fixed accumulation over ``dim``,
    whatever B and wherever row i lies in ``emb``: :func:`transformer_core.functional.linear` with
    a few rows (at most 32 queries, or a row of ones for the squares) streams its weight (here
    ``emb``) and computes every output the same way. (A numpy ``emb @ q.T`` rounds differently for
    another number of rows, so a score would depend on ``block_rows``.)
    """
    from .functional import linear

    emb = np.ascontiguousarray(emb, dtype=DTYPE)
    if len(emb) == 0:
        return np.empty((len(q), 0), DTYPE)
    ones = np.ones((1, emb.shape[1]), DTYPE)
    norms = np.maximum(np.sqrt(linear(ones, emb * emb)[0]), DTYPE.type(1e-12))           # (B,)
    dots = np.concatenate([linear(q[g:g + _QUERY_GROUP], emb) for g in range(0, len(q), _QUERY_GROUP)])
    return dots / norms


def _open_index(index, allow_incomplete: bool) -> tuple[dict, Path]:
    index = _user_path(index, "index")
    try:
        man = read_manifest(index)
    except FileNotFoundError:
        if index.exists():
            raise ValueError(f"index: {index} has no manifest ({manifest_path(index).name}); search reads "
                             f"outputs of `embed --out`") from None
        raise FileNotFoundError(f"index: {index}: no such file") from None
    if man["complete"]:
        data = index
    else:
        if not allow_incomplete:
            raise ValueError(f"index: {index} is incomplete ({_num_completed(man)} of {man['num_chunks']} chunks "
                             f"done): `embed --resume` finishes it; --allow-incomplete searches the chunks done")
        data = _partial_path(index) if _partial_path(index).exists() else index
    if not data.exists():
        raise FileNotFoundError(f"index: the data {data} is missing (the manifest {manifest_path(index)} remains)")
    return man, data


def _row_ranges(man: dict) -> list[tuple[int, int]]:
    """``[start, stop)`` row ranges of the completed chunks."""
    c, n = man["chunk_size"], man["num_rows"]
    ranges: list[tuple[int, int]] = []
    for first, stop in man["completed"]:
        ranges.append((first * c, min(stop * c, n)))
    return ranges


def _map_npy(path: Path, what: str):
    """``path`` memory-mapped read-only (nothing read but its header).

    Raises:
        ValueError: naming ``what`` and the file: not a ``.npy``, or shorter than its header says
        (a truncated file: the bytes expected and found).
    """
    try:
        return np.load(path, mmap_mode="r")
    except ValueError as e:
        size = path.stat().st_size
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read_header is None:
                    raise ValueError(f".npy format version {version}")
                shape, _, dtype = read_header(f)
                expected = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        except (ValueError, OSError, EOFError):
            raise ValueError(f"{what}: {path} is not a readable .npy file ({e})") from None
        raise ValueError(f"{what}: {path} is truncated or damaged: its header says {shape} {dtype}, "
                         f"{expected:,} bytes, the file holds {size:,} ({e})") from None


def _read_part(man: dict, data: Path, index: Path, chunk: int, columns: list[str]):
    """The columns of one chunk's Parquet part.

    Raises:
        FileNotFoundError: the part is missing (named, with its chunk, rows and dataset).
        ValueError: the part is not a readable Parquet file or lacks a column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = data / _part_name(chunk, man["part_width"])
    first = chunk * man["chunk_size"]
    last = min(first + man["chunk_size"], man["num_rows"]) - 1
    if not part.is_file():
        raise FileNotFoundError(f"index: {part} is missing: the part of chunk {chunk} (rows {first}..{last}) of the "
                                f"dataset {data}, which its manifest {manifest_path(index)} records as done; "
                                f"`embed --overwrite` remakes it")
    try:
        # Arrow's own local file, opened by its bytes (a name need not be UTF-8); never the path
        # string, which pyarrow would take for a URI ("out-12:30.parquet"), nor a Python file
        # object: read_table reads through a dataset whose worker threads may drop the last
        # reference to its file after read_table returns, and a Python file's wrapper then needs
        # the GIL; at interpreter exit that aborted the process ("terminate called without an
        # active exception").
        with pa.OSFile(os.fsencode(part)) as f:
            return pq.read_table(f, columns=columns)
    except (pa.ArrowException, OSError, KeyError) as e:
        raise ValueError(f"index: {part} (chunk {chunk}, rows {first}..{last}, of the dataset {data}) is not a "
                         f"readable part with the columns {columns} ({e})") from None


def _iter_blocks(man: dict, data: Path, index: Path, block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(ids (B,), embeddings (B, dim))`` of the stored rows, block by block."""
    dim = man["model"]["dim"]
    if man["kind"] == "npy":
        mm = _map_npy(data, "index")
        if mm.shape != (man["num_rows"], dim) or mm.dtype != DTYPE:
            raise ValueError(f"index: {data} holds {mm.shape} {mm.dtype}, the manifest says ({man['num_rows']}, {dim}) "
                             f"float32")
        for a, b in _row_ranges(man):
            for s in range(a, b, block_rows):
                e = min(s + block_rows, b)
                yield np.arange(s, e, dtype=np.int64), np.asarray(mm[s:e])
        return
    pa = _need_pyarrow("Searching a Parquet output")

    for i in sorted(completed_chunks(man)):
        table = _read_part(man, data, index, i, ["id", "embedding"])
        col = table.column("embedding").combine_chunks()
        if not (pa.types.is_fixed_size_list(col.type) and col.type.list_size == dim):
            raise ValueError(f"index: {data / _part_name(i, man['part_width'])}: column 'embedding' has type "
                             f"{col.type}, expected fixed_size_list<float>[{dim}]")
        emb = col.flatten().to_numpy(zero_copy_only=False).astype(DTYPE, copy=False).reshape(-1, dim)
        yield table.column("id").to_numpy().astype(np.int64, copy=False), emb


class TextsMissingWarning(UserWarning):
    """:func:`search` found the texts file of a ``.npy`` index (``OUT.npy.texts.jsonl``) missing or
    shorter than its manifest records: the hits come without their texts (``Hit.text`` None)."""


def _texts_of(man: dict, data: Path, index: Path, ids: set[int]) -> dict[int, str]:
    """The texts of the given ids (read by streaming the sidecar, or the parts that hold them).

    A ``.npy`` index whose sidecar is missing or shorter than the manifest's ``texts_bytes`` gives
    no texts, with a :class:`TextsMissingWarning` naming the file and the bytes expected and found
    (an index whose manifest records no texts gives none, silently).

    Raises:
        ValueError: a line of the sidecar that is not a JSON string (invalid JSON or UTF-8), named
        with the file and its line number.
    """
    found: dict[int, str] = {}
    if not ids:
        return found
    if man["kind"] == "npy":
        path = _texts_path(index)
        # texts only from a sidecar that holds what the manifest says the finished chunks wrote (a
        # shorter one, cut or replaced, would give its rows to the wrong ids)
        expected = man.get("texts_bytes", 0)
        size = path.stat().st_size if path.exists() else None
        if size is None or size < expected:
            if expected > 0:
                state = "is missing" if size is None else f"holds {size:,} bytes"
                warnings.warn(TextsMissingWarning(
                    f"index: {path} {state}, its manifest {manifest_path(index)} records {expected:,} bytes of "
                    f"texts: the hits are shown without their texts (the file was removed or cut; `embed "
                    f"--overwrite` makes the index again)"), stacklevel=3)
            return found
        last = max(ids)
        with open(path, "rb") as f:
            for row, line in enumerate(f):
                if row in ids:
                    found[row] = _stored_text(line, path, row)
                if row >= last:
                    break
        return found
    by_chunk: dict[int, list[int]] = {}
    for i in ids:
        by_chunk.setdefault(i // man["chunk_size"], []).append(i)
    for chunk, wanted in by_chunk.items():
        table = _read_part(man, data, index, chunk, ["id", "text"])
        part_ids = table.column("id").to_numpy()
        texts = table.column("text")
        for i in wanted:
            pos = np.flatnonzero(part_ids == i)
            if len(pos):
                found[i] = texts[int(pos[0])].as_py()
    return found


def _stored_text(line: bytes, path: Path, row: int) -> str:
    """The text of one line of a texts sidecar (a JSON string), ``row`` its 0-based line.

    Raises:
        ValueError: not a JSON string (invalid UTF-8 or JSON, another JSON value), naming the file
        and the line (1-based).
    """
    try:
        text = json.loads(line)
    except JSON_ERRORS as e:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise ValueError(f"index: {path}, line {row + 1}: expected a JSON string ({json_problem(e)}); the texts "
                         f"file is damaged: `embed --overwrite` makes the index again") from None
    if not isinstance(text, str):
        raise ValueError(f"index: {path}, line {row + 1}: expected a JSON string, got {_json_type(text)}; the "
                         f"texts file is damaged: `embed --overwrite` makes the index again")
    return text


def search(index, queries, k: int = 5, *, model=None, allow_incomplete: bool = False,
           block_rows: int = 65536, batch_size: int = 1) -> list[list[Hit]]:
    """Exact top-k nearest texts by cosine similarity, over an output of :func:`embed_file`.

    Scores are ``cos(q, e_i) = q . e_i / (|q| |e_i|)`` in float32, computed block by block
    (``block_rows`` rows of the memory-mapped ``.npy``, or one Parquet part, at a time) and merged
    into a running top-k; ties go to the lower id. Each dot product and norm is one fixed float32
    accumulation (:func:`transformer_core.functional.linear` with at most 32 queries as its rows,
    the block's embeddings as its weight: every output is computed the same way whatever the
    number of embeddings beside it), so the scores, and the ranking of near-ties, are bitwise
    the same for any ``block_rows`` and for a ``.npy`` and a ``.parquet`` output of the same rows.

    Args:
        index: the ``out`` of the embedding run (``*.npy`` or ``*.parquet``; its manifest beside it; a
            leading ``~`` is the home directory).
        queries: one str or a list of str.
        k: results per query (fewer if the index holds fewer rows).
        model: the model that embeds the queries; default the index's own (found by the name or
            path its manifest records, and checked against its fingerprint). Another model is refused.
        allow_incomplete: search the chunks done of an interrupted run instead of refusing it.
        block_rows: rows of a ``.npy`` scored at a time (memory; the scores do not depend on it).
        batch_size: queries embedded together. Default 1: each alone, so that a query's scores
            never depend on the other queries of the call (in a batch each is rounded by the
            batch's shape, about 1e-7, which can reorder near-ties); larger is faster for many.

    Returns:
        One list of :class:`Hit` per query, best first.

    Raises:
        The arguments are checked before the index is opened or the model loaded:
        TypeError: ``queries`` neither a str nor an iterable of str (the first item that is not a
        str is named by index); ``k``, ``block_rows`` or ``batch_size`` not an int (a numpy
        integer is one); ``allow_incomplete`` not a bool; ``index`` not a str or path; ``model``
        neither None, a str nor a path.
        ValueError: no query (an empty list), a blank query (empty, or only whitespace and
        characters that carry no text: Unicode categories Cc, Cf, Co and Mn, U+FFFD), a query that
        is not valid Unicode; ``k`` or ``block_rows`` < 1; ``batch_size`` outside ``[1, 2**63 - 1]``; an
        ``index`` holding a NUL character, or too long for the file system (named, cut short); an
        empty ``model``. FileNotFoundError: no such ``model``.
        Then: FileNotFoundError: no such index, or a Parquet part of a chunk done is missing
        (naming it, its chunk and the dataset); with ``model`` left out, the model the manifest
        records is not found (moved or removed since the index was made: the message names the
        index and its path, and ``model=`` (``--model``) gives it). ValueError: no manifest or a
        damaged one, a truncated ``.npy`` or an unreadable part (named), an incomplete index
        (unless ``allow_incomplete``), a line of a ``.npy`` index's texts file that is not a JSON
        string (the file and the line named), another ``model`` (another fingerprint, or a manifest of an
        earlier version whose fingerprint cannot be compared: see ``FINGERPRINT_VERSION``); with
        ``model`` left out, the index's own model changed since the index was made (the files at
        its path have another fingerprint; a manifest of an earlier version is not checked); an
        index made by an earlier version with a model this version embeds differently, its files
        the same (:func:`model_identity`: the message says so).

    Warns:
        TextsMissingWarning: a ``.npy`` index's texts file is missing or shorter than its manifest
        records (both named): the hits come without their texts (``Hit.text`` None).
    """
    from .sentence_encoder import SentenceEncoder

    if isinstance(queries, str):
        queries = [queries]
    if isinstance(queries, (bytes, bytearray, dict)) or not hasattr(queries, "__iter__"):
        raise TypeError(f"queries: expected a str or a non-empty list of str, got {type(queries).__name__}")
    queries = list(queries)
    if not queries:
        raise ValueError("queries: expected a str or a non-empty list of str, got an empty list")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise TypeError(f"queries: expected a list of str, got {type(q).__name__} at index {i}")
    for i, q in enumerate(queries):
        blank = _blank_kind(q)  # it would embed to [CLS] [SEP] alone, and rank the index against that
        if blank:
            raise ValueError(f"queries: expected some text, got {_blank_text_phrase(blank, 'query')} at index {i}")
        check_unicode(q, "queries", i)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k: expected an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k: expected an int >= 1, got {k}")
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)):
        raise TypeError(f"block_rows: expected an int, got {type(block_rows).__name__}")
    if block_rows < 1:
        raise ValueError(f"block_rows: expected an int >= 1, got {block_rows}")
    block_rows = int(block_rows)
    batch_size = check_int(batch_size, "batch_size", 1)
    check_bool(allow_incomplete, "allow_incomplete")
    _check_path_type(index, "index")
    if model is not None:
        _check_model(model)
    man, data = _open_index(index, allow_incomplete)
    name = man["model"]["name"] if model is None else model
    quantize = man["model"].get("quantize")  # the queries are embedded as the index was
    comparable = man["model"].get("fingerprint_version", 1) == FINGERPRINT_VERSION
    if model is not None and not comparable:
        raise ValueError(f"model: {index} was embedded with another model or with an older fingerprint: its "
                         f"manifest holds {_fingerprint_kind(man['model'])}, which cannot be compared with "
                         f"the fingerprint of {str(model)!r}; leave model out to embed the queries with the "
                         f"index's own model {man['model']['name']!r}")
    if model is None:  # the index's own model, by the name or path its manifest records: gone since?
        try:
            _check_model(name)
        except FileNotFoundError as e:
            reason = str(e).removeprefix("model: ")
            raise FileNotFoundError(f"index: {index} was embedded with the model {name!r} (the name or path its "
                                    f"manifest records), which cannot be found now: {reason}; give model= "
                                    f"(--model) the model it was embedded with, wherever it is now") from None
    # the model given, or the index's own found by its name (whose files may have changed since:
    # a fine-tune saved over it), against the manifest: queries of another model would not match
    identity = _model_identity(name, quantize) if comparable else None
    if comparable and identity["fingerprint"] != man["model"]["fingerprint"]:
        why = _embedding_rule_change(identity, man["model"]["fingerprint"])
        if why is not None:  # the same files, embedded otherwise by this version
            raise ValueError(f"{'index' if model is None else 'model'}: {index} was embedded by an earlier version "
                             f"with the model at {man['model']['name']!r}; the model's files are unchanged, but "
                             f"this version embeds with it differently: {why}, so its queries would not match the "
                             f"rows; embed the corpus again (--overwrite)")
        if model is not None:
            raise ValueError(f"model: {index} was embedded with {man['model']['name']!r}, not {model!r}; "
                             f"queries must be embedded by the same model")
        raise ValueError(f"index: {index} was embedded with the model at {name!r}, whose files have changed "
                         f"since (their fingerprint differs): embed the corpus again with it, or give model= "
                         f"(--model) the model it was embedded with")
    encoder = SentenceEncoder.from_pretrained(name, quantize=quantize)
    q = encoder.encode(queries, batch_size=batch_size, normalize=True, progress=False)  # (Q, dim)
    best = [(np.empty(0, DTYPE), np.empty(0, np.int64)) for _ in queries]
    for ids, emb in _iter_blocks(man, data, _user_path(index), block_rows):
        scores = _cosine_scores(q, emb)  # (Q, B)
        for j in range(len(queries)):
            best[j] = _merge_topk(best[j][0], best[j][1], scores[j], ids, k)
    texts = _texts_of(man, data, _user_path(index), {int(i) for _, ids in best for i in ids})
    return [[Hit(int(i), float(s), texts.get(int(i))) for s, i in zip(*b)] for b in best]


# =============================================================================================== CLI
def _shown(path) -> str:
    """A path (or model name) as a result line prints it, whatever the encoding of standard output:
    bytes of the name that are not UTF-8 as ``\\xff``, characters stdout cannot encode as
    ``\\u....``. (Printed as they are, ``PYTHONIOENCODING=utf-8:strict`` would make a run that
    succeeded end with an encoding error.)"""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _check_paths_given(**flags) -> None:
    """Refuses an empty path argument (``--out ''``): it is not the flag left out."""
    for flag, value in flags.items():
        if value is not None and not value:
            raise ValueError(f"--{flag}: expected a path, got {value!r}")


def _cli_batch_size(args) -> int:
    """``--batch-size``: the value given; left out, the batch size that the run ``--resume``
    continues recorded in its manifest (a resumed run must keep it: another changes the rows' last
    bits), else 32. A manifest that cannot be read gives 32: the resume's own checks name it."""
    if args.batch_size is not None:
        return args.batch_size
    if args.resume and args.out:
        try:
            return read_manifest(args.out).get("batch_size", 32)
        except (OSError, ValueError):
            pass
    return 32


def run_embed(args) -> int:
    """``python -m transformer_core embed``: see ``__main__``. Prints to stdout; errors propagate
    (the CLI's one handler reports them)."""
    _check_paths_given(file=args.file, out=args.out)
    if args.file is not None and args.sentences:
        raise ValueError("give sentences as arguments or --file, not both")
    if args.file is None and not args.sentences:
        raise ValueError("give sentences as arguments or with --file")
    distributed = args.scheduler is not None or args.workers is not None
    if distributed and args.quantize is not None:
        raise ValueError("--quantize: not supported with --scheduler/--workers (the workers load float32 models)")
    if args.threads_per_worker is not None and not distributed:
        raise ValueError("--threads-per-worker needs --workers or --scheduler")
    if args.file is None:  # options of --file's reader, which sentence arguments do not use
        for flag, given in (("--format", args.format is not None), ("--text-field", args.text_field is not None),
                            ("--errors", args.errors != "strict")):
            if given:
                raise ValueError(f"{flag} needs --file")
    if args.out is None:
        for flag, value in (("--resume", args.resume), ("--overwrite", args.overwrite),
                            ("--scheduler/--workers", distributed)):
            if value:
                raise ValueError(f"{flag} needs --out")
    progress = not args.no_progress
    batch_size = _cli_batch_size(args)
    source = ListSource(args.sentences) if args.sentences else _open_source(
        args.file, args.format, args.text_field, args.errors, "--file", "--text-field")
    if args.out is not None and distributed:
        if args.file is None:
            raise ValueError("--scheduler/--workers: the distributed job reads --file")
        from .distributed import embed_corpus

        result = embed_corpus(source, args.out, model=args.model, scheduler=args.scheduler, workers=args.workers,
                              threads_per_worker=args.threads_per_worker, chunk_size=args.chunk_size,
                              batch_size=batch_size, resume=args.resume, overwrite=args.overwrite,
                              progress=progress)
    elif args.out is not None:
        result = embed_file(source, args.out, model=args.model, chunk_size=args.chunk_size,
                            batch_size=batch_size, resume=args.resume, overwrite=args.overwrite,
                            progress=progress, quantize=args.quantize)
    else:
        return _print_summary(args, embed_summary(source, model=args.model, chunk_size=args.chunk_size or
                                                  DEFAULT_CHUNK_SIZE, batch_size=batch_size, progress=progress,
                                                  quantize=args.quantize))
    _report_skipped(result.num_skipped, result.skipped)
    info = {"out": str(result.out), "rows": result.rows, "dim": result.dim, "chunks": result.chunks,
            "chunks_computed": result.chunks_computed, "rows_computed": result.rows_computed,
            "seconds": round(result.seconds, 3), "sentences_per_second": round(result.sentences_per_second, 1),
            "skipped": result.num_skipped}
    if args.json:
        print(json.dumps(info))
    elif result.chunks_computed == 0:
        print(f"{_shown(result.out)}: already complete ({result.rows} rows, dim {result.dim}); nothing to do")
    else:
        print(f"{_shown(result.out)}: {result.rows} rows x {result.dim} float32 in {result.chunks} chunks "
              f"({result.rows_computed} embedded now in {result.seconds:.1f} s, "
              f"{result.sentences_per_second:.1f} sentences/s)")
    return 0


def _report_skipped(num: int, skipped) -> None:
    if num:
        first = "; ".join(f"{w}: {r}" for w, r in list(skipped)[:5])
        print(f"skipped {num} records: {first}{' ...' if num > 5 else ''}", file=sys.stderr)


def _print_summary(args, s: EmbedSummary) -> int:
    _report_skipped(s.num_skipped, s.skipped)
    if s.embeddings is not None:
        from .sentence_encoder import cosine_similarity

        emb, sentences = s.embeddings, s.texts
        sim = cosine_similarity(emb)
        if args.json:
            print(json.dumps({"model": args.model, "quantize": args.quantize, "sentences": sentences, "shape": list(emb.shape),
                              "similarity": sim.round(6).tolist(), "embeddings": emb.tolist()}))
            return 0
        print(f"model: {_shown(args.model)}{'' if args.quantize is None else ' (' + args.quantize + ')'}")
        print(f"embeddings: shape {emb.shape}, dtype {emb.dtype}")
        print("cosine similarity:")
        short = [_short(t, 40) for t in sentences]
        width = max(len(t) for t in short)
        for i, t in enumerate(short):
            row = " ".join(f"{x:6.3f}" for x in sim[i])
            print(f"  [{i}] {t:<{width}}  {row}")
        with np.printoptions(precision=4, suppress=True):
            print(f"first embedding, first 8 values: {emb[0, :8]}")
        return 0
    rate = s.count / s.seconds if s.seconds > 0 else float("nan")
    if args.json:
        print(json.dumps({"model": args.model, "quantize": args.quantize, "count": s.count, "shape": [s.count, s.dim],
                          "mean_cosine": round(s.mean_cosine, 6), "seconds": round(s.seconds, 3),
                          "sentences_per_second": round(rate, 1)}))
        return 0
    print(f"model: {_shown(args.model)}{'' if args.quantize is None else ' (' + args.quantize + ')'}")
    print(f"embedded {s.count} sentences (dim {s.dim}) in {s.seconds:.1f} s ({rate:.1f} sentences/s)")
    print(f"mean cosine similarity over all pairs: {s.mean_cosine:.4f}")
    print("the similarity matrix is printed for up to 20 sentences; --out FILE.npy or FILE.parquet saves the "
          "embeddings, and `search --index FILE` queries them")
    return 0


def run_search(args) -> int:
    """``python -m transformer_core search``: see ``__main__``."""
    _check_paths_given(index=args.index)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TextsMissingWarning)
        results = search(args.index, args.queries, args.k, model=args.model, allow_incomplete=args.allow_incomplete)
    missing = False  # the texts file is gone or cut: the hits are "(text missing)", not "(text not stored)"
    for w in caught:
        if issubclass(w.category, TextsMissingWarning):
            missing = True
            print(f"transformer_core search: warning: {w.message}", file=sys.stderr)
        else:  # another's warning, shown as it would have been
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if args.json:
        print(json.dumps([{"query": q, "hits": [dataclasses.asdict(h) for h in hits]}
                          for q, hits in zip(args.queries, results)], ensure_ascii=False))
        return 0
    for qi, (q, hits) in enumerate(zip(args.queries, results)):
        if qi:
            print()
        print(f"query: {q}")
        for rank, h in enumerate(hits, 1):
            text = _short(h.text, 100) if h.text is not None else "(text missing)" if missing else "(text not stored)"
            print(f"  {rank:>2}. {h.score:7.4f}  [{h.id}] {text}")
    return 0
