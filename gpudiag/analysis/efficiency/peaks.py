"""The peak of each GPU by number format and its memory and link bandwidth, from a table.

Dense (no structured sparsity) peaks at boost clock, TFLOP/s (10^12 FLOP/s); memory and
link bandwidth in GB/s (10^9 B/s), links **per direction** (what a ring's bus bandwidth is
measured against, nccl-tests' convention). Sources, as published by the vendors:

* NVIDIA data sheets: V100 (SXM2/PCIe, 2018), T4, A100 (SXM4/PCIe, 40 and 80 GB; 2021),
  A10, A30, L4, L40, L40S, H100 (SXM5/PCIe/NVL, 2023), H200 (2024), H800, B200 and GB200
  (HGX/DGX B200 and GB200 NVL72 specifications, per GPU), the Turing, Ampere GA102 and
  Ada Lovelace architecture whitepapers for GeForce/RTX parts (RTX 2080 Ti, 3090, 4090,
  RTX A6000, RTX 6000 Ada; tensor figures with FP32 accumulate, which training uses).
* AMD Instinct data sheets: MI100, MI210, MI250/MI250X (a device is one GCD: half the
  package), MI300X, MI300A, MI325X. AMD runs fp32 GEMMs on its matrix cores, so ``fp32``
  is the fp32 *matrix* peak there; ``fp32_simt`` the vector peak.
* Links (the peak a collective's bus bandwidth is compared with): NVLink 2 (V100) 25 GB/s
  per link per direction × 6, NVLink 3 (A100) × 12,
  NVLink 4 (H100/H200) 450, NVLink 5 (B200) 900; PCIe 3.0/4.0/5.0 x16 15.75/31.5/63;
  AMD Infinity Fabric (xGMI) 64 GB/s per link per direction × 7 (MI300X), × 3 (MI250X
  across packages); NVLink bridges of PCIe cards (A100/H100 PCIe 300, RTX 3090 56.25). A part
  without peer-to-peer links (GeForce 40 series, T4, L4, L40S) talks over PCIe, and GeForce
  cards without P2P through host memory (about half of PCIe or less).

A part the table does not know gets ``None``: no share of peak is printed for it.
"""

from __future__ import annotations

import re

from gpudiag._support import lazyre
from gpudiag._support.records import dataclass

PCIE = {3: 15.75, 4: 31.5, 5: 63.0}


@dataclass(frozen=True)
class Peak:
    """One GPU model's peaks: TFLOP/s by format, memory and link GB/s per direction."""

    model: str  # the table's name for it
    fp32: float  # fp32 matrix products (SIMT on NVIDIA, matrix cores on AMD)
    tf32: float | None  # TF32 (NVIDIA) / xf32 (AMD CDNA3) tensor path; None: none
    bf16: float | None  # bf16 with fp32 accumulate; None: no bf16 matrix units
    fp16: float | None
    fp8: float | None
    memory_gbps: float
    link: str  # "NVLink 3", "PCIe 4.0 x16", "xGMI"
    link_gbps: float

    def tflops(self, path: str) -> float | None:
        """The peak of one format path ("fp32", "tf32", "bf16", "fp16", "fp8")."""
        return {
            "fp32": self.fp32,
            "tf32": self.tf32,
            "bf16": self.bf16,
            "fp16": self.fp16,
            "fp8": self.fp8,
        }.get(path)

    def best(self) -> tuple[str, float]:
        """The fastest 16-bit path training can use (bf16, else fp16, else fp32)."""
        for path in ("bf16", "fp16"):
            v = self.tflops(path)
            if v:
                return path, v
        return "fp32", self.fp32


def _p(
    model: str,
    fp32: float,
    tf32: float | None,
    bf16: float | None,
    fp16: float | None,
    fp8: float | None,
    mem: float,
    link: str,
    link_gbps: float,
) -> Peak:
    return Peak(model, fp32, tf32, bf16, fp16, fp8, mem, link, link_gbps)


