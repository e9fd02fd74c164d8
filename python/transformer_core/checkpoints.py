"""Checkpoints of a causal LM, read and written without torch: reading (config, weights) from a
Hugging Face directory (``config.json`` + safetensors) or a GGUF file, reading a config dict so
that its errors name the file it came from (:func:`config_from_file`, for every model's
``from_pretrained``), and writing a directory's files so that none is ever half-written
(:func:`write_files_atomically`, which every ``save_pretrained`` goes through)."""

from __future__ import annotations

import errno
import os
import re
import secrets
from pathlib import Path

import numpy as np

from ._validation import resolve_dtype
from .hub import expand_home, load_safetensors, read_config, resolve_model_path

__all__ = ["load_llama_checkpoint", "config_from_file", "build_for_checkpoint", "write_files_atomically", "save_pretrained_files"]


def config_from_file(config_class, config: dict, path):
    """``config_class.from_dict(config)`` for a config read from the file ``path`` (a model
    directory's ``config.json``, or a ``.gguf`` file), its errors naming that file.

    Raises:
        ValueError: ``"{path}: {what from_dict said}"`` for any TypeError or ValueError of
            ``from_dict`` (a field of the wrong type or out of range, an unsupported option): the
            file's content is wrong, not an argument of the caller, so a wrong type is a ValueError
            here as every other malformed file; the original error is chained.
    """
    try:
        return config_class.from_dict(config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {str(e).removeprefix('config.json: ')}") from e


def build_for_checkpoint(cls, config, dtype, path, **options):
    """``cls(config, dtype=dtype, **options)`` without its random initialisation (every weight is
    loaded next), for a config read from the file ``path``, its errors naming that file.

    Raises:
        ValueError: ``"{path}: {what the model said}"``: sizes the model refuses together
            (``hidden_size`` not a multiple of the heads, say), which the config's own checks let
            through; the original error is chained.
    """
    from .module import skip_weight_init

    try:
        with skip_weight_init():
            return cls(config, dtype=dtype, **options)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def load_llama_checkpoint(name_or_path, dtype=np.float32):
    """``(LlamaConfig, state dict, source)`` of a Llama checkpoint: a Hugging Face directory, a
    ``.gguf`` file, or the name of an embedded model (``"SmolLM2-135M-Instruct"``).

    The state dict holds numpy arrays of ``dtype`` under Hugging Face's ``LlamaForCausalLM`` names
    (GGUF blocks dequantized, q/k rows back in Hugging Face's order); ``source`` is a
    :class:`~transformer_core.gguf_file.GGUFCheckpoint` or the directory's path.

    Raises:
        FileNotFoundError: nothing at ``name_or_path``.
        ValueError: an unsupported or malformed checkpoint, naming the file (a config field of the
            wrong type or out of range too: :func:`config_from_file`).
    """
    from .llama import LlamaConfig

    dtype = resolve_dtype(dtype)
    location = resolve_model_path(name_or_path)
    if location.is_file():
        from .gguf_file import read_gguf

        checkpoint = read_gguf(location)
        return config_from_file(LlamaConfig, checkpoint.config, location), checkpoint.state_dict(dtype), checkpoint
    config = config_from_file(LlamaConfig, read_config(location), location / "config.json")
    return config, load_safetensors(location, dtype), location


#: How the safetensors writer (Rust) reports the OS error under its SafetensorError, which has no
#: errno attribute: "... I/O error: File too large (os error 27)".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _write_error(path: Path, error: BaseException) -> OSError:
    """The OSError that names ``path`` for a failed write, with ``error``'s errno (ENOSPC for a
    full disk, EFBIG past a file-size limit): an OSError's own, or the ``(os error N)`` that the
    safetensors writer's SafetensorError message carries."""
    if isinstance(error, OSError) and error.errno is not None:
        return OSError(error.errno, f"cannot write {path.name} ({error.strerror})", str(path))
    found = _RUST_OS_ERROR.search(str(error))
    if found:
        code = int(found.group(1))
        return OSError(code, f"cannot write {path.name} ({os.strerror(code)}; {type(error).__name__}: {error})",
                       str(path))
    return OSError(f"{path}: cannot write the file ({type(error).__name__}: {error})")


def _not_a_folder(path: Path) -> NotADirectoryError:
    """The error for a ``directory`` that cannot be a folder: ``path`` itself, or the nearest folder
    above it that exists, is a file (or anything else that is not a folder)."""
    blocker = next((p for p in (path, *path.parents) if p.exists() or p.is_symlink()), path)
    is_file = blocker.is_file()
    if blocker == path:
        what = "a file" if is_file else "something that is not a folder"
    else:
        what = f"a path under {blocker}, which is {'a file' if is_file else 'not a folder'}"
    return NotADirectoryError(errno.ENOTDIR, f"directory: expected a folder (or a path where one can be made), got "
                              f"{what} (nothing written)", str(path))


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
            permission; the original error chained, its errno kept: ENOSPC, EFBIG, ... also when
            the safetensors writer reported it, in its message); the folder holds what it held
            before (a folder created here stays, empty) and no temporary. A failure of the final renames themselves (rare: a rename inside one
            folder) can leave the files renamed before it replaced.
        IsADirectoryError (an OSError): a folder stands where one of the files goes (before anything
            is written).
        NotADirectoryError (an OSError): ``directory`` is a file, or lies under one (naming
            ``directory``; nothing is written).
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
    try:
        path.mkdir(parents=True, exist_ok=True)  # the first change made: it fails before creating anything
    except (FileExistsError, NotADirectoryError) as e:  # a file where the folder (or one above it) goes
        raise _not_a_folder(path) from e
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


