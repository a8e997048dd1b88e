"""Text from traces and jobs is printed as it is, never read as rich markup.

A failed job's error line quotes gloo's source location ("[/__w/pytorch/.../pair.cc:553]"),
which rich read as a closing tag: the gate died with an internal error on a run whose rank
raised. Operator and kernel names carry brackets too ("[bold]" is a name there).
"""

from __future__ import annotations

import io

from gpudiag.analysis.compare.checks import Check, CheckStatus, GateResult, GateStatus
from gpudiag.report.console import make_console
from gpudiag.report.gate_console import render_gate

GLOO = (
    "the run did not end well (rank 0: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/"
    "gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:38092)"
)


def test_a_gate_check_quoting_a_source_location_is_printed_as_it_is():
    res = GateResult(
        GateStatus.FAILED,
        [Check("run_outcome", None, CheckStatus.FAIL, None, None, GLOO)],
    )
    out = io.StringIO()
    render_gate(res, out, width=400, color=False)
    text = out.getvalue()
    assert "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]" in text
    assert "[127.0.0.1]:38092" in text
    assert "gate failed (exit 1)" in text


def test_brackets_in_names_are_text_not_styles():
    out = io.StringIO()
    make_console(out, width=80, color=False).print("[bold]my_kernel[/bold] [red]x")
    assert out.getvalue().strip() == "[bold]my_kernel[/bold] [red]x"
