"""GateResult → JUnit XML: one testcase per check (per rank where it applies)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import IO

from gpudiag.analysis.compare.gate import GateResult


def render(res: GateResult, out: IO[str]) -> None:
    """Write a ``<testsuites>`` document; failing checks carry ``<failure>``.

    Warnings pass, with their message in ``<system-out>``; inconclusive checks and checks
    not applied are ``<skipped>`` (the message says which) so CI dashboards show them
    apart from passes and failures.
    """
    n = res.counts()
    suites = ET.Element("testsuites", name="gpudiag gate")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="gpudiag.gate",
        tests=str(len(res.checks)),
        failures=str(n["fail"]),
        errors="0",
        skipped=str(n["inconclusive"] + n["off"]),
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (
        ("status", res.status),
        ("exit_code", str(res.exit_code)),
        ("subject", res.subject),
        ("baseline", res.baseline or ""),
    ):
        ET.SubElement(props, "property", name=k, value=v)
    for c in res.checks:
        name = c.name if c.rank is None else f"{c.name}[rank {c.rank}]"
        case = ET.SubElement(suite, "testcase", classname=f"gpudiag.gate.{c.name}", name=name)
        if c.status == "fail":
            ET.SubElement(case, "failure", message=c.message, type=c.name).text = c.message
        elif c.status in ("inconclusive", "off"):
            ET.SubElement(case, "skipped", message=c.message)
        elif c.status == "warn":
            ET.SubElement(case, "system-out").text = f"warning: {c.message}"
    ET.indent(suites)
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(ET.tostring(suites, encoding="unicode"))
    out.write("\n")
