"""Checkpoints of a causal LM, read and written without torch: reading (config, weights) from a
Hugging Face directory (``config.json`` + safetensors) or a GGUF file, reading a config dict so
that its errors name the file it came from (:func:`config_from_file`, for every model's
``from_pretrained``), and writing a directory's files so that none is ever half-written
(:func:`write_files_atomically`, which every ``save_pretrained`` goes through)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from pathlib import Path

import numpy as np

from ._validation import resolve_dtype, type_path
from .hub import (
    SAVE_IN_PROGRESS,
    expand_home,
    read_config,
    resolve_model_dir,
    resolve_model_path,
    save_safetensors,
    stored_tensors,
)
from .module import deferred_interrupts

__all__ = ["load_llama_checkpoint", "config_from_file", "build_for_checkpoint", "write_files_atomically", "save_pretrained_files",
           "json_value"]


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
    config, state, source = _llama_checkpoint(name_or_path, dtype)
    return config, {name: np.asarray(value) for name, value in state.items()}, source


def _llama_checkpoint(name_or_path, dtype):
    """:func:`load_llama_checkpoint`, whose state dict holds, for a directory,
    :class:`~transformer_core.hub.StoredTensor` values, read when loaded (one at a time, into the
    model built for them: :func:`~transformer_core.hub.load_weights_into`)."""
    from .llama import LlamaConfig

    dtype = resolve_dtype(dtype)
    location = resolve_model_path(name_or_path)
    if location.is_file():
        from .gguf_file import read_gguf

        checkpoint = read_gguf(location)
        return config_from_file(LlamaConfig, checkpoint.config, location), checkpoint.state_dict(dtype), checkpoint
    resolve_model_dir(name_or_path)  # a folder without config.json: named as name_or_path
    config = config_from_file(LlamaConfig, read_config(location), location / "config.json")
    return config, stored_tensors(location, dtype), location


#: How the safetensors writer (Rust) reports the OS error under its SafetensorError, which has no
#: errno attribute: "... I/O error: File too large (os error 27)".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (PEP 678; Python 3.11+). On Python 3.10, which has no
    ``add_note``, the note is appended to ``error.__notes__`` (the attribute PEP 678 defines, which
    3.10's traceback does not print) and to the message of an ``OSError``'s ``strerror``, so that
    the recovery it describes is seen."""
    if hasattr(error, "add_note"):
        error.add_note(note)
        return
    error.__notes__ = [*getattr(error, "__notes__", []), note]
    if isinstance(error, OSError) and error.strerror is not None:
        error.strerror = f"{error.strerror}; {note}"


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


def _keep_previous(final: Path, backup: Path) -> bool:
    """Keeps the file (or symbolic link) at ``final`` under the name ``backup`` in the same folder
    without changing ``final``: a hard link (no data copied; for a symbolic link, a link to the
    link itself). False where the file system or its rules refuse the link (FAT, some network and
    FUSE file systems; Linux's protected_hardlinks for a file of another user): the caller then
    renames the previous file aside right before its replacement, which needs no more than the
    folder's write permission and no space. FileNotFoundError: ``final`` is gone (a concurrent
    save moved it)."""
    try:
        os.link(final, backup, follow_symlinks=False)
    except FileNotFoundError:
        raise
    except (OSError, NotImplementedError):
        return False
    return True


def _restore(changed: list, kept: dict) -> list:
    """Undoes the renames of a failed :func:`write_files_atomically`, last first: each name in
    ``changed`` gets its previous file back from its backup in ``kept`` (``os.replace``, atomic),
    or is removed when it had none. Returns ``[(name, backup or None, error)]`` for what could not
    be undone (its backup, if any, is then left in place)."""
    failed = []
    for final in reversed(changed):
        backup = kept.get(final)
        try:
            if backup is None:
                os.unlink(final)
            else:
                os.replace(backup, final)
                del kept[final]
        except OSError as e:
            failed.append((final, backup, e))
    return failed


def _fsync_folder(path: Path) -> None:
    """Flushes the folder's entries (the renames) to disk, where the OS allows it (POSIX); best effort."""
    _sync_entries(path)


