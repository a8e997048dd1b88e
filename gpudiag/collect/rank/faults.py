"""``GPUDIAG_FAULT``: failures injected into the rank hook (tests only)."""

from __future__ import annotations

FAULT_SITES = (
    "hook:install",
    "hook:data",
    "hook:backward",
    "hook:comm",
    "hook:step",
    "hook:profiler",
    "hook:save",
    "hook:job_profiler",
    "hook:exec",
    "hook:exit",
    "write:enospc",
)


class InjectedFault(RuntimeError):
    """A failure injected through ``GPUDIAG_FAULT`` (tests only)."""


def parse_faults(text: str | None) -> dict[str, tuple[int, int | None]]:
    """``GPUDIAG_FAULT`` → {site: (first step, last step or None)}; other prefixes ignored.

    The value is a comma-separated list of ``SITE[@A[-B]]``: ``hook:data`` fails at every
    step, ``hook:step@3`` at step 3 only, ``write:enospc@3-5`` during steps 3..5 and
    ``hook:comm@4-`` from step 4 on. Sites are :data:`FAULT_SITES`; ``hook:*`` raise
    :class:`InjectedFault` inside gpudiag's part of that hook, ``write:enospc`` makes
    telemetry writes stop half-way with ``ENOSPC``. Entries for other components
    (``nvml:``, ``conditions:``) are read by them.
    """
    out: dict[str, tuple[int, int | None]] = {}
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item.startswith(("hook:", "write:")):
            continue
        site, _, span = item.partition("@")
        if site not in FAULT_SITES:
            raise ValueError(f"GPUDIAG_FAULT: unknown site {site!r} (known: {FAULT_SITES})")
        lo, hi = 0, None
        if span:
            a, dash, b = span.partition("-")
            lo = int(a)
            hi = (int(b) if b else None) if dash else lo
        out[site] = (lo, hi)
    return out


class Faults:
    """The parsed ``GPUDIAG_FAULT`` spans; false when none are set (the normal case)."""

    def __init__(self, text: str | None) -> None:
        self.spans = parse_faults(text)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def on(self, site: str, step: int) -> bool:
        """Whether ``site`` fails at ``step``."""
        span = self.spans.get(site)
        if span is None:
            return False
        lo, hi = span
        return step >= lo and (hi is None or step <= hi)

    def fire(self, site: str, step: int) -> None:
        """Raise :class:`InjectedFault` when ``site`` fails at ``step``."""
        if self.on(site, step):
            raise InjectedFault(f"{site} at step {step} (GPUDIAG_FAULT)")
