"""Every field of the Diagnosis types is in its JSON schema (gpudiag/schema/diagnosis.schema.json).

The walk starts at :class:`Diagnosis` and the schema's root and follows each dataclass field
by its annotation (optional, lists, string-keyed dicts, nested dataclasses) into the
schema's ``properties``, ``items`` and ``additionalProperties``. A field the types have and
the schema lacks fails; so does a typed section the schema leaves as a bare object that is
not in :data:`BARE` (the issue-28 ceiling is three: these are the ones left to describe).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from gpudiag.analysis.model.diagnosis import Diagnosis

SCHEMA = Path(__file__).resolve().parents[3] / "gpudiag" / "schema" / "diagnosis.schema.json"
# Typed sections the schema leaves as bare objects; remove one when the schema describes it.
BARE = {
    ".ranks[].evidence": "RankEvidence: each evidence part (docs/json-schema.md, ranks[])",
    ".findings[].metrics": "one shape per finding kind (analysis/model/metrics.py)",
    ".collectives.pipeline": "PipelineSummary (the pipeline_bubble finding's metrics)",
    ".efficiency": "ComputeEfficiency (analysis/model/efficiency.py), described in the docs",
}
# Fields of the types that are not JSON keys, and why.
NOT_IN_JSON = {
    "Shares.comm_measured": "the JSON writes comm_wait as null when it was not measured",
}


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _walk(schema: dict[str, Any]) -> tuple[list[str], list[str], int]:
    missing: list[str] = []
    bare: list[str] = []
    checked = 0
    seen: set[tuple[type, str]] = set()

    def walk(tp: Any, node: dict[str, Any], path: str) -> None:
        nonlocal checked
        node = _resolve(schema, node)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            for a in args:
                if a is not type(None):
                    walk(a, node, path)
        elif origin in (list, tuple):
            walk(args[0], node.get("items", {}), path + "[]")
        elif origin is dict and isinstance(node.get("additionalProperties"), dict):
            walk(args[1], node["additionalProperties"], path + "{}")
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if "properties" not in node:
                bare.append(path)
                return
            if (tp, path) in seen:
                return
            seen.add((tp, path))
            hints = typing.get_type_hints(tp)
            for f in dataclasses.fields(tp):
                checked += 1
                if f.name not in node["properties"]:
                    if f"{tp.__name__}.{f.name}" not in NOT_IN_JSON:
                        missing.append(f"{path}.{f.name} ({tp.__name__})")
                    continue
                walk(hints[f.name], node["properties"][f.name], f"{path}.{f.name}")

    walk(Diagnosis, schema, "")
    return missing, bare, checked


def test_every_field_of_the_diagnosis_types_is_in_the_schema() -> None:
    missing, bare, checked = _walk(json.loads(SCHEMA.read_text(encoding="utf-8")))
    assert checked > 100, "the walk did not reach the Diagnosis types' fields"
    assert missing == []
    assert sorted(bare) == sorted(BARE), "a typed section is a bare object in the schema"


def test_a_field_the_schema_lacks_is_found() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    del _resolve(schema, schema["properties"]["run"])["properties"]["steps"]
    missing, _, _ = _walk(schema)
    assert missing == [".run.steps (RunSummary)"]
