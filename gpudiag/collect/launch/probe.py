"""Detects what this host can capture (NVML, nsys path and version, torch/CUDA) → Capabilities.

torch is probed in a ``python -c`` subprocess so the CLI process never imports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import field
from typing import Any

from gpudiag._support import nsysbin
from gpudiag._support.records import asdict, dataclass
from gpudiag.collect.samplers.nvml import list_gpus, load_nvml

_TORCH_PROBE = r"""
import json
out = {}
try:
    import torch
    out["torch_version"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    try:
        v = torch.cuda.nccl.version() if out["cuda_available"] else None
        out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
    except Exception as e:
        out["nccl_version"] = None
    import torch.distributed as d
    out["distributed"] = d.is_available()
    out["gloo"] = d.is_available() and d.is_gloo_available()
    out["nccl"] = d.is_available() and d.is_nccl_available()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@dataclass
class Capabilities:
    """What works on this host, and why not where it does not."""

    python: str
    nvml: bool = False
    nvml_reason: str = ""
    driver_version: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    torch_version: str | None = None
    torch_reason: str = ""
    torch_cuda: str | None = None
    cuda_available: bool = False
    nccl_version: str | None = None
    distributed_backends: list[str] = field(default_factory=list)
    nsys_path: str | None = None
    nsys_version: str | None = None
    nsys_reason: str = ""
    nvtx: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def find_nsys(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """The nsys binary (see :mod:`gpudiag._support.nsysbin`); (path, why not)."""
    return nsysbin.locate(env)


def _nsys_version(path: str) -> tuple[str | None, str]:
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{path} --version failed ({e})"
    text = (r.stdout or r.stderr).strip()
    return (text.splitlines()[0] if text else None), ("" if r.returncode == 0 else text)


def probe_torch(python: str = sys.executable, timeout: float = 120) -> dict[str, Any]:
    """torch, CUDA and NCCL versions as the job's interpreter sees them."""
    try:
        r = subprocess.run(
            [python, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=timeout
        )
        data: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        return data
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return {"error": f"probe failed: {type(e).__name__}: {e}"}


def probe(nvml: Any | None = None, python: str = sys.executable) -> Capabilities:
    """Probe everything; never raises."""
    caps = Capabilities(python=f"{python} ({sys.version.split()[0]})")
    nv = load_nvml(nvml)
    if nv.nvml is None:
        caps.nvml_reason = nv.reason
    else:
        caps.nvml = True
        caps.driver_version = nv.driver_version
        caps.gpus = [g.__dict__ for g, _ in list_gpus(nv.nvml)]
        if not caps.gpus:
            caps.nvml_reason = "NVML works but reports no GPUs"
    t = probe_torch(python)
    if "error" in t:
        caps.torch_reason = str(t["error"])
    caps.torch_version = t.get("torch_version")
    caps.torch_cuda = t.get("torch_cuda")
    caps.cuda_available = bool(t.get("cuda_available"))
    caps.nccl_version = t.get("nccl_version")
    caps.distributed_backends = [b for b in ("gloo", "nccl") if t.get(b)]
    if caps.torch_version and not caps.cuda_available:
        caps.torch_reason = "torch sees no CUDA device (CPU build or no GPU)"
    path, why = find_nsys()
    caps.nsys_path, caps.nsys_reason = path, why
    if path:
        caps.nsys_version, caps.nsys_reason = _nsys_version(path)
    try:
        import nvtx  # noqa: F401

        caps.nvtx = True
    except ImportError:
        caps.nvtx = False
    return caps
