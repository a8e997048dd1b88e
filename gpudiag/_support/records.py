"""``@dataclass`` without the per-class code generation that costs import time (issues 23, 34).

On Python < 3.13 the standard decorator compiles up to six methods for every class with
``exec`` (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, and ``__setattr__`` /
``__delattr__`` for frozen ones) and inspects every annotation: ~0.3-1.4 ms a class, and a
diagnosis imports ~120 of them. :func:`dataclass` here builds the same class itself:

* its fields are real :class:`dataclasses.Field` objects in ``__dataclass_fields__`` (with
  ``__dataclass_params__`` from a standard dataclass of the same ``frozen``), so
  ``dataclasses.fields``, ``asdict``, ``replace``, ``is_dataclass``, msgspec and pickling
  see an ordinary dataclass;
* ``__init__`` is a template function compiled once per number of parameters, its code
  given the field names with ``code.replace`` (no ``exec`` a class); defaults are its
  ``__defaults__``, ``default_factory`` fields and ``__post_init__`` are handled after
  the fields are stored, as the generated ``__init__`` does;
* ``__repr__``, ``__eq__``, ``__hash__`` (and, if frozen, ``__setattr__`` /
  ``__delattr__``) are shared functions of this module with the generated ones' results.

A class this module does not handle the same way (``InitVar`` or ``KW_ONLY`` fields, a
string annotation it cannot read) is handed to :func:`dataclasses.dataclass` as before.
Differences, none of which gpudiag relies on: a frozen instance refuses to *re*-assign an
attribute (or delete one), as before, but may be given a new, non-field attribute once;
``__init__`` carries no annotations; a class without a docstring gets ``Name(a, b)`` as
its ``__doc__``, without the types; ``__dataclass_params__`` reports ``eq`` and ``repr`` as
``False`` (``frozen`` as given). Type checkers see :func:`dataclasses.dataclass` itself.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import sys
from _thread import get_ident as _get_ident
from operator import attrgetter
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Any, ClassVar

__all__ = ["asdict", "dataclass"]

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


_MISSING = dataclasses.MISSING
_FIELD = getattr(dataclasses, "_FIELD", None)
_FIELD_CLASSVAR = getattr(dataclasses, "_FIELD_CLASSVAR", None)


class _FactorySentinel:
    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _FactorySentinel()  # the default of a default_factory parameter, as dataclasses'


@_std_dataclass(repr=False, eq=False)
class _PlainParams:
    pass


@_std_dataclass(repr=False, eq=False, frozen=True)
class _FrozenParams:
    pass


_PARAMS = {False: _PlainParams.__dataclass_params__, True: _FrozenParams.__dataclass_params__}  # type: ignore[attr-defined]
_CLASSVAR_TEXT = ("ClassVar", "typing.ClassVar", "t.ClassVar")
_NOT_HANDLED_TEXT = ("InitVar", "dataclasses.InitVar", "KW_ONLY", "dataclasses.KW_ONLY")
_templates: dict[int, CodeType] = {}


def template_source(n: int) -> str:
    """The source of the ``__init__`` template of ``n`` parameters ``_p0`` ….

    It stores them under ``__record_names__`` with one ``dict.update`` for all fields
    (faster than ``n`` assignments from ~6 fields on, and half the source to compile), then
    calls ``__record_after__`` for factories and ``__post_init__``. It writes the instance's
    ``__dict__``, as the generated ``__init__`` of a frozen dataclass does through
    ``object.__setattr__``; a class with its own ``__setattr__`` goes to :mod:`dataclasses`
    (:func:`_build`).
    """
    params = "".join(f", _p{i}" for i in range(n))
    values = "".join(f"_p{i}, " for i in range(n))
    return (
        f"def __init__(__record_self__{params}):\n"
        f"    __record_self__.__dict__.update(zip(__record_names__, ({values})))\n"
        "    __record_after__(__record_self__)\n"
    )


INITS_MAX = 40  # templates kept in record_inits.py: the classes here have up to 35 fields


def inits_source() -> str:
    """The text of :mod:`gpudiag._support.record_inits` (tests check the file is this)."""
    head = (
        '"""``__init__`` templates of 0 to INITS_MAX parameters, as bytecode on import.\n\n'
        "Generated from :func:`gpudiag._support.records.template_source`; do not edit. To write\n"
        "it again: ``python -m gpudiag._support.records``.\n"
        '"""\n'
    )
    defs = "".join(
        "\n\n" + template_source(n).replace("def __init__(", f"def init{n}(")
        for n in range(INITS_MAX + 1)
    )
    return head + defs


