"""A trainable parameter: a name, a numpy array of values and its gradient, both updated in place.

Layers in training mode hand out :class:`Parameter` objects whose arrays may be zero-copy views of
buffers the C++ core owns; the optimizers (:mod:`transformer_core.optim`) update ``data`` IN PLACE
and never rebind it, so those views stay valid.
"""

from __future__ import annotations

import numpy as np

from ._validation import check_bool

__all__ = ["Parameter"]

_FLOAT = (np.dtype(np.float32), np.dtype(np.float64))


def _check_array(a, name: str, *, shape=None, dtype=None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if a.dtype not in _FLOAT:
        raise TypeError(f"{name}: expected float32 or float64, got {a.dtype}")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (the parameter's), got {a.dtype}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name}: expected shape {shape} (the parameter's), got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (it is updated in place)")
    if not a.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array (it is updated in place)")
    return a


def _index_text(index) -> str:
    """``index`` as written between brackets (``0``, ``...``, ``1:3``, ``0, ...``), for the messages."""
    def one(i) -> str:
        """One index item as written (``...``, ``a:b:c``, ``i``)."""
        if i is Ellipsis:
            return "..."
        if isinstance(i, slice):
            return ":".join("" if v is None else repr(v) for v in (i.start, i.stop)) + (
                "" if i.step is None else f":{i.step!r}")
        text = repr(i)
        return text if len(text) <= 20 else "index"  # an index array: not its values
    return ", ".join(one(i) for i in index) if isinstance(index, tuple) else one(index)


def freezing_refused(what: str) -> ValueError:
    """The ValueError of ``requires_grad_(False)`` on a Parameter or a module (``what``: the call and
    what it would freeze): every weight's gradient is computed; the way to freeze is to leave weights
    out of the optimizer."""
    return ValueError(f"{what} is not supported, a backward computes the gradient of every weight (in C++, no "
                      "autograd); give the optimizer only the parameters to train (a filtered named_parameters())")


class Parameter:
    """A named trainable array (torch's ``nn.Parameter`` with its ``.grad``, as numpy).

    Args:
        data: the values, a C-contiguous, writeable float32 or float64 numpy array. It is NOT copied:
            the optimizers update this very array in place (it may be a view of a C++ buffer).
        name: the parameter's name in its model's state dict (e.g. ``"encoder.layers.0.linear1.weight"``);
            optimizers key their state by it. None: the optimizer names it by position.
        grad: None (no gradient yet: optimizers skip the parameter, as torch does) or an array of
            ``data``'s shape and dtype, C-contiguous and writeable.

    Attributes:
        data: the values (read-only attribute: assign into it, ``p.data[...] = x``; ``p.data = x``
            raises AttributeError, see the ``data`` setter; an in-place operator, torch's
            ``p.data -= lr * p.grad``, writes into it and is accepted).
        grad: the gradient or None; may be reassigned (checked) or set to None.
        name: str or None.

    A Parameter is array-like (``__array__``), as torch's ``nn.Parameter`` is a tensor: numpy
    functions and this library's ops take it for its ``data`` (``np.sum(p)``, ``p.data @ x`` or
    ``functional.linear(x, p)``), with no copy unless a dtype or ``copy=True`` asks for one. It is
    not an array itself: indexing it (``p[0]``, ``p[...] = x``) raises TypeError saying to index
    ``p.data``, which reads and writes the values in place.

    Differences from torch's names:

    * ``size`` is numpy's: the NUMBER of values (an int attribute, ``data.size``), where torch's
      ``size()`` is the shape. Use ``shape`` for the shape and :meth:`numel` (torch's name) for the
      number of values.
    * ``requires_grad`` is always True (every weight trains: a model's backward computes every
      gradient, there is no autograd to switch off); setting it to False raises ValueError (to
      freeze a weight, leave it out of the optimizer).

    Raises:
        TypeError: ``data``/``grad`` not numpy float arrays, or ``grad`` of another dtype; ``name``
            neither a str nor None.
        ValueError: ``grad`` of another shape; an array not C-contiguous or not writeable.
    """

    __slots__ = ("_data", "_grad", "name")

    def __init__(self, data, name: str | None = None, grad=None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name: expected a str or None, got {type(name).__name__}")
        self._data = _check_array(data, "data")
        self.name = name
        self._grad = None
        if grad is not None:  # (a subclass's setter may act on None: a model's clears its C++ gradient)
            self.grad = grad

    @property
    def data(self) -> np.ndarray:
        """The values, as a numpy array (for a model's parameter: a zero-copy view of its C++ buffer)."""
        return self._data

    @data.setter
    def data(self, value) -> None:
        """Refused (AttributeError): torch's ``p.data = x`` rebinds the parameter to another tensor,
        but this ``data`` is the very array the optimizers update in place (for a model's
        parameter, a view of its C++ buffer), so another array would never reach the model; and
        copying ``x`` in instead would silently break torch's sharing (``a.data = b.data`` ties
        ``a`` to ``b``). The message says what to do: copy the values in, ``p.data[...] = x``, or
        load them with the model's ``load_state_dict``.

        ``value`` being ``data`` itself is accepted and changes nothing: Python runs an in-place
        operator on the attribute, torch's ``p.data -= lr * p.grad`` (``+=``, ``*=``, ...), as
        ``p.data = p.data.__isub__(...)``, whose result is ``data``, already written in place.

        Raises:
            AttributeError: ``value`` is any other object than ``data`` itself.
        """
        if value is self._data:
            return
        shape = getattr(value, "shape", None)
        got = type(value).__name__ + (f" of shape {tuple(shape)}" if isinstance(shape, tuple) else "")
        raise AttributeError(
            f"data: a Parameter's data cannot be rebound (got {got}); it is the array the optimizers update "
            f"in place{'' if self.name is None else f' (of {self.name!r})'}: copy the values into it with "
            f"p.data[...] = x (shape {self._data.shape}, dtype {self._data.dtype}), or load them with "
            f"model.load_state_dict(...)")

    @property
    def grad(self) -> np.ndarray | None:
        """The gradient (``data``'s shape and dtype), or None."""
        return self._grad

    @grad.setter
    def grad(self, value) -> None:
        """Sets the gradient: None, or an array of ``data``'s shape and dtype (TypeError / ValueError
        otherwise)."""
        if value is not None:
            _check_array(value, "grad", shape=self._data.shape, dtype=self._data.dtype)
        self._grad = value

    @property
    def shape(self) -> tuple:
        """``data.shape``."""
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        """``data.dtype`` (float32 or float64)."""
        return self._data.dtype

    @property
    def size(self) -> int:
        """``data.size``: the number of values, as numpy's ``size`` (NOT torch's ``size()``, the
        shape: use :attr:`shape`); the same as :meth:`numel`."""
        return self._data.size

    def numel(self) -> int:
        """The number of values (torch's ``numel()``; numpy's ``data.size``)."""
        return self._data.size

    @property
    def requires_grad(self) -> bool:
        """Always True, as torch's default: every weight trains (a model's backward computes the
        gradient of every weight; there is no autograd to switch off per parameter). Setting it to
        True does nothing; setting it to False raises ValueError (see :meth:`requires_grad_`)."""
        return True

    @requires_grad.setter
    def requires_grad(self, value) -> None:
        """``True``: nothing changes. ``False``: refused (ValueError), as :meth:`requires_grad_`.

        Raises:
            TypeError: ``value`` not a bool. ValueError: ``value`` is False.
        """
        self.requires_grad_(check_bool(value, "requires_grad"))

    def requires_grad_(self, requires_grad: bool = True) -> "Parameter":
        """Torch's ``requires_grad_``: ``True`` is what every parameter already does (returns
        ``self``); ``False`` (freeze it) is refused: a model's backward runs in C++ and computes the
        gradient of every weight (there is no autograd). To freeze weights, give the optimizer (and
        ``clip_grad_norm_``) only the others, e.g. ``[(n, p) for n, p in model.named_parameters() if
        not n.startswith("embeddings.")]``: their gradients are still computed, never applied.

        Raises:
            TypeError: ``requires_grad`` not a bool. ValueError: ``requires_grad`` is False.
        """
        if not check_bool(requires_grad, "requires_grad"):
            raise freezing_refused(f"requires_grad=False ({self._called()}): freezing a parameter")
        return self

    def _called(self) -> str:
        """How the messages name this parameter: ``Parameter 'name'``, or ``a Parameter``."""
        return "a Parameter" if self.name is None else f"Parameter {self.name!r}"

    def __iter__(self):
        """Refused (TypeError): a Parameter is not a sequence (``iter(p)``, ``list(p)``, ``x in p``);
        iterate over its values, ``p.data``."""
        raise TypeError(f"{self._called()} is not iterable: iterate over its values instead, p.data (a numpy "
                        f"array of shape {self._data.shape})")

    def __contains__(self, value):
        """Refused (TypeError), as :meth:`__iter__` (``x in p``: Python would replace the iterator's
        message by its own)."""
        self.__iter__()

    def __getitem__(self, index):
        """Refused (TypeError): a Parameter is not an array; index its values, ``p.data[index]``
        (a numpy array: a view of the values, whose writes reach the parameter)."""
        raise TypeError(f"{self._called()} is not indexable: index its values instead, p.data[{_index_text(index)}] "
                        f"(p.data is a numpy array of shape {self._data.shape}; writes into it reach the parameter)")

    def __setitem__(self, index, value) -> None:
        """Refused (TypeError): assign into the values instead, ``p.data[index] = value`` (in place:
        the optimizers and, for a model's parameter, the C++ weight see the change)."""
        raise TypeError(f"{self._called()} does not support item assignment: assign into its values instead, "
                        f"p.data[{_index_text(index)}] = x (p.data is a numpy array of shape {self._data.shape}, "
                        "updated in place), or load a model's weights with model.load_state_dict(...)")

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``data`` for numpy (``np.asarray(p)``, ``np.sum(p)``, ...), by numpy 2's protocol:
        ``data`` itself (no copy: writes through it change the parameter) when neither ``dtype``
        (another dtype than ``data``'s) nor ``copy=True`` asks for a copy, else a new array.

        Raises:
            ValueError: ``copy=False`` with a ``dtype`` that needs a copy (numpy's rule).
        """
        same = dtype is None or np.dtype(dtype) == self._data.dtype
        if copy is False and not same:
            raise ValueError(f"Parameter.__array__: copy=False, but dtype {np.dtype(dtype)} needs a copy of the "
                             f"{self._data.dtype} data")
        if copy:
            return np.array(self._data, dtype=dtype, copy=True)
        return self._data if same else self._data.astype(dtype)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops the gradient (``set_to_none``, torch's default: ``grad`` becomes None) or fills it
        with zeros in place (``grad`` stays an array; a None gradient stays None), as torch.

        Raises:
            TypeError: ``set_to_none`` not a bool.
        """
        if check_bool(set_to_none, "set_to_none"):
            self._grad = None
        elif self._grad is not None:
            self._grad.fill(0)

    def __reduce_ex__(self, protocol):
        """Copies and pickles: a plain :class:`Parameter` of ``data``, ``name`` and ``grad``; over the
        same arrays for ``copy.copy`` (as torch's shares the data), over copies of them for
        ``copy.deepcopy`` and pickle (any protocol; torch's drop ``.grad``, these keep a copy)."""
        return Parameter, (self._data, self.name, self._grad)

    def __repr__(self) -> str:
        grad = "None" if self.grad is None else "array"  # the property: a model's reads its C++ buffer
        return f"Parameter(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, grad={grad})"
