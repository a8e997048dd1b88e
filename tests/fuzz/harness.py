"""Runs one fuzz case through ``gpudiag.analyze`` (or the CLI) and checks the property.

The property: every case ends in a Diagnosis or a ``GpudiagError`` with exit code 4
(bad input) or 3 (environment), within a time bound and a memory bound, and every input
file is byte-identical afterwards, with nothing created beside it. A case that hangs is
interrupted by ``SIGALRM``; its peak memory is the process's VmHWM, reset before the case
(``/proc/self/clear_refs``), so cases are measured one by one in one process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TIME_BOUND_S = 30.0  # a case takes < 1 s; a hang or a quadratic path takes far longer
MEMORY_BOUND_BYTES = 1536 << 20  # cases are < 10 MB; an endless read grows past this fast
CLEAN_EXIT_CODES = (3, 4)


@dataclass
class Outcome:
    """How one case ended."""

    name: str
    kind: str  # "diagnosis", "error" (a GpudiagError with a clean exit code), "other"
    detail: str
    wall_s: float
    peak_rss: int | None  # bytes; None where /proc cannot tell
    exit_code: int | None = None
    changed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The property holds for this case."""
        return (
            self.kind in ("diagnosis", "error")
            and not self.changed
            and self.wall_s < TIME_BOUND_S
            and (self.peak_rss is None or self.peak_rss < MEMORY_BOUND_BYTES)
        )

    def describe(self) -> str:
        """One line for a failure message."""
        rss = "?" if self.peak_rss is None else f"{self.peak_rss / 1e6:.0f} MB"
        changed = f" changed: {self.changed}" if self.changed else ""
        return f"{self.name}: {self.kind} {self.detail} ({self.wall_s:.2f} s, {rss}){changed}"


RUN_DIR_CACHE = ".gpudiag-cache"


def snapshot(root: Path) -> dict[str, str]:
    """Path → sha256 (or the file type) of everything under ``root``, links not followed."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        # gpudiag keeps a run directory's per-rank results inside it (gpudiag/fanout/cache.py):
        # its own output, by design, not a change to the inputs
        dirnames[:] = [d for d in dirnames if d != RUN_DIR_CACHE]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                try:
                    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
                except PermissionError:  # an unreadable case: its mode is its identity
                    out[rel] = f"unreadable {st.st_size} {st.st_mtime_ns}"
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = "link " + os.readlink(p)
            else:
                out[rel] = f"mode {stat.S_IFMT(st.st_mode):o}"
    return out


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Files added, removed or modified between two snapshots."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class CaseTimeout(BaseException):
    """Raised by the alarm in a case that runs past the time bound (not an Exception)."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def fire(signum: int, frame: FrameType | None) -> None:
        raise CaseTimeout(f"still running after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_case(
    name: str,
    root: Path,
    paths: list[Path],
    call: Callable[[list[Path]], Any] | None = None,
    bound_s: float = TIME_BOUND_S,
) -> Outcome:
    """Analyse ``paths`` (files under ``root``) in this process; classify how it ended."""
    from gpudiag.errors import GpudiagError

    if call is None:
        import gpudiag

        def call(ps: list[Path]) -> Any:
            return gpudiag.analyze(*ps, jobs=1)

    before = snapshot(root)
    measured = _reset_peak()
    t0 = time.perf_counter()
    exit_code = None
    try:
        with _alarm(bound_s):
            d = call(paths)
        kind, detail = "diagnosis", f"{len(getattr(d, 'ranks', []))} rank(s)"
        json.dumps(d.to_json(), allow_nan=False)  # a Diagnosis must serialise as JSON
    except GpudiagError as e:
        exit_code = e.exit_code
        ok = exit_code in CLEAN_EXIT_CODES and "\n" not in e.message
        kind = "error" if ok else "other"
        detail = f"exit {exit_code}: {e.message[:300]}"
    except (Exception, CaseTimeout, RecursionError, MemoryError) as e:
        kind, detail = "other", f"{type(e).__name__}: {str(e)[:300]}"
    wall = time.perf_counter() - t0
    peak = _peak() if measured else None
    return Outcome(name, kind, detail, wall, peak, exit_code, changes(before, snapshot(root)))


def run_cli_case(name: str, root: Path, args: list[str], timeout: float = 120) -> Outcome:
    """``python -m gpudiag ARGS`` in a subprocess: exit 0/3/4, one error line, no traceback."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    before = snapshot(root)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpudiag", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Outcome(name, "other", f"timed out after {timeout} s", timeout, None)
    wall = time.perf_counter() - t0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("gpudiag: error:")]
    rc = proc.returncode
    if rc == 0 and not errors:
        kind, detail = "diagnosis", "exit 0"
    elif rc in CLEAN_EXIT_CODES and len(errors) == 1 and "Traceback" not in proc.stderr:
        kind, detail = "error", f"exit {rc}: {errors[0]}"
    else:
        kind, detail = "other", f"exit {rc}: {proc.stderr[-800:]}"
    return Outcome(name, kind, detail, wall, None, rc, changes(before, snapshot(root)))
