"""Reading a saved Diagnosis back: the JSON schema, then every field against its type.

The inverse of :meth:`gpudiag.analysis.model.diagnosis.Diagnosis.to_json`, outside analysis' pure
core because it reads a package file (``gpudiag/schema/diagnosis.schema.json``).
:func:`schema_problem` checks a document with the subset of JSON Schema that file uses;
:func:`diagnosis_from_json` then rebuilds each dataclass, checking every field against its
annotation, and each finding's ``metrics`` against its kind's class
(:data:`gpudiag.analysis.model.metrics.BY_KIND`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import json
import math
import types
import typing
from importlib import resources
from typing import Any

from gpudiag.analysis.model.diagnosis import SCHEMA_VERSION, Diagnosis, Finding, Shares
from gpudiag.analysis.model.metrics import BY_KIND, FindingMetrics, NoMetrics, SavedMetrics
from gpudiag.analysis.verdict import verdict as make_verdict


def diagnosis_from_json(d: Any) -> Diagnosis:
    """Rebuild a Diagnosis from ``Diagnosis.to_json`` output (e.g. a saved baseline).

    The document is checked against ``gpudiag/schema/diagnosis.schema.json`` and every
    field against its type here; ValueError names the first bad field by its JSON path
    (``steps[3].rank: expected an integer, got a string``). A document saved before the
    verdict existed gets one derived as analysis would.
    """
    version = d.get("schema_version") if isinstance(d, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise ValueError(
            f"diagnosis schema {version} is newer than this gpudiag understands ({SCHEMA_VERSION})"
        )
    problem = schema_problem(d)
    if problem:
        raise ValueError(problem)
    kw = {
        k: d[k]
        for k in (
            "run",
            "ranks",
            "steps",
            "findings",
            "recommendations",
            "inputs",
            "thresholds",
            "notes",
            "gpudiag_version",
            "schema_version",
            "spread",
            "whole_run",
            "verdict",
            "kernels",
            "alerts",
            "reading",
            "efficiency",
        )
        if k in d
    }
    for k in ("what_if", "collectives", "whole_run", "verdict", "kernels", "reading", "efficiency"):
        if not d.get(k):
            kw.pop(k, None)
        else:
            kw[k] = d[k]
    out: Diagnosis = _typed(Diagnosis, kw, "")
    findings = [
        _with_metrics(f, d["findings"][i].get("metrics", {}), f"findings[{i}].metrics")
        for i, f in enumerate(out.findings)
    ]
    out = dataclasses.replace(out, findings=findings)
    if out.verdict is None:  # saved before the verdict existed: derive it as analysis would
        out = dataclasses.replace(out, verdict=make_verdict(out.run, out.findings))
    return out


def _with_metrics(f: Finding, raw: dict[str, Any], path: str) -> Finding:
    """The finding with its metrics typed by its kind's class (the first that fits)."""
    if "threshold" in raw and not _is_number(raw["threshold"]):
        raise ValueError(
            f"{path}.threshold: expected a number, got {_json_words(raw['threshold'])}"
        )
    if not raw:
        return dataclasses.replace(f, metrics=NoMetrics())
    for cls in BY_KIND.get(f.kind, []):
        with contextlib.suppress(ValueError):
            metrics: FindingMetrics = _typed(cls, raw, path)
            if metrics.to_json() == raw:
                return dataclasses.replace(f, metrics=metrics)
    # a shape this version does not define (another version's metrics): kept as read
    return dataclasses.replace(f, metrics=SavedMetrics(dict(raw)))


# ---- the JSON schema (the subset of JSON Schema that diagnosis.schema.json uses)


