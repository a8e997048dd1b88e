"""Issue 5: the self-contained HTML report, escaped, and rendered by headless Chromium."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from builders import gpu_run
from cli_runner import run_cli

from gpudiag.analysis.model.diagnosis import Finding, RankEvidence
from gpudiag.api.load import diagnose
from gpudiag.report.html_report import render

EVIL = '</script><script>alert("x")</script><img src=x onerror=alert(1)>'
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    print("chromium not found: install the Debian package `chromium` (.ci/run does)")
    pytest.skip("chromium not installed (apt-get install chromium)")


def evil_diagnosis():
    d = diagnose(gpu_run(steps=4))
    f = Finding("straggler", "warning", f"rank 1 slow in {EVIL}", ranks=[1], steps=[0, 1])
    ranks = [
        dataclasses.replace(r, evidence=RankEvidence(comm_names=[EVIL], comm_top=EVIL))
        for r in d.ranks
    ]
    return dataclasses.replace(d, findings=[f], ranks=ranks, notes=[EVIL])


def test_every_trace_string_is_escaped_and_json_embedded_safely():
    buf = io.StringIO()
    render(evil_diagnosis(), buf)
    page = buf.getvalue()
    assert "<img src=x" not in page and 'alert("x")</script>' not in page
    assert page.count("<script") == 1  # only the JSON data block
    assert "http://" not in page and "https://" not in page  # no CDN, works offline
    data = re.search(r'<script type="application/json" id="diagnosis">(.*?)</script>', page, re.S)
    assert data is not None
    doc = json.loads(data.group(1))
    assert doc["notes"] == [EVIL]  # the embedded JSON round-trips the raw string


def run_chromium(html: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        chromium(),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        *extra,
        html.resolve().as_uri(),
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def console_errors(stderr: str) -> list[str]:
    return [
        line
        for line in stderr.splitlines()
        if "Uncaught" in line or re.search(r"CONSOLE\(\d+\)|console\.error", line)
    ]


def test_html_report_renders_in_chromium(shared_traces, tmp_path):
    # a 2-rank set whose split is measured (sampled_2rank_a2a's is withheld: no bars)
    html = tmp_path / "report.html"
    r = run_cli(
        "report", str(shared_traces / "nsys/nsys-ai/mfu_2gpu_before.sqlite"), "-o", str(html)
    )
    assert r.returncode == 0, r.stderr
    dom = run_chromium(html, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="bars"') == 2  # one stacked-bar chart per rank
    assert dom.stdout.count('class="timeline"') == 1
    assert dom.stdout.count("<rect") >= 2 * 1 * 3 * 2  # 2 ranks x 1 step x ≥3 parts, twice
    assert not console_errors(dom.stderr), console_errors(dom.stderr)
    shot = tmp_path / "shot.png"
    s = run_chromium(html, tmp_path, "--window-size=1280,1500", f"--screenshot={shot}")
    assert s.returncode == 0 and shot.stat().st_size > 10_000
    assert not console_errors(s.stderr)


def test_html_report_with_hostile_strings_has_no_console_errors(tmp_path):
    html = tmp_path / "evil.html"
    with html.open("w") as f:
        render(evil_diagnosis(), f)
    dom = run_chromium(html, tmp_path, "--dump-dom")
    assert dom.returncode == 0
    assert "<img" not in dom.stdout and not console_errors(dom.stderr)
