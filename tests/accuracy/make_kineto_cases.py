"""A hand-built Kineto trace in milliseconds: host calls on one thread, kernels linked to them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

MS = 1_000_000
US_PER_MS = 1000
PID, TID = 1, 1


class Kineto:
    """A Kineto trace in milliseconds: host calls on one thread, kernels linked to them."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def host(self, cat: str, name: str, start: float, end: float) -> Kineto:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": PID,
                "tid": TID,
                "ts": start * US_PER_MS,
                "dur": (end - start) * US_PER_MS,
                "args": {},
            }
        )
        return self

    def gpu(self, cat: str, name: str, launch: float, start: float, end: float) -> Kineto:
        self.corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": PID,
                "tid": TID,
                "ts": launch * US_PER_MS,
                "dur": 10,
                "args": {"correlation": self.corr},
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": start * US_PER_MS,
                "dur": (end - start) * US_PER_MS,
                "args": {"correlation": self.corr, "device": 0, "stream": 7},
            }
        )
        return self

    def kernel(self, launch: float, start: float, end: float, name: str = "gemm") -> Kineto:
        return self.gpu("kernel", name, launch, start, end)

    def save(self, path: Path) -> Path:
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
            "traceEvents": self.events,
        }
        with gzip.open(path, "wt") as f:
            f.write(json.dumps(doc))  # dumps: C-encoded; dump streams through the Python one
        return path