def save_pretrained_files(directory, config: dict, state: dict, metadata: dict | None = None,
                          generation_config: dict | None = None) -> None:
    """Writes a Hugging Face model directory: ``model.safetensors`` (``state``, name -> C-contiguous
    array, with ``metadata`` in its header; default ``{"format": "np"}``), ``generation_config.json``
    (``generation_config``, when given) and ``config.json`` (``config``), through
    :func:`write_files_atomically`: the weights first, ``config.json`` last, so that a failed save
    leaves the old files (or nothing) and never a new config beside old weights. Without a
    ``generation_config``, a ``generation_config.json`` left by an earlier save is removed after
    the new files are in place (it would give the new model the old one's end ids).
    A leading ``~`` of ``directory`` is expanded to the home directory, as ``from_pretrained``
    does (``save_pretrained("~/m")`` writes ``$HOME/m``, which ``from_pretrained("~/m")`` reads).

    Raises:
        OSError: a file cannot be written (named, with its errno; the folder keeps its old files).
        FileNotFoundError (an OSError): a ``~user`` of no known user, naming ``directory`` (nothing
            written).
        NotADirectoryError (an OSError): ``directory`` is a file, or lies under one (naming
            ``directory``; nothing written).
        TypeError: ``config`` or ``generation_config`` not JSON-serializable (before anything is
            written); ``directory`` not a str or path.
    """
    import json

    from safetensors.numpy import save_file

    if isinstance(directory, (str, os.PathLike)) and not isinstance(os.fspath(directory), bytes):
        directory = expand_home(directory, "directory")  # else write_files_atomically's TypeError

    text = json.dumps(config, indent=2) + "\n"  # a config that cannot be written fails before any file
    generation = json.dumps(generation_config, indent=2) + "\n" if generation_config is not None else None
    metadata = {"format": "np"} if metadata is None else metadata
    files = [("model.safetensors", lambda p: save_file(state, p, metadata=metadata))]
    if generation is not None:
        files.append(("generation_config.json", lambda p: Path(p).write_text(generation, encoding="utf-8")))
    files.append(("config.json", lambda p: Path(p).write_text(text, encoding="utf-8")))
    write_files_atomically(directory, files)
    if generation is None:
        stale = Path(directory) / "generation_config.json"
        try:
            stale.unlink(missing_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"{stale}: cannot remove the earlier save's file ({e.strerror})") from e
