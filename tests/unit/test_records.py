"""gpudiag.records.dataclass behaves as dataclasses.dataclass where gpudiag can tell (issue 23).

Each class is declared twice, once with each decorator, and the two are checked against
each other: the truth is the standard library's behaviour, not gpudiag's.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from gpudiag import records


def _pair(frozen: bool) -> tuple[type, type]:
    def make(deco: Any) -> type:
        @deco(frozen=frozen)
        class Point:
            x: int
            y: float = 0.5
            tags: list[str] = dataclasses.field(default_factory=list)
            note: str = dataclasses.field(default="", repr=False, compare=False)

        return Point

    return make(dataclasses.dataclass), make(records.dataclass)


# module level, so that pickle finds them
@records.dataclass(frozen=True)
class Frozen:
    """A frozen record for the pickle round trip."""

    a: int
    b: tuple[int, ...] = ()


@records.dataclass
class Plain:
    """A mutable record for the pickle round trip."""

    a: int
    b: list[int] = dataclasses.field(default_factory=list)


@pytest.mark.parametrize("frozen", [True, False])
def test_same_behaviour_as_dataclasses(frozen: bool) -> None:
    std, rec = _pair(frozen)
    for args in [(1,), (1, 2.0), (1, 2.0, ["a"]), (1, float("nan"), [], "n")]:
        s, r = std(*args), rec(*args)
        assert repr(r) == repr(s)
        assert (r == rec(*args)) == (s == std(*args))
        assert (r == rec(9)) == (s == std(9))
        assert r.__eq__(s) is NotImplemented  # another class: as the generated __eq__
        assert dataclasses.asdict(r) == dataclasses.asdict(s)
        assert dataclasses.astuple(r) == dataclasses.astuple(s)
        assert [f.name for f in dataclasses.fields(r)] == [f.name for f in dataclasses.fields(s)]
        assert dataclasses.replace(r, x=3) == rec(3, *args[1:])
        if frozen:  # hashable as a tuple of its compared fields; a list field is not
            with pytest.raises(TypeError, match="unhashable"):
                hash(r)
            assert hash(rec(1, 2.0, (), "x")) == hash(std(1, 2.0, (), "x"))  # type: ignore[arg-type]
    assert (rec.__hash__ is None) == (std.__hash__ is None)
    assert rec(1, note="a") == rec(1, note="b")  # compare=False
    assert dataclasses.is_dataclass(rec)


def test_frozen_refuses_assignment() -> None:
    r = Frozen(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.a = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del r.a  # type: ignore[misc]
    assert r.a == 1
    m = Plain(1)
    m.a = 2
    assert m.a == 2


def test_pickle_copy_and_recursion() -> None:
    for obj in (Frozen(1, (2, 3)), Plain(1, [2])):
        assert pickle.loads(pickle.dumps(obj)) == obj
        assert copy.deepcopy(obj) == obj
    p = Plain(1)
    p.b.append(p)  # type: ignore[arg-type]
    assert repr(p) == "Plain(a=1, b=[...])"


def test_explicit_methods_are_kept() -> None:
    @records.dataclass(frozen=True)
    class Own:
        a: int

        def __repr__(self) -> str:
            return "own"

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    assert repr(Own(1)) == "own"
    assert Own(1) == Own(2)
    assert Own.__hash__ is object.__hash__


def _classes(deco: Any) -> tuple[type, type, type]:
    @deco(frozen=True)
    class Base:
        a: int
        b: str = "b"
        c: list[int] = dataclasses.field(default_factory=list, compare=False)
        d: int = dataclasses.field(default=4, init=False)

        def __post_init__(self) -> None:
            object.__setattr__(self, "d", self.a * 10)

    @deco(frozen=True)
    class Child(Base):
        e: float = 1.5

    class Plain(Child):  # not a dataclass: inherits Child's __init__
        pass

    return Base, Child, Plain


def test_init_as_dataclasses_builds_it():
    std, rec = _classes(dataclasses.dataclass), _classes(records.dataclass)
    for s, r in zip(std, rec, strict=True):
        for args, kw in [((1,), {}), ((1, "x"), {"c": [2]}), ((), {"a": 3, "b": "y"})]:
            assert repr(r(*args, **kw)) == repr(s(*args, **kw))
            assert dataclasses.asdict(r(*args, **kw)) == dataclasses.asdict(s(*args, **kw))
        for args, kw in [((), {}), ((1, 2, 3, 4, 5, 6), {}), ((1,), {"d": 2}), ((1,), {"z": 0})]:
            with pytest.raises(TypeError) as want:
                s(*args, **kw)
            with pytest.raises(TypeError) as got:
                r(*args, **kw)
            assert str(got.value) == str(want.value)
    assert rec[2](1).e == 1.5 and rec[1](2).d == 20  # after the first instance too
    assert rec[0].__init__.__qualname__ == std[0].__init__.__qualname__


def test_init_of_a_copy_is_the_same():
    """The path taken where dataclasses has no _init_fn of 3.10-3.12's signature (3.13+)."""
    std, rec = _classes(dataclasses.dataclass), _classes(records.dataclass)
    for s, r in zip(std[:2], rec[:2], strict=True):
        fields = list(dataclasses.fields(r))
        init = records._init_of_copy(r, fields, True)
        obj = object.__new__(r)
        init(obj, 1, "x", [2])
        assert repr(obj) == repr(s(1, "x", [2]))
        with pytest.raises(TypeError) as want:
            s(1, b="y", a=2)
        with pytest.raises(TypeError) as got:
            init(object.__new__(r), 1, b="y", a=2)
        assert str(got.value) == str(want.value)
