"""Learning-rate schedules for the optimizers of :mod:`transformer_core.optim`, with the semantics of
``torch.optim.lr_scheduler`` (and Hugging Face transformers' warmup schedules, which are LambdaLRs):

* construction records each group's ``initial_lr`` and performs the initial step (epoch 0), which
  sets the groups' ``lr`` to the schedule's first value;
* ``step()`` (call it AFTER ``optimizer.step()``) advances ``last_epoch`` by one and writes the new
  learning rate into every param group; the first ``step()`` after construction warns (a
  UserWarning, as torch's) when the optimizer has not stepped since the scheduler was built: the
  order is reversed, and the schedule's first learning rate would be skipped;
* ``get_last_lr()`` returns the learning rates last written;
* a ``step()`` (or a ``load_state_dict``) that raises changes nothing: the new learning rates are
  computed first, then written with the counters; a param group added to the optimizer after the
  scheduler was built makes ``step()`` raise, as it has no schedule. That refusal is deliberate
  here, for every scheduler: torch 2.x raises only in ``LambdaLR`` (its ``zip(..., strict=True)``
  over the functions); its ``LinearLR`` and ``CosineAnnealingLR`` go on, rescaling the new group's
  lr recursively although they have no base lr for it.

A scheduler can be copied (``copy.deepcopy``, with its optimizer) and pickled (but for a LambdaLR of
a lambda, which pickle cannot write: as torch; and not over a model's parameters, see
:mod:`transformer_core.optim`).

Composing schedules, as torch: :class:`SequentialLR` runs schedulers one after the other (a
LinearLR warmup, then a CosineAnnealingLR from the warmup's end: the usual warmup + cosine); or
several schedulers are chained on one optimizer, each ``step()`` called in turn, their factors
multiplying (a LinearLR warmup with a CosineAnnealingLR over the whole run).

Resuming: build the optimizer and its scheduler(s) as at the start, then load their state dicts in
any order (:func:`~transformer_core.training.save_checkpoint` / ``load_checkpoint`` take a list of
chained schedulers, and a SequentialLR, whose state holds its schedulers'). The groups' learning
rates come from the optimizer's state dict; a scheduler's ``load_state_dict`` restores its counters
and settings and leaves the groups' ``lr`` alone (as torch's), so that several schedulers chained on
one optimizer resume the uninterrupted run whatever order they are loaded in. Every scheduler of a
chain must be loaded: one left as built starts its schedule again.

``LambdaLR``, ``LinearLR``, ``CosineAnnealingLR`` and ``SequentialLR`` reproduce torch's own
formulas and steps (the recursive, "chainable" forms of torch 2.x for LinearLR and
CosineAnnealingLR, so that the values agree with torch's to the last bit of rounding), with one
exception: a LinearLR decay to ``end_factor=0`` is clamped at 0 where torch's rounding leaves a
tiny negative learning rate (about -1e-18) on its last steps.
``state_dict()`` is a flat ``name -> numpy array`` dict (for safetensors). A LambdaLR's functions are
not saved (as torch); of a function that is a callable object, torch saves the attributes
(``__dict__``) and restores them: here its attributes that are numbers (bool, int, float; saved as
``lr_lambdas.{i}.{name}``) are, others not (rebuild such an object with them before loading). A
state without them (an earlier version's) loads, leaving the functions as built (torch's ``None``).

The schedules' int settings (``T_max``, ``total_iters``, ``milestones``, the warmup schedules' step
counts) also take a float holding a whole number (``100.0``, e.g. ``epochs * len(loader) / accum``),
converted to an int, as torch takes floats there; a fractional one (``100.5``) is a ValueError
naming the argument (a count of steps is whole: torch computes with the fraction, and its LinearLR
then stops short of ``end_factor``).
"""

from __future__ import annotations

import bisect
import functools
import math
import numbers
import types
import warnings
from typing import Callable

import numpy as np

from ._validation import check_float, check_int, described, to_numpy

__all__ = [
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "CosineAnnealingLR",
    "SequentialLR",
    "get_linear_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
]


#: The largest count a scheduler holds (``last_epoch``, the step count): :meth:`LRScheduler.state_dict`
#: saves them as int64 scalars (as the optimizers bound their step counts, ``optim._MAX_STEP``). A
#: constructor takes a ``last_epoch`` below it (its initial step adds one), ``load_state_dict`` up to
#: it, and ``step()`` refuses to go past it.
_MAX_COUNT = 2**63 - 1


def _check_int(value, name: str, minimum: int, maximum: int = _MAX_COUNT) -> int:
    return check_int(value, name, minimum, maximum)


def _check_steps(value, name: str, minimum: int) -> int:
    """A schedule's int setting (a length or a milestone, in steps) as an int in ``[minimum,
    2**63 - 1]``: an int, or a float (any real number) holding a whole number, such as ``100.0``
    (torch takes floats there).

    Raises:
        TypeError: not a real number (a bool, a str, None, an array).
        ValueError: a fractional, NaN or infinite float; out of range.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        try:
            whole = float(value).is_integer()  # False for NaN and ±inf
        except OverflowError:  # a Fraction beyond float's range
            whole = False
        if not whole:
            raise ValueError(f"{name}: expected an int, or a float holding a whole number (such as 100.0), "
                             f"got {described(value)}")
        value = int(value)
    return _check_int(value, name, minimum)


def _advanced(scheduler, count: int, name: str) -> int:
    """``count + 1``, the next value of ``scheduler``'s counter ``name`` (``last_epoch``,
    ``step_count``), or a ValueError naming it when that would pass :data:`_MAX_COUNT`."""
    if count >= _MAX_COUNT:
        raise ValueError(f"step: {type(scheduler).__name__}'s {name} is {count}, the largest a state dict holds "
                         f"(int64, {_MAX_COUNT}): the schedule cannot advance further; nothing was changed")
    return count + 1


def _check_real(value, name: str) -> float:
    """A finite real number (NaN and infinities are refused: a schedule of them is no schedule)."""
    return check_float(value, name)


def _loaded_array(value, key: str) -> np.ndarray:
    """A loaded state-dict value as an array of real numbers (int or float): TypeError naming ``key``
    for anything else (None, str, bool, complex, object arrays)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:  # a ragged list, an odd object
        raise TypeError(f"load_state_dict: {key}: expected an array of numbers, got {type(value).__name__} ({e})") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"load_state_dict: {key}: expected a number (an int or float array), "
                        f"got a {arr.dtype} array of shape {arr.shape}")
    return arr


