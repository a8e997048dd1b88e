"""What each GPU generation can run: the number formats its matrix units support.

Precision remedies depend on the device: Volta and Turing have fp16 tensor cores but no
bf16 or TF32 (mixed precision there is fp16 autocast with a loss scaler); Ampere adds bf16
and TF32; Ada and Hopper add FP8; Blackwell adds FP4/FP6. AMD's CDNA generations are
alike: CDNA1 (MI100) and CDNA2 (MI200) run fp16 and bf16 matrix instructions, CDNA3
(MI300) adds TF32 (xf32) and FP8, CDNA4 (MI350) FP4/FP6.

A device is recognised from its compute capability where the trace records it (Kineto's
``deviceProperties``: ``computeMajor``/``computeMinor``; Nsight's ``TARGET_INFO_GPU``),
which decides NVIDIA generations exactly, else from its model name. AMD parts report
gfx9 as 9.x for every CDNA generation, so there the name decides, and an unnamed part
("AMD Radeon Graphics") is told apart by its compute-unit count when the trace has it.
An unknown device gets :data:`UNKNOWN`: no format is promised.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpudiag._support import lazyre
from gpudiag._support.records import dataclass
from gpudiag.analysis.model.evidence import DeviceFormats


@dataclass(frozen=True)
class Capability:
    """One GPU generation and the matrix-unit formats it supports."""

    vendor: str  # "nvidia", "amd", "" when unknown
    generation: str  # "Volta", "Ampere", "CDNA3", "" when unknown
    fp16: bool  # fp16 matrix units (tensor cores / MFMA)
    bf16: bool
    tf32: bool  # TF32 (NVIDIA) / xf32 (AMD CDNA3) for fp32 matmuls
    fp8: bool
    fp4: bool = False
    basis: str = ""  # how it was recognised: "compute capability 7.0", "name", ""

    @property
    def known(self) -> bool:
        """Whether the generation was recognised."""
        return bool(self.generation)

    def as_dict(self) -> DeviceFormats:
        """Plain dict for JSON evidence."""
        return DeviceFormats(
            vendor=self.vendor,
            generation=self.generation,
            fp16=self.fp16,
            bf16=self.bf16,
            tf32=self.tf32,
            fp8=self.fp8,
            fp4=self.fp4,
            basis=self.basis,
        )


UNKNOWN = Capability("", "", False, False, False, False)

# NVIDIA generations by compute capability (major, minor) → generation and formats.
_NV = {
    "Pascal": (False, False, False, False, False),
    "Volta": (True, False, False, False, False),
    "Turing": (True, False, False, False, False),
    "Ampere": (True, True, True, False, False),
    "Ada": (True, True, True, True, False),
    "Hopper": (True, True, True, True, False),
    "Blackwell": (True, True, True, True, True),
}
_AMD = {
    "CDNA1": (True, True, False, False, False),
    "CDNA2": (True, True, False, False, False),
    "CDNA3": (True, True, True, True, False),
    "CDNA4": (True, True, True, True, True),
}


def _nv_by_cc(major: int, minor: int) -> str:
    if major >= 10:
        return "Blackwell"
    if major == 9:
        return "Hopper"
    if major == 8:
        return "Ada" if minor >= 9 else "Ampere"
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    if major == 6:
        return "Pascal"
    return ""


# Model names, most specific first: (pattern, vendor, generation).
_NAMES: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (lazyre.compile(p, re.IGNORECASE), v, g)
    for p, v, g in (
        (r"\bMI3[5-9]\d", "amd", "CDNA4"),
        (r"\bMI3\d\d", "amd", "CDNA3"),
        (r"\bMI2\d\d", "amd", "CDNA2"),
        (r"\bMI100\b", "amd", "CDNA1"),
        (r"\bG?B[123]00\b|Blackwell|RTX 50\d0|RTX PRO \d+", "nvidia", "Blackwell"),
        (r"\bG?H[12]00\b|\bH800\b|\bH20\b", "nvidia", "Hopper"),
        (r"\bL4\b|\bL40S?\b|RTX 40\d0|RTX \d+ Ada|\bAda\b", "nvidia", "Ada"),
        (r"\bA100\b|\bA800\b|\bA[1-4]0G?\b|\bA[2-6]000\b|RTX 30\d0|\bA16\b", "nvidia", "Ampere"),
        (r"\bT4\b|RTX 20\d0|Quadro RTX|TITAN RTX|GTX 16\d0", "nvidia", "Turing"),
        (r"\bV100|TITAN V\b|Quadro GV100", "nvidia", "Volta"),
        (r"\bP100\b|\bP40\b|\bP4\b|GTX 10\d0|TITAN Xp?\b", "nvidia", "Pascal"),
    )
)
# Compute units of AMD parts whose name says nothing ("AMD Radeon Graphics").
_AMD_CUS = {104: "CDNA2", 110: "CDNA2", 120: "CDNA1", 228: "CDNA3", 304: "CDNA3", 256: "CDNA4"}


def _make(vendor: str, gen: str, basis: str) -> Capability:
    table = _NV if vendor == "nvidia" else _AMD
    fp16, bf16, tf32, fp8, fp4 = table[gen]
    return Capability(vendor, gen, fp16, bf16, tf32, fp8, fp4, basis)


def capability(
    name: str, compute_capability: str | None = None, multiprocessors: int | None = None
) -> Capability:
    """The generation and formats of one device (see the module docstring)."""
    amd = bool(re.search(r"\bAMD\b|Instinct|Radeon|\bMI\d{3}", name, re.IGNORECASE))
    cc = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", compute_capability or "")
    if cc and not amd:
        major, minor = int(cc.group(1)), int(cc.group(2))
        gen = _nv_by_cc(major, minor)
        if gen:
            return _make("nvidia", gen, f"compute capability {major}.{minor}")
    for pat, vendor, gen in _NAMES:
        if pat.search(name):
            return _make(vendor, gen, "name")
    if amd:
        gen = _AMD_CUS.get(multiprocessors or 0, "")
        return _make("amd", gen, f"{multiprocessors} compute units") if gen else UNKNOWN
    return UNKNOWN


def common_capability(devices: Sequence[Capability]) -> Capability:
    """What every listed device supports (a format only when all of them have it)."""
    known = [d for d in devices if d.known]
    if not known:
        return UNKNOWN
    if len({(d.vendor, d.generation) for d in known}) == 1:
        return known[0]
    return Capability(
        vendor=known[0].vendor if len({d.vendor for d in known}) == 1 else "",
        generation="/".join(sorted({d.generation for d in known})),
        fp16=all(d.fp16 for d in known),
        bf16=all(d.bf16 for d in known),
        tf32=all(d.tf32 for d in known),
        fp8=all(d.fp8 for d in known),
        fp4=all(d.fp4 for d in known),
        basis="several generations",
    )
