"""Issue 13: saved diagnoses are checked against the JSON schema on load; HTML escapes all."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import random
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cli_runner import run_cli
from testpaths import GOLDEN, nonempty

from gpudiag.api.saved import diagnosis_from_json, diagnosis_schema, schema_problem
from gpudiag.report import html_report

SCRIPT = "<script>alert(1)</script>"


def _golden(name: str = "sampled_2rank_a2a") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((GOLDEN / name / "diagnosis.json").read_text())
    return doc


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in a JSON document."""
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*path, i))
    return out


def test_our_validator_agrees_with_jsonschema_on_mutated_documents() -> None:
    """The small validator gives the verdict of the reference implementation."""
    schema = diagnosis_schema()
    reference_validator = jsonschema.validators.validator_for(schema)
    reference_validator.check_schema(schema)
    validator = reference_validator(schema)  # compiled once: validate() re-checks the schema
    rng = random.Random(13)
    base = _golden()
    paths = [p for p in _paths(base) if p]
    values = [SCRIPT, None, True, -1, 0, 1.5, 2**70, [], {}, [1], "x", "gpu", "error", 1]
    agree = 0
    for _ in range(600):
        doc = copy.deepcopy(base)
        p = rng.choice(paths)
        target = doc
        for k in p[:-1]:
            target = target[k]
        if rng.random() < 0.15 and isinstance(target, dict):
            del target[p[-1]]
        else:
            target[p[-1]] = rng.choice(values)
        ours = schema_problem(doc)
        error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
        reference = None if error is None else error.message
        assert (ours is None) == (reference is None), (p, ours, reference)
        agree += 1
    assert agree == 600


@pytest.mark.parametrize(
    "name", nonempty((p.parent.name for p in GOLDEN.glob("*/diagnosis.json")), "golden diagnoses")
)
def test_golden_diagnoses_pass_and_round_trip(name: str) -> None:
    doc = _golden(name)
    assert schema_problem(doc) is None
    assert diagnosis_from_json(doc).to_json() == doc


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("steps", 3, "rank"), SCRIPT, "steps[3].rank: expected an integer, got a string"),
        (("steps", 0, "step"), SCRIPT, "steps[0].step: expected an integer, got a string"),
        (("run", "ranks"), SCRIPT, "run.ranks: expected an integer, got a string"),
        (("ranks", 1, "steps"), SCRIPT, "ranks[1].steps: expected an integer, got a string"),
        (("ranks",), {"rank": 0}, "ranks: expected a list, got an object"),
        (("run", "shares", "compute"), 1.5, "run.shares.compute: 1.5 is above the maximum 1"),
        (
            ("run", "mode"),
            "tpu",
            'run.mode: "tpu" is not one of ["gpu", "cpu", "mixed", "telemetry"]',
        ),
        (("findings", 0, "kind"), "bogus", 'findings[0].kind: "bogus" is not one of'),
        (("what_if",), {"step_time_ns": 1}, "what_if.if_comm_overlapped_ns: missing"),
        (("ranks", 0, "evidence"), {"comm_names": "allreduce"}, "ranks[0].evidence.comm_names"),
    ],
)
def test_bad_fields_are_named_by_their_json_path(path, value, message) -> None:
    doc = _golden()
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        diagnosis_from_json(doc)


def test_report_of_a_saved_diagnosis_with_script_is_refused(tmp_path: Path) -> None:
    doc = _golden()
    doc["steps"][2]["step"] = SCRIPT
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(doc))
    for args in (
        ["report", str(saved), "-o", str(tmp_path / "x.html")],
        ["gate", str(saved)],
        ["diff", str(saved), str(saved)],
        ["analyze", str(saved)],
    ):
        r = run_cli(*args)
        assert r.returncode == 4, (args, r.stderr)
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpudiag: error:")]
        assert len(errors) == 1 and "steps[2].step: expected an integer" in errors[0], r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "x.html").exists()


def test_html_escapes_numbers_that_are_not_numbers() -> None:
    """A Diagnosis built in code (not checked on load) with markup in numeric fields."""
    d = diagnosis_from_json(_golden())
    steps = [dataclasses.replace(s, rank=SCRIPT, step=SCRIPT) for s in d.steps]  # type: ignore[arg-type]
    ranks = [
        dataclasses.replace(r, rank=SCRIPT, steps=SCRIPT, devices=[SCRIPT])  # type: ignore[arg-type]
        for r in d.ranks
    ]
    run = dataclasses.replace(d.run, world_size=SCRIPT, steps=SCRIPT)  # type: ignore[arg-type]
    bad = dataclasses.replace(d, steps=steps, ranks=ranks, run=run, notes=[SCRIPT], inputs=[SCRIPT])
    out = io.StringIO()
    html_report.render(bad, out)
    page = out.getvalue()
    body, _, embedded = page.rpartition('<script type="application/json" id="diagnosis">')
    assert "<script>" not in body and "<script>" not in embedded
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