def _loaded_one(value, key: str) -> np.ndarray:
    """A loaded state-dict value that must be one number (a 0-d or one-element array of numbers),
    as a 0-d array."""
    arr = _loaded_array(value, key)
    if arr.size != 1:
        raise ValueError(f"load_state_dict: {key}: expected a number, got {arr.dtype} array of shape {arr.shape}")
    return arr.reshape(())


def _loaded_scalar(value, key: str) -> float:
    """A loaded state-dict value that must be one number, as a float."""
    return float(_loaded_one(value, key))


def _loaded_int(value, key: str, minimum: int | None, maximum: int | None = _MAX_COUNT) -> int:
    """A loaded count or int setting: a whole number (saved as int64, read exactly, or float64) in
    ``[minimum, maximum]`` (None: unbounded on that side; a setting's own check follows). The
    default ``maximum`` is a counter's, :data:`_MAX_COUNT`: what ``state_dict`` can save again."""
    arr = _loaded_one(value, key)
    if arr.dtype.kind == "f" and not float(arr).is_integer():  # NaN and ±inf too
        raise ValueError(f"load_state_dict: {key}: expected a whole number, got {float(arr)}")
    x = int(arr)
    if minimum is not None and x < minimum:
        raise ValueError(f"load_state_dict: {key}: expected an int >= {minimum}, got {x}")
    if maximum is not None and x > maximum:
        raise ValueError(f"load_state_dict: {key}: expected an int <= {maximum} (an int64 count), got {x}")
    return x


def _loaded_lr(value, key: str) -> float:
    """A loaded learning rate: finite and >= 0 (what the optimizers take)."""
    try:
        return check_float(float(value), key, minimum=0.0)
    except ValueError as e:
        raise ValueError(f"load_state_dict: {e}") from None


def _too_large(number) -> str:
    """A number too large for a float (``10**400``), described without writing it out: its
    decimal form can be too long to write (Python refuses ints of more than 4300 digits)."""
    if isinstance(number, numbers.Integral):
        return f"{type(number).__name__} of {abs(int(number)).bit_length()} bits, too large for a float"
    return f"{type(number).__name__}, too large for a float"


