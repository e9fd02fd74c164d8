"""Optimizers (AdamW, Adam, SGD) and gradient clipping for :class:`~transformer_core.parameter.Parameter`
objects, with torch.optim's semantics and order of operations, and fused C++ updates.

Each optimizer updates every parameter's ``data`` IN PLACE (one fused, parallel C++ pass per
parameter over its flat arrays: the moments and the weights together), skips parameters whose
``grad`` is None (as torch), and keys its state by parameter NAME, so that its ``state_dict()`` is a
flat ``name -> numpy array`` dict that ``safetensors.numpy.save_file`` writes as is::

    state.{param_name}.step                     int64 scalar (Adam/AdamW)
    state.{param_name}.exp_avg, .exp_avg_sq     (Adam/AdamW), .max_exp_avg_sq (amsgrad)
    state.{param_name}.momentum_buffer          (SGD with momentum, after its first step)
    params.{param_name}.group                   int64 scalar: the index of its param group
    param_groups.{i}.{hyperparameter}           float64 scalars (lr, eps, weight_decay, ...;
                                                betas as a (2,) array, flags as 0/1)

A step writes the weights: a model's training forward still awaiting its backward can no longer
have it (its backward raises :class:`~transformer_core.module.WeightsChangedError`, as torch's
"modified by an inplace operation"); the order is forward, backward, ``step()``. Only the library's
writes are seen (a step, ``load_state_dict``): values assigned into ``p.data`` by hand are not.

Non-finite gradients: ``step()`` first checks every gradient it is about to use; if any holds NaN or
±inf it raises :class:`NonFiniteGradientError` (a ``ValueError``) naming those parameters, and
NOTHING has changed (no weight, moment or step count). The training loop can catch it, call
``zero_grad()`` and go on with the next batch (what ``torch.amp.GradScaler`` does on overflow), or
stop.

Hyperparameters degenerate in the parameters' dtype: the C++ update rounds its scalars to the
parameter's dtype once (as torch's kernels take Python floats), so ``step()`` also refuses, before
any update, a hyperparameter that becomes degenerate there, with a ValueError naming it and the
dtype: an Adam ``eps`` that rounds to 0 (``eps=1e-50`` in float32: an element whose gradient has
been zero at every step would get 0 / 0 = NaN; for the same reason ``eps`` must be > 0, where torch
allows 0), or a scalar that overflows to ±inf (``lr``, ``weight_decay``, SGD's ``momentum`` and
``1 - dampening``, Adam's first step size ``lr / (1 - β1)``, AdamW's ``lr · weight_decay``: inf
times a zero element is NaN). These are scalar checks, once per group and dtype. torch checks none
of them: its float32 step then writes NaN / inf into the weights, or raises RuntimeError ("cannot be
converted to type float without overflow") where the scalar is an ``alpha`` / ``value`` argument.

What is not checked is overflow of the values themselves: with finite gradients and hyperparameters
that pass these checks, a step can still write ±inf into the weights when an intermediate exceeds
the dtype's range (float32's max is 3.4e38: e.g. SGD with ``lr=1e10`` and a gradient of 1e30, or a
weight times a huge L2 term), as torch's does, and NaN can follow at the next step (inf - inf). The
gradients of the next backward are then non-finite as a rule, and that ``step()`` refuses them.

An optimizer over parameters that own their arrays (``Parameter(np.array(...))``) can be copied
(``copy.deepcopy``) and pickled, alone or with a learning-rate scheduler that holds it: the copy
(with copies of the parameters) keys its state by the same names and goes on as the original would.
One over a model's parameters (``model.named_parameters()``: views of the C++ model's buffers, which
cannot be copied) cannot: copying or pickling it raises a TypeError naming such a parameter. Save its
``state_dict()`` instead (``training.save_checkpoint``) and load it into an optimizer over the other
model's parameters.

Hyperparameters are checked when a group is added AND at every ``step()``, for every group before
any parameter is touched (a learning-rate scheduler, or the caller, may have written into
``param_groups``): a bad value raises the constructor's ValueError / TypeError, prefixed with the
group, and nothing changes (torch checks only at construction).

Sources: Kingma & Ba 2015 (Adam), Loshchilov & Hutter 2019 (AdamW, decoupled weight decay), Reddi et
al. 2018 (AMSGrad), Sutskever et al. 2013 (momentum); torch/optim/adam.py and sgd.py for the order
of operations, torch/nn/utils/clip_grad.py for clipping.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Callable

import numpy as np

from ._runtime import variant
from ._validation import check_bool, check_float, described, type_path
from .module import (
    TIED_HEAD_COPY,
    _BoundParameter,
    _lost_view,
    _storage_epoch,
    _storage_tables,
    deferred_interrupts,
    weights_written,
)
from .parameter import Parameter

__all__ = ["Optimizer", "Adam", "AdamW", "SGD", "NonFiniteGradientError", "clip_grad_norm_"]


class NonFiniteGradientError(ValueError):
    """A gradient holds NaN or ±inf. ``names``: the parameters concerned."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = names


def _check_iterable(params, argument: str, expected: str) -> None:
    """Refuses (TypeError naming ``argument``: ``expected``, then what was given) what cannot be an
    iterable of parameters, BEFORE it is iterated: a single Parameter, None, a str, bytes, or an
    array (numpy's, torch's, anything with ``__array__`` / ``__array_interface__`` / ``__dlpack__``:
    iterating one element by element would take seconds and many times its size in memory before
    its first element, a number, is refused)."""
    if isinstance(params, Parameter):
        raise TypeError(f"{argument}: expected {expected}, got a single Parameter (wrap it in a list)")
    array_like = isinstance(params, np.ndarray) or any(
        hasattr(params, attribute) for attribute in ("__array__", "__array_interface__", "__dlpack__"))
    if array_like:
        raise TypeError(f"{argument}: expected {expected}, got {described(params)} (an array: the optimizers and "
                        "clip_grad_norm_ take Parameters, e.g. model.named_parameters(), or Parameter(array, name=...))")
    if params is None or isinstance(params, (str, bytes, bytearray, memoryview)) or not hasattr(params, "__iter__"):
        raise TypeError(f"{argument}: expected {expected}, got {described(params)}")


def _check_ordered(params, argument: str) -> None:
    """Refuses (TypeError naming ``argument``) a ``set`` or ``frozenset`` of an optimizer's
    parameters, as torch's ``add_param_group`` refuses a set: its order changes between runs, and
    with it the names by position of unnamed parameters, so a resumed optimizer would load one
    parameter's moments into another (stricter than torch, which takes a set at the top level and a
    frozenset anywhere)."""
    if isinstance(params, (set, frozenset)):
        raise TypeError(f"{argument}: optimizer parameters need to be organized in ordered collections, got a "
                        f"{type(params).__name__}: the ordering of parameters in a set changes between runs (the "
                        "names by position, which key the state, would follow it); use a list instead")


