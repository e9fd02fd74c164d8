"""Checkpoints of training: a model, its optimizer and its learning-rate schedule as safetensors
files (no pickle), under the model's ``state_dict`` names, so that a model trained here loads in
torch (``safetensors.torch.load_file`` + ``load_state_dict``, or ``from_pretrained`` of a directory
written by ``save_pretrained``) and back.

    directory/model.safetensors       the model's weights under the names its save_pretrained writes
                                      (Hugging Face's: GPT-2's "transformer.h.0...", Llama's
                                      "model.layers.0..."), the state of the dropout seeds'
                                      generator (get_rng_state) in its metadata
    directory/optimizer.safetensors   optimizer.state_dict() (see transformer_core.optim)
    directory/scheduler.safetensors   scheduler.state_dict() (see transformer_core.lr_scheduler); for
                                      a list of schedulers chained on the optimizer, each one's
                                      state under "{i}." ("0.last_epoch", "1.last_epoch", ...) and
                                      their number in the metadata key "num_schedulers"

A resumed run (load_checkpoint, then the same calls) is bitwise the uninterrupted one, dropout
included: the generator of the dropout seeds is restored with the weights. For that, the optimizer
must step the model's weights only: a module trained beside the model (a classification head kept
apart from a BertModel) would have its moments saved without its weights, so both functions refuse
such an optimizer (a ValueError naming those parameters) until the module is attached to the model
(``model.head = head``, whose weights ``state_dict`` then holds as ``head.*``). The parameters are
matched by identity, the same C++ weight (a submodule's Parameters are the model's), never by name.

Optimizer moments of weights whose C++ layout is not the checkpoint's (GPT-2's Conv1D weights, stored
transposed; the q/k rows of a Llama model of ``rope_layout="interleaved"``, held in another order)
are written in the checkpoint's layout too, as torch's optimizer would hold them, and read back into
the model's.

A checkpoint is one set: :func:`save_checkpoint` writes its files through
:func:`~transformer_core.checkpoints.write_files_atomically` (a failed save leaves the previous set)
and stamps each with the same random ``checkpoint_id`` in its safetensors metadata;
:func:`load_checkpoint` refuses files of different saves (a model of one save beside the optimizer
of another, copied in by hand or left over from an older save) and accepts files without the stamp
only when none has it (checkpoints written before the stamp existed). It reads and checks every file
before it changes anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from pathlib import Path

import numpy as np

from .checkpoints import save_directory, write_files_atomically
from .hub import _read_header, expand_home, load_safetensors, save_safetensors
from .lr_scheduler import LRScheduler, _check_scheduler_entries
from .module import (
    Module,
    NonFiniteLossError,
    NoTrainingStateError,
    WeightsChangedError,
    _pcg64_of,
    _written_in_checkpoint_layout,
    get_rng_state,
    manual_seed,
    set_rng_state,
)
from .optim import Optimizer, _weight_key

__all__ = ["save_checkpoint", "load_checkpoint", "manual_seed", "NoTrainingStateError", "WeightsChangedError",
           "NonFiniteLossError"]


def _model_weights_of(optimizer: Optimizer, model: Module, action: str) -> dict:
    """``{name in the optimizer: the model's Parameter}`` for every parameter ``optimizer`` steps,
    matched by identity: the same weight (a model's Parameter, or another Parameter object over the
    same C++ weight, e.g. a submodule's), never by name (a separate module's ``"weight"`` is not the
    model's ``"weight"``).

    Raises:
        ValueError: parameters of the optimizer that are not the model's (named as the optimizer
            names them): their state would be saved, or loaded, without their weights, which the
            model file does not hold; ``action`` ends the message (``"nothing was written"``).
    """
    ours = {_weight_key(p): p for _, p in model.named_parameters()}
    weights, foreign = {}, []
    for name, p in optimizer.named_parameters():
        q = ours.get(_weight_key(p))
        if q is None:
            foreign.append(name)
        else:
            weights[name] = q
    if foreign:
        shown = repr(foreign) if len(foreign) <= 10 else f"{foreign[:10]!r} and {len(foreign) - 10} more"
        raise ValueError(
            f"optimizer: it steps parameters {shown} that are not `model`'s ({type(model).__name__}): the "
            "checkpoint holds the model's weights only, so their optimizer state would be saved or restored "
            "without their weights (a resumed run would pair new weights with trained moments); attach their "
            "module to the model (e.g. `model.head = head`) and build the optimizer from model.named_parameters() "
            f"(again, after a module of the model was replaced); {action}")
    return weights


def _relaid(weights: dict) -> dict:
    """``{name in the optimizer: the model's Parameter}`` of :func:`_model_weights_of`'s parameters
    whose ``data`` does not have the checkpoint's layout (``transposed`` or a ``row_permutation``)."""
    return {name: p for name, p in weights.items() if not getattr(p, "checkpoint_layout", True)}


def _optimizer_layout(state: dict, relaid: dict, to_checkpoint: bool) -> dict:
    """``state`` (an optimizer's ``state_dict()``, or one read back) with the per-parameter arrays
    (``state.{name}.{field}``) of the parameters in ``relaid`` (see :func:`_relaid`)
    moved from the model's layout to the checkpoint's (``to_checkpoint``: as views, or lazy copies,
    for :func:`~transformer_core.hub.save_safetensors` to write one at a time,
    :func:`~transformer_core.module._written_in_checkpoint_layout`) or back. An array of another shape is left as
    it is (``Optimizer.load_state_dict`` names it)."""
    out = {}
    for key, value in state.items():
        head, _, rest = key.partition(".")
        name = rest.rpartition(".")[0]
        p = relaid.get(name) if head == "state" else None
        if p is not None:
            value = np.asarray(value)
            ours = p.data.shape
            if to_checkpoint and value.shape == ours:
                value = _written_in_checkpoint_layout(value, p.transposed, p.row_permutation)
            elif not to_checkpoint and value.shape == (ours[::-1] if p.transposed else ours):
                value = p.from_checkpoint_layout(value)
        out[key] = value
    return out


#: The safetensors metadata key that ties the files of one save together (the same random hex in each).
CHECKPOINT_ID_KEY = "checkpoint_id"
#: The model file's metadata key holding get_rng_state() as JSON.
RNG_STATE_KEY = "rng_state"
_FILES = ("model.safetensors", "optimizer.safetensors", "scheduler.safetensors")


#: The scheduler file's metadata key holding the number of schedulers of a save of a list of them
#: (absent from the save of one scheduler, whose state is stored with no prefix).
NUM_SCHEDULERS_KEY = "num_schedulers"


def _schedulers_of(scheduler, optimizer) -> list[LRScheduler]:
    """``scheduler`` (None, an LRScheduler, or a list or tuple of them) as a list, checked: a
    TypeError / ValueError naming ``scheduler`` (``scheduler[i]`` for an entry)."""
    if scheduler is None:
        return []
    if isinstance(scheduler, LRScheduler):
        schedulers, names = [scheduler], ["scheduler"]
    elif isinstance(scheduler, (list, tuple)):
        if not scheduler:
            raise ValueError(f"scheduler: expected at least one scheduler, got an empty {type(scheduler).__name__} "
                             "(pass None for no scheduler)")
        schedulers, names = list(scheduler), [f"scheduler[{i}]" for i in range(len(scheduler))]
    else:
        raise TypeError(f"scheduler: expected a transformer_core.lr_scheduler LRScheduler or None, "
                        f"got {type(scheduler).__name__}; or a list or tuple of LRSchedulers chained on `optimizer`")
    # the learning rates a scheduler sets live in its optimizer's state (param_groups.{i}.lr)
    got = "optimizer=None" if optimizer is None else "a scheduler of another optimizer than `optimizer`"
    _check_scheduler_entries(schedulers, names, optimizer, lambda s: (
        f"expected a scheduler of `optimizer` (the groups' learning rates are saved and restored with the "
        f"optimizer's state), got {got}; pass scheduler.optimizer as optimizer"))
    return schedulers


def _check_arguments(directory, model, optimizer, scheduler, action: str) -> tuple[list[LRScheduler], dict]:
    """The arguments of :func:`save_checkpoint` / :func:`load_checkpoint`, checked before anything is
    read, written or changed: TypeError / ValueError naming the argument (a ValueError ending with
    ``action`` for an optimizer of parameters that are not the model's). Returns the schedulers as a
    list (empty for None) and :func:`_model_weights_of` (``{}`` without an optimizer)."""
    if not isinstance(directory, (str, os.PathLike)) or isinstance(os.fspath(directory), bytes):
        raise TypeError(f"directory: expected a str or os.PathLike, got {type(directory).__name__}")
    if not isinstance(model, Module):
        raise TypeError(f"model: expected a transformer_core Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer: expected a transformer_core.optim Optimizer or None, got {type(optimizer).__name__}")
    quantized = {name: fmt for name, fmt in model.weight_formats().items() if fmt not in ("float32", "float64")}
    if quantized:
        name, fmt = next(iter(quantized.items()))
        raise ValueError(f"model: {len(quantized)} weights are held quantized (e.g. {name!r}: {fmt}); a training "
                         "checkpoint is of a float model (a quantized one does not train, and its dequantized "
                         "weights would not load back into it): checkpoint the float model, or save this one with "
                         f"save_pretrained; {action}")
    schedulers = _schedulers_of(scheduler, optimizer)
    weights = {} if optimizer is None else _model_weights_of(optimizer, model, action)
    return schedulers, weights


def save_checkpoint(directory, model: Module, optimizer=None, scheduler=None) -> None:
    """Writes the model (and the optimizer's and scheduler's states) under ``directory``, as one set:
    every state is taken before any file is written, the files go through
    :func:`~transformer_core.checkpoints.write_files_atomically` (each written whole under a
    temporary name, then moved into place), and each carries the same new random
    ``checkpoint_id`` in its metadata, which :func:`load_checkpoint` checks. A leading ``~`` of
    ``directory`` is the home directory (as for ``save_pretrained`` and :func:`load_checkpoint`).

    ``scheduler`` is one scheduler, or a list or tuple of the schedulers chained on ``optimizer``
    (each ``step()`` called in turn, e.g. a LinearLR warmup and a CosineAnnealingLR: save them all,
    as a scheduler left out would start its schedule again on resuming), each one's state stored
    separately in ``scheduler.safetensors`` (see the module doc). A
    :class:`~transformer_core.lr_scheduler.SequentialLR` is one scheduler (its state holds its
    schedulers').

    A file of a component not given (``optimizer=None``) is not written, and one left in
    ``directory`` by an earlier save stays: :func:`load_checkpoint` refuses to read it with this save's
    model (another ``checkpoint_id``).

    Raises:
        TypeError: ``directory`` not a str or ``os.PathLike`` (of a str path), ``model`` not a
            :class:`~transformer_core.module.Module`, ``optimizer`` not a
            :class:`~transformer_core.optim.Optimizer` (or None), ``scheduler`` not a
            :class:`~transformer_core.lr_scheduler.LRScheduler` (or None, or a list or tuple of them; an
            entry is named ``scheduler[i]``): nothing is written.
        ValueError: a ``model`` with weights held quantized (:func:`~transformer_core.quantize`: it
            does not train, and a checkpoint of its dequantized weights would not load back into
            it; checkpoint the float model); nothing is written.
        ValueError: a ``scheduler`` whose optimizer is not ``optimizer`` (None included: the groups'
            learning rates are saved in the optimizer's state, not the scheduler's), an empty list,
            a scheduler listed twice; an ``optimizer`` that steps parameters that are not
            ``model``'s (a separate head: named; their state would be saved without their weights:
            attach the module to the model, ``model.head = head``); nothing is written.
        ValueError / TypeError: an optimizer or scheduler state that :func:`load_checkpoint` would
            refuse (each state goes through its ``load_state_dict``'s own checks before anything is
            written, so that every checkpoint written loads back): e.g. a learning rate or
            hyperparameter written by hand into ``optimizer.param_groups`` that the optimizer
            refuses, a moment holding NaN; named ``optimizer`` or ``scheduler`` (``scheduler[i]``
            in a list) with the loader's message; nothing is written.
        ValueError: ``directory`` empty or blank (it would name the current directory) or holding
            a NUL character; nothing is written.
        FileNotFoundError: a ``~user`` of no known user in ``directory`` (nothing written).
        NotADirectoryError (an OSError): ``directory`` is a file, or lies under one (naming
            ``directory``; nothing written).
        OSError: a file cannot be written or renamed (naming it); ``directory`` keeps the files it
            held before (the previous set, whole: a failed rename, or a KeyboardInterrupt, puts back
            what the renames before it replaced) and no temporary. Only a power loss or a killed
            process during the final renames, or a second I/O error while the previous files are
            put back (the error's notes say which), leaves a mixed set, which :func:`load_checkpoint`
            refuses by its ``checkpoint_id`` stamps; the previous files are then beside it as
            ``.{name}.*.bak`` (:func:`~transformer_core.checkpoints.write_files_atomically`).
    """
    schedulers, weights = _check_arguments(directory, model, optimizer, scheduler, "nothing was written")
    directory = save_directory(directory)  # "~/run" is the home's, as save_pretrained's; "" refused
    # "pt": transformers' own format key (its 4.x loader refuses another); the tensors are plain arrays
    metadata = {"format": "pt", CHECKPOINT_ID_KEY: secrets.token_hex(16)}
    states = []  # (file name, state, its own metadata): all taken, and checked, before anything is written
    if optimizer is not None:
        # the moments themselves, not copies: written (one at a time) before anything can step again
        state = optimizer._state_dict(copy=False)
        with _loadable("optimizer"):
            optimizer._check_state_dict(state)
        states.append(("optimizer.safetensors", _optimizer_layout(state, _relaid(weights), to_checkpoint=True), {}))
    scheduler_states = [s.state_dict() for s in schedulers]
    for i, (s, state) in enumerate(zip(schedulers, scheduler_states)):
        with _loadable(f"scheduler[{i}]" if isinstance(scheduler, (list, tuple)) else "scheduler"):
            s._check_state_dict(state)
    if isinstance(scheduler, LRScheduler):
        states.append(("scheduler.safetensors", scheduler_states[0], {}))
    elif schedulers:  # a list: each state under its index, and their number
        state = {f"{i}.{key}": value for i, s_state in enumerate(scheduler_states) for key, value in s_state.items()}
        states.append(("scheduler.safetensors", state, {NUM_SCHEDULERS_KEY: str(len(schedulers))}))
    # last: the file a reader starts from, under the names save_pretrained writes (transformers loads it)
    # (views of the weights: the writer copies one tensor at a time, never the whole model)
    checkpoint_state = getattr(model, "_checkpoint_state", model._checkpoint_tensors)
    states.append(("model.safetensors", checkpoint_state(), {RNG_STATE_KEY: json.dumps(get_rng_state())}))
    files = []
    for name, state, own in states:
        meta = dict(metadata, **own)
        files.append((name, lambda p, state=state, meta=meta: save_safetensors(state, p, meta)))
    write_files_atomically(directory, files)


@contextlib.contextmanager
def _loadable(argument: str):
    """For :func:`save_checkpoint`: turns the refusal of a state's own ``load_state_dict`` checks
    (``_check_state_dict``, run on the state about to be written) into a TypeError / ValueError
    naming ``argument``, saying that :func:`load_checkpoint` would refuse it and that nothing was
    written."""
    try:
        yield
    except (TypeError, ValueError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        why = str(e).removeprefix("load_state_dict: ").removesuffix("; nothing was loaded")
        raise kind(f"{argument}: its state would not load back (load_checkpoint would refuse it: {why}); "
                   "nothing was written") from e


def _read_safetensors(path: Path, arrays: bool) -> tuple[dict, dict]:
    """``({name: array} or {}, metadata)`` of a safetensors file whose header
    :func:`~transformer_core.hub._read_header` has checked: its arrays (with ``arrays``; each of its
    stored dtype: int64 counters, float moments) and its ``__metadata__`` (``{}`` if none).

    Raises:
        ValueError: naming the file: what the safetensors library refuses (SafetensorError, a dtype
            numpy lacks such as BF16), never a raw library error.
        OSError: the file cannot be read (naming it).
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = dict(f.metadata() or {})
            values = {name: np.array(f.get_tensor(name), copy=True) for name in f.keys()} if arrays else {}
    except OSError as e:
        raise OSError(e.errno, f"cannot read {path.name} ({e.strerror or e})", str(path)) from e
    except Exception as e:
        raise ValueError(f"{path}: cannot read safetensors file ({type(e).__name__}: {e})") from None
    return values, metadata


def _check_one_save(directory: Path, metadata: dict) -> None:
    """Refuses (ValueError naming the files and their ids) files of different saves: their
    ``checkpoint_id`` stamps differ, or some have one and some not. None stamped: a checkpoint of
    the format before the stamp, accepted."""
    ids = {name: meta.get(CHECKPOINT_ID_KEY) for name, meta in metadata.items()}
    if len(set(ids.values())) > 1:
        listing = ", ".join(f"{name}: {ident if ident is not None else 'none'}" for name, ident in ids.items())
        raise ValueError(f"{directory}: the checkpoint's files are from different saves (checkpoint_id {listing}); "
                         f"expected the files of one save_checkpoint; nothing was loaded")


def _rng_state(path: Path, metadata: dict):
    """The generator state a save stored (None in a checkpoint written before it was stored),
    checked: a ValueError naming the file if it is not one."""
    text = metadata.get(RNG_STATE_KEY)
    if text is None:
        return None
    try:
        state = json.loads(text)
        _pcg64_of(state, RNG_STATE_KEY)  # the check set_rng_state makes, without setting it yet
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: metadata {RNG_STATE_KEY}: not a generator state ({e}); nothing was loaded") from None
    return state


def _shown(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut to ``limit`` characters (a forged metadata value may be megabytes long)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _scheduler_states(path: Path, arrays: dict, metadata: dict, count: int) -> list[dict]:
    """The scheduler file's states, one per scheduler (see the module doc), for ``count`` schedulers
    given to :func:`load_checkpoint`. The number the file says it holds is checked against
    ``count`` before anything is built from it (a forged ``num_schedulers`` of 10**20 is refused,
    not allocated).

    Raises:
        ValueError: naming ``scheduler`` and the file: the file holds the states of another number
            of schedulers; naming the file: a ``num_schedulers`` that is not a positive int (ASCII
            digits), a key of no scheduler.
    """
    text = metadata.get(NUM_SCHEDULERS_KEY)
    saved = "1" if text is None else text  # no key: the save of one scheduler, its state with no prefix
    if not re.fullmatch(r"[1-9][0-9]*", saved):
        raise ValueError(f"{path}: metadata {NUM_SCHEDULERS_KEY}: expected a positive int, got {_shown(text)}; "
                         "nothing was loaded")
    if saved != str(count):  # compared as text: a forged 10**20 is neither converted nor allocated
        shown = saved if len(saved) <= 40 else f"{saved[:40]}... ({len(saved)} digits)"
        raise ValueError(f"scheduler: the checkpoint holds the states of {shown} scheduler(s), got {count}; expected "
                         f"the schedulers it was saved with ({path}), in the same order (a scheduler chained on the "
                         "optimizer and not restored would start its schedule again); nothing was loaded")
    if text is None:
        return [arrays]
    states = [{} for _ in range(count)]  # count: the schedulers given, not a number read from the file
    index_of = {str(i): i for i in range(count)}  # "0", "1", ...: the prefixes save_checkpoint writes
    for key, value in arrays.items():
        index, _, name = key.partition(".")
        if index not in index_of or not name:
            raise ValueError(f"{path}: key {_shown(key)}: expected '{{i}}.{{name}}' with i < {count} (the state of "
                             f"scheduler i of {count}); nothing was loaded")
        states[index_of[index]][name] = value
    return states


def _check_model_state(path: Path, model: Module, state: dict) -> None:
    """Refuses a model file whose names or shapes are not ``model``'s, before anything is loaded:
    the checks ``Module.load_state_dict`` makes on names and shapes (after the model's renaming of
    a checkpoint's alternative names), made first so that a checkpoint of another architecture or
    size is reported as such, and not by the optimizer's state (loaded before the model, and keyed
    by the same parameter names). Names the model has no weight for are left to the model's own
    ``load_state_dict`` when it overrides it (a seq2seq model reads a buffer under its own name).

    Raises:
        ValueError: ``"{path}: ... does not match the model"``, listing the missing, unknown and
            mis-shaped names; a TypeError or ValueError of the model's renaming (a tied head that
            differs from the embedding), prefixed with the file.
    """
    with _naming(path):
        renamed = model._rename_state_dict(dict(state))  # (a copy: a model may rename in place)
    shapes = model.parameter_shapes()
    problems = []
    missing = [name for name in shapes if name not in renamed]
    if missing:
        problems.append(f"missing keys: {missing}")
    if type(model).load_state_dict is Module.load_state_dict:
        unknown = [name for name in renamed if name not in shapes]
        if unknown:
            problems.append(f"unknown keys: {unknown}")
    misshaped = [f"{name}: expected {shape}, got {np.shape(renamed[name])}" for name, shape in shapes.items()
                 if name in renamed and np.shape(renamed[name]) != shape]
    if misshaped:
        problems.append(f"mis-shaped: {misshaped}")
    if problems:
        raise ValueError(f"{path}: the checkpoint's weights do not match the model ({type(model).__name__}; a "
                         f"checkpoint of another architecture or size?): " + "; ".join(problems)
                         + "; nothing was loaded")


@contextlib.contextmanager
def _naming(path: Path, what: str = ""):
    """Prefixes a TypeError or ValueError raised inside with the file it concerns (``"{path}: "``,
    then ``what``), keeping its kind (TypeError stays TypeError, any other ValueError becomes a plain
    ValueError); the original is chained."""
    try:
        yield
    except (TypeError, ValueError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(f"{path}: {what}{e}") from e


def _with_inner(schedulers) -> list:
    """``schedulers`` and, recursively, those a SequentialLR holds (its ``load_state_dict`` loads
    theirs)."""
    out = []
    for s in schedulers:
        out.append(s)
        out.extend(_with_inner(getattr(s, "_schedulers", ())))
    return out


def _snapshot(objects) -> list:
    """What ``load_state_dict`` of an optimizer or a scheduler changes: the objects' attributes
    (which they rebind: ``state``, ``last_epoch``, ...) and the optimizers' param-group dicts (which
    they update in place; a scheduler writes ``initial_lr`` into its optimizer's)."""
    return [(obj, dict(vars(obj)), [(g, dict(g)) for g in getattr(obj, "param_groups", ())]) for obj in objects]


def _restore(snapshot: list) -> None:
    for obj, attributes, groups in snapshot:
        vars(obj).clear()
        vars(obj).update(attributes)
        for group, saved in groups:
            group.clear()
            group.update(saved)


def load_checkpoint(directory, model: Module, optimizer=None, scheduler=None) -> None:
    """Reads what :func:`save_checkpoint` wrote into ``model`` (and ``optimizer``, ``scheduler``,
    which must hold the same parameters by name: see ``Optimizer.load_state_dict``). ``scheduler``
    is what the save was given: one scheduler, or a list or tuple of as many schedulers, in the same
    order (a list of one and one scheduler are interchangeable).

    Every file is read and checked (headers, the ``checkpoint_id`` stamps of one save, the model
    file's names and shapes against ``model``'s) before anything changes; the optimizer's and
    scheduler's states are then loaded (each checks all of its values first), and the model's last.
    On any error the model, the optimizer and the scheduler are left as they were, and the error
    names the file it concerns. Then the generator of the dropout seeds
    (process-wide: :func:`~transformer_core.manual_seed`) is set to the state the save stored, so
    that a resumed run draws what the uninterrupted one would (a checkpoint written before it was
    stored leaves the generator alone).

    Raises:
        TypeError: ``directory``, ``model``, ``optimizer`` or ``scheduler`` of the wrong type (as
            :func:`save_checkpoint`); nothing is read or changed.
        ValueError: a ``scheduler`` whose optimizer is not ``optimizer`` (None included: the groups'
            learning rates are restored from the optimizer's file), an empty list, a scheduler listed
            twice; an ``optimizer`` that steps parameters that are not ``model``'s, a ``model`` with
            weights held quantized (as :func:`save_checkpoint`: load into the float model, then
            quantize it); nothing is read or changed.
        ValueError: the model file replaced while it was read (a :func:`save_checkpoint` into
            ``directory`` ran meanwhile: its weights and the other files' states could be of two
            saves); nothing is changed: load again.
        ValueError: another number of schedulers than the checkpoint holds (naming ``scheduler``
            and the file); nothing is changed.
        FileNotFoundError: a file is missing, or a ``~user`` of no known user in ``directory``.
        ValueError: naming the file: one that is truncated or has a corrupt header; files of
            different saves (naming them); a model file whose names or shapes are not the model's
            (a checkpoint of another architecture or size: listed, before any state is loaded); an
            optimizer or scheduler state that does not fit (the ``load_state_dict`` message,
            prefixed with the file, and ``scheduler[i]: `` for an entry of a list); a model tensor
            that is not floating-point; a ``num_schedulers`` that is not a positive int.
        TypeError: a value the optimizer's, a scheduler's or the model's ``load_state_dict``
            refuses by type, prefixed with the file.
        OSError: a file that cannot be read (naming it).
    """
    schedulers, weights = _check_arguments(directory, model, optimizer, scheduler, "nothing was loaded")
    path = expand_home(directory, "directory")
    wanted = [name for name, given in zip(_FILES, (True, optimizer is not None, bool(schedulers))) if given]
    for name in wanted:
        if not (path / name).is_file():
            raise FileNotFoundError(f"directory: no {name} in {path}")
    # read and check everything first
    model_file = path / "model.safetensors"
    # the stamp before and after the weights are read: a save landing in between (another id) would
    # pair these weights with the next save's optimizer, scheduler and RNG states, whose stamps agree
    _read_header(model_file)  # truncated or corrupt: a ValueError naming the file
    before = _read_safetensors(model_file, arrays=False)[1]
    model_state = load_safetensors(path, model.dtype)  # checks model.safetensors' header; names the file
    metadata = {"model.safetensors": _read_safetensors(model_file, arrays=False)[1]}
    if before.get(CHECKPOINT_ID_KEY) != metadata["model.safetensors"].get(CHECKPOINT_ID_KEY):
        raise ValueError(f"{model_file}: the file was replaced while it was read (a save into {path} ran "
                         "meanwhile); nothing was loaded: load again")
    rng_state = _rng_state(model_file, metadata["model.safetensors"])
    states = {}
    for name in wanted[1:]:
        _read_header(path / name)  # truncated or corrupt: a ValueError naming the file
        states[name], metadata[name] = _read_safetensors(path / name, arrays=True)
    _check_one_save(path, metadata)
    scheduler_states = []
    if schedulers:
        name = "scheduler.safetensors"
        scheduler_states = _scheduler_states(path / name, states[name], metadata[name], len(schedulers))
    # the model's names and shapes first: a checkpoint of another model is named as such, not by
    # the optimizer's state (keyed by the same names, loaded before the model)
    _check_model_state(model_file, model, model_state)
    # then load: each load_state_dict checks all of its input before it changes anything, so only a
    # later component's refusal needs the earlier ones put back
    objects = {id(o): o for o in (optimizer, *_with_inner(schedulers)) if o is not None}
    snapshot = _snapshot(objects.values())
    try:
        if optimizer is not None:
            with _naming(path / "optimizer.safetensors"):
                optimizer.load_state_dict(_optimizer_layout(states["optimizer.safetensors"], _relaid(weights),
                                                            to_checkpoint=False))
        for i, (s, state) in enumerate(zip(schedulers, scheduler_states)):
            with _naming(path / "scheduler.safetensors", f"scheduler[{i}]: " if isinstance(scheduler, (list, tuple))
                         else ""):
                s.load_state_dict(state)
        with _naming(model_file):
            model.load_state_dict(model_state)
    except BaseException:
        _restore(snapshot)
        raise
    if rng_state is not None:
        set_rng_state(rng_state)