def _param_groups(optimizer) -> list[dict]:
    """``optimizer.param_groups``: a list of dicts holding ``"lr"``, or TypeError naming ``optimizer``."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "lr" in g for g in groups):
        raise TypeError(f"optimizer: expected an optimizer with param_groups, got {type(optimizer).__name__}")
    return groups


class LRScheduler:
    """Base class (torch's ``LRScheduler``): subclasses define :meth:`get_lr`.

    Args:
        optimizer: an optimizer of :mod:`transformer_core.optim` (anything with ``param_groups``,
            a list of dicts holding ``"lr"``).
        last_epoch: -1 to start a schedule; >= 0 to resume one (then every group must hold
            ``initial_lr``, as restored by ``optimizer.load_state_dict``), below ``2**63 - 1``
            (the initial step adds one, and ``state_dict`` saves it as an int64).

    Raises:
        TypeError: ``optimizer`` without ``param_groups``; ``last_epoch`` not an int.
        ValueError: ``last_epoch`` < -1 or >= ``2**63 - 1``; resuming (``last_epoch >= 0``) without
            ``initial_lr`` in the groups.
        NotImplementedError: this base class itself, or a subclass without :meth:`get_lr` (the
            constructor's initial step calls it), as torch's constructor does; unlike torch's, it
            takes back the ``initial_lr`` it added (one already in a group stays).
    """

    #: numeric attributes of the subclass saved in the state dict (besides the common ones)
    _HYPER: tuple = ()
    #: those of ``_HYPER`` that are ints (saved as float64 like the others)
    _INT_HYPER: tuple = ()
    #: what computes the learning rates, as :meth:`_write_lrs`'s errors name it (None: the class's name)
    _COMPUTED_BY: str | None = None

    def __init__(self, optimizer, last_epoch: int = -1):
        groups = _param_groups(optimizer)
        last_epoch = _check_int(last_epoch, "last_epoch", -1, _MAX_COUNT - 1)  # the initial step adds one
        self.optimizer = optimizer
        added = []  # the groups given an initial_lr here: taken back if the first step raises
        if last_epoch == -1:
            for g in groups:
                if "initial_lr" not in g:
                    g["initial_lr"] = g["lr"]
                    added.append(g)
        else:
            for i, g in enumerate(groups):
                if "initial_lr" not in g:
                    raise ValueError(f"last_epoch: resuming at {last_epoch} needs 'initial_lr' in param_groups[{i}] "
                                     "(load the optimizer's state first)")
        self.base_lrs: list[float] = [float(g["initial_lr"]) for g in groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._optimizer_steps = getattr(optimizer, "_step_calls", None)  # for step()'s order warning
        try:
            self._initial_step()
        except BaseException:
            for g in added:
                g.pop("initial_lr", None)
            raise

    def _initial_step(self) -> None:
        """torch's ``_initial_step``: the step count back to 0, then one step in "initial mode" (the
        constructor's step; :class:`SequentialLR` also makes it for the scheduler that starts the
        sequence). A step that raises leaves the step count as it was."""
        step_count = self._step_count
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        except BaseException:
            self._step_count = step_count
            raise
        finally:
            self._is_initial = False

    def get_lr(self) -> list[float]:
        """The learning rates for ``self.last_epoch``, one per param group (called by :meth:`step`).
        Each subclass defines its own.

        Raises:
            NotImplementedError: on this base class (as torch's ``LRScheduler.get_lr``): its
                constructor, whose initial step calls it, raises it too.
        """
        raise NotImplementedError

    def _closed_form_lr(self) -> list[float]:
        """The learning rates for ``self.last_epoch`` from ``base_lrs`` alone (torch's
        ``_get_closed_form_lr``; :meth:`get_lr` where torch has none, as for LambdaLR, whose
        ``get_lr`` is a closed form). Used by :meth:`_restart`."""
        return self.get_lr()

    def _check_settings(self, **settings) -> dict:
        """The schedule's own settings (the ``_HYPER`` keyword arguments) checked as the constructor
        checks them: ``{name: value}``, or ValueError / TypeError naming the setting. The constructor
        and :meth:`load_state_dict` both use it."""
        return settings

    def step(self) -> None:
        """Advances the schedule by one step and writes the new learning rates into the groups.
        The new rates are computed first: a step that raises (``get_lr``, e.g. a LambdaLR's function)
        leaves ``last_epoch``, the step count and the groups' ``lr`` as they were.

        Raises:
            ValueError: the optimizer has another number of param groups than the scheduler has
                base learning rates (a group added with ``add_param_group`` after the scheduler was
                built: build the scheduler again), or ``get_lr`` gave another number of rates. The
                refusal is deliberate, for every scheduler: torch's LambdaLR raises too, but its
                LinearLR and CosineAnnealingLR step on, scheduling the new group without a base lr.
            ValueError / TypeError: a new learning rate that is not a finite number >= 0 (see
                :meth:`_write_lrs`; nothing changes).
            ValueError: ``last_epoch`` or the step count at ``2**63 - 1`` already, the most an int64
                state dict holds (nothing changes).
            Whatever ``get_lr`` raises (nothing changes).

        Warns:
            UserWarning: the first step after construction, when the optimizer (one of
                :mod:`transformer_core.optim`) has not stepped since this scheduler was built (torch's
                warning): call ``optimizer.step()`` first, or the schedule's first value is skipped.
        """
        if self._step_count == 1 and not self._is_initial:
            self._warn_if_optimizer_idle()
        self._check_group_count()
        counters = self.last_epoch, self._step_count
        last_epoch = _advanced(self, self.last_epoch, "last_epoch")  # at the int64 bound: ValueError, nothing changed
        step_count = _advanced(self, self._step_count, "step_count")
        self.last_epoch, self._step_count = last_epoch, step_count  # get_lr reads the new counters
        self._write_lrs(self.get_lr, counters)

    def _warn_if_optimizer_idle(self) -> None:
        """torch's order check: the UserWarning of :meth:`step` when the optimizer has made no step
        since this scheduler was built (an optimizer that does not count its steps is not checked)."""
        built_at = getattr(self, "_optimizer_steps", None)
        if built_at is not None and getattr(self.optimizer, "_step_calls", 0) == built_at:
            warnings.warn(f"{type(self).__name__}.step() was called before optimizer.step(): call optimizer.step() "
                          "first, then the scheduler's step(), or the schedule's first learning rate is skipped "
                          "(torch's warning)", UserWarning, stacklevel=3)

    def _restart(self) -> None:
        """Restarts the schedule at epoch 0 from ``base_lrs`` (torch's ``_update_lr(0)``, which
        :class:`SequentialLR` calls when a scheduler's milestone comes): ``last_epoch = 0``, the
        learning rates of :meth:`_closed_form_lr`; the step count is left as it is (as torch).
        Raises as :meth:`step` does, changing nothing."""
        self._check_group_count()
        counters = self.last_epoch, self._step_count
        self.last_epoch = 0
        self._write_lrs(self._closed_form_lr, counters)

    def _check_group_count(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.base_lrs):
            raise ValueError(f"step: the optimizer has {len(groups)} param groups, this scheduler has "
                             f"{len(self.base_lrs)} base_lrs (one per group when it was built): a group added "
                             "since has no schedule; build the scheduler again")

    def _write_lrs(self, compute: Callable[[], list], counters: tuple[int, int]) -> None:
        """Writes ``compute()`` (the new counters set) into the groups' ``lr``, each as a float; if
        it raises, gives another number of rates or a rate that is not a finite number >= 0 (what
        the optimizers take), the counters go back to ``counters`` and nothing is written.

        Raises:
            TypeError: a rate that is not a real number (a str, an array of several values, None,
                complex), ValueError: NaN, ±inf or < 0; either naming ``lr_lambda`` for a
                :class:`LambdaLR` (else the scheduler's class: a rate computed from a group's ``lr``
                written by hand), the epoch, the group and the value. A 0-d array or tensor of
                real numbers is its number (torch takes it too).
        """
        groups = self.optimizer.param_groups
        try:
            values = list(compute())
            if len(values) != len(groups):
                raise ValueError(f"step: get_lr gave {len(values)} learning rates for {len(groups)} param groups")
            values = [self._checked_lr(i, lr) for i, lr in enumerate(values)]
        except BaseException:
            self.last_epoch, self._step_count = counters
            raise
        for g, lr in zip(groups, values):
            g["lr"] = lr
        self._last_lr = [g["lr"] for g in groups]

    def _checked_lr(self, index: int, lr) -> float:
        """The learning rate computed for ``param_groups[index]`` as a float, or the TypeError /
        ValueError of :meth:`_write_lrs`."""
        try:
            if not isinstance(lr, numbers.Real) and getattr(lr, "shape", None) == ():  # a 0-d array or tensor
                number = to_numpy(lr, "lr")
                if number.dtype.kind in "iuf":
                    lr = number.item()
            return check_float(lr, self._lr_formula(index), minimum=0.0)
        except (TypeError, ValueError) as e:
            source = self._COMPUTED_BY or type(self).__name__
            raise type(e)(f"{source} (epoch {self.last_epoch}): param_groups[{index}]: {e} "
                          "(the optimizers take a finite learning rate >= 0); nothing was changed") from None

    def _lr_formula(self, index: int) -> str:
        """How :meth:`_checked_lr`'s error names the rate it computed for ``param_groups[index]``."""
        return "lr"

    def get_last_lr(self) -> list[float]:
        """The learning rates last written into the param groups, one per group."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, np.ndarray]:
        """``last_epoch``, ``step_count`` (int64 scalars), ``base_lrs``, ``last_lr`` (float64, one per
        group) and the schedule's own numeric settings, as numpy arrays (safetensors-ready)."""
        out = {
            "last_epoch": np.array(self.last_epoch, dtype=np.int64),
            "step_count": np.array(self._step_count, dtype=np.int64),
            "base_lrs": np.array(self.base_lrs, dtype=np.float64),
            "last_lr": np.array(self._last_lr, dtype=np.float64),
        }
        for key in self._HYPER:
            out[key] = np.array(getattr(self, key), dtype=np.float64)
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a :meth:`state_dict`: the counters, ``base_lrs`` (also written into the groups'
        ``initial_lr``, which every scheduler of one optimizer shares), the schedule's settings and
        ``get_last_lr()``. As torch's, it does NOT write the groups' ``lr``: the optimizer's state
        dict carries them (``param_groups.{i}.lr``), so load the optimizer's state too, before or
        after this one. The order of the loads does not matter, with several schedulers chained on
        one optimizer as well (whose ``last_lr`` each is only that scheduler's step of the chain,
        not the groups' lr: writing it would resume the chain from the wrong value).

        Build the schedulers before loading the optimizer, as torch: a scheduler built afterwards
        performs its initial step on the loaded ``lr`` (which loading the scheduler does not undo).

        Every value is checked before anything changes: the counters are whole numbers
        (``last_epoch`` >= -1, ``step_count`` >= 0, both <= ``2**63 - 1``: int64), the learning rates
        finite and >= 0, and the schedule's settings (``T_max``, ``total_iters``, the factors, ...)
        pass the constructor's checks (an int setting saved as float64 must hold a whole number).

        Raises:
            TypeError: ``state_dict`` not a mapping; a value that is not numbers (None, str, bool,
                complex, object), named by its key; a setting the constructor refuses with a TypeError.
            ValueError: missing or unknown keys, another number of param groups, a value not a
                scalar, a counter or int setting that is not a whole number, a value out of range
                (named, with the constructor's message for the settings).
        """
        self._apply_state(self._read_state_dict(state_dict))

    def _check_state_dict(self, state_dict: dict) -> None:
        """Raises what :meth:`load_state_dict` would raise for ``state_dict``, changing nothing
        (``save_checkpoint``'s check that what it writes loads back: one check, the loader's)."""
        self._read_state_dict(state_dict)

    def _read_state_dict(self, state_dict: dict) -> dict:
        """``{attribute: value}`` that :meth:`load_state_dict` sets, every value checked (see its
        Raises); nothing changes."""
        if not hasattr(state_dict, "items"):
            raise TypeError(f"state_dict: expected a mapping of names to arrays, got {type(state_dict).__name__}")
        expected = {"last_epoch", "step_count", "base_lrs", "last_lr", *self._HYPER}
        keys = set(state_dict)
        if keys != expected:
            raise ValueError(f"load_state_dict: missing keys {sorted(expected - keys)}, "
                             f"unknown keys {sorted(keys - expected)}")
        n = len(self.optimizer.param_groups)
        base = _loaded_array(state_dict["base_lrs"], "base_lrs").reshape(-1)
        last = _loaded_array(state_dict["last_lr"], "last_lr").reshape(-1)
        if base.size != n or last.size != n:
            raise ValueError(f"load_state_dict: expected {n} learning rates (one per param group), "
                             f"got base_lrs {base.size}, last_lr {last.size}")
        last_epoch = _loaded_int(state_dict["last_epoch"], "last_epoch", -1)
        step_count = _loaded_int(state_dict["step_count"], "step_count", 0)
        base_lrs = [_loaded_lr(x, f"base_lrs[{i}]") for i, x in enumerate(base)]
        last_lr = [_loaded_lr(x, f"last_lr[{i}]") for i, x in enumerate(last)]
        settings = {}
        for key in self._HYPER:
            if key in self._INT_HYPER:
                settings[key] = _loaded_int(state_dict[key], key, None, None)
            else:
                settings[key] = _loaded_scalar(state_dict[key], key)
        try:
            settings = self._check_settings(**settings)
        except (TypeError, ValueError) as e:
            raise type(e)(f"load_state_dict: {e}") from None
        return dict(last_epoch=last_epoch, _step_count=step_count, base_lrs=base_lrs, _last_lr=last_lr, **settings)

    def _apply_state(self, values: dict) -> None:
        """Sets what :meth:`_read_state_dict` returned (it cannot fail): the attributes, and each
        group's ``initial_lr`` to its base lr."""
        for key, value in values.items():
            setattr(self, key, value)
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["initial_lr"] = base


class LambdaLR(LRScheduler):
    """``lr = initial_lr · lr_lambda(last_epoch)``, as ``torch.optim.lr_scheduler.LambdaLR``.

    Args:
        optimizer: see :class:`LRScheduler`.
        lr_lambda: a function of the step (int) returning a factor, or a list of them, one per group.
        last_epoch: see :class:`LRScheduler`.

    Each ``initial_lr · lr_lambda(epoch)`` must be a finite number >= 0 (what the optimizers take;
    torch writes NaN, a negative value or an array into the group unchecked): a ``lr_lambda`` that returns
    anything else (a linear decay without ``max(0, ·)`` run past its end, a str, an array) makes the
    constructor or :meth:`~LRScheduler.step` raise, naming ``lr_lambda`` and the epoch, and nothing
    changes. A numpy number or a 0-d array or tensor is taken as its number, as torch takes it.

    Raises:
        TypeError: ``optimizer`` without ``param_groups`` (checked first); ``lr_lambda`` not
            callable; a factor that is no real number (at construction or at a step).
        ValueError: a list of the wrong length; a learning rate that is NaN, ±inf or negative (at
            construction or at a step).
    """

    _COMPUTED_BY = "lr_lambda"

    def __init__(self, optimizer, lr_lambda: Callable[[int], float] | list, last_epoch: int = -1):
        groups = _param_groups(optimizer)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != len(groups):
                raise ValueError(f"lr_lambda: expected {len(groups)} functions (one per param group), "
                                 f"got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * len(groups)
        for f in self.lr_lambdas:
            if not callable(f):
                raise TypeError(f"lr_lambda: expected a function of the step, got {type(f).__name__}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """Each group's lr at ``last_epoch``: ``base_lr · lr_lambda(last_epoch)`` (closed form).
        A factor that cannot multiply a float (a str, None) is a TypeError naming ``lr_lambda``;
        what the functions raise themselves goes through unchanged."""
        lrs = []
        for i, (f, base_lr) in enumerate(zip(self.lr_lambdas, self.base_lrs)):
            factor = f(self.last_epoch)
            try:
                with np.errstate(over="ignore", invalid="ignore"):  # inf / NaN: refused by _checked_lr
                    lrs.append(base_lr * factor)
            except TypeError:
                raise TypeError(f"lr_lambda (epoch {self.last_epoch}): param_groups[{i}]: expected a function "
                                f"returning a real number (the factor of initial_lr), got {described(factor)}; "
                                "nothing was changed") from None
            except OverflowError:  # an int (or Fraction) beyond float's range: float * 10**400 raises
                raise ValueError(f"lr_lambda (epoch {self.last_epoch}): param_groups[{i}]: {self._lr_formula(i)}: "
                                 f"expected a finite number >= 0.0, got a factor {_too_large(factor)} (the "
                                 "optimizers take a finite learning rate >= 0); nothing was changed") from None
        return lrs

    def state_dict(self) -> dict[str, np.ndarray]:
        """:meth:`LRScheduler.state_dict`, and of each function that is a callable object (not a
        plain function: torch's test), its attributes that are numbers, as ``lr_lambdas.{i}.{name}``
        0-d arrays: bool for a bool, int64 for an int in int64's range, float64 for a float (torch
        saves the whole ``__dict__``, which safetensors cannot hold)."""
        out = super().state_dict()
        for i, f in enumerate(self.lr_lambdas):
            if isinstance(f, types.FunctionType):
                continue
            for name, value in getattr(f, "__dict__", {}).items():
                if isinstance(value, (bool, np.bool_)):
                    out[f"lr_lambdas.{i}.{name}"] = np.array(bool(value))
                elif isinstance(value, numbers.Integral) and -(2 ** 63) <= int(value) < 2 ** 63:
                    out[f"lr_lambdas.{i}.{name}"] = np.array(int(value), dtype=np.int64)
                elif isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
                    out[f"lr_lambdas.{i}.{name}"] = np.array(float(value), dtype=np.float64)
        return out

    def _read_state_dict(self, state_dict: dict) -> dict:
        """:meth:`LRScheduler._read_state_dict`, and under ``"_lambda_values"`` the functions'
        attributes to set, ``(function, name, value)``, each value of the type it was saved as (a
        bool, an int or a float), as torch's ``lr_lambda.__dict__.update(saved)``: whatever the
        function holds now, and none where nothing was saved (a state of an earlier version, or
        of plain functions).

        Raises (besides the base class's):
            ValueError: a ``lr_lambdas.`` key that names no function of this scheduler
                (``lr_lambdas.{i}.{name}`` with ``i`` not below ``len(lr_lambdas)``, or ``name`` not
                an identifier), or whose value is not one number.
            TypeError: such a value that is not a bool, int or float array.
        """
        if not hasattr(state_dict, "items"):
            raise TypeError(f"state_dict: expected a mapping of names to arrays, got {type(state_dict).__name__}")
        own = {k: v for k, v in state_dict.items() if not (isinstance(k, str) and k.startswith("lr_lambdas."))}
        loaded = []
        for key, value in state_dict.items():
            if key in own:
                continue
            index, _, name = key.removeprefix("lr_lambdas.").partition(".")
            if not (index.isdigit() and int(index) < len(self.lr_lambdas) and name.isidentifier()):
                raise ValueError(f"load_state_dict: unknown key {key!r} (expected lr_lambdas.{{i}}.{{attribute}} with i "
                                 f"below {len(self.lr_lambdas)}, this LambdaLR's functions)")
            try:
                arr = np.asarray(value)
            except (TypeError, ValueError) as e:
                raise TypeError(f"load_state_dict: {key}: expected a number, got {type(value).__name__} ({e})") from None
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"load_state_dict: {key}: expected a bool, int or float, got a {arr.dtype} array")
            if arr.size != 1:
                raise ValueError(f"load_state_dict: {key}: expected one number, got an array of shape {arr.shape}")
            number = arr.reshape(()).item()  # bool, int or float, as saved
            loaded.append((self.lr_lambdas[int(index)], name, number))
        values = super()._read_state_dict(own)
        values["_lambda_values"] = loaded
        return values

    def _apply_state(self, values: dict) -> None:
        """:meth:`LRScheduler._apply_state`, then the functions' saved attributes (torch's
        ``lr_lambda.__dict__.update``)."""
        loaded = values.pop("_lambda_values")
        super()._apply_state(values)
        for f, name, value in loaded:
            setattr(f, name, value)

    def _lr_formula(self, index: int) -> str:
        """LambdaLR's rate: the base lr times ``lr_lambda`` of the epoch."""
        return f"lr = initial_lr ({self.base_lrs[index]!r}) * lr_lambda({self.last_epoch})"


class LinearLR(LRScheduler):
    """Multiplies the learning rate by a factor that goes linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` steps, then stays, as ``torch.optim.lr_scheduler.LinearLR``
    (torch's recursive form: each step rescales the current lr)::

        epoch 0:  lr = lr · start_factor
        1 <= epoch <= total_iters:  lr = lr · (1 + (end - start) / (total_iters · start + (epoch - 1)(end - start)))

    Args:
        optimizer, last_epoch: see :class:`LRScheduler`.
        start_factor: in (0, 1].  end_factor: in [0, 1].
        total_iters: an int >= 1, or a float holding one (``4.0``: converted to an int).

    A decay to ``end_factor=0`` is clamped at 0: torch's recursive form can round its last steps
    to a tiny negative learning rate (``-1.85e-18`` from ``lr=0.1, start_factor=1/3,
    total_iters=4``), which the optimizers would refuse; here it is 0.0. Every other value equals
    torch's to the last bit.

    Raises:
        ValueError: factors out of range; ``total_iters`` < 1, or a float that is not a whole
            number (``4.5``), NaN or inf.
        TypeError: a factor that is not a real number; ``total_iters`` not an int or a float (a
            bool, a str).
    """

    _HYPER = ("start_factor", "end_factor", "total_iters")
    _INT_HYPER = ("total_iters",)

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5,
                 last_epoch: int = -1):
        settings = self._check_settings(start_factor=start_factor, end_factor=end_factor, total_iters=total_iters)
        self.start_factor = settings["start_factor"]
        self.end_factor = settings["end_factor"]
        self.total_iters = settings["total_iters"]
        super().__init__(optimizer, last_epoch)

    def _check_settings(self, *, start_factor, end_factor, total_iters) -> dict:
        start_factor = _check_real(start_factor, "start_factor")
        end_factor = _check_real(end_factor, "end_factor")
        if not 0 < start_factor <= 1:
            raise ValueError(f"start_factor: expected a value in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"end_factor: expected a value in [0, 1], got {end_factor}")
        return dict(start_factor=start_factor, end_factor=end_factor,
                    total_iters=_check_steps(total_iters, "total_iters", 1))

    def get_lr(self) -> list[float]:
        """Each group's lr at ``last_epoch``: the current lr times the linear factor's ratio between
        this step and the last (torch's recursive form, the class docstring's formula)."""
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return [g["lr"] for g in groups]
        delta = self.end_factor - self.start_factor
        # the ratio is >= 0 (both factors are); rounding made it -1.5e-17 on the last step of a decay
        # to end_factor 0 from 1/3 (torch then writes lr = -1.5e-18, which _checked_lr refuses): 0
        ratio = max(0.0, 1.0 + delta / (self.total_iters * self.start_factor + (self.last_epoch - 1) * delta))
        return [g["lr"] * ratio for g in groups]

    def _closed_form_lr(self) -> list[float]:
        """``base_lr · (start + (end - start) · min(total_iters, last_epoch) / total_iters)`` (torch's
        ``_get_closed_form_lr``, the same arithmetic)."""
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor)
                           * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial lr to ``eta_min`` over ``T_max`` steps (Loshchilov & Hutter
    2017, SGDR without restarts), as ``torch.optim.lr_scheduler.CosineAnnealingLR`` (torch's
    recursive form, which beyond ``T_max`` climbs back up, a cosine of period ``2 · T_max``)::

        lr_t = eta_min + (initial_lr - eta_min) · (1 + cos(π t / T_max)) / 2

    Args:
        optimizer, last_epoch: see :class:`LRScheduler`.
        T_max: the half period in steps, an int >= 1, or a float holding one (``100.0``: converted
            to an int).
        eta_min: the minimum lr, finite and >= 0 (stricter than torch: a negative one writes
            negative learning rates, which the optimizers refuse).

    Raises:
        ValueError: ``T_max`` < 1, or a float that is not a whole number (``100.5``), NaN or inf;
            ``eta_min`` < 0 or not finite.
        TypeError: ``T_max`` not an int or a float (a bool, a str); ``eta_min`` not a real number.
    """

    _HYPER = ("T_max", "eta_min")
    _INT_HYPER = ("T_max",)

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        settings = self._check_settings(T_max=T_max, eta_min=eta_min)
        self.T_max = settings["T_max"]
        self.eta_min = settings["eta_min"]
        super().__init__(optimizer, last_epoch)

    def _check_settings(self, *, T_max, eta_min) -> dict:
        return dict(T_max=_check_steps(T_max, "T_max", 1), eta_min=check_float(eta_min, "eta_min", minimum=0.0))

    def get_lr(self) -> list[float]:
        """Each group's lr at ``last_epoch``: torch's recursive cosine step from the current lr (the
        closed form of the class docstring on the first step of a resumed schedule)."""
        groups = self.optimizer.param_groups
        t, T, eta = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return [g["lr"] for g in groups]
        if self._step_count == 1 and t > 0:
            return [eta + (base - eta) * (1 + math.cos(t * math.pi / T)) / 2 for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [g["lr"] + (base - eta) * (1 - math.cos(math.pi / T)) / 2 for base, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (g["lr"] - eta) + eta
                for g in groups]

    def _closed_form_lr(self) -> list[float]:
        """The class docstring's formula at ``last_epoch`` (torch's ``_get_closed_form_lr``, the same
        arithmetic)."""
        return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class SequentialLR(LRScheduler):
    """Runs ``schedulers`` one after the other on one optimizer, each from its milestone on, as
    ``torch.optim.lr_scheduler.SequentialLR`` (torch 2.x: the same steps, hence the same learning
    rates to the last bit). The usual warmup then cosine decay::

        warmup = LinearLR(opt, start_factor=0.1, total_iters=w)
        cosine = CosineAnnealingLR(opt, T_max=total - w)
        sched = SequentialLR(opt, [warmup, cosine], milestones=[w])

    Steps (``milestones`` m_1 < m_2 < ..., the scheduler of step t is ``schedulers[i]``, i the
    number of milestones <= t)::

        construction: every group's lr back to its initial_lr, every scheduler's last_epoch one
                      back (undoing the step its own constructor made), then the initial step of
                      the scheduler of step 0
        t == m_i:     schedulers[i] restarts at its epoch 0, from its base lrs (its closed form:
                      cosine's base lr, LinearLR's base lr · start_factor)
        otherwise:    schedulers[i].step()

    ``get_last_lr()`` is the learning rates the scheduler of the last step wrote. ``state_dict()``
    nests the schedulers' states as torch's does (its ``_schedulers`` list), flat for safetensors:
    ``last_epoch`` (int64), ``last_lr`` (float64, one per group), ``milestones`` (int64, shape
    ``(len(schedulers) - 1,)``) and ``schedulers.{i}.{key}`` for each key of ``schedulers[i]``'s.
    To resume, build the optimizer, the schedulers and the SequentialLR as at the start, then load the
    optimizer's state and this one's (not the inner schedulers' separately: this one holds theirs).

    Args:
        optimizer: see :class:`LRScheduler`.
        schedulers: a list or tuple of at least one scheduler of this module, all built on
            ``optimizer`` (each once, none a SequentialLR itself).
        milestones: a list or tuple of ``len(schedulers) - 1`` increasing ints >= 0 (or floats
            holding them, ``4.0``: converted to ints): the steps at which ``schedulers[1]``,
            ``schedulers[2]``, ... take over.
        last_epoch: -1 (the default) to start; as torch, another value only shifts the step count
            (the schedulers start as at -1): resume with :meth:`load_state_dict` instead.

    Raises:
        TypeError: ``optimizer`` without ``param_groups``; ``schedulers`` or ``milestones`` not a
            list or tuple; an entry of ``schedulers`` that is not an :class:`LRScheduler`, or is a
            SequentialLR (stricter than torch, which cannot restart a nested one at its milestone);
            a milestone not an int or a float (a bool, a str); ``last_epoch`` not an int.
        ValueError: no scheduler; a scheduler of another optimizer, one given twice, or one built
            for another number of param groups (a group added since); ``len(milestones) !=
            len(schedulers) - 1``; a milestone that is a float but no whole number (``4.5``), NaN
            or inf; milestones negative or not increasing (torch does not check the
            order, and bisects a disordered list into a meaningless schedule). Nothing changes.

    Source: torch.optim.lr_scheduler.SequentialLR (torch/optim/lr_scheduler.py;
    https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.SequentialLR.html).
    """

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1):
        groups = _param_groups(optimizer)
        schedulers = _check_schedulers(schedulers, optimizer, len(groups))
        milestones = _check_milestones(milestones, len(schedulers))
        last_epoch = _check_int(last_epoch, "last_epoch", -1, _MAX_COUNT - 1)  # the step count: one more
        for i, g in enumerate(groups):
            if "initial_lr" not in g:  # the schedulers' constructors put it in every group of theirs
                raise ValueError(f"optimizer: param_groups[{i}] has no 'initial_lr'; expected the optimizer the "
                                 "schedulers were built on, with the groups they were built for")
        self.optimizer = optimizer
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        saved = _snapshot_schedulers(schedulers, optimizer)
        try:
            for g in groups:
                g["lr"] = g["initial_lr"]
            for s in schedulers:  # torch's recursive_undo (no nesting here)
                s.last_epoch -= 1
            first = schedulers[bisect.bisect_right(milestones, 0)]
            first._initial_step()
        except BaseException:
            _restore_schedulers(saved)
            raise
        self._last_lr = first.get_last_lr()

    def step(self) -> None:
        """Advances by one step: the scheduler of the new step steps, or restarts at its epoch 0 if
        the step is its milestone (see the class docstring). A step that raises changes nothing.

        Raises:
            What the scheduler's step raises (e.g. a param group added since: ValueError).
            ValueError: ``last_epoch`` at ``2**63 - 1`` already, the most an int64 state dict holds.
        """
        self.last_epoch = _advanced(self, self.last_epoch, "last_epoch")
        i = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[i]
        try:
            if i > 0 and self._milestones[i - 1] == self.last_epoch:
                scheduler._restart()
            else:
                scheduler.step()
        except BaseException:
            self.last_epoch -= 1
            raise
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, np.ndarray]:
        """``last_epoch``, ``last_lr``, ``milestones`` and each scheduler's state under
        ``schedulers.{i}.`` (see the class docstring), as numpy arrays (safetensors-ready)."""
        out = {
            "last_epoch": np.array(self.last_epoch, dtype=np.int64),
            "last_lr": np.array(self._last_lr, dtype=np.float64),
            "milestones": np.array(self._milestones, dtype=np.int64),
        }
        for i, s in enumerate(self._schedulers):
            out.update({f"schedulers.{i}.{key}": value for key, value in s.state_dict().items()})
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a :meth:`state_dict`: this scheduler's step count, milestones and last learning
        rates and every inner scheduler's state (with its ``load_state_dict``, which does not write
        the groups' ``lr``: load the optimizer's state too, in either order).

        Everything is checked before anything changes: this scheduler's values, then each inner
        scheduler's state (with the checks of its own ``load_state_dict``).

        Raises:
            TypeError: ``state_dict`` not a mapping; a value that is not numbers (named by its key).
            ValueError: missing or unknown keys (a ``schedulers.{i}.`` of no scheduler among them),
                another number of param groups or of milestones, milestones negative, not whole
                or not increasing, ``last_epoch`` < 0 or > ``2**63 - 1``; an inner scheduler's refusal, prefixed with
                ``schedulers.{i}``.
        """
        self._apply_state(self._read_state_dict(state_dict))

    def _read_state_dict(self, state_dict: dict) -> dict:
        """As :meth:`LRScheduler._read_state_dict`: this scheduler's attributes, and under
        ``"inner"`` what each inner scheduler's ``_read_state_dict`` returned."""
        if not hasattr(state_dict, "items"):
            raise TypeError(f"state_dict: expected a mapping of names to arrays, got {type(state_dict).__name__}")
        n = len(self._schedulers)
        own, inner = {}, [{} for _ in range(n)]
        for key, value in state_dict.items():
            head, _, rest = str(key).partition(".")
            index, _, name = rest.partition(".")
            if head == "schedulers" and index.isdecimal() and int(index) < n and name:
                inner[int(index)][name] = value
            else:
                own[key] = value
        expected = {"last_epoch", "last_lr", "milestones"}
        if set(own) != expected:
            raise ValueError(f"load_state_dict: missing keys {sorted(expected - set(own))}, unknown keys "
                             f"{sorted(map(str, set(own) - expected))} (expected {sorted(expected)} and "
                             f"schedulers.{{i}}.* for i < {n})")
        last_epoch = _loaded_int(own["last_epoch"], "last_epoch", 0)
        groups = self.optimizer.param_groups
        last = _loaded_array(own["last_lr"], "last_lr").reshape(-1)
        if last.size != len(groups):
            raise ValueError(f"load_state_dict: last_lr: expected {len(groups)} learning rates (one per param group), "
                             f"got {last.size}")
        last_lr = [_loaded_lr(x, f"last_lr[{i}]") for i, x in enumerate(last)]
        saved = _loaded_array(own["milestones"], "milestones").reshape(-1)
        try:
            milestones = _check_milestones([_loaded_int(x, f"milestones[{i}]", 0) for i, x in enumerate(saved)], n)
        except ValueError as e:
            raise ValueError(f"load_state_dict: {str(e).removeprefix('load_state_dict: ')}") from None
        inner_values = []
        for i, (s, state) in enumerate(zip(self._schedulers, inner)):
            try:
                inner_values.append(s._read_state_dict(state))
            except (TypeError, ValueError) as e:
                raise type(e)(f"load_state_dict: schedulers.{i}: {str(e).removeprefix('load_state_dict: ')}") from None
        return dict(last_epoch=last_epoch, _milestones=milestones, _last_lr=last_lr, inner=inner_values)

    def _apply_state(self, values: dict) -> None:
        """Sets what :meth:`_read_state_dict` returned: each inner scheduler's state, then ours."""
        values = dict(values)
        for s, inner in zip(self._schedulers, values.pop("inner")):
            s._apply_state(inner)
        for key, value in values.items():
            setattr(self, key, value)


def _check_scheduler_entries(schedulers: list, names: list[str], optimizer, foreign: Callable[[LRScheduler], str]) -> None:
    """Each of ``schedulers`` an :class:`LRScheduler` of ``optimizer``, none listed twice; the
    shared check of :class:`SequentialLR`'s ``schedulers`` and of a checkpoint's list of schedulers
    (``transformer_core.training``).

    Args:
        schedulers: the entries, in order.
        names: how the errors name each entry (``"schedulers[0]"``, ...).
        optimizer: the optimizer they must all belong to.
        foreign: the message's "expected ..., got ..." for an entry of another optimizer.

    Raises:
        TypeError: an entry that is not an LRScheduler. ValueError: an entry of another optimizer,
            or one listed twice; each naming the entry.
    """
    for i, (s, name) in enumerate(zip(schedulers, names)):
        if not isinstance(s, LRScheduler):
            raise TypeError(f"{name}: expected a transformer_core.lr_scheduler LRScheduler, got {type(s).__name__}")
        if s.optimizer is not optimizer:
            raise ValueError(f"{name}: {foreign(s)}")
        first = next(j for j, other in enumerate(schedulers) if other is s)
        if first != i:
            raise ValueError(f"{name}: expected each scheduler once, got the same {type(s).__name__} as "
                             f"{names[first]}")


def _check_schedulers(schedulers, optimizer, n_groups: int) -> list[LRScheduler]:
    """SequentialLR's ``schedulers``, checked (see its Raises): a new list."""
    if not isinstance(schedulers, (list, tuple)):
        raise TypeError(f"schedulers: expected a list or tuple of LRSchedulers, got {type(schedulers).__name__}")
    if not schedulers:
        raise ValueError("schedulers: expected at least one scheduler, got none")
    schedulers = list(schedulers)
    _check_scheduler_entries(
        schedulers, [f"schedulers[{i}]" for i in range(len(schedulers))], optimizer,
        lambda s: (f"expected a scheduler of `optimizer` (all schedulers must belong to the same optimizer), "
                   f"got a {type(s).__name__} of another optimizer"))
    for i, s in enumerate(schedulers):
        if isinstance(s, SequentialLR):
            raise TypeError(f"schedulers[{i}]: expected a scheduler that steps by itself, got a SequentialLR "
                            "(a SequentialLR cannot be nested: list its schedulers in this one)")
        if len(s.base_lrs) != n_groups:
            raise ValueError(f"schedulers[{i}]: built for {len(s.base_lrs)} param groups, the optimizer has "
                             f"{n_groups} (a group added since has no schedule: build the schedulers again)")
    return schedulers


def _check_milestones(milestones, n_schedulers: int) -> list[int]:
    """SequentialLR's ``milestones``: ``n_schedulers - 1`` increasing ints >= 0 (or whole floats,
    see :func:`_check_steps`), as a new list of ints."""
    if not isinstance(milestones, (list, tuple)):
        raise TypeError(f"milestones: expected a list or tuple of ints, got {type(milestones).__name__}")
    if len(milestones) != n_schedulers - 1:
        raise ValueError(f"milestones: expected len(schedulers) - 1 = {n_schedulers - 1} milestones (the steps at "
                         f"which the schedulers after the first take over), got {len(milestones)}")
    milestones = [_check_steps(m, f"milestones[{i}]", 0) for i, m in enumerate(milestones)]
    if any(b <= a for a, b in zip(milestones, milestones[1:])):
        raise ValueError(f"milestones: expected increasing steps, got {milestones}")
    return milestones


def _snapshot_schedulers(schedulers, optimizer) -> list:
    """What stepping or loading ``schedulers`` may change: their attributes and the optimizer's
    param-group dicts (``lr``, ``initial_lr``), for :func:`_restore_schedulers`."""
    return [(s, dict(vars(s))) for s in schedulers] + [(g, dict(g)) for g in optimizer.param_groups]


def _restore_schedulers(snapshot: list) -> None:
    for obj, saved in snapshot:
        target = obj if isinstance(obj, dict) else vars(obj)
        target.clear()
        target.update(saved)


def _linear_warmup_decay(current_step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine_warmup_decay(current_step: int, *, num_warmup_steps: int, num_training_steps: int,
                         num_cycles: float) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int,
                                    last_epoch: int = -1) -> LambdaLR:
    """Linear warmup from 0 to the initial lr over ``num_warmup_steps``, then linear decay to 0 at
    ``num_training_steps`` (Hugging Face transformers' schedule, the same formula)::

        factor(t) = t / max(1, warmup)                                     for t < warmup
                  = max(0, (total - t) / max(1, total - warmup))           after

    Returns:
        A :class:`LambdaLR`.

    The step counts are ints, or floats holding whole numbers (``100.0``: converted to ints).

    Raises:
        ValueError: negative step counts, or floats that are not whole numbers (``10.5``), NaN or
            inf. TypeError: step counts not ints or floats (a bool, a str).
    """
    fn = functools.partial(_linear_warmup_decay, num_warmup_steps=_check_steps(num_warmup_steps, "num_warmup_steps", 0),
                           num_training_steps=_check_steps(num_training_steps, "num_training_steps", 0))
    return LambdaLR(optimizer, fn, last_epoch)


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int,
                                    num_cycles: float = 0.5, last_epoch: int = -1) -> LambdaLR:
    """Linear warmup from 0 to the initial lr over ``num_warmup_steps``, then a cosine decay
    (Hugging Face transformers' schedule, the same formula; ``num_cycles=0.5``: half a cosine, from
    the initial lr down to 0 at ``num_training_steps``)::

        factor(t) = t / max(1, warmup)                                     for t < warmup
                  = max(0, ½ (1 + cos(2π · num_cycles · progress)))        after,
        progress = (t - warmup) / max(1, total - warmup)

    Returns:
        A :class:`LambdaLR`.

    The step counts are ints, or floats holding whole numbers (``100.0``: converted to ints).

    Raises:
        ValueError: negative step counts, or floats that are not whole numbers (``10.5``), NaN or
            inf; ``num_cycles`` NaN or inf. TypeError: step counts not ints or floats (a bool, a
            str), non-numeric ``num_cycles``.
    """
    fn = functools.partial(_cosine_warmup_decay, num_warmup_steps=_check_steps(num_warmup_steps, "num_warmup_steps", 0),
                           num_training_steps=_check_steps(num_training_steps, "num_training_steps", 0),
                           num_cycles=_check_real(num_cycles, "num_cycles"))
    return LambdaLR(optimizer, fn, last_epoch)