def _named_parameters(params, argument: str = "params") -> list[tuple[str | None, Parameter]]:
    """A list of ``(given name or None, Parameter)`` from Parameters and ``(name, Parameter)`` pairs
    (or a ``{name: Parameter}`` dict): the name is the pair's, None for a Parameter given alone
    (the caller falls back on ``p.name``). Errors name ``argument`` (``params`` of an optimizer,
    ``parameters`` of ``clip_grad_norm_``)."""
    _check_iterable(params, argument, "an iterable of Parameters or (name, Parameter) pairs")
    if isinstance(params, dict):
        params = params.items()  # a {name: Parameter} mapping
    out = []
    for i, item in enumerate(params):
        if isinstance(item, Parameter):
            out.append((None, item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Parameter):
            if not isinstance(item[0], str):
                raise TypeError(f"{argument}[{i}]: expected a (str name, Parameter) pair, got name {item[0]!r}")
            out.append(item)
        else:
            # a pair's second element is what is wrong in it (torch's named_parameters() gives such pairs)
            got = (f"a ({type_path(item[0])}, {type_path(item[1])}) pair" if isinstance(item, tuple) and len(item) == 2
                   else type_path(item))
            raise TypeError(f"{argument}[{i}]: expected a Parameter or a (name, Parameter) pair, got {got} (pass "
                            "transformer_core Parameters: a model's parameters() or named_parameters(), or "
                            "transformer_core.parameter.Parameter(array, name=...))")
    return out


def _weight_key(p: Parameter) -> tuple:
    """What identifies the weight ``p`` holds: for a model's parameter (a view of a C++ module's
    buffer) that module and the weight's name there, so that two Parameter objects over one weight
    (a model's and a submodule's ``named_parameters()``) are the same weight; else ``p`` itself."""
    if isinstance(p, _BoundParameter):
        return ("model", id(p._impl), p._core_name)
    return ("parameter", id(p))


def _given_twice(i: int, name: str | None, p: Parameter, earlier: Parameter, earlier_name: str | None,
                 earlier_index: int | None) -> str:
    """The message for ``params[i]`` (``p``, named ``name`` or None) whose weight ``earlier`` holds
    too (named ``earlier_name`` or None; ``earlier_index``: its index in the same group, or None
    for one of an earlier group)."""
    if earlier is p:
        if earlier_name is not None:
            return f"params: parameter {earlier_name!r} is given twice"
        return f"params[{i}]: the unnamed parameter of params[{earlier_index}] is given twice"

    def what(n, j):
        """How a message names the parameter named ``n`` (or None) at index ``j``."""
        return f"parameter {n!r}" if n is not None else f"the unnamed parameter of params[{j}]"

    return (f"params[{i}]: {what(name, i)} views the same model weight as {what(earlier_name, earlier_index)} "
            "(two Parameter objects over one weight, e.g. from a model's and its submodule's named_parameters(): "
            "a step would update it twice); pass each weight once")


#: The calls that convert a model's weights in place, and what a user who wants to train does
#: instead. ``quantize`` stores int8 (a tied head's copy too); ``set_gguf_weights`` (and a GGUF
#: file's ``from_pretrained``, which calls it) stores GGUF blocks, always in place.
_CONVERTED_BY = {
    "quantize(inplace=True)": "int8 weights do not train: train the float model and quantize it afterwards, or "
                              "quantize a copy (quantize(model), without inplace) and keep training this one",
    "set_gguf_weights": "GGUF blocks do not train: train a float model (e.g. a new one that loads this model's "
                        "state_dict(), which holds the blocks dequantized to float32) and give it the blocks "
                        "afterwards",
}


def _converted_by(storage: str) -> str:
    """The call of ``_CONVERTED_BY`` that stores a weight as ``storage`` (a ``parameter_storage()`` name)."""
    return "quantize(inplace=True)" if storage == "int8" else "set_gguf_weights"


def _converted_message(lost: dict) -> str:
    """The message of a step refused for converted weights: ``lost`` maps ``(by, why)`` (see
    ``Optimizer._converted``) to the names of the parameters. Led by the calls that converted them
    (generic where one is not known), then each call's remedy."""
    calls = list(dict.fromkeys(by for by, _ in lost))
    if None in calls:
        head = "step: weights this optimizer updates were converted in place: "
    else:
        head = f"step: {' and '.join(calls)} converted weights this optimizer updates: "
    what = "; ".join(f"{', '.join(names)}: {why}" for (_, why), names in lost.items())
    remedies = [_CONVERTED_BY[by] for by in calls if by is not None]
    return (head + what + "; nothing was updated" + "".join(f". {r[0].upper()}{r[1:]}" for r in remedies))


#: The largest step count a state may hold: the C++ update takes the next one, ``step + 1``, as an int64.
_MAX_STEP = 2**63 - 2


def _count(value: np.ndarray, key: str, minimum: int, maximum: int | None = None) -> int:
    """A loaded scalar that counts (a step, a group index) as an int in ``[minimum, maximum]``: an
    integer array, or a float one holding a whole number (torch saves ``step`` as a float tensor).
    TypeError for an array of no numbers (bool, str, object, complex), ValueError otherwise."""
    expected = f"a whole number >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    if value.dtype.kind not in "iuf":
        raise TypeError(f"load_state_dict: {key}: expected {expected} (an int or float scalar), "
                        f"got a {value.dtype} array")
    whole = value.shape == () and (value.dtype.kind in "iu" or float(value).is_integer())
    if not whole or int(value) < minimum or (maximum is not None and int(value) > maximum):
        raise ValueError(f"load_state_dict: {key}: expected {expected}, got {value!r}")
    return int(value)


def _check_float(value, name: str, minimum: float = 0.0, below: float | None = None) -> float:
    """A finite hyperparameter in ``[minimum, below)`` (see ``_validation.check_float``)."""
    return check_float(value, name, minimum=minimum, maximum=below, max_open=below is not None)


def _check_betas(betas) -> tuple[float, float]:
    """Adam's ``betas`` as a tuple of two Python floats, each in [0, 1): from a tuple, a list or any
    other sequence of two numbers, or a numpy array of shape (2,). TypeError for anything else (a
    str, a number, a mapping, an array of another shape), naming ``betas`` and saying what is
    accepted; the numbers' own TypeError / ValueError name ``betas[0]`` / ``betas[1]``."""
    accepted = "a pair (beta1, beta2): a tuple, list or other sequence of 2 numbers, or a numpy array of shape (2,)"
    if isinstance(betas, np.ndarray):
        pair = betas.ndim == 1 and betas.shape == (2,)
        if pair:
            betas = betas.tolist()  # numpy scalars as Python numbers (a bool or complex array: refused below)
    else:
        pair = isinstance(betas, Sequence) and not isinstance(betas, (str, bytes, bytearray)) and len(betas) == 2
    if not pair:
        raise TypeError(f"betas: expected {accepted}; got {described(betas)}")
    return _check_float(betas[0], "betas[0]", 0.0, 1.0), _check_float(betas[1], "betas[1]", 0.0, 1.0)


def _check_torch_options(foreach, fused, capturable: bool | None, differentiable: bool) -> None:
    """torch's implementation choices, taken for its signature (see :class:`Adam`): ``foreach`` and
    ``fused`` None, False or True (not both True, as torch), ``capturable`` (None for SGD, which
    has no such argument) and ``differentiable`` False. TypeError for another type, ValueError for a
    value not supported; each naming the argument. None of them is stored."""
    for name, value in (("foreach", foreach), ("fused", fused)):
        if value is not None and not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name}: expected a bool or None, got {described(value)}")
    if foreach and fused:
        raise ValueError("foreach, fused: expected at most one of them True (as torch, which raises too), got both")
    for name, value in (("capturable", capturable), ("differentiable", differentiable)):
        if value is None:
            continue
        if check_bool(value, name):
            raise ValueError(f"{name}: expected False, got True (not supported: {_UNSUPPORTED[name]})")


#: why ``capturable`` / ``differentiable`` cannot be True (see :func:`_check_torch_options`)
_UNSUPPORTED = {
    "capturable": "there are no CUDA graphs to capture; the step runs on the CPU, its scalars in Python",
    "differentiable": "the step is a C++ update in place, through which no gradient flows",
}


