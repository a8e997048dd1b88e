"""The manifest's ``extra`` sections are typed, documented, and read from older manifests.

Truth from outside the code: docs/run-directory.md names every section, and a manifest as
``gpudiag run`` has written it (its ``extra`` object, an unknown key among them) reads back
and is written out byte for byte.
"""

from __future__ import annotations

import json
import re
import typing

from testpaths import ROOT

from gpudiag.rundir.layout import RunManifest
from gpudiag.rundir.sections import ManifestExtra

DOC = ROOT / "docs" / "run-directory.md"


def test_every_section_is_documented_and_every_documented_one_typed() -> None:
    declared = set(typing.get_type_hints(ManifestExtra))
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Manifest additions from `gpudiag run`")
    para = text[start : text.index("`sources` has", start)]
    named = set(re.findall(r"`([a-z_]+)`", para)) - {"argv", "extra", "gpudiag"}
    named |= set(re.findall(r"`?extra\.(\w+)`?", text))
    fields_of_sections = {"binary", "version", "range", "rank", "where", "message"}
    fields_of_sections |= {"buffer_size", "set_by", "torch_dump_prefix", "signal"}
    fields_of_sections |= {"job_exit_code", "kill_signal", "SIGINT", "SIGTERM", "SIGKILL"}
    fields_of_sections |= set(typing.get_type_hints(typing.get_type_hints(ManifestExtra)["hang"]))
    assert declared - named == set(), "sections the docs do not name"
    assert named - fields_of_sections - declared == set(), "documented sections not typed"


def test_a_manifest_written_before_reads_back_and_writes_out_the_same() -> None:
    old = {
        "schema_version": 1,
        "gpudiag_version": "0.9.0",
        "argv": ["python", "train.py"],
        "started_ns": 1,
        "ended_ns": 2,
        "exit_code": 0,
        "hosts": ["h"],
        "node_rank": 0,
        "world_size": 2,
        "ranks": [],
        "sources": {},
        "profile_steps": "5:10",
        "diagnosis_incomplete": [],
        "extra": {
            "gpudiag_argv": ["gpudiag", "run", "--", "python", "train.py"],
            "run_dir": "/runs/a",
            "child_pid": 4242,
            "steps_per_rank": {"0": 20, "1": 20},
            "interrupted": {"signal": "SIGINT", "job_exit_code": 130},
            "from_a_later_version": {"kept": True},
        },
        "conditions": None,
    }
    m = RunManifest.from_json(json.loads(json.dumps(old)))
    assert m.extra.get("child_pid") == 4242
    assert m.extra.get("interrupted", {}).get("signal") == "SIGINT"
    assert json.dumps(m.to_json()) == json.dumps(old)
