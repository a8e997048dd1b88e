"""The host cause is a typed record: saved diagnoses read back into it, field for field.

The truth is outside the code under test: the checked-in golden diagnoses (written by
``analyze -f json``) hold host causes of several kinds; each reads back as a
:class:`HostCause` whose JSON is the file's object, key for key.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

from testpaths import ROOT

from gpudiag.analysis.model.causes import HostCause, HostCauseKind
from gpudiag.analysis.model.metrics import HostMetrics
from gpudiag.api.saved import diagnosis_from_json

GOLDEN = ROOT / "tests" / "golden"


def _with_causes() -> list[Path]:
    found = [
        p
        for p in sorted(GOLDEN.glob("*/diagnosis.json"))
        if any("cause" in f["metrics"] for f in json.loads(p.read_text())["findings"])
    ]
    assert found, f"no golden diagnosis under {GOLDEN} names a host cause"
    return found


def test_saved_host_causes_read_back_typed() -> None:
    kinds = set()
    for path in _with_causes():
        doc = json.loads(path.read_text())
        d = diagnosis_from_json(doc)
        for raw, f in zip(doc["findings"], d.findings, strict=True):
            if f.kind != "host_bound" or "cause" not in raw["metrics"]:
                continue
            assert isinstance(f.metrics, HostMetrics), path
            assert isinstance(f.metrics.cause, HostCause), path
            assert f.metrics.cause.to_json() == raw["metrics"]["cause"], path
            kinds.add(f.metrics.cause.kind)
    assert kinds <= set(typing.get_args(HostCauseKind))
    assert len(kinds) >= 3, kinds  # launch, eager, copies, unknown among the goldens


def test_a_cause_writes_only_the_fields_its_kind_sets() -> None:
    cause = HostCause(kind="python", label="Python", text="t", share=0.5, ns_per_step=10)
    assert cause.to_json() == {
        "kind": "python",
        "label": "Python",
        "text": "t",
        "share": 0.5,
        "ns_per_step": 10,
    }