NVL2, NVL3, NVL4, NVL5 = "NVLink 2", "NVLink 3", "NVLink 4", "NVLink 5"
P3, P4, P5 = "PCIe 3.0 x16", "PCIe 4.0 x16", "PCIe 5.0 x16"
# PCIe data-centre cards are often bridged in pairs by NVLink: their peak is the bridge's,
# so that a bridged pair is never shown above 100% (a card without one reads low)
BRIDGE = "NVLink bridge or PCIe"
# (pattern on the device name, peak); most specific first, first match wins
TABLE: tuple[tuple[str, Peak], ...] = (
    (r"GB200", _p("GB200", 80, 1250, 2500, 2500, 5000, 8000, NVL5, 900)),
    (r"\bB200\b", _p("B200", 75, 1125, 2250, 2250, 4500, 8000, NVL5, 900)),
    (r"\bH200\b", _p("H200", 67, 494.7, 989.4, 989.4, 1978.9, 4800, NVL4, 450)),
    (r"H100 NVL", _p("H100 NVL", 60, 417.5, 835.5, 835.5, 1670.5, 3900, NVL4, 300)),
    (r"H100 PCIe", _p("H100 PCIe", 51, 378, 756, 756, 1513, 2000, BRIDGE, 300)),
    (r"\bH100\b", _p("H100 SXM5", 67, 494.7, 989.4, 989.4, 1978.9, 3350, NVL4, 450)),
    (r"\bH800\b", _p("H800 SXM5", 67, 494.7, 989.4, 989.4, 1978.9, 3350, NVL4, 200)),
    (r"A100.*PCIE.*80", _p("A100 PCIe 80GB", 19.5, 156, 312, 312, None, 1935, BRIDGE, 300)),
    (r"A100.*PCIE", _p("A100 PCIe 40GB", 19.5, 156, 312, 312, None, 1555, BRIDGE, 300)),
    (r"\bA800\b", _p("A800", 19.5, 156, 312, 312, None, 2039, NVL3, 200)),
    (r"A100.*80GB", _p("A100 SXM4 80GB", 19.5, 156, 312, 312, None, 2039, NVL3, 300)),
    (r"\bA100\b", _p("A100 SXM4", 19.5, 156, 312, 312, None, 1555, NVL3, 300)),
    (r"\bA10G?\b", _p("A10", 31.2, 62.5, 125, 125, None, 600, P4, PCIE[4])),
    (r"\bA30\b", _p("A30", 10.3, 82, 165, 165, None, 933, P4, PCIE[4])),
    (r"\bL40S\b", _p("L40S", 91.6, 183, 362, 362, 733, 864, P4, PCIE[4])),
    (r"\bL40\b", _p("L40", 90.5, 90.5, 181, 181, 362, 864, P4, PCIE[4])),
    (r"\bL4\b", _p("L4", 30.3, 60, 121, 121, 242, 300, P4, PCIE[4])),
    (r"RTX 6000 Ada", _p("RTX 6000 Ada", 91.1, 182.1, 364.2, 364.2, 728.5, 960, P4, PCIE[4])),
    (r"RTX A6000", _p("RTX A6000", 38.7, 77.4, 154.8, 154.8, None, 768, P4, PCIE[4])),
    (r"RTX 4090", _p("GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008, P4, PCIE[4])),
    (
        r"RTX 3090",
        _p("GeForce RTX 3090", 35.6, 35.6, 71, 71, None, 936, "NVLink bridge or " + P4, 56.25),
    ),
    (r"RTX 2080 Ti", _p("GeForce RTX 2080 Ti", 13.4, None, None, 53.8, None, 616, P3, PCIE[3])),
    (r"\bT4\b", _p("T4", 8.1, None, None, 65, None, 320, P3, PCIE[3])),
    (r"V100S", _p("V100S PCIe", 16.4, None, None, 130, None, 1134, P3, PCIE[3])),
    (r"V100-PCIE", _p("V100 PCIe", 14, None, None, 112, None, 900, P3, PCIE[3])),
    (r"V100", _p("V100 SXM2", 15.7, None, None, 125, None, 900, NVL2, 150)),
    (r"MI325X", _p("MI325X", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 6000, "xGMI", 448)),
    (r"MI300A", _p("MI300A", 122.6, 490.3, 980.6, 980.6, 1961.2, 5300, "xGMI", 384)),
    (r"MI300X?", _p("MI300X", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 5300, "xGMI", 448)),
    (r"MI250X?", _p("MI250/MI250X (one GCD)", 47.9, None, 191.5, 191.5, None, 1638, "xGMI", 100)),
    (r"MI210", _p("MI210", 45.3, None, 181, 181, None, 1638, "xGMI", 100)),
    (r"MI100", _p("MI100", 46.1, None, 92.3, 184.6, None, 1228, P4, PCIE[4])),
)
_TABLE = tuple((lazyre.compile(p, re.IGNORECASE), peak) for p, peak in TABLE)


def peak_of(device_name: str) -> Peak | None:
    """The table's entry for a device name as traces give it, None when it is not known."""
    for rx, peak in _TABLE:
        if rx.search(device_name):
            return peak
    return None
