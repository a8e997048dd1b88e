"""Thresholds and matching rules: defaults → ``[tool.gpudiag]`` in pyproject.toml → the CLI."""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpudiag.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

# A kernel is communication when its name matches this (NVIDIA NCCL ≤2.18 ncclKernel_*,
# ≥2.19 ncclDevKernel_*, ≥2.27 ncclSymDevKernel_*, and AMD RCCL, which keeps the nccl prefix).
DEFAULT_COMM_KERNEL_RE = r"^(nccl|rccl)"
# Host-side ranges that mean "this thread is inside a collective".
DEFAULT_COMM_HOST_RE = (
    r"^(nccl:|gloo:|mpi:|ucc:|c10d::|record_param_comms$|"
    r"ProcessGroup(NCCL|Gloo|MPI)?::|torch\.distributed\.(all_reduce|all_gather|broadcast|"
    r"reduce_scatter|barrier|all_to_all))"
)
DEFAULT_DATA_RE = r"^enumerate\((DataLoader|DataPipe)\)#|^## data_load ##$|^gpudiag\.data$"
DEFAULT_STEP_RE = r"^ProfilerStep#(\d+)$"


@dataclass(frozen=True)
class Thresholds:
    """Every number and pattern that changes a verdict (documented in docs/definitions.md)."""

    idle_ratio_max: float = 0.30
    data_bound_ratio: float = 0.10
    comm_bound_ratio: float = 0.10
    host_bound_ratio: float = 0.30
    comm_kernel_re: str = DEFAULT_COMM_KERNEL_RE
    comm_host_re: str = DEFAULT_COMM_HOST_RE
    data_re: str = DEFAULT_DATA_RE
    step_re: str = DEFAULT_STEP_RE
    truncated_step_ratio: float = 0.5
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("idle_ratio_max", "data_bound_ratio", "comm_bound_ratio", "host_bound_ratio"):
            v = getattr(self, name)
            if not 0.0 <= float(v) <= 1.0:
                raise UsageError(
                    f"{name}={v} is not a ratio in [0, 1]",
                    "ratios are fractions: 0.30 means 30%",
                )
        for name in ("comm_kernel_re", "comm_host_re", "data_re", "step_re"):
            try:
                re.compile(getattr(self, name))
            except re.error as e:
                raise UsageError(
                    f"{name}: invalid regular expression {getattr(self, name)!r} ({e})",
                    "use Python `re` syntax",
                ) from e

    def replace(self, **changes: Any) -> Thresholds:
        """A copy with the given fields changed; ``None`` values are ignored."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        """The thresholds as recorded in a Diagnosis (patterns included)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}


_KNOWN = {f.name for f in fields(Thresholds)} - {"extra"}


def load_project_config(start: Path | None = None) -> dict[str, Any]:
    """Return ``[tool.gpudiag]`` from the nearest pyproject.toml (or gpudiag.toml), or ``{}``."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        for name, key in (("gpudiag.toml", None), ("pyproject.toml", "tool.gpudiag")):
            p = d / name
            if not p.is_file():
                continue
            try:
                data = tomllib.loads(p.read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise UsageError(f"{p}: cannot read configuration ({e})", "fix the TOML") from e
            if key is None:
                return dict(data)
            section: Any = data
            for part in key.split("."):
                section = section.get(part, {}) if isinstance(section, dict) else {}
            if section:
                return dict(section)
    return {}


def thresholds_from_config(config: dict[str, Any]) -> Thresholds:
    """Build Thresholds from a ``[tool.gpudiag]`` table, rejecting unknown keys with a hint."""
    top = {k: v for k, v in config.items() if not isinstance(v, dict)}
    unknown = sorted(set(top) - _KNOWN)
    if unknown:
        raise UsageError(
            f"[tool.gpudiag]: unknown setting(s) {', '.join(unknown)}",
            f"known settings: {', '.join(sorted(_KNOWN))}",
        )
    extra = {k: v for k, v in config.items() if isinstance(v, dict)}
    return Thresholds(**top, extra=extra)
