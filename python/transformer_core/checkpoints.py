"""Checkpoints of a causal LM, read and written without torch: reading (config, weights) from a
Hugging Face directory (``config.json`` + safetensors) or a GGUF file, and writing a directory's
files so that none is ever half-written (:func:`write_files_atomically`, which every
``save_pretrained`` goes through)."""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

import numpy as np

from ._validation import resolve_dtype
from .hub import load_safetensors, read_config, resolve_model_path

__all__ = ["load_llama_checkpoint", "write_files_atomically", "save_pretrained_files"]


def load_llama_checkpoint(name_or_path, dtype=np.float32):
    """``(LlamaConfig, state dict, source)`` of a Llama checkpoint: a Hugging Face directory, a
    ``.gguf`` file, or the name of an embedded model (``"SmolLM2-135M-Instruct"``).

    The state dict holds numpy arrays of ``dtype`` under Hugging Face's ``LlamaForCausalLM`` names
    (GGUF blocks dequantized, q/k rows back in Hugging Face's order); ``source`` is a
    :class:`~transformer_core.gguf_file.GGUFCheckpoint` or the directory's path.

    Raises:
        FileNotFoundError: nothing at ``name_or_path``.
        ValueError: an unsupported or malformed checkpoint, naming the file.
    """
    from .llama import LlamaConfig

    dtype = resolve_dtype(dtype)
    location = resolve_model_path(name_or_path)
    if location.is_file():
        from .gguf_file import read_gguf

        checkpoint = read_gguf(location)
        return LlamaConfig.from_dict(checkpoint.config), checkpoint.state_dict(dtype), checkpoint
    config = LlamaConfig.from_dict(read_config(location))
    return config, load_safetensors(location, dtype), location


def _write_error(path: Path, error: BaseException) -> OSError:
    """The OSError that names ``path`` for a failed write (``error``'s errno kept when it has one:
    ENOSPC for a full disk, EFBIG past a file-size limit)."""
    if isinstance(error, OSError) and error.errno is not None:
        return OSError(error.errno, f"cannot write {path.name} ({error.strerror})", str(path))
    return OSError(f"{path}: cannot write the file ({type(error).__name__}: {error})")


def write_files_atomically(directory, files) -> None:
    """Writes files into ``directory`` so that no reader ever sees one half-written, and a failure
    while writing leaves the folder as it was.

    Each file is written whole under a temporary name in ``directory`` (``.{name}.{random}.tmp``:
    the same folder, so the rename below stays on one file system), flushed to disk, and only when
    every one is written are they moved into place with ``os.replace`` (atomic per file), in the
    order given: put last the file a reader looks at first (``config.json`` after the weights).
    On a failure every temporary is removed.

    Args:
        directory: the folder, created with its parents if missing.
        files: ``(file name, write)`` pairs, in order: ``write(path: str)`` writes the whole file at
            ``path`` (e.g. ``lambda p: safetensors.numpy.save_file(state, p)``).

    Raises:
        OSError: naming the file that could not be written (a full disk, a file-size limit, no
            permission; the original error chained, its errno kept); the folder holds what it held
            before (a folder created here stays, empty) and no temporary. A failure of the final renames themselves (rare: a rename inside one
            folder) can leave the files renamed before it replaced.
        IsADirectoryError (an OSError): a folder stands where one of the files goes (before anything
            is written).
        TypeError: ``directory`` not a str or path.
        ValueError: a file name that is not a plain name inside the folder, or one given twice.
    """
    from safetensors import SafetensorError

    if not isinstance(directory, (str, os.PathLike)) or isinstance(os.fspath(directory), bytes):
        raise TypeError(f"directory: expected a str or path, got {type(directory).__name__}")
    path = Path(directory)
    files = list(files)
    names = [name for name, _ in files]
    for name in names:
        if not isinstance(name, str) or not name or name in (".", "..") or Path(name).name != name:
            raise ValueError(f"files: expected plain file names inside {path}, got {name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"files: expected each file once, got {names}")
    for name in names:  # a folder in a file's place would fail its rename after earlier files moved in
        if (path / name).is_dir():
            raise IsADirectoryError(errno.EISDIR, f"cannot write {name}: a folder of that name is in the way "
                                    f"(nothing written)", str(path / name))
    path.mkdir(parents=True, exist_ok=True)
    written = []  # (temporary, final)
    try:
        for name, write in files:
            final = path / name
            temporary = path / f".{name}.{secrets.token_hex(6)}.tmp"
            try:
                # created here (O_EXCL: never someone else's file), with the umask's usual permissions
                os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                written.append((temporary, final))
                write(str(temporary))
                fd = os.open(temporary, os.O_RDWR)
                try:
                    os.fsync(fd)  # the data is on disk before the rename makes it the file
                finally:
                    os.close(fd)
            except (OSError, SafetensorError) as e:
                raise _write_error(final, e) from e
        for temporary, final in written:
            try:
                os.replace(temporary, final)
            except OSError as e:
                raise _write_error(final, e) from e
    except BaseException:
        for temporary, _ in written:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass  # already renamed into place
            except OSError:
                pass  # best effort: the error being raised says what went wrong
        raise
    if hasattr(os, "O_DIRECTORY"):  # the renames themselves on disk (POSIX); best effort
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass


def save_pretrained_files(directory, config: dict, state: dict, metadata: dict | None = None) -> None:
    """Writes a Hugging Face model directory: ``model.safetensors`` (``state``, name -> C-contiguous
    array, with ``metadata`` in its header; default ``{"format": "np"}``) and ``config.json``
    (``config``), through :func:`write_files_atomically`: the weights first, ``config.json`` last,
    so that a failed save leaves the old pair (or nothing) and never a new config beside old weights.

    Raises:
        OSError: a file cannot be written (named; the folder keeps its old files).
        TypeError: ``config`` not JSON-serializable (before anything is written).
    """
    import json

    from safetensors.numpy import save_file

    text = json.dumps(config, indent=2) + "\n"  # a config that cannot be written fails before any file
    metadata = {"format": "np"} if metadata is None else metadata
    write_files_atomically(directory, [
        ("model.safetensors", lambda p: save_file(state, p, metadata=metadata)),
        ("config.json", lambda p: Path(p).write_text(text, encoding="utf-8")),
    ])