@functools.lru_cache(maxsize=1)
def diagnosis_schema() -> dict[str, Any]:
    """The checked-in JSON Schema of a Diagnosis document."""
    text = resources.files("gpudiag").joinpath("schema/diagnosis.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_problem(doc: Any, schema: dict[str, Any] | None = None) -> str | None:
    """The first way ``doc`` breaks the Diagnosis schema, as ``path: problem``; None if none.

    Supports what the schema uses: ``type`` (one or a list), ``const``, ``enum``,
    ``minimum``, ``maximum``, ``properties``, ``required``, ``additionalProperties``
    (false or a schema), ``items`` and local ``$ref``. Numbers must be finite.
    """
    root = schema or diagnosis_schema()
    try:
        _check(doc, root, "", root)
    except _SchemaError as e:
        return str(e)
    return None


class _SchemaError(ValueError):
    pass


_TYPE_WORDS = {
    "null": "null",
    "boolean": "a boolean",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "an object",
}


def _json_words(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number" if math.isfinite(v) else f"{v} (not a finite number)"
    if isinstance(v, str):
        return "a string"
    return "a list" if isinstance(v, list) else "an object"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_type(v: Any, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return _is_number(v)
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    return t == "object" and isinstance(v, dict)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _check(v: Any, s: dict[str, Any], path: str, root: dict[str, Any]) -> None:
    where = path or "the document"
    if "$ref" in s:
        target: Any = root
        for part in str(s["$ref"]).lstrip("#/").split("/"):
            target = target[part]
        s = target
    if "const" in s and not _same(v, s["const"]):
        raise _SchemaError(f"{where}: expected {json.dumps(s['const'])}, got {_json_words(v)}")
    if "enum" in s and not any(_same(v, e) for e in s["enum"]):
        shown = json.dumps(v)[:60] if isinstance(v, (str, int, float)) else _json_words(v)
        raise _SchemaError(f"{where}: {shown} is not one of {json.dumps(s['enum'])}")
    if "type" in s:
        kinds = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_is_type(v, t) for t in kinds):
            want = " or ".join(_TYPE_WORDS[t] for t in kinds)
            raise _SchemaError(f"{where}: expected {want}, got {_json_words(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise _SchemaError(f"{where}: {v} is not a finite number")
    if _is_number(v):
        if "minimum" in s and v < s["minimum"]:
            raise _SchemaError(f"{where}: {v} is below the minimum {s['minimum']}")
        if "maximum" in s and v > s["maximum"]:
            raise _SchemaError(f"{where}: {v} is above the maximum {s['maximum']}")
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k in s.get("required", []):
            if k not in v:
                raise _SchemaError(f"{_at(path, k)}: missing")
        extra = s.get("additionalProperties", True)
        for k, x in v.items():
            if k in props:
                _check(x, props[k], _at(path, k), root)
            elif extra is False:
                raise _SchemaError(f"{_at(path, k)}: unknown field")
            elif isinstance(extra, dict):
                _check(x, extra, _at(path, k), root)
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            _check(x, s["items"], _at(path, i), root)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _typed(cls: type[Any], data: Any, path: str) -> Any:
    """A dataclass from JSON, every field checked against its annotation (ValueError)."""
    if not isinstance(data, dict):
        raise ValueError(f"{path or 'the document'}: expected an object, got {_json_words(data)}")
    if cls is Shares and "comm_wait" in data and data["comm_wait"] is None:
        data = {**data, "comm_wait": 0.0, "comm_measured": False}  # not measured (JSON null)
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    for k in data:
        if k not in names:
            raise ValueError(f"{_at(path, k)}: unknown field")
    hints = _hints(cls)
    kw = {}
    for f in fields:
        if f.name in data:
            kw[f.name] = _value(data[f.name], hints[f.name], _at(path, f.name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{_at(path, f.name)}: missing")
    return cls(**kw)


def _value(v: Any, tp: Any, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return v
    if origin is typing.Literal:  # a closed set of words: read back as the string it is
        if not isinstance(v, str):
            raise ValueError(f"{path}: expected a string, got {_json_words(v)}")
        return v
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        first: ValueError | None = None
        for a in (a for a in args if a is not type(None)):
            try:
                return _value(v, a, path)
            except ValueError as e:
                first = first or e
        raise first or ValueError(f"{path}: unexpected {_json_words(v)}")
    if origin is list:
        if not isinstance(v, list):
            raise ValueError(f"{path}: expected a list, got {_json_words(v)}")
        return [_value(x, args[0], _at(path, i)) for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{path}: expected an object, got {_json_words(v)}")
        return {str(k): _value(x, args[1], _at(path, str(k))) for k, x in v.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(v, str):
            with contextlib.suppress(ValueError):
                return tp(v)
        known = ", ".join(str(m.value) for m in tp)
        raise ValueError(f"{path}: {json.dumps(v)[:60]} is not one of {known}")
    if tp is FindingMetrics:  # typed by the finding's kind afterwards
        if not isinstance(v, dict):
            raise ValueError(f"{path}: expected an object, got {_json_words(v)}")
        return NoMetrics()
    if dataclasses.is_dataclass(tp):
        return _typed(tp, v, path)  # type: ignore[arg-type]
    checks = {
        bool: lambda x: isinstance(x, bool),
        str: lambda x: isinstance(x, str),
        int: lambda x: isinstance(x, int) and not isinstance(x, bool),
        float: _is_number,
    }
    if tp in checks and not checks[tp](v):
        want = {bool: "a boolean", str: "a string", int: "an integer", float: "a number"}[tp]
        raise ValueError(f"{path}: expected {want}, got {_json_words(v)}")
    return v
