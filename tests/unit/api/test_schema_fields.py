"""The Diagnosis types and their JSON schema (gpudiag/schema/diagnosis.schema.json) agree, both ways.

The walk starts at :class:`Diagnosis` and the schema's root and follows each field by its
annotation (optional, lists, string-keyed dicts, nested dataclasses and TypedDicts, a
finding's metrics as every kind's class) into the schema's ``properties``, ``items``,
``additionalProperties``, ``$ref`` and ``oneOf``. A field the types have and the schema
lacks fails; so does a property the schema has and the types lack, and a leaf whose
schema type does not admit its annotation (an ``int`` the schema calls a string). Apart,
every object the schema leaves bare (no properties, no schema for its values) must be one
of :data:`FREE_FORM`, which says why, and at most three (issue 28). The host cause
(``metrics.cause``, ``metrics.blocking_call``) is still a ``dict[str, Any]``: its
properties are those analysis/findings/causes.py writes, checked here once it is a typed record.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from pathlib import Path
from typing import Any

from gpudiag.analysis.model.diagnosis import Diagnosis
from gpudiag.analysis.model.metrics import BY_KIND, FindingMetrics

SCHEMA = Path(__file__).resolve().parents[3] / "gpudiag" / "schema" / "diagnosis.schema.json"
# The objects the schema leaves bare, and why each is free-form (each says so in the schema).
FREE_FORM = {
    ".recommendations[].evidence": "the numbers each remedy quotes, by its own names",
    ".thresholds": "every rule constant in force (Thresholds.as_dict), grouped as configured",
    ".alerts[].metrics": "the numbers each live rule judged (analysis/run/online.py)",
}
# Fields of the types that are not JSON keys, and why.
NOT_IN_JSON = {
    "Shares.comm_measured": "the JSON writes comm_wait as null when it was not measured",
    "RankEvidence.python_sites": "read by the host cause; its call_sites carry what it names",
}
_SCALARS = {bool: {"boolean"}, int: {"integer", "number"}, float: {"number"}, str: {"string"}}


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    for branch in node.get("oneOf", []):  # {section} or {}: the section's branch
        if "properties" in _resolve(schema, branch):
            return _resolve(schema, branch)
    return node


def _fields(tp: Any) -> list[str] | None:
    """The JSON keys of a dataclass or TypedDict (None for anything else)."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return [f.name for f in dataclasses.fields(tp)]
    if isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__"):
        return list(typing.get_type_hints(tp))
    return None


def _is_scalar(tp: Any) -> bool:
    """A bool, int, float or str, a Literal or a string enum."""
    is_enum = isinstance(tp, type) and issubclass(tp, enum.Enum)
    return tp in _SCALARS or typing.get_origin(tp) is typing.Literal or is_enum


def _admits(tp: Any, node: dict[str, Any]) -> bool:
    """Whether the schema node's ``type`` or ``enum`` admits the scalar annotation."""
    kinds = node.get("type", [])
    kinds = set(kinds if isinstance(kinds, list) else [kinds])
    if "enum" in node:
        kinds |= {"string" for v in node["enum"] if isinstance(v, str)}
    if typing.get_origin(tp) is typing.Literal or (
        isinstance(tp, type) and issubclass(tp, enum.Enum)
    ):
        return "string" in kinds
    return not kinds or bool(_SCALARS[tp] & kinds)


