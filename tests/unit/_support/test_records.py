"""gpudiag._support.records.dataclass behaves as dataclasses.dataclass where gpudiag can tell (issue 23).

Each class is declared twice, once with each decorator, and the two are checked against
each other: the truth is the standard library's behaviour, not gpudiag's.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any, ClassVar

import pytest

from gpudiag._support import records


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


def test_init_defaults_factories_and_post_init_as_dataclasses() -> None:
    """The template ``__init__``: keywords, defaults, factories, init=False, __post_init__."""

    def make(deco: Any) -> type:
        @deco(frozen=True)
        class Base:
            a: int
            b: list[int] = dataclasses.field(default_factory=lambda: [7])

        @deco(frozen=True)
        class Child(Base):
            c: str = "c"
            d: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
            e: int = dataclasses.field(default=5, init=False)

            def __post_init__(self) -> None:
                object.__setattr__(self, "e", self.e + self.a)

        return Child

    std, rec = make(dataclasses.dataclass), make(records.dataclass)
    for args, kw in [((1,), {}), ((1, [2]), {"c": "x"}), ((), {"a": 3, "b": [], "c": "y"})]:
        s, r = std(*args, **kw), rec(*args, **kw)
        assert repr(r) == repr(s) and dataclasses.asdict(r) == dataclasses.asdict(s)
    assert rec(1).b is not rec(1).b  # a new list each time
    for bad_args, bad_kw in [
        ((), {}),
        ((1, [], "c", "extra"), {}),
        ((1,), {"d": {}}),
        ((1,), {"z": 1}),
    ]:
        with pytest.raises(TypeError):
            std(*bad_args, **bad_kw)
        with pytest.raises(TypeError):
            rec(*bad_args, **bad_kw)
    assert [f.name for f in dataclasses.fields(rec)] == ["a", "b", "c", "d", "e"]
    assert rec.__match_args__ == std.__match_args__
    assert rec.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert "e" in rec.__dict__ and "d" not in rec.__dict__  # class attributes as dataclasses
    with pytest.raises(TypeError, match="non-default argument"):

        @records.dataclass
        class Wrong:
            a: int = 1
            b: int  # type: ignore[misc]

    with pytest.raises(ValueError, match="mutable default"):

        @records.dataclass
        class Mutable:
            a: list[int] = []  # noqa: RUF012


def test_classvar_and_own_setattr() -> None:
    @records.dataclass(frozen=True)
    class K:
        kinds: ClassVar[tuple[str, ...]] = ("x",)
        a: int = 0

    assert [f.name for f in dataclasses.fields(K)] == ["a"] and K.kinds == ("x",)

    @records.dataclass
    class Logged:  # its own __setattr__: dataclasses builds it, and assignment goes through it
        a: int
        seen: ClassVar[list[str]] = []

        def __setattr__(self, name: str, value: Any) -> None:
            Logged.seen.append(name)
            object.__setattr__(self, name, value)

    Logged(1)
    assert Logged.seen == ["a"]


def test_asdict_is_dataclasses_asdict() -> None:
    """records.asdict gives what dataclasses.asdict gives, on a real diagnosis and odd leaves."""
    from collections import namedtuple

    import numpy as np
    from testpaths import DATA

    import gpudiag

    d = gpudiag.analyze(DATA / "straggler_comms_id")
    assert records.asdict(d) == dataclasses.asdict(d)
    assert repr(records.asdict(d)) == repr(dataclasses.asdict(d))  # key order, types of leaves

    Pair = namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Odd:
        t: tuple[Any, ...]
        n: Any
        arr: Any

    o = Odd((1, [Frozen(2)]), Pair(Frozen(1), 2.5), np.arange(3))
    mine, std = records.asdict(o), dataclasses.asdict(o)
    assert repr({k: v for k, v in mine.items() if k != "arr"}) == repr(
        {k: v for k, v in std.items() if k != "arr"}
    )
    assert mine["arr"] is not o.arr and (mine["arr"] == o.arr).all()  # deep-copied, as theirs
    with pytest.raises(TypeError):
        records.asdict(3)


def test_a_class_left_to_dataclasses_arrives_untouched() -> None:
    """A field this module does not handle (InitVar) after a factory field: dataclasses
    builds the class from its own body, factory included, as if records had not looked."""

    def make(deco: Any) -> type:
        @deco
        class WithInitVar:
            a: list[int] = dataclasses.field(default_factory=list)
            b: dataclasses.InitVar[int] = 0

            def __post_init__(self, b: int) -> None:
                self.a.append(b)

        return WithInitVar

    std, rec = make(dataclasses.dataclass), make(records.dataclass)
    assert repr(rec(b=3)) == repr(std(b=3)) and repr(rec(b=3)).endswith("WithInitVar(a=[3])")
    assert rec().a is not rec().a


def test_frozen_and_plain_do_not_mix() -> None:
    @records.dataclass(frozen=True)
    class FrozenBase:
        a: int = 0

    with pytest.raises(TypeError, match="non-frozen dataclass from a frozen one"):

        @records.dataclass
        class Plain(FrozenBase):
            b: int = 0


def test_init_templates_module_is_current() -> None:
    """record_inits.py is what records.py generates (``python -m gpudiag._support.records``)."""
    from pathlib import Path

    text = Path(records.__file__).with_name("record_inits.py").read_text()
    assert text == records.inits_source()


def test_beyond_the_kept_templates_and_with_evaluated_annotations() -> None:
    """More fields than record_inits keeps, and annotations that are types, not strings."""
    n = records.INITS_MAX + 3
    ns: dict[str, Any] = {f"f{i}": i for i in range(1, n)}  # the first field has no default

    def make(deco: Any) -> Any:
        notes: dict[str, Any] = {f"f{i}": int for i in range(n)}
        notes["kind"] = ClassVar[str]
        return deco(type("Wide", (), {"__annotations__": notes, "kind": "w", **ns}))

    std, rec = make(dataclasses.dataclass), make(records.dataclass)
    assert [f.name for f in dataclasses.fields(rec)] == [f.name for f in dataclasses.fields(std)]
    a, b = std(-1, f5=50), rec(-1, f5=50)
    assert dataclasses.asdict(a) == dataclasses.asdict(b) == records.asdict(b)
    assert rec.__init__.__name__ == rec.__init__.__code__.co_name == "__init__"
    with pytest.raises(TypeError):
        rec()