class Optimizer:
    """Base class: parameter groups, state keyed by name, ``zero_grad``, the non-finite check,
    ``state_dict`` / ``load_state_dict``. Subclasses define ``_check_group``, ``_state_fields`` and
    ``_update``.

    Args:
        params: an iterable of :class:`Parameter`, of ``(name, Parameter)`` pairs (e.g. a model's
            ``named_parameters()``), a ``{name: Parameter}`` dict, or of param-group dicts
            ``{"params": [...], "lr": ..., ...}`` (torch's form: per-group hyperparameters override
            the defaults). A group's ``"params"`` may be a single Parameter (wrapped in a list, as
            torch does) or empty (a group with no parameters, e.g. the no-decay group of a model
            without biases or norms: it steps nothing), as long as the optimizer has at least one
            parameter in all.

            The names key the state (and the state dict's keys): a pair's (or the dict's) name, else
            the Parameter's own ``name``. A Parameter without a name (and not in a pair) is named by
            its position, ``"0"``, ``"1"``, ..., or, when a named parameter of the optimizer already
            has that name, by the next number no parameter has (``[Parameter(x, name="1"),
            Parameter(y)]``: ``"1"``, ``"2"``). So is a Parameter given alone whose own name an
            earlier parameter carries too (the ``parameters()`` of two modules, both ``"weight"``,
            which torch accepts): ``a.parameters() + b.parameters()`` of two ``nn.Linear`` gives
            ``"weight"``, ``"bias"``, ``"2"``, ``"3"``. Any other clash is refused: a name given in a
            pair, or one that a parameter was named by position, is no other parameter's. Names by
            position depend on the order: an optimizer that is to load this one's state dict must be
            built the same way (pairs with distinct names, e.g. a model's ``named_parameters()``,
            give names that do not).
        defaults: the hyperparameters of every group.

    Raises:
        TypeError: ``params`` not an iterable (a single Parameter, an array: refused before it is
            iterated); a ``set`` or ``frozenset`` of parameters, here or as a group's ``"params"``
            (its order, and so the names by position, changes between runs: torch's
            ``add_param_group`` refuses a set too); a params entry that is neither a Parameter, a
            pair nor a group dict.
        ValueError: no parameters (an empty ``params``, as torch, or only groups without
            parameters, which torch accepts: such an optimizer would step nothing), a parameter given
            twice (or two Parameters over one model weight), a name given in a pair that another
            parameter has, an empty name (``""``: its state-dict keys could not be read back), a
            group key that is no hyperparameter (see :meth:`add_param_group`), a bad
            hyperparameter: in a group or in ``defaults`` (checked even when every group overrides
            it, as torch checks the constructor's arguments).
    """

    #: names of the flags among the hyperparameters (stored as 0/1 in the state dict)
    _FLAGS: tuple = ()
    #: per-parameter state arrays that hold no negative value (second moments)
    _NONNEGATIVE_STATE: tuple = ()
    #: what a load's error adds when it refuses +inf in one of ``_NONNEGATIVE_STATE``
    _INF_REFUSED: str = ""

    def __init__(self, params, defaults: dict):
        defaults = dict(defaults)
        self._check_group(defaults)  # even if every group overrides them (as torch): a later group may not
        self.defaults = defaults
        self.param_groups: list[dict] = []
        self.state: dict[str, dict] = {}
        self._step_calls = 0  # step() calls, for the schedulers' order warning (torch's _opt_called)
        self._names: dict[int, str] = {}  # id(Parameter) -> name
        # an array is refused before it is iterated (list() would make a numpy scalar of each element)
        _check_iterable(params, "params", "an iterable of Parameters, (name, Parameter) pairs or param-group dicts")
        _check_ordered(params, "params")
        params = list(params.items()) if isinstance(params, dict) else list(params)
        if not params:
            raise ValueError("params: expected at least one parameter, got an empty list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for g in groups:
            self.add_param_group(g)
        if not self._names:  # only groups without parameters (torch accepts them): nothing to optimize
            raise ValueError(f"params: expected at least one parameter, got {len(groups)} param groups without "
                             "parameters")

    # ---- groups and names -----------------------------------------------------------------------
    def add_param_group(self, param_group: dict) -> None:
        """Adds a group ``{"params": [...], **hyperparameters}`` (missing hyperparameters: defaults).
        ``"params"`` may be a single Parameter (wrapped in a list, as torch does) or empty: a group
        without parameters steps nothing, and its hyperparameters are in the state dict as any
        group's (``param_groups.{i}.*``; no ``params.*.group`` names it). The whole group is checked
        before anything is registered: a group that raises leaves the optimizer as it was (its
        parameters can be added again, in a valid group).

        Raises:
            TypeError: not a dict with a ``"params"`` key; ``"params"`` a ``set`` or ``frozenset``
                (unordered: use a list); a params entry that is neither a Parameter nor a
                ``(name, Parameter)`` pair; a hyperparameter of the wrong type.
            ValueError: a parameter given twice (here or in another group; or two Parameters over
                one model weight), a name given in a pair that another parameter has (see
                :class:`Optimizer` for the names), an empty name (``""``), bad hyperparameters
                (named); a key that is no hyperparameter of this optimizer (e.g. ``"name": "head"``,
                which torch keeps): the state dict is flat float64 arrays, one per group key
                (``param_groups.{i}.{key}``), so that such a value (a str, any object) could not be
                saved, and ``load_state_dict`` reads back only the hyperparameters.
        """
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(f"param_group: expected a dict with a 'params' key, got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Parameter):  # as torch's add_param_group
            params = [params]
        _check_ordered(params, "params")
        named = _named_parameters(params)
        unknown = set(param_group) - set(self.defaults) - {"params", "initial_lr"}
        if unknown:
            raise ValueError(f"param_group: unknown hyperparameters {sorted(unknown)}; expected {sorted(self.defaults)} "
                             "(the state dict holds each group key as a float64 array: other keys could not be saved)")
        group = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        self._check_group(group)
        owner = {self._names[id(q)]: q for g in self.param_groups for q in g["params"]}  # name -> its parameter
        # weight -> (its Parameter, its name or None, its index in this group or None): a Parameter given
        # twice, or two Parameters over one model weight, would have it stepped twice
        seen = {_weight_key(q): (q, self._names[id(q)], None) for g in self.param_groups for q in g["params"]}
        added: dict[int, str] = {}  # id(Parameter) -> name, registered only once all are checked
        by_position: list[tuple[int, Parameter]] = []  # named once every other name is known (below)
        for i, (given, p) in enumerate(named):
            name = p.name if given is None else given
            if name == "":
                raise ValueError(f"params[{i}]: expected a non-empty parameter name, got '' (the state dict's keys "
                                 "are made of the names, params.{name}.group: an empty one could not be read back)")
            earlier = seen.get(_weight_key(p))
            if earlier is not None:
                raise ValueError(_given_twice(i, name, p, *earlier))
            seen[_weight_key(p)] = (p, name, i)
            if name is None:
                by_position.append((i, p))
                continue
            holder = owner.get(name)
            if holder is not None:
                if given is None and holder.name == name:
                    # two Parameters given alone that carry one name (two modules' parameters(): both
                    # "weight"), which torch accepts: the first keeps it, this one is named by position
                    by_position.append((i, p))
                    continue
                raise ValueError(
                    f"params: two parameters are named {name!r} (the names key the optimizer's state: a name given in "
                    "a (name, Parameter) pair, or a dict, must be unique); give each module's parameters their own "
                    "prefix, e.g. [(f\"head.{n}\", p) for n, p in head.named_parameters()], or attach the modules to "
                    "one model (model.head = head) and pass model.named_parameters()")
            owner[name] = p
            added[id(p)] = name
        taken = set(owner)
        for i, p in by_position:
            # its position among all the optimizer's parameters, or the next number no parameter is named
            position = len(self._names) + i
            while str(position) in taken:
                position += 1
            taken.add(str(position))
            added[id(p)] = str(position)
        group["params"] = [p for _, p in named]
        self._names.update(added)
        self.param_groups.append(group)
        self._converted_cache = None  # new parameters: checked again at the next step

    # ---- copies (copy.deepcopy, pickle) ----------------------------------------------------------
    def __getstate__(self) -> dict:
        """The names by position (one list per group), not by ``id``: a copy's Parameters are new
        objects, whose ids :meth:`__setstate__` maps to the same names.

        Raises:
            TypeError: a parameter is a model's (a view of a C++ module's buffer, which cannot be
                copied or pickled), named.
        """
        for group in self.param_groups:
            for p in group["params"]:
                if isinstance(p, _BoundParameter):
                    raise TypeError(
                        f"cannot copy or pickle {type(self).__name__}: its parameter {self._names[id(p)]!r} is a "
                        "model's (a view of the C++ model's buffer, which cannot be copied); copy its state_dict() "
                        "instead and load_state_dict() it into an optimizer over the other model's parameters")
        state = dict(self.__dict__)
        state["_names"] = [[self._names[id(p)] for p in g["params"]] for g in self.param_groups]
        state.pop("_converted_cache", None)  # keyed by the ids of this optimizer's Parameters, not the copy's
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        names = state.pop("_names")
        self.__dict__.update(state)
        self._names = {id(p): name for g, group_names in zip(self.param_groups, names)
                       for p, name in zip(g["params"], group_names)}

    def name_of(self, p: Parameter) -> str:
        """The name this optimizer keys ``p``'s state by."""
        return self._names[id(p)]

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """``(name, Parameter)`` of every parameter, group by group."""
        return [(self._names[id(p)], p) for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's: ``set_to_none=True`` (the default) drops every gradient (``p.grad`` reads None
        and the next ``step()`` skips the parameter); ``set_to_none=False`` zeroes the gradients in
        place (``p.grad`` stays a zero array, which ``step()`` still uses: momentum and weight decay
        move the weights; a None gradient stays None).

        Raises:
            TypeError: ``set_to_none`` not a bool (nothing changes).
        """
        set_to_none = check_bool(set_to_none, "set_to_none")
        for g in self.param_groups:
            for p in g["params"]:
                p.zero_grad(set_to_none)

    # ---- step -------------------------------------------------------------------------------------
    def step(self, closure: Callable | None = None):
        """One update of every parameter that has a gradient. ``closure`` (optional, as torch):
        re-evaluates the model and returns the loss, which ``step`` returns.

        Every group's hyperparameters are checked first (before ``closure`` runs), then, for every
        parameter to update, that the model still reads its array (see below), its gradient, its
        array (writeable), the group's hyperparameters in its dtype (see the module doc) and its state
        (every field the update reads, arrays of its shape and dtype, a step count the C++ update
        takes); only then is anything updated, so a step that raises changes nothing: no weight,
        optimizer state or step count. A Ctrl-C during the updates is raised after the last one
        (:func:`~transformer_core.module.deferred_interrupts`): the step is whole, weights and
        state together.

        A model's parameter whose weight was converted in place (``quantize(model, inplace=True)``,
        ``set_gguf_weights``) is refused: one held quantized (the model multiplies by the int8 or
        GGUF weight; the Parameter's float array, kept alive by the optimizer, reaches it no more),
        and a token embedding whose tied LM head multiplies by an int8 copy of it (``quantize`` of a
        GPT-2 or a tied Llama: a step would move the lookups' float table but not the head's copy).
        Whether the optimizer was built before or after quantizing changes nothing. The storage is
        read again only after some weight changed storage (``module.storage_changed``), so the check
        costs a comparison per step.

        Raises:
            ValueError / TypeError: a bad hyperparameter in a group (e.g. a negative or NaN ``lr``
                written by a scheduler), named with its group: ``"step: param_groups[1]: lr: ..."``.
            NonFiniteGradientError: a gradient holds NaN/inf (nothing was updated; see the module doc).
            ValueError: a parameter to update whose weight was converted in place (above), each named
                with what happened to it, the message led by the call that converted it
                (``"step: quantize(inplace=True) converted weights this optimizer updates: 'weight':
                held as int8 ..."``, ``"step: set_gguf_weights converted ...: 'weight': held as Q8_0
                GGUF blocks ..."``) and ending with the remedy for that call; a gradient whose shape or
                dtype differs from its parameter's; a parameter
                whose array is read-only (named); a hyperparameter degenerate in the dtype of a
                parameter to update (an ``eps`` that rounds to 0, an ``lr`` that overflows: named
                with its group and the dtype, ``"step: param_groups[0]: eps: 1e-50 rounds to 0 in
                float32 ..."``); a state entry missing a field the update reads (``state.{name}:
                missing ['exp_avg_sq']``), a state array of another shape or dtype, or not
                writeable, a step count out of ``[0, 2**63 - 2]`` (named by key: ``state.{name}.step``).
            TypeError: ``closure`` neither callable nor None (checked first); a state entry of the
                wrong type (a step count not an int, an array not an array).

        A model whose weights a step updates loses the training state of a forward that has not had
        its backward yet: that backward raises :class:`~transformer_core.module.WeightsChangedError`
        (its activations belong to the old weights; torch raises too). Run backward before ``step()``.
        Writes into ``p.data`` made by hand are not detected (numpy keeps no version count).
        """
        if closure is not None and not callable(closure):
            raise TypeError(f"closure: expected a callable returning the loss, or None, got {described(closure)}")
        self._step_calls = getattr(self, "_step_calls", 0) + 1  # read by the schedulers' order check, as torch's
        checked = [self._checked_group(gi, group) for gi, group in enumerate(self.param_groups)]
        loss = closure() if closure is not None else None
        converted = self._converted()  # {id(Parameter): why}, empty unless a weight was converted in place
        work = []
        bad = []
        lost: dict[tuple, list[str]] = {}  # (converted by, why) -> the names of the parameters it applies to
        for gi, group in enumerate(checked):
            dtypes = set()  # the dtypes this group's hyperparameters were checked in
            required = self._state_fields(group)[0]
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                name = self._names[id(p)]
                if converted and id(p) in converted:
                    model_name = f" (the model's {p.name!r})" if p.name and p.name != name else ""
                    lost.setdefault(converted[id(p)], []).append(f"{name!r}{model_name}")
                    continue
                data = p.data
                if g.shape != data.shape or g.dtype != data.dtype:
                    raise ValueError(f"{name}: gradient of shape {g.shape} {g.dtype} for a parameter of "
                                     f"shape {data.shape} {data.dtype}")
                if not g.flags.c_contiguous:
                    raise ValueError(f"{name}: expected a C-contiguous gradient")
                if not data.flags.writeable:
                    raise ValueError(f"step: {name}: expected a writeable parameter array (it is updated in "
                                     "place), got a read-only one; nothing was updated")
                if data.dtype not in dtypes:
                    self._check_in_dtype(gi, group, data.dtype, name)
                    dtypes.add(data.dtype)
                self._check_state_ready(name, p, self.state.get(name, {}), group, required)
                if variant("count_nonfinite", data.dtype)(g):
                    bad.append(name)
                work.append((group, name, p))
        if lost:
            raise ValueError(_converted_message(lost))
        if bad:
            raise NonFiniteGradientError(
                f"step: non-finite (NaN or inf) gradient in {', '.join(repr(b) for b in bad)}; nothing was updated "
                "(zero_grad() and skip the batch, or lower the learning rate)", bad)
        # the models whose weights this step writes: a training forward of theirs that has not had its
        # backward can no longer have it (WeightsChangedError), as torch's version counter refuses it
        weights_written({id(p._impl): p._impl for _, _, p in work if isinstance(p, _BoundParameter)}.values())
        with deferred_interrupts():  # a Ctrl-C: after every parameter's update and its state (step count)
            for group, name, p in work:
                self.state[name] = self._update(group, name, p, dict(self.state.get(name, {})))
        return loss

    def _converted(self) -> dict[int, tuple]:
        """``{id(p): (by, why)}`` of this optimizer's model parameters that a step must not write,
        each with the call that converted its weight (``by``: ``_CONVERTED_BY``'s, None where the
        storage does not tell) and what happened to it (``why``): held quantized (the model no longer
        reads ``p.data``), given another buffer, or a table whose tied LM head multiplies by an int8
        copy of it (see :meth:`step`). Read from the C++ modules' ``parameter_storage()`` once per
        storage epoch (bumped by ``module.storage_changed`` whenever weights change storage in
        place) and kept until the epoch moves or a group is added: between those, a step compares
        one int."""
        epoch = _storage_epoch[0]
        cache = getattr(self, "_converted_cache", None)
        if cache is not None and cache[0] == epoch:
            return cache[1]
        converted: dict[int, tuple] = {}
        bound = (p for group in self.param_groups for p in group["params"] if isinstance(p, _BoundParameter))
        for p, storage in _storage_tables(bound):
            lost = _lost_view(p, storage)
            if lost == "new buffer":
                converted[id(p)] = (None, "given a new buffer (a step would write values that the model no "
                                          "longer reads)")
            elif lost is not None:
                held = "int8" if lost == "int8" else f"{lost} GGUF blocks"
                converted[id(p)] = (_converted_by(lost), f"held as {held} (a step would write {p.data.dtype} "
                                                         "values that the model no longer reads)")
            elif p._core_name + TIED_HEAD_COPY in storage:
                head_copy = storage[p._core_name + TIED_HEAD_COPY]
                converted[id(p)] = (_converted_by(head_copy),
                                    f"the table of a tied LM head that multiplies by an {head_copy} copy of "
                                    "it (a step would move the table, not the head's copy)")
        self._converted_cache = (epoch, converted)
        return converted

    def _check_in_dtype(self, index: int, group: dict, dtype: np.dtype, name: str) -> None:
        """Refuses (ValueError naming the hyperparameter, the group and ``dtype``) the scalars of
        ``_scalars_in_dtype`` that the C++ update, which rounds them to the parameter's dtype, would
        make degenerate: ±inf, or 0 where the update needs them > 0 (see the module doc)."""
        if dtype.kind != "f":
            return
        for what, value, positive in self._scalars_in_dtype(group):
            with np.errstate(over="ignore", under="ignore"):
                rounded = dtype.type(value)
            if not np.isfinite(rounded):
                raise ValueError(
                    f"step: param_groups[{index}]: {what}: {value!r} overflows {dtype} (the dtype of parameter "
                    f"{name!r}, max {float(np.finfo(dtype).max):.4g}) to {rounded}: the update would write inf "
                    "or NaN; nothing was updated")
            if positive and rounded == 0:
                raise ValueError(
                    f"step: param_groups[{index}]: {what}: {value!r} rounds to 0 in {dtype} (the dtype of parameter "
                    f"{name!r}, smallest positive {float(np.finfo(dtype).smallest_subnormal):.4g}): the update would "
                    "divide 0 by 0 (NaN); nothing was updated")

    def _check_state_ready(self, name: str, p: Parameter, state: dict, group: dict,
                           required: tuple[str, ...] | None = None) -> None:
        """Refuses (before any update) a state the C++ update would refuse half-way through a step:
        a non-empty state missing a field the update reads (``_state_fields``; ``required``: its
        first element, when the caller has it), a step count not an int in ``[0, _MAX_STEP]``, an
        array not of ``p``'s shape and dtype, C-contiguous and writeable (a caller may have written
        into ``state``). Runs for every parameter at every step: the messages are built only on a
        failure."""
        if required is None:
            required = self._state_fields(group)[0]
        if state:
            for field in required:
                if field not in state:
                    missing = [field for field in required if field not in state]
                    raise ValueError(f"step: state.{name}: missing {missing} (a state entry holds {list(required)}, "
                                     f"got {sorted(state)}); nothing was updated")
        data = p.data
        for field, value in state.items():
            if field == "step":
                # type(value) is int: the common case, without the ABC check (bool is not int's type)
                if type(value) is not int and (isinstance(value, (bool, np.bool_))
                                               or not isinstance(value, numbers.Integral)):
                    raise TypeError(f"step: state.{name}.{field}: expected an int, got {described(value)}")
                if not 0 <= value <= _MAX_STEP:
                    raise ValueError(f"step: state.{name}.{field}: expected an int in [0, {_MAX_STEP}], got {value}")
                continue
            if not isinstance(value, np.ndarray):
                raise TypeError(f"step: state.{name}.{field}: expected a numpy array, got {type(value).__name__}")
            if (value.shape != data.shape or value.dtype != data.dtype or not value.flags.c_contiguous
                    or not value.flags.writeable):
                raise ValueError(f"step: state.{name}.{field}: expected a writeable C-contiguous {data.dtype} array "
                                 f"of shape {data.shape}, got {value.dtype} {value.shape} (C-contiguous "
                                 f"{value.flags.c_contiguous}, writeable {value.flags.writeable})")

    def _checked_group(self, index: int, group: dict) -> dict:
        """A checked copy of ``param_groups[index]`` (``_check_group``'s errors prefixed with the group)."""
        checked = dict(group)
        try:
            self._check_group(checked)
        except (TypeError, ValueError) as e:
            raise type(e)(f"step: param_groups[{index}]: {e}") from None
        return checked

    # ---- subclass hooks -----------------------------------------------------------------------------
    def _check_group(self, group: dict) -> None:
        """Checks the hyperparameters of ``group`` (a dict: raises ValueError / TypeError naming the
        hyperparameter) and normalises them in place (floats, bools)."""
        raise NotImplementedError

    def _state_fields(self, group: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(fields every non-empty state entry has, ``step`` included where there is one; array
        fields it may have)."""
        raise NotImplementedError

    def _scalars_in_dtype(self, group: dict) -> list[tuple[str, float, bool]]:
        """``(what, value, positive)`` of each scalar the C++ update rounds to the parameter's dtype
        (``group`` checked): it must stay finite there, and > 0 where ``positive``."""
        raise NotImplementedError

    def _inf_allowed(self, field: str, group: dict) -> bool:
        """Whether the state array ``field`` of a parameter of ``group`` (checked) may hold +inf
        when loaded: a value that ``step()`` can write from finite gradients and that the next step
        turns into no NaN. False by default."""
        return False

    def _loaded_group(self, group: dict) -> None:
        """Adjusts, in place, a group's hyperparameters read by :meth:`load_state_dict`, before they
        are checked (AdamW: the decay is decoupled, whatever was saved)."""

    def _update(self, group: dict, name: str, p: Parameter, state: dict) -> dict:
        """Updates ``p.data`` in place from ``p.grad`` and returns its new state. ``state`` is a
        shallow copy of the parameter's state ({} before its first step): new entries go into it,
        never into ``self.state``, which ``step`` replaces with the result only once the update ran."""
        raise NotImplementedError

    # ---- state dict ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """The optimizer's state as a flat ``name -> numpy array`` dict (copies), ready for
        ``safetensors.numpy.save_file``; the keys are listed in the module doc."""
        return self._state_dict(copy=True)

    def _state_dict(self, copy: bool) -> dict[str, np.ndarray]:
        """:meth:`state_dict`; without ``copy``, the per-parameter arrays are the optimizer's own (the
        moments it updates in place), for a writer that streams them to disk before the next step
        (:func:`~transformer_core.training.save_checkpoint`) instead of copying them all first."""
        out: dict[str, np.ndarray] = {}
        for gi, group in enumerate(self.param_groups):
            for key, value in group.items():
                if key == "params":
                    continue
                if key in self._FLAGS:
                    value = float(bool(value))
                out[f"param_groups.{gi}.{key}"] = np.array(value, dtype=np.float64)
            for p in group["params"]:
                out[f"params.{self._names[id(p)]}.group"] = np.array(gi, dtype=np.int64)
        for name, st in self.state.items():
            for field, value in st.items():
                if isinstance(value, np.ndarray):
                    out[f"state.{name}.{field}"] = value.copy() if copy else value
                else:
                    out[f"state.{name}.{field}"] = np.array(value, dtype=np.int64)
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a :meth:`state_dict` (e.g. read back with ``safetensors.numpy.load_file``): the
        per-parameter state and the groups' hyperparameters. The optimizer must hold the same
        parameter names in the same groups. Arrays are copied (cast to each parameter's dtype).
        Everything is checked before anything changes.

        Adam's ``max_exp_avg_sq`` is optional: kept as loaded (where ``amsgrad`` is off too: a run
        that turned amsgrad off keeps it, as torch does), and, where amsgrad is on and it was not
        saved (a run that turned amsgrad on after its last step), created at zeros by the next step,
        as ``step()`` does for such a state. :class:`AdamW` loads every group with
        ``decoupled_weight_decay`` on, whatever was saved (an Adam's state dict included), as torch's.

        Every message names the key (``param_groups.1.lr``, ``state.{name}.exp_avg``, ...) with what
        was expected and what was given.

        Raises:
            ValueError: unknown or missing parameter names (named), a parameter in another group,
                another number of groups, unknown keys, a group without its full set of
                hyperparameters (the missing keys listed: a group's hyperparameters are loaded whole,
                never completed with the current ones; ``initial_lr`` alone is optional), arrays of
                the wrong shape, incomplete state,
                a ``step`` that is not a whole number in ``[0, 2**63 - 2]`` (the C++ update counts in
                int64) or a group index that is not a whole number >= 0, a flag other than 0/1, a
                hyperparameter of the wrong shape or that the constructor refuses (its message,
                prefixed with the key), a state array holding NaN or -inf, or +inf (after the cast
                to the parameter's dtype) where it is no Adam second moment (see below), or a
                negative second moment (``exp_avg_sq``, ``max_exp_avg_sq``: expected >= 0), naming
                the entry.
            TypeError: ``state_dict`` not a mapping, keys not str; a value that is not numbers (None,
                str, object, complex, and bool except for the flags), named by its key.

        Adam's second moments may hold +inf: a step writes it where a finite gradient's square
        overflows the dtype (``(1 - β2) · g² > 3.4e38`` in float32, ``|g| ≳ 5.8e20`` at β2 = 0.999),
        and goes on (that element's update is then ``m / inf = 0``, as torch's), so a state that
        ``step()`` produced loads, as torch's does. ``exp_avg_sq`` is the exception in a group with
        ``betas[1] == 0``, whose next step would compute ``0 · inf = NaN``.

        :func:`~transformer_core.training.save_checkpoint` makes these same checks on the state it
        is about to write (:meth:`_check_state_dict`), so that a checkpoint it writes loads back.
        """
        new_groups, new_state = self._read_state_dict(state_dict, copy=True)
        for group, g in zip(self.param_groups, new_groups):
            group.update({k: v for k, v in g.items() if k != "params"})
        self.state = new_state

    def _check_state_dict(self, state_dict: dict) -> None:
        """Raises what :meth:`load_state_dict` would raise for ``state_dict``, changing nothing and
        copying no array that already has its parameter's dtype (``save_checkpoint``'s check that
        what it writes loads back: one check, the loader's)."""
        self._read_state_dict(state_dict, copy=False)

    def _read_state_dict(self, state_dict: dict, copy: bool) -> tuple[list[dict], dict[str, dict]]:
        """``(the new param groups, the new state)`` that :meth:`load_state_dict` sets, every value
        checked (see its Raises); nothing changes. ``copy``: the state arrays are new arrays (else
        those of ``state_dict`` where they have the parameter's dtype and are C-contiguous)."""
        if not hasattr(state_dict, "items"):
            raise TypeError(f"state_dict: expected a mapping of names to arrays, got {type(state_dict).__name__}")
        saved_group: dict[str, int] = {}
        hyper: dict[int, dict[str, np.ndarray]] = {}
        states: dict[str, dict[str, np.ndarray]] = {}
        for key, value in state_dict.items():
            if not isinstance(key, str):
                raise TypeError(f"state_dict: expected str keys, got {key!r}")
            try:
                value = np.asarray(value)
            except (TypeError, ValueError) as e:  # a ragged list, an odd object
                raise TypeError(f"load_state_dict: {key}: expected an array of numbers, got "
                                f"{type(value).__name__} ({e})") from None
            head, _, rest = key.partition(".")
            name, _, field = rest.rpartition(".")
            if head == "params" and field == "group" and name:
                saved_group[name] = _count(value, key, 0)
            elif head == "state" and name and field:
                states.setdefault(name, {})[field] = value
            elif head == "param_groups" and name.isdigit() and field:
                hyper.setdefault(int(name), {})[field] = value
            else:
                raise ValueError(f"state_dict: unexpected key {key!r}")
        ours = {name: gi for gi, g in enumerate(self.param_groups) for name in (self._names[id(p)] for p in g["params"])}
        unknown = sorted(set(saved_group) - set(ours))
        missing = sorted(set(ours) - set(saved_group))
        stray = sorted(set(states) - set(saved_group))
        if unknown or missing or stray:
            parts = []
            if unknown:
                parts.append(f"unknown parameter names {unknown}")
            if missing:
                parts.append(f"missing parameter names {missing}")
            if stray:
                parts.append(f"state for parameters not listed under params.*: {stray}")
            raise ValueError("load_state_dict: " + "; ".join(parts))
        if sorted(hyper) != list(range(len(self.param_groups))):
            raise ValueError(f"load_state_dict: expected hyperparameters of {len(self.param_groups)} param groups, "
                             f"got groups {sorted(hyper)}")
        moved = sorted(n for n in ours if saved_group[n] != ours[n])
        if moved:
            raise ValueError(f"load_state_dict: parameters in another param group than saved: {moved}")
        absent = [f"param_groups.{gi}.{field}" for gi in range(len(self.param_groups))
                  for field in self.defaults if field not in hyper[gi]]
        if absent:
            raise ValueError(f"load_state_dict: missing hyperparameters {absent} (every group's full set, "
                             f"{sorted(self.defaults)}, is expected); nothing was loaded")
        new_groups = []
        for gi, group in enumerate(self.param_groups):
            g = dict(group)
            for field, value in hyper[gi].items():
                key = f"param_groups.{gi}.{field}"
                if field not in self.defaults and field != "initial_lr":
                    raise ValueError(f"load_state_dict: unknown hyperparameter {field!r} in param_groups.{gi}")
                if field in self._FLAGS:
                    if value.dtype.kind not in "biuf":
                        raise TypeError(f"load_state_dict: {key}: expected a flag 0 or 1, got a {value.dtype} array")
                    if value.shape != () or value not in (0, 1):
                        raise ValueError(f"load_state_dict: {key}: expected a flag 0 or 1, got {value!r}")
                    g[field] = bool(value)
                    continue
                if value.dtype.kind not in "iuf":
                    raise TypeError(f"load_state_dict: {key}: expected a real number (an int or float array), "
                                    f"got a {value.dtype} array")
                # betas is a pair, saved as a (2,) array; every other hyperparameter is a scalar
                default = self.defaults.get(field)
                shape = (len(default),) if isinstance(default, (tuple, list)) else ()
                if value.shape != shape:
                    raise ValueError(f"load_state_dict: {key}: expected an array of shape {shape}, got {value.shape}")
                g[field] = float(value) if shape == () else tuple(float(x) for x in value)
            self._loaded_group(g)
            try:
                self._check_group(g)
            except (TypeError, ValueError) as e:  # "lr: ..." -> "param_groups.1.lr: ..."
                raise type(e)(f"load_state_dict: param_groups.{gi}.{e}") from None
            new_groups.append(g)
        params = dict(self.named_parameters())
        new_state: dict[str, dict] = {}
        for name, fields in states.items():
            p = params[name]
            required, optional = self._state_fields(new_groups[ours[name]])
            absent = [f for f in required if f not in fields]
            extra = sorted(set(fields) - set(required) - set(optional) - {"step"})
            if absent or extra:
                raise ValueError(f"load_state_dict: state of {name!r}: missing {absent}, unexpected {extra}")
            st = {}
            for field, value in fields.items():
                if field == "step":
                    st["step"] = _count(value, f"state.{name}.step", 0, _MAX_STEP)
                    continue
                if value.dtype.kind not in "iuf":
                    raise TypeError(f"load_state_dict: state.{name}.{field}: expected an array of real numbers "
                                    f"(float, cast to the parameter's {p.data.dtype}), got a {value.dtype} array")
                if value.shape != p.data.shape:
                    raise ValueError(f"load_state_dict: state.{name}.{field}: expected shape {p.data.shape} "
                                     f"(the parameter's), got {value.shape}")
                with np.errstate(over="ignore", invalid="ignore"):  # a value out of range: inf, refused below
                    arr = np.array(value, dtype=p.data.dtype, order="C", copy=True if copy else None)
                self._check_state_values(arr, f"state.{name}.{field}", field, new_groups[ours[name]])
                st[field] = arr
            new_state[name] = st
        return new_groups, new_state

    def _check_state_values(self, arr: np.ndarray, key: str, field: str, group: dict) -> None:
        """Refuses (ValueError naming ``key``) a loaded state array (``field`` of a parameter of
        ``group``) that would make the next step write NaN into the weights: one holding NaN or
        -inf, or +inf where :meth:`_inf_allowed` does not allow it, or, for a second moment
        (``_NONNEGATIVE_STATE``, whose square root the update takes), a value < 0."""
        bad = int(variant("count_nonfinite", arr.dtype)(arr))
        allowed = bad > 0 and self._inf_allowed(field, group)
        if allowed:
            bad -= int(np.count_nonzero(arr == np.inf))  # +inf is allowed here: NaN and -inf are not
        if bad:
            note = self._INF_REFUSED if field in self._NONNEGATIVE_STATE and not allowed else ""
            expected, got = ("finite values or +inf", "NaN or -inf") if allowed else ("finite values", "NaN or inf")
            raise ValueError(f"load_state_dict: {key}: expected {expected}, got {bad} {got} "
                             f"(of {arr.size}){note}; nothing was loaded")
        if field in self._NONNEGATIVE_STATE and arr.size and float(arr.min()) < 0:
            raise ValueError(f"load_state_dict: {key}: expected values >= 0 (a second moment), got "
                             f"{int(np.count_nonzero(arr < 0))} negative (min {float(arr.min())}); nothing was loaded")

    def __repr__(self) -> str:
        n = sum(len(g["params"]) for g in self.param_groups)
        hyper = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({n} parameters in {len(self.param_groups)} groups; {hyper})"


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015), as ``torch.optim.Adam`` (single-tensor path), for step t::

        g ← -g if maximize;   g ← g + weight_decay · p                  (L2 penalty in the gradient)
        m ← β1 m + (1 - β1) g   (torch's lerp);   v ← β2 v + (1 - β2) g²
        p ← p - lr / (1 - β1ᵗ) · m / (sqrt(v) / sqrt(1 - β2ᵗ) + eps)     (amsgrad: v_max = max(v_max, v))

    With ``decoupled_weight_decay=True`` the decay is AdamW's ``p ← p · (1 - lr · weight_decay)``
    before the moments (see :class:`AdamW`).

    Args:
        params: see :class:`Optimizer`.
        lr: >= 0.  weight_decay: >= 0.
        betas: ``(β1, β2)``, each in [0, 1): a tuple, a list or any other sequence of two real
            numbers, or a numpy array of shape (2,); stored as a tuple of two Python floats.
        eps: > 0. Stricter than torch, which allows 0: with eps = 0 a gradient element that has been
            zero at every step gives m = v = 0 and the update 0 / 0 = NaN (see the module doc); for
            the same reason ``step()`` refuses an eps that rounds to 0 in the parameters' dtype
            (below float32's smallest positive 1.4e-45).
        amsgrad: keep the running max of v (Reddi et al. 2018).  maximize: ascend instead.
        decoupled_weight_decay: AdamW's decay. The flags are bools (True / False; anything else,
            ``"False"`` or 0 included, is a TypeError).
        foreach, fused: None (the default), False or True, accepted for torch's signature and
            ignored (torch's choice between a loop over the parameters, a batched one and a fused
            kernel): the step here is the same whatever they say, one fused C++ pass per parameter
            that updates its weights and moments together. As torch, they may not both be True.
        capturable, differentiable: False only (torch's CUDA-graph capture and autograd through
            the step, which this CPU step in place does not support).

    Raises:
        ValueError / TypeError: bad hyperparameters (named), bad params (see :class:`Optimizer`).
        TypeError: ``betas`` not a sequence of two numbers nor an array of shape (2,) (the message
            says what is accepted); ``foreach`` / ``fused`` not a bool or None; ``capturable`` /
            ``differentiable`` not a bool.
        ValueError: ``foreach`` and ``fused`` both True (torch raises RuntimeError);
            ``capturable`` or ``differentiable`` True (not supported).
    """

    _FLAGS = ("amsgrad", "maximize", "decoupled_weight_decay")
    _NONNEGATIVE_STATE = ("exp_avg_sq", "max_exp_avg_sq")
    _INF_REFUSED = (" (+inf, a second moment's overflow, loads only where the group's betas[1] > 0: the next step "
                    "computes betas[1] · exp_avg_sq, and 0 · inf is NaN)")

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False):
        _check_torch_options(foreach, fused, capturable, differentiable)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, decoupled_weight_decay=decoupled_weight_decay))

    def _check_group(self, group: dict) -> None:
        group["lr"] = _check_float(group["lr"], "lr")
        group["eps"] = check_float(group["eps"], "eps", minimum=0.0, min_open=True)
        group["weight_decay"] = _check_float(group["weight_decay"], "weight_decay")
        group["betas"] = _check_betas(group["betas"])
        if "initial_lr" in group:
            group["initial_lr"] = _check_float(group["initial_lr"], "initial_lr")
        for flag in self._FLAGS:
            group[flag] = check_bool(group[flag], flag)

    def _inf_allowed(self, field: str, group: dict) -> bool:
        """Adam's +inf second moments (see below); the first moment stays finite."""
        # a step writes +inf into v where (1 - β2) g² overflows, then steps that element by m / inf = 0
        # (as torch); v_max only takes maxima, but v is multiplied by β2 first: 0 · inf = NaN if β2 = 0
        return field == "max_exp_avg_sq" or (field == "exp_avg_sq" and group["betas"][1] > 0)

    def _state_fields(self, group: dict):
        # max_exp_avg_sq is optional whatever amsgrad is: with amsgrad off, one (of a run that had it
        # on) is kept, as torch keeps it; with amsgrad on, a missing one (amsgrad turned on mid-run)
        # is created at zeros by _update
        return ("step", "exp_avg", "exp_avg_sq"), ("max_exp_avg_sq",)

    def _scalars_in_dtype(self, group: dict):
        # as the C++ kernel rounds them: the step size lr / (1 - β1ᵗ) is largest at t = 1
        lr, wd = group["lr"], group["weight_decay"]
        out = [("lr", lr, False), ("eps", group["eps"], True), ("weight_decay", wd, False),
               ("lr / (1 - betas[0]) (the first step's size)", lr / (1.0 - group["betas"][0]), False)]
        if group["decoupled_weight_decay"]:
            out.append(("lr * weight_decay (the decoupled decay)", lr * wd, False))
        return out

    def _update(self, group: dict, name: str, p: Parameter, state: dict) -> dict:
        data = p.data
        if not state:
            state["step"] = 0
            state["exp_avg"] = np.zeros_like(data)
            state["exp_avg_sq"] = np.zeros_like(data)
        if group["amsgrad"] and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = np.zeros_like(data)
        beta1, beta2 = group["betas"]
        variant("adam_update", data.dtype)(
            data, p.grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq") if group["amsgrad"] else None,
            group["lr"], beta1, beta2, group["eps"], group["weight_decay"], group["decoupled_weight_decay"],
            group["amsgrad"], group["maximize"], state["step"] + 1)
        state["step"] += 1
        return state


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter 2019), as ``torch.optim.AdamW``: Adam with decoupled weight decay,
    applied to the weights before the moments::

        p ← p · (1 - lr · weight_decay)
        m ← β1 m + (1 - β1) g;   v ← β2 v + (1 - β2) g²
        step_size = lr / (1 - β1ᵗ);   denom = sqrt(v) / sqrt(1 - β2ᵗ) + eps
        p ← p - step_size · m / denom                                  (amsgrad: v_max = max(v_max, v))

    Args: as :class:`Adam` (``foreach``, ``fused``, ``capturable`` and ``differentiable`` included),
    with ``weight_decay=1e-2`` by default (torch's).

    Its decay is always decoupled: :meth:`~Optimizer.load_state_dict` sets every group's
    ``decoupled_weight_decay`` to True whatever was saved (an Adam's state dict loads as AdamW, as
    torch's AdamW does), and a group given ``decoupled_weight_decay=False`` (``add_param_group``,
    or written into ``param_groups`` before a ``step()``) is refused with a ValueError (torch's
    would silently step that group as Adam): use :class:`Adam` for the L2 penalty.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        if not group["decoupled_weight_decay"]:
            raise ValueError("decoupled_weight_decay: AdamW's weight decay is always decoupled, expected True, "
                             "got False (use Adam for the L2 penalty)")

    def _loaded_group(self, group: dict) -> None:
        group["decoupled_weight_decay"] = True  # as torch's AdamW.__setstate__


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, as ``torch.optim.SGD``::

        g ← -g if maximize;   g ← g + weight_decay · p
        b ← g (first step), else b ← momentum · b + (1 - dampening) · g
        g ← g + momentum · b (nesterov), or g ← b                       (when momentum ≠ 0)
        p ← p - lr · g

    Args:
        params: see :class:`Optimizer`.
        lr: >= 0 (torch's default 1e-3).  momentum: >= 0.  weight_decay: >= 0.
        dampening: any finite number, as torch (> 1 or < 0 gives the buffer's gradient term
            ``1 - dampening`` a negative or a > 1 weight).
        nesterov: Nesterov momentum (needs momentum > 0 and dampening = 0, as torch).
        maximize: ascend instead. The flags are bools (True / False; anything else is a TypeError).
        foreach, fused, differentiable: as :class:`Adam`'s (torch's SGD has no ``capturable``).

    Raises:
        ValueError / TypeError: bad hyperparameters (named; NaN or ±inf included), bad params (see
            :class:`Optimizer`), ``foreach`` / ``fused`` / ``differentiable`` as :class:`Adam`'s.
    """

    _FLAGS = ("nesterov", "maximize")

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None):
        _check_torch_options(foreach, fused, None, differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _check_group(self, group: dict) -> None:
        for key in ("lr", "momentum", "weight_decay"):
            group[key] = _check_float(group[key], key)
        group["dampening"] = check_float(group["dampening"], "dampening")  # any finite value, as torch
        if "initial_lr" in group:
            group["initial_lr"] = _check_float(group["initial_lr"], "initial_lr")
        for flag in self._FLAGS:
            group[flag] = check_bool(group[flag], flag)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("nesterov: needs momentum > 0 and dampening = 0, got "
                             f"momentum={group['momentum']}, dampening={group['dampening']}")

    def _state_fields(self, group: dict):
        return (), ("momentum_buffer",)

    def _scalars_in_dtype(self, group: dict):
        return [("lr", group["lr"], False), ("momentum", group["momentum"], False),
                ("weight_decay", group["weight_decay"], False),
                ("1 - dampening", 1.0 - group["dampening"], False)]

    def _update(self, group: dict, name: str, p: Parameter, state: dict) -> dict:
        data = p.data
        buf = None
        first = False
        if group["momentum"] != 0:
            buf = state.get("momentum_buffer")
            if buf is None:  # the first step writes it whole (b ← g): no need to zero it
                buf = state["momentum_buffer"] = np.empty_like(data)
                first = True
        variant("sgd_update", data.dtype)(
            data, p.grad, buf, group["lr"], group["momentum"], group["dampening"], group["weight_decay"],
            group["nesterov"], group["maximize"], first)
        return state


def _parameters_of(parameters) -> list[tuple[str, Parameter]]:
    """``clip_grad_norm_``'s ``parameters`` as ``(name, Parameter)``, each named for its messages by
    the name its pair gave, else its own ``name``, else its position (``"0"``, ``"1"``, ...)."""
    if isinstance(parameters, Parameter):
        return [(parameters.name or "0", parameters)]
    named = _named_parameters(parameters, "parameters")
    return [(given if given is not None else p.name or str(i), p) for i, (given, p) in enumerate(named)]


def _vector_norm_nonpositive(x: np.ndarray, norm_type: float) -> float:
    """``torch.linalg.vector_norm(x, norm_type)`` for ``norm_type`` <= 0 or -inf (no norms: the C++
    core computes only ord > 0), in double: 0 counts the non-zero elements (NaN and inf count),
    -inf is the smallest ``|x|``, a negative p gives ``(Σ |x|^p)^(1/p)`` (0 as soon as one element
    is 0: ``|0|^p`` = inf); NaN spreads."""
    a = np.abs(np.asarray(x, dtype=np.float64)).reshape(-1)
    if norm_type == 0:
        return float(np.count_nonzero(a))
    if math.isinf(norm_type):
        return float(a.min())
    with np.errstate(divide="ignore", over="ignore"):
        return float(np.sum(a ** norm_type) ** (1.0 / norm_type))


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> np.float64:
    """Scales the gradients in place so that their total norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_``::

        total = ‖(‖g_1‖, ‖g_2‖, ...)‖          (the norm of the per-parameter norms = the norm of all)
        clip_coef = max_norm / (total + 1e-6),  g_i ← g_i · min(clip_coef, 1)

    The norms of order > 0 are computed in C++ in double (deterministic chunked sums), the others
    (0, negative, -inf: ``torch.linalg.vector_norm``'s definitions, see below) in numpy in double;
    parameters with ``grad=None`` are skipped. As torch, the total is the same norm of the
    per-parameter norms: for ``norm_type=0`` it counts the parameters whose gradient has a non-zero
    element; for a negative one it is 0 as soon as one gradient holds a zero.

    Args:
        parameters: a :class:`Parameter`, or an iterable of Parameters / ``(name, Parameter)`` pairs.
        max_norm: >= 0; ``float("inf")`` measures the norm and clips nothing (unless the norm is
            inf too: inf / inf is NaN, which torch writes into the gradients as well).
        norm_type: the p of the p-norm, any real number (0: the count of non-zeros; < 0: as torch),
            or ``float("inf")`` / ``-inf`` (or ``"inf"`` / ``"-inf"``) for the max / min of ``|g|``.
        error_if_nonfinite: a bool: raise if the total norm is NaN or inf (torch raises RuntimeError;
            we raise :class:`NonFiniteGradientError`, a ValueError, naming the parameters whose
            gradients hold NaN or inf, or, when every gradient is finite, saying that the norm
            overflowed: ``names`` is then empty).
            Otherwise the gradients are scaled anyway (NaN spreads; :meth:`Optimizer.step` will
            refuse them).
        foreach: None (the default), True or False, accepted for torch's signature (torch 2.x: its
            foreach implementation, batched over the gradients, or the loop over them; the same
            norm). It changes nothing here: there is one implementation, the C++ norms above, for
            any value.

    Returns:
        The total norm of the gradients before clipping, a ``np.float64`` (a subclass of Python's
        float, with ``.item()`` as torch's 0-d tensor: ported ``clip_grad_norm_(...).item()`` runs;
        0.0 when no parameter has a gradient).
        An empty gradient (a parameter of size 0) counts as a norm of 0 for ``norm_type`` >= 0 and
        finite, as torch's.

    Raises:
        ValueError: ``max_norm`` < 0 or NaN, ``norm_type`` NaN or too large for a float
            (``10**400``); a ``norm_type`` of inf, -inf or < 0 with an empty gradient among the
            gradients (the max or min of no element is undefined: torch raises RuntimeError,
            "cannot compute the inf norm on an empty tensor"), naming the parameters;
            NonFiniteGradientError (see above). Errors name a parameter by its pair's name, else
            its own ``name``, else its position.
        TypeError: bad ``parameters`` (the message names ``parameters``), non-numeric ``max_norm`` /
            ``norm_type``, ``error_if_nonfinite`` not a bool, ``foreach`` not a bool or None. Nothing
            is scaled when it raises.
    """
    named = _parameters_of(parameters)
    max_norm = check_float(max_norm, "max_norm", minimum=0.0, finite=False)
    error_if_nonfinite = check_bool(error_if_nonfinite, "error_if_nonfinite")
    if foreach is not None and not isinstance(foreach, (bool, np.bool_)):  # as torch's; one implementation either way
        raise TypeError(f"foreach: expected a bool or None, got {described(foreach)}")
    if isinstance(norm_type, str) and norm_type.strip().lower() in ("inf", "+inf", "-inf"):
        norm_type = float(norm_type)
    if isinstance(norm_type, (bool, np.bool_)) or not isinstance(norm_type, numbers.Real):
        raise TypeError(f"norm_type: expected a real number or ±inf, got {described(norm_type)}")
    try:
        norm_type = float(norm_type)
    except OverflowError:  # an int such as 10**400 (not written out: its decimal form can be too long)
        size = f" of {abs(int(norm_type)).bit_length()} bits" if isinstance(norm_type, numbers.Integral) else ""
        hint = "math.inf gives the max norm" if norm_type > 0 else "-math.inf gives the min norm"
        raise ValueError(f"norm_type: expected a real number or ±inf, got {type(norm_type).__name__}{size} (too "
                         f"large for a float; {hint})") from None
    if math.isnan(norm_type):
        raise ValueError(f"norm_type: expected a real number or ±inf, got {norm_type}")
    named_grads = [(name, p.grad) for name, p in named if p.grad is not None]
    grads = [g for _, g in named_grads]
    if not grads:
        return np.float64(0.0)
    empty = [name for name, g in named_grads if g.size == 0]
    if empty and (norm_type < 0 or math.isinf(norm_type)):  # -inf < 0, and inf: the max of no element
        raise ValueError(f"norm_type: the {norm_type} norm of an empty gradient is undefined (no identity: "
                         f"torch raises too), got empty gradients in {empty}")
    if norm_type > 0:
        norms = np.array([variant("vector_norm", g.dtype)(np.ascontiguousarray(g), norm_type, False) for g in grads])
        if math.isinf(norm_type):
            total = float(norms.max()) if not np.isnan(norms).any() else math.nan
        elif norm_type == 2.0:
            total = math.sqrt(float(np.dot(norms, norms)))
        else:
            total = float(np.sum(norms ** norm_type)) ** (1.0 / norm_type)
    else:
        norms = np.array([_vector_norm_nonpositive(g, norm_type) for g in grads])
        total = _vector_norm_nonpositive(norms, norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        names = [name for name, g in named_grads if variant("count_nonfinite", g.dtype)(np.ascontiguousarray(g))]
        if names:
            why = f"non-finite gradients in {names}"
        else:  # every gradient is finite: the sum of their powers exceeded the float64 range
            why = ("every gradient is finite, but their norm overflowed the float64 range (gradients too large "
                   "to measure: lower the learning rate or scale the loss)")
        raise NonFiniteGradientError(
            f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is non-finite ({total}); {why}",
            names)
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # also NaN: scale (as torch), so the NaN shows
        with np.errstate(invalid="ignore", over="ignore"):  # inf · 0 or a NaN coef: NaN, as torch (no warning)
            for g in grads:
                g *= g.dtype.type(coef)
    return np.float64(total)  # a float with torch's 0-d tensor's .item()