def _walk(schema: dict[str, Any]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"missing": [], "extra": [], "bare": [], "types": []}
    seen: set[tuple[Any, str]] = set()
    checked = 0

    def record(
        tp: Any, names: list[str], node: dict[str, Any], path: str, descend: bool = True
    ) -> None:
        nonlocal checked
        label = tp.__name__
        if "properties" not in node:
            found["bare"].append(path)
            return
        if (tp, path) in seen:
            return
        seen.add((tp, path))
        hints = typing.get_type_hints(tp) if descend else {}
        for name in names:
            checked += 1
            if name not in node["properties"]:
                if f"{label}.{name}" not in NOT_IN_JSON:
                    found["missing"].append(f"{path}.{name} ({label})")
            elif hints:
                walk(hints[name], node["properties"][name], f"{path}.{name}")
        found["extra"] += [f"{path}.{k} ({label})" for k in node["properties"] if k not in names]

    def walk(tp: Any, node: dict[str, Any], path: str) -> None:
        node = _resolve(schema, node)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        names = _fields(tp)
        if origin in (typing.Union, types.UnionType):
            for a in args:
                if a is not type(None):
                    walk(a, node, path)
        elif origin in (list, tuple):
            walk(args[0], node.get("items", {}), path + "[]")
        elif origin is dict and isinstance(node.get("additionalProperties"), dict):
            walk(args[1], node["additionalProperties"], path + "{}")
        elif tp is FindingMetrics:  # one class per kind: each against the one section
            classes = sorted({c for cs in BY_KIND.values() for c in cs}, key=lambda c: c.__name__)
            every = sorted({n for c in classes for n in _fields(c) or []})
            record(tp, every, node, path, descend=False)
            for c in classes:
                walk(c, node, path)
        elif names is not None:
            if tp in {c for cs in BY_KIND.values() for c in cs}:  # its fields, not the union's
                hints = typing.get_type_hints(tp)
                for name in names:
                    if name in node.get("properties", {}):
                        walk(hints[name], node["properties"][name], f"{path}.{name}")
            else:
                record(tp, names, node, path)
        elif _is_scalar(tp) and not _admits(tp, node):
            found["types"].append(f"{path}: {tp} vs {node.get('type', node.get('enum'))}")

    walk(Diagnosis, schema, "")
    assert checked > 200, "the walk did not reach the Diagnosis types' fields"
    return found


def _bare_objects(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every object node of the schema without properties or a schema for its values."""
    out: dict[str, dict[str, Any]] = {}

    def visit(node: dict[str, Any], path: str, depth: int = 0) -> None:
        if depth > 12:
            return
        if "$ref" in node:
            visit(_resolve(schema, node), path, depth + 1)
            return
        for branch in node.get("oneOf", []):
            visit(branch, path, depth + 1)
        kinds = node.get("type", [])
        kinds = kinds if isinstance(kinds, list) else [kinds]
        values = node.get("additionalProperties")
        described = "properties" in node or isinstance(values, dict)
        if "object" in kinds and not described and node.get("maxProperties") != 0:
            out[path] = node
        for k, v in node.get("properties", {}).items():
            visit(v, f"{path}.{k}", depth + 1)
        if isinstance(values, dict):
            visit(values, path + "{}", depth + 1)
        if isinstance(node.get("items"), dict):
            visit(node["items"], path + "[]", depth + 1)

    visit(schema, "")
    return out


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return schema


def test_every_field_of_the_diagnosis_types_is_in_the_schema() -> None:
    found = _walk(_schema())
    assert found["missing"] == []
    assert found["bare"] == [], "a typed section is a bare object in the schema"


def test_every_property_of_the_schema_is_a_field_of_the_types() -> None:
    assert _walk(_schema())["extra"] == []


def test_the_schema_types_admit_the_fields_annotations() -> None:
    assert _walk(_schema())["types"] == []


def test_only_the_free_form_sections_are_bare_and_say_so() -> None:
    bare = _bare_objects(_schema())
    assert sorted(bare) == sorted(FREE_FORM)
    assert len(bare) <= 3
    assert all("free-form" in node.get("description", "") for node in bare.values())


def test_a_field_the_schema_lacks_or_adds_is_found() -> None:
    schema = _schema()
    run = _resolve(schema, schema["properties"]["run"])["properties"]
    run["bogus"] = run.pop("steps")
    evidence = schema["$defs"]["rank_evidence"]["properties"]
    evidence["host_ops"]["properties"]["threads"] = {"type": "string"}
    found = _walk(schema)
    assert found["missing"] == [".run.steps (RunSummary)"]
    assert found["extra"] == [".run.bogus (RunSummary)"]
    assert found["types"] == [".ranks[].evidence.host_ops.threads: <class 'int'> vs string"]
    del schema["$defs"]["finding_metrics"]["properties"]["waiting_ranks"]
    assert ".findings[].metrics.waiting_ranks (FindingMetrics)" in _walk(schema)["missing"]
