"""``@dataclass`` with the generated methods that cost import time shared instead (issue 23).

On Python < 3.13 the standard decorator compiles up to six methods for every class with
``exec`` (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, and ``__setattr__`` /
``__delattr__`` for frozen ones): ~1.4 ms a class, and a diagnosis imports ~100 of them.
:func:`dataclass` here lets :mod:`dataclasses` build the class and compile only its
``__init__``, then gives it ``__repr__``, ``__eq__``, ``__hash__`` (and, if frozen,
``__setattr__`` / ``__delattr__``) from this module — the same results as the generated
ones, from code compiled once into this module's bytecode. ``dataclasses.fields``,
``asdict``, ``replace``, ``is_dataclass`` and pickling see an ordinary dataclass.

Differences, none of which gpudiag relies on: a frozen instance refuses to *re*-assign an
attribute (or delete one), as before, but may be given a new, non-field attribute once;
``__dataclass_params__`` reports ``eq``, ``repr`` and ``frozen`` as ``False``.
Type checkers see :func:`dataclasses.dataclass` itself.
"""

from __future__ import annotations

import dataclasses
from _thread import get_ident as _get_ident
from operator import attrgetter
from typing import TYPE_CHECKING, Any

__all__ = ["dataclass"]

_std_dataclass = dataclasses.dataclass
_repr_running: set[tuple[int, int]] = set()  # (instance, thread) in a repr: recursion guard


def _values(names: tuple[str, ...]) -> Any:
    """A function from an instance to the tuple of its ``names`` (C speed for two or more)."""
    if len(names) >= 2:
        return attrgetter(*names)
    if names:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return lambda obj: ()


def _repr(self: Any) -> str:
    key = (id(self), _get_ident())
    if key in _repr_running:
        return "..."
    _repr_running.add(key)
    try:
        cls = self.__class__
        parts = [f"{n}={getattr(self, n)!r}" for n in cls.__record_repr__]
        return f"{cls.__qualname__}({', '.join(parts)})"
    finally:
        _repr_running.discard(key)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        values = self.__record_compare__
        return values(self) == values(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self.__record_hash__(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    if name in self.__dict__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _set(cls: type, name: str, value: Any) -> None:
    if name not in cls.__dict__:  # what the class defines itself stays, as with dataclasses
        setattr(cls, name, value)


def _process(cls: type, frozen: bool) -> type:
    # the class's own __eq__ / __hash__, read before dataclasses adds anything
    class_hash = cls.__dict__.get("__hash__", dataclasses.MISSING)
    explicit_hash = not (
        class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in cls.__dict__)
    )
    cls = _std_dataclass(cls, repr=False, eq=False)
    fs = dataclasses.fields(cls)
    cls.__record_repr__ = tuple(f.name for f in fs if f.repr)  # type: ignore[attr-defined]
    compare = tuple(f.name for f in fs if f.compare)
    cls.__record_compare__ = staticmethod(_values(compare))  # type: ignore[attr-defined]
    hashed = tuple(f.name for f in fs if (f.compare if f.hash is None else f.hash))
    cls.__record_hash__ = staticmethod(_values(hashed))  # type: ignore[attr-defined]
    _set(cls, "__repr__", _repr)
    _set(cls, "__eq__", _eq)
    if not explicit_hash:  # dataclasses' rule for eq=True, unsafe_hash=False
        cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
    if frozen:
        for name, fn in (("__setattr__", _frozen_setattr), ("__delattr__", _frozen_delattr)):
            if name in cls.__dict__:
                raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
            setattr(cls, name, fn)
    return cls


if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
else:

    def dataclass(cls=None, /, *, frozen=False):
        """``dataclasses.dataclass`` (with ``frozen``), its shared methods from this module."""
        if cls is None:
            return lambda c: _process(c, frozen)
        return _process(cls, frozen)