def _template(n: int) -> CodeType:
    """The code of the ``__init__`` template of ``n`` parameters (:func:`template_source`).

    Up to :data:`~gpudiag._support.record_inits.MAX` parameters it comes from that module's
    bytecode, written when the package is installed or first imported (compiling the ~25
    templates a diagnosis uses took ~3 ms of every start); beyond, it is compiled here once.
    """
    code = _templates.get(n)
    if code is None:
        from gpudiag._support import record_inits

        fn = getattr(record_inits, f"init{n}", None)
        if fn is None:
            ns: dict[str, Any] = {}
            exec(compile(template_source(n), __file__, "exec"), ns)
            fn = ns["__init__"]
        code = _templates[n] = fn.__code__
    return code


def _nothing_after(self: Any) -> None:
    pass


def _is_classvar(annotation: Any) -> bool | None:
    """True for ``ClassVar[...]``, False for a field, None where dataclasses must decide."""
    if isinstance(annotation, str):
        head = annotation.split("[", 1)[0].strip()
        if head in _CLASSVAR_TEXT:
            return True
        if head in _NOT_HANDLED_TEXT:
            return None
        return False
    if annotation is ClassVar or getattr(annotation, "__origin__", None) is ClassVar:
        return True
    if (
        annotation is dataclasses.KW_ONLY
        or annotation is dataclasses.InitVar
        or isinstance(annotation, dataclasses.InitVar)
    ):
        return None
    return False