def _sync_entries(path: Path) -> None:
    """:func:`_fsync_folder`'s work (also for the marker of :func:`_write_marker`)."""
    if hasattr(os, "O_DIRECTORY"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass


#: The hidden files a :data:`~transformer_core.hub.SAVE_IN_PROGRESS` marker names: a backup's line
#: ``{name} <- {backup}``, a temporary's ``{temporary}: the new {name} ...``.
_MARKER_FILES = re.compile(r"^(?:[^\n]+ <- (?P<backup>\.[^/\n]+\.[0-9a-f]{12}\.bak)"
                           r"|(?P<temporary>\.[^/\n]+\.[0-9a-f]{12}\.tmp): the new [^\n]*)$", re.MULTILINE)


def _marker_text(lines: list, earlier: str | None) -> str:
    """The text of the marker that :func:`write_files_atomically` leaves during its renames: what
    happened, how to go on, then one line per name: ``{name} <- {backup}`` (the previous file) or
    ``{name}: remove (...)`` (no previous file), and one per temporary; an ``earlier`` marker's
    text (a save that was interrupted before this one) follows."""
    text = ("A save into this folder was interrupted during its final renames (transformer_core's "
            "write_files_atomically): its files may be a mix of two saves.\n"
            "To go on: save into this folder again, or restore the previous files: rename each backup below over "
            "its name (a backup that is not there was not made yet: its name still holds the previous file), "
            "remove each name marked 'remove', then delete this file.\n" + "".join(f"{line}\n" for line in lines))
    if earlier is not None:
        text += "\nThe folder already held the files of an earlier interrupted save; its marker said:\n" + earlier
    return text


def _write_marker(marker: Path, text: str) -> None:
    """Writes ``text`` into ``marker`` and flushes it and its folder entry to disk (it must be there
    before the first rename it warns of). Written under a temporary name, then renamed over it: a
    kill while it is written leaves the marker it replaces whole (an earlier save's list)."""
    temporary = marker.with_name(f"{marker.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.rename(temporary, marker)  # POSIX: over the old marker, atomically (os.replace is the files')
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_entries(marker.parent)


def _read_marker(marker: Path) -> str | None:
    """The text of an interrupted save's marker, None without one ("" if unreadable)."""
    if not os.path.lexists(marker):
        return None
    try:
        return marker.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def write_files_atomically(directory, files, remove=()) -> None:
    """Writes files into ``directory`` so that no reader ever sees one half-written, and a failure
    leaves the folder's files as they were.

    1. Each file is written whole under a temporary name in ``directory`` (``.{name}.{random}.tmp``:
       the same folder, so the renames below stay on one file system) and flushed to disk.
    2. Each file that one of them will replace is kept under a backup name,
       ``.{name}.{random}.bak``: a hard link to it (no data copied; the name never misses a file).
       Where the file system refuses the link, the previous file is instead renamed to that name
       right before its replacement in step 3 (no data copied either; the name is missing between
       the two renames).
    3. A marker, ``.save-in-progress`` (:data:`~transformer_core.hub.SAVE_IN_PROGRESS`), is
       written and flushed to disk: it lists each name with its backup (``{name} <- {backup}``) or
       as new (``{name}: remove ...``). Then the files named in ``remove`` are moved aside (renamed
       to such a backup name), and the new files are moved into place with ``os.replace`` (atomic
       per file) in the order given: put last the file a reader looks at first (``config.json``
       after the weights).
    4. When every rename is done and on disk, the marker is removed (and that removal flushed),
       then the backups are deleted (also if an exception such as KeyboardInterrupt arrives while
       the folder is flushed: the new set is then whole). So a marker on disk always lists backups
       that are there, bar those not made yet; a marker that cannot be removed keeps its backups
       (an OSError says to delete it). A kill between the marker's removal and the backups' leaves
       those ``.bak`` files, listed nowhere, beside the whole new set (as large as the files they
       kept; delete them by hand: no later save knows of them).
       The backups and temporaries that an earlier interrupted save's marker lists are deleted
       too: the folder now holds one whole set.

    A file that vanishes meanwhile (a concurrent save's ``remove``) counts as one that was not
    there.

    A failure, or an exception such as KeyboardInterrupt, at any step puts every name that step 3
    changed back to its previous file (``os.replace`` of its backup; a name that had none is
    removed), last first, and removes every temporary and backup: the folder holds exactly the files
    it held before (and the marker is gone). What no exception reaches cannot be undone: a power
    loss or a killed process (SIGKILL) during step 3 leaves the names renamed so far new and the
    others old (for a model: new weights beside the old ``config.json``), with the previous files
    still beside them as ``.{name}.*.bak``, and the marker, which every model's ``from_pretrained``
    refuses to load past (:func:`~transformer_core.hub.resolve_model_dir`). Saving into the folder
    again replaces the mix and removes the marker; or rename each backup the marker lists back over
    its name, remove the names it marks ``remove``, and delete the marker, to get the previous set
    back. The ``.{name}.*.tmp`` files are unfinished new ones, safe to delete. A crash during step 1
    or 2 leaves only such hidden files beside the untouched previous ones (and, for a ``write``
    that makes its own temporary, as ``safetensors.numpy.save_file`` does, ``.tmpXXXXXX``, that
    one too; the package's own saves write into the ``.tmp`` file:
    :func:`~transformer_core.hub.save_safetensors`). A later save does not remove those.

    Args:
        directory: the folder, created with its parents if missing.
        files: ``(file name, write)`` pairs, in order: ``write(path: str)`` writes the whole file at
            ``path`` (e.g. ``lambda p: save_safetensors(state, p)``; a SafetensorError of the
            safetensors library's writer is reported as the OSError it carries).
        remove: file names that the new set must not have (a file an earlier save left that would
            contradict the new ones): removed as part of the same all-or-nothing change (step 3; a
            name not present is skipped).

    Raises:
        OSError: naming the file that could not be written, moved aside, moved into place or removed (a
            full disk, a file-size limit, no permission; the original error chained, its errno kept:
            ENOSPC, EFBIG, ... also when the safetensors writer reported it, in its message); the
            folder holds the files it held before (a folder created here stays, empty), no temporary
            and no backup. Should putting a previous file back fail too (a second I/O error), its
            backup is left in place, and the marker too (the folder is a mix): the error's notes
            (``__notes__``; on Python 3.10, whose tracebacks print no notes, the OSError's message
            too) name them and how to restore the previous files.
        IsADirectoryError (an OSError): a folder stands where one of the files goes, or under a
            name of ``remove`` (before anything is written).
        NotADirectoryError (an OSError): ``directory`` is a file, or lies under one (naming
            ``directory``; nothing is written).
        TypeError: ``directory`` not a str or path.
        ValueError: a file name that is not a plain name inside the folder, or one given twice
            (in ``files`` and ``remove`` together), or the marker's name.
    """
    from safetensors import SafetensorError

    if not isinstance(directory, (str, os.PathLike)) or isinstance(os.fspath(directory), bytes):
        raise TypeError(f"directory: expected a str or path, got {type(directory).__name__}")
    path = Path(directory)
    files = list(files)
    if not isinstance(remove, (list, tuple)):
        raise TypeError(f"remove: expected a list or tuple of file names, got {type(remove).__name__}")
    remove = list(remove)
    names = [name for name, _ in files]
    for argument, given in (("files", names), ("remove", remove)):
        for name in given:
            if (not isinstance(name, str) or not name or name in (".", "..", SAVE_IN_PROGRESS)
                    or Path(name).name != name):
                raise ValueError(f"{argument}: expected plain file names inside {path} (other than "
                                 f"{SAVE_IN_PROGRESS}), got {name!r}")
    if len(set(names + remove)) != len(names) + len(remove):
        raise ValueError(f"files: expected each file once (remove included), got {names} and remove={remove}")
    for name in names + remove:  # a folder in a file's place would fail its rename after earlier files moved in
        if (path / name).is_dir():
            raise IsADirectoryError(errno.EISDIR, f"cannot write {name}: a folder of that name is in the way "
                                    f"(nothing written)", str(path / name))
    try:
        path.mkdir(parents=True, exist_ok=True)  # the first change made: it fails before creating anything
    except (FileExistsError, NotADirectoryError) as e:  # a file where the folder (or one above it) goes
        raise _not_a_folder(path) from e
    written = []  # (temporary, final): every temporary created
    kept = {}  # final -> its backup: the previous file of that name, until the new set is in place
    changed = []  # the names step 3 has changed (renamed into place, or moved aside), in order
    marker = path / SAVE_IN_PROGRESS
    earlier = _read_marker(marker)  # an interrupted save's marker: the folder is a mix already
    marked = False  # whether this save has (begun to) put its marker in place
    try:
        for name, write in files:  # 1. the temporaries
            final = path / name
            temporary = path / f".{name}.{secrets.token_hex(6)}.tmp"
            try:
                # created here (O_EXCL: never someone else's file), with the umask's usual permissions
                with deferred_interrupts():  # the file and its record for the rollback, together
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
        aside = {}  # final -> the backup name its previous file is renamed to in step 3 (no hard link)
        for _, final in written:  # 2. the backups of the files about to be replaced
            if os.path.lexists(final):
                backup = path / f".{final.name}.{secrets.token_hex(6)}.bak"
                with deferred_interrupts():  # the link and its record for the rollback, together
                    try:
                        linked = _keep_previous(final, backup)
                    except FileNotFoundError:
                        continue  # gone meanwhile: nothing to keep
                    if linked:
                        kept[final] = backup
                    else:
                        aside[final] = backup

        def move_aside(final: Path, backup: Path, what: str) -> None:
            """Renames ``final`` to ``backup`` (recorded in ``kept`` and ``changed``, so a failure
            puts it back); a file gone meanwhile is skipped. OSError: ``cannot {what} (...)``."""
            with deferred_interrupts():  # the rename and its record for the rollback, together
                try:
                    os.replace(final, backup)
                except FileNotFoundError:
                    return  # gone meanwhile: nothing to put back
                except OSError as e:
                    raise OSError(e.errno, f"cannot {what} ({e.strerror})", str(final)) from e
                kept[final] = backup
                changed.append(final)

        moved = [(path / name, path / f".{name}.{secrets.token_hex(6)}.bak") for name in remove
                 if os.path.lexists(path / name)]
        lines = [f"{final.name} <- {backup.name}" for final, backup in moved]
        for _, final in written:
            backup = kept.get(final, aside.get(final))
            lines.append(f"{final.name} <- {backup.name}" if backup is not None
                         else f"{final.name}: remove (the previous files had no such file)")
        lines += [f"{temporary.name}: the new {final.name} until its rename (delete it)" for temporary, final in written]
        marked = True  # 3. the marker, on disk before the first rename ...
        try:
            _write_marker(marker, _marker_text(lines, earlier))
        except OSError as e:
            raise OSError(e.errno, f"cannot write {SAVE_IN_PROGRESS} ({e.strerror})", str(marker)) from e
        for final, backup in moved:  # ... the renames: first what goes (moved aside: its own backup) ...
            move_aside(final, backup, f"remove the earlier save's {final.name}")
        for temporary, final in written:  # ... then the new files, in their order
            if final in aside:  # the previous file, not linked: renamed to its backup name first
                move_aside(final, aside[final], f"move the previous {final.name} aside")
            with deferred_interrupts():  # the rename and its record for the rollback, together
                try:
                    os.replace(temporary, final)
                except OSError as e:
                    raise _write_error(final, e) from e
                if final not in changed:
                    changed.append(final)
    except BaseException as error:
        failed = _restore(changed, kept)
        for final, backup, e in failed:
            if backup is None:
                _add_note(error, f"could not remove the new {final} ({e}); the folder had no such file before")
            else:
                _add_note(error, f"could not put the previous {final.name} back ({e}): it is kept as "
                                 f"{backup}; rename it to {final} to restore the previous files")
        for leftover in [temporary for temporary, _ in written] + [b for f, b in kept.items() if f not in changed]:
            try:
                os.unlink(leftover)
            except OSError:
                pass  # already renamed into place, never created; best effort otherwise
        if marked and failed:  # the folder is a mix: the marker stays, and loads refuse it
            _add_note(error, f"{marker} stays (the folder's files are a mix of two saves, which "
                             f"from_pretrained refuses): delete it once the previous files are restored, or save again")
        elif marked:  # the folder as it was: with the earlier marker it had, or none
            try:
                if earlier is None:
                    os.unlink(marker)
                else:
                    _write_marker(marker, earlier)
            except OSError:
                pass  # best effort: a marker left refuses loads, never lets a mix through
        raise
    try:
        _fsync_folder(path)  # the renames on disk before the backups go
    finally:
        stale = [path / (m["backup"] or m["temporary"]) for m in _MARKER_FILES.finditer(earlier or "")
                 if (m["backup"] or m["temporary"]) not in names]
        unmarked = None
        try:
            os.unlink(marker)  # 4. the new set is in place: first the marker, so that it never
            _sync_entries(path)  # outlives the backups it lists (its advice would rebuild a mix)
        except FileNotFoundError:
            pass
        except OSError as e:  # loads would refuse the whole new set: said, not hidden
            unmarked = OSError(e.errno, f"the new files are in place, but {SAVE_IN_PROGRESS} could not be removed "
                               f"({e.strerror}): delete it", str(marker))
        if unmarked is not None:  # the marker stays: so do the backups it lists (its advice restores them)
            raise unmarked
        for backup in [*kept.values(), *stale]:  # then the backups
            try:
                os.unlink(backup)
            except OSError:
                pass  # best effort: a hidden file left behind, the save itself is whole


def json_value(value, name: str, _active: frozenset = frozenset()):
    """A copy of ``value`` that ``json.dumps`` writes (for a ``config.json`` or
    ``generation_config.json``): numpy scalars as Python values (as
    :func:`~transformer_core._validation.hf_config_fields` converts a config's fields), tuples as
    lists, dicts and lists copied with their items converted; str, int, float, bool and None as
    they are.

    Raises:
        TypeError: anything else (an array, a set, an object), or a dict key other than a str, int,
            float, bool or None, naming where it is: ``name``, then ``[key]`` / ``[index]`` down to it
            (``config.extra['x']: expected a JSON value (str, int, float, bool, None, list, dict), got
            numpy.ndarray``).
        ValueError: a list or dict that contains itself, naming where.
    """
    if isinstance(value, np.generic):
        value = value.item()  # np.float32(0.1) -> 0.1; what is left (a complex, a datetime) is checked below
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return value
    if isinstance(value, (list, tuple, dict)):
        if id(value) in _active:
            raise ValueError(f"{name}: a value that contains itself (JSON cannot write it)")
        _active = _active | {id(value)}
    if isinstance(value, (list, tuple)):
        return [json_value(v, f"{name}[{i}]", _active) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if isinstance(key, np.generic):
                key = key.item()
            if not (key is None or isinstance(key, (str, int, float))):
                raise TypeError(f"{name}: expected JSON object keys (str, int, float, bool, None), got the key "
                                f"{key!r} of type {type_path(key)}")
            out[key] = json_value(v, f"{name}[{key!r}]", _active)
        return out
    raise TypeError(f"{name}: expected a JSON value (str, int, float, bool, None, list, dict), got {type_path(value)}")


def save_directory(directory):
    """``directory`` to save into, its leading ``~`` expanded; one that is not a str or path is
    returned as it is (:func:`write_files_atomically` names it in its TypeError).

    Raises:
        ValueError: ``directory`` empty or blank (it would name the current directory) or holding
            a NUL character (no path can), naming ``directory``.
        FileNotFoundError: a ``~user`` of no known user, naming ``directory``.
    """
    if isinstance(directory, (str, os.PathLike)) and not isinstance(os.fspath(directory), bytes):
        text = os.fspath(directory)
        if not text.strip() or "\0" in text:
            why = ("it holds a NUL character, which no path can" if "\0" in text
                   else "an empty or blank path would name the current directory")
            raise ValueError(f"directory: expected a folder path, got {text[:200]!r} ({why}; nothing written)")
        return expand_home(directory, "directory")
    return directory


def save_pretrained_files(directory, config: dict, state: dict, metadata: dict | None = None,
                          generation_config: dict | None = None) -> None:
    """Writes a Hugging Face model directory: ``model.safetensors`` (``state``, name -> numpy array
    or :class:`~transformer_core.hub.LazyTensor`, written one tensor at a time by
    :func:`~transformer_core.hub.save_safetensors`, with ``metadata`` in its header; default ``{"format": "pt"}``, what transformers' own save
    writes and transformers 4's loader requires, the tensors being plain arrays either way),
    ``generation_config.json`` (``generation_config``, when given) and ``config.json``
    (``config``), through :func:`write_files_atomically`: the weights first, ``config.json``
    last. An earlier sharded save's ``model.safetensors.index.json`` and its shard files go
    in the same step (they would be stale weights beside the new ones). A save that fails
    (a full disk, a file-size limit, one of the final renames, a KeyboardInterrupt) leaves the
    folder's previous files as they were, or no file in a folder that had none: never new weights
    beside an old config or the reverse. Without a ``generation_config``, a
    ``generation_config.json`` left by an earlier save is removed in the same all-or-nothing change
    (it would give the new model the old one's end ids; a failed save puts it back). Only what no
    exception reaches, a power loss or a killed process during the final renames, or a second I/O
    error while the previous files are put back (the error's notes say which), can leave a mixed
    set: the previous files are then beside it as hidden ``.{name}.*.bak`` files, with a
    ``.save-in-progress`` marker that makes every ``from_pretrained`` refuse the folder until it
    is saved into again (see :func:`write_files_atomically`).
    A leading ``~`` of ``directory`` is expanded to the home directory, as ``from_pretrained``
    does (``save_pretrained("~/m")`` writes ``$HOME/m``, which ``from_pretrained("~/m")`` reads).

    Raises:
        OSError: a file cannot be written, moved into place or removed (named, with its errno;
            the folder keeps its old files).
        FileNotFoundError (an OSError): a ``~user`` of no known user, naming ``directory`` (nothing
            written).
        NotADirectoryError (an OSError): ``directory`` is a file, or lies under one (naming
            ``directory``; nothing written).
        TypeError: a value of ``config`` or ``generation_config`` that JSON cannot write (an array,
            a set, an object; numpy scalars are written as Python numbers), naming it
            (``generation_config['eos_token_id']``, :func:`json_value`), before anything is
            written; ``directory`` not a str or path.
        ValueError: such a value that contains itself (a dict holding itself), naming it;
            ``directory`` empty or blank (it would name the current directory) or holding a NUL
            character (no path can), before anything is written.
    """
    import json

    directory = save_directory(directory)

    # a config that cannot be written fails before any file, naming the value
    text = json.dumps(json_value(config, "config"), indent=2) + "\n"
    generation = (json.dumps(json_value(generation_config, "generation_config"), indent=2) + "\n"
                  if generation_config is not None else None)
    metadata = {"format": "pt"} if metadata is None else metadata
    files = [("model.safetensors", lambda p: save_safetensors(state, p, metadata))]
    if generation is not None:
        files.append(("generation_config.json", lambda p: Path(p).write_text(generation, encoding="utf-8")))
    files.append(("config.json", lambda p: Path(p).write_text(text, encoding="utf-8")))
    remove = ["generation_config.json"] if generation is None else []
    write_files_atomically(directory, files, remove=remove + _earlier_shards(directory))


def _earlier_shards(directory) -> list[str]:
    """``model.safetensors.index.json`` of an earlier sharded save in ``directory`` and the shards
    it lists that are transformers' shard files (``model-00001-of-00003.safetensors``, regular
    files or links in the folder; other names the index lists are left alone, as transformers' own
    save leaves them); [] without an index. An index that cannot be read: the index alone (the new
    ``model.safetensors`` is what loaders read first)."""
    import json

    if not isinstance(directory, (str, os.PathLike)):
        return []  # write_files_atomically names the wrong type
    folder = Path(directory)
    index = folder / "model.safetensors.index.json"
    try:
        if not index.is_file():
            return []
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, RecursionError, AttributeError):  # unreadable, not JSON, too deep, not an object
        return [index.name]
    names = weight_map.values() if isinstance(weight_map, dict) else ()
    shards = {n for n in names if isinstance(n, str) and _SHARD_NAME.fullmatch(n)}
    return [index.name, *sorted(n for n in shards if (folder / n).is_symlink() or (folder / n).is_file())]


#: transformers' name of a weights shard (``save_pretrained(max_shard_size=...)``).
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
