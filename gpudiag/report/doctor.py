"""What ``gpudiag doctor`` found this host can capture, as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TextIO

from rich.table import Table
from rich.text import Text

from gpudiag.report.console import make_console

WIDE = 1000  # the console width when not a terminal: rows are as long as they need


def render_table(
    caps: Mapping[str, Any], out: TextIO, *, width: int | None = None, color: bool | None = None
) -> None:
    """One row per capability: ok or no, and the version or the reason."""
    t = Table("capability", "status", "detail", box=None)

    def row(name: str, ok: bool, detail: str | None) -> None:
        t.add_row(name, Text("ok", style="green") if ok else Text("no", style="red"), detail or "")

    row(
        "NVML",
        caps["nvml"],
        f"driver {caps['driver_version']}" if caps.get("driver_version") else caps["nvml_reason"],
    )
    for g in caps.get("gpus", []):
        row(f"  gpu {g['index']}", True, f"{g['name']} {g['uuid']}")
    row(
        "torch",
        caps.get("torch_version") is not None,
        caps.get("torch_version") or caps.get("torch_reason"),
    )
    row(
        "CUDA (torch)",
        bool(caps.get("cuda_available")),
        caps.get("torch_cuda") or caps.get("torch_reason"),
    )
    row("NCCL", caps.get("nccl_version") is not None, caps.get("nccl_version") or "n/a")
    backends = caps.get("distributed_backends") or []
    row("torch.distributed", bool(backends), ", ".join(backends))
    row(
        "nsys",
        caps.get("nsys_version") is not None,
        caps.get("nsys_version") or caps.get("nsys_reason"),
    )
    row(
        "nvtx",
        bool(caps.get("nvtx")),
        "installed" if caps.get("nvtx") else "pip install gpudiag[collect]",
    )
    if width is None and not (hasattr(out, "isatty") and out.isatty()):
        width = WIDE  # piped or redirected: one line per capability, never wrapped
    make_console(out, width=width, color=color).print(t)


def render_json(caps: Mapping[str, Any], out: TextIO) -> None:
    """The capabilities as indented JSON."""
    out.write(json.dumps(dict(caps), indent=2) + "\n")