def _build(cls: type, frozen: bool) -> type | None:
    """``cls`` made a dataclass here, or None where :mod:`dataclasses` must do it."""
    if _FIELD is None or _FIELD_CLASSVAR is None:
        return None
    own = cls.__dict__
    setattr_fn: Any = cls.__setattr__
    if "__slots__" in own or setattr_fn not in (object.__setattr__, _frozen_setattr):
        return None  # __init__ writes __dict__: only where assignment does nothing else
    fields: dict[str, dataclasses.Field[Any]] = {}
    for base in cls.__mro__[-1:0:-1]:
        base_fields = base.__dict__.get("__dataclass_fields__")
        if base_fields is not None:
            if base.__dict__["__dataclass_params__"].frozen != frozen:
                return None  # dataclasses says why a frozen and a plain one cannot mix
            fields.update(base_fields)
    annotations = own.get("__annotations__", {})
    kinds = {name: _is_classvar(annotation) for name, annotation in annotations.items()}
    if None in kinds.values() or any(
        isinstance(v, dataclasses.Field) and v.kw_only is True for v in own.values()
    ):
        return None  # decided before the class is touched: dataclasses gets it as it was
    for name, annotation in annotations.items():
        classvar = kinds[name]
        value = own.get(name, _MISSING)
        if isinstance(value, dataclasses.Field):
            f = value
            if classvar and f.default_factory is not _MISSING:
                raise TypeError(f"field {name} cannot have a default factory")
        else:
            f = dataclasses.field(default=value)
        f.name = name
        f.type = annotation
        f._field_type = _FIELD_CLASSVAR if classvar else _FIELD  # type: ignore[attr-defined]
        if f.kw_only is _MISSING:
            f.kw_only = False
        if not classvar and f.default is not _MISSING and f.default.__class__.__hash__ is None:
            raise ValueError(
                f"mutable default {type(f.default)} for field {name} is not allowed: "
                "use default_factory"
            )
        fields[name] = f
        if isinstance(value, dataclasses.Field):  # the class attribute: the default, or none
            if f.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
    for name, value in own.items():
        if isinstance(value, dataclasses.Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    cls.__dataclass_params__ = _PARAMS[frozen]  # type: ignore[attr-defined]
    cls.__dataclass_fields__ = fields  # type: ignore[attr-defined]
    if "__init__" not in own:
        cls.__init__ = _init(cls, [f for f in fields.values() if f._field_type is _FIELD], frozen)  # type: ignore[attr-defined,misc]
    return cls


def _init(cls: type, fs: list[dataclasses.Field[Any]], frozen: bool) -> Any:
    """The ``__init__`` of a class with fields ``fs``, as dataclasses generates it."""
    params = [f for f in fs if f.init]
    defaults: list[Any] = []
    for f in params:
        if f.default is not _MISSING:
            defaults.append(f.default)
        elif f.default_factory is not _MISSING:
            defaults.append(_FACTORY)
        elif defaults:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
    factories: list[tuple[str, Any]] = [
        (f.name, f.default_factory) for f in params if f.default_factory is not _MISSING
    ]
    # init=False: set from their default or factory
    fixed: list[tuple[str, Any, Any]] = [
        (f.name, f.default, f.default_factory) for f in fs if not f.init
    ]
    post_init = getattr(cls, "__post_init__", None) is not None
    after: Any = _nothing_after
    if factories or fixed or post_init:
        setter = object.__setattr__ if frozen else setattr

        def after(self: Any) -> None:
            for name, factory in factories:
                if getattr(self, name) is _FACTORY:
                    setter(self, name, factory())
            for name, default, factory in fixed:
                if factory is not _MISSING:
                    setter(self, name, factory())
                elif default is not _MISSING:
                    setter(self, name, default)
            if post_init:
                self.__post_init__()

    names = tuple(f.name for f in params)
    real = {f"_p{i}": name for i, name in enumerate(names)}
    code = _template(len(names))
    code = code.replace(
        co_name="__init__", co_varnames=tuple(real.get(v, v) for v in code.co_varnames)
    )
    if sys.version_info >= (3, 11):  # tracebacks name the class's __init__
        code = code.replace(co_qualname=f"{cls.__qualname__}.__init__")
    scope = {
        "__builtins__": builtins,
        "__record_names__": names,
        "__record_after__": after,
    }
    fn = FunctionType(code, scope, "__init__", tuple(defaults) or None)
    fn.__qualname__ = f"{cls.__qualname__}.__init__"
    fn.__module__ = cls.__module__
    return fn


def _process(cls: type, frozen: bool) -> type:
    # the class's own __eq__ / __hash__, read before dataclasses adds anything
    class_hash = cls.__dict__.get("__hash__", dataclasses.MISSING)
    explicit_hash = not (
        class_hash is dataclasses.MISSING or (class_hash is None and "__eq__" in cls.__dict__)
    )
    built = _build(cls, frozen)
    if built is None:
        cls = _std_dataclass(cls, repr=False, eq=False, frozen=frozen)
    else:
        cls = built
        if not cls.__dict__.get("__doc__"):
            names = ", ".join(f.name for f in dataclasses.fields(cls) if f.init)
            cls.__doc__ = f"{cls.__name__}({names})"
        if "__match_args__" not in cls.__dict__:
            cls.__match_args__ = tuple(f.name for f in dataclasses.fields(cls) if f.init)  # type: ignore[attr-defined,misc]
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
    if frozen and built is not None:
        for name, fn in (("__setattr__", _frozen_setattr), ("__delattr__", _frozen_delattr)):
            if name in cls.__dict__:
                raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
            setattr(cls, name, fn)
    return cls


_ATOMS = frozenset({str, int, float, bool, type(None)})
_names: dict[type, tuple[str, ...]] = {}


def asdict(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict(obj)``, the same result at a fraction of the cost.

    The standard one calls ``copy.deepcopy`` on every leaf and ``fields()`` on every
    instance: a diagnosis has thousands of leaves, nearly all of them numbers and strings
    that a deep copy returns as they are. Here those are returned directly, each class's
    field names are read once, and any other leaf is deep-copied as before.
    """
    if not hasattr(type(obj), "__dataclass_fields__"):
        raise TypeError("asdict() should be called on dataclass instances")
    return _plain(obj)  # type: ignore[no-any-return]


def _plain(obj: Any) -> Any:
    cls = type(obj)
    if cls in _ATOMS:
        return obj
    if cls is list:
        return [_plain(v) for v in obj]
    if cls is dict:
        return {_plain(k): _plain(v) for k, v in obj.items()}
    names = _names.get(cls)
    if names is None:
        if not hasattr(cls, "__dataclass_fields__"):
            return _other(obj)
        names = _names[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return {n: _plain(getattr(obj, n)) for n in names}


def _other(obj: Any) -> Any:
    """What ``dataclasses.asdict`` makes of a value that is no dataclass, list or dict."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*[_plain(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    if isinstance(obj, dict):
        if hasattr(type(obj), "default_factory"):  # defaultdict, as Python 3.12 does
            out = type(obj)(obj.default_factory)  # type: ignore[attr-defined]
            out.update((_plain(k), _plain(v)) for k, v in obj.items())
            return out
        return type(obj)((_plain(k), _plain(v)) for k, v in obj.items())
    return copy.deepcopy(obj)


if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
else:

    def dataclass(cls=None, /, *, frozen=False):
        """``dataclasses.dataclass`` (with ``frozen``), its shared methods from this module."""
        if cls is None:
            return lambda c: _process(c, frozen)
        return _process(cls, frozen)


if __name__ == "__main__":  # writes record_inits.py again
    from pathlib import Path

    Path(__file__).with_name("record_inits.py").write_text(inits_source())
