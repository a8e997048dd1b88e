"""``.nsys-rep`` / ``.qdrep`` reports: their header, the nsys binary, ``nsys export`` and its cache.

A report is read through its SQLite export: an up-to-date ``.sqlite`` beside it, else
``nsys export`` into gpudiag's cache directory (``$XDG_CACHE_HOME/gpudiag/nsys``), keyed by
the report's path, size and modification time. An nsys opens only reports of its own
version or older; a mismatch is an :class:`~gpudiag.errors.EnvironmentProblem` naming both.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from gpudiag._support import nsysbin
from gpudiag.errors import EnvironmentProblem, InputError
from gpudiag.traces.nsys.database import vtuple

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
HEADER_MAGIC = b"NVIDIA Tegra Profiler Report "
EXPORT_TIMEOUT_S = float(os.environ.get("GPUDIAG_NSYS_TIMEOUT", "900"))
_MISMATCH = ("newer than your current version", "Version number is invalid", "ProtobufParse")


def report_version(path: Path) -> str:
    """The nsys that captured a report, from its header: ``2024.6.2.25`` or ``before 2023.4``."""
    try:
        with path.open("rb") as f:
            head = f.read(96)
    except OSError as e:
        raise InputError(path, f"cannot read ({e.strerror or e})") from e
    if not head.startswith(HEADER_MAGIC):
        raise InputError(
            path,
            "not an Nsight Systems report (no `NVIDIA Tegra Profiler Report` header)",
            "give a .nsys-rep/.qdrep written by `nsys profile`, or its .sqlite export",
        )
    rest = head[len(HEADER_MAGIC) :]
    m = re.match(rb"(\d{4})@(\d+)@(\d+)@(\d+)", rest)
    if m:
        return ".".join(x.decode() for x in m.groups())
    return "before 2023.4"


def find_nsys(explicit: str | None = None) -> str | None:
    """The nsys binary: ``explicit`` (``--nsys``), else :mod:`gpudiag._support.nsysbin`'s search.

    A given binary that is not an executable file is an error, as is a bad ``GPUDIAG_NSYS``.
    """
    env = dict(os.environ)
    if explicit:
        env["GPUDIAG_NSYS"] = explicit
    path, why = nsysbin.locate(env)
    if path is None and env.get("GPUDIAG_NSYS"):
        raise EnvironmentProblem(why, "point --nsys / GPUDIAG_NSYS at the nsys binary")
    return path


def nsys_version(nsys: str) -> str:
    """``2022.4.2.1`` from ``nsys --version`` (``?`` when it cannot be told)."""
    return nsysbin.version(nsys)


def cache_dir() -> Path:
    """Where exports of reports are kept: ``$XDG_CACHE_HOME/gpudiag/nsys``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpudiag" / "nsys"


def cache_path(report: Path) -> Path:
    """The cached export of ``report``, keyed by its absolute path, size and mtime."""
    st = report.stat()
    key = f"{report.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return cache_dir() / f"{hashlib.sha256(key).hexdigest()[:24]}.sqlite"


def _manual(report: Path) -> str:
    """The command a user runs to export ``report`` beside itself."""
    return f"nsys export --type sqlite -o {report.with_suffix('.sqlite')} {report}"


def _needs(captured: str) -> str:
    """Which nsys opens a report (an nsys opens reports of its own version or older)."""
    if captured[:1].isdigit():
        return f"nsys {captured} or newer"
    return "nsys 2023.4 or newer (or the release that captured it)"


def resolve_report(report: Path, nsys_bin: str | None = None) -> Path:
    """The SQLite export to read for a ``.nsys-rep``/``.qdrep``, exporting it if needed.

    ``nsys_bin``: the binary to export with (``--nsys``), else the one :func:`find_nsys` finds.
    """
    captured = report_version(report)
    beside = report.with_suffix(".sqlite")
    if beside.is_file() and beside.stat().st_mtime >= report.stat().st_mtime:
        return beside
    manual = _manual(report)
    nsys = find_nsys(nsys_bin)
    if nsys is None:
        raise EnvironmentProblem(
            f"{report}: no nsys found to export this report (captured by nsys {captured}; "
            f"it needs {_needs(captured)})",
            f"run `{manual}` and analyse the .sqlite, or pass --nsys PATH / set GPUDIAG_NSYS",
        )
    cached = cache_path(report)
    if cached.is_file():
        return cached
    local = nsys_version(nsys)
    if captured[0].isdigit() and local != "?" and vtuple(local) < vtuple(captured):
        raise _mismatch(report, captured, local, manual)
    export_report(report, cached, nsys, local, captured)
    return cached


def _mismatch(report: Path, captured: str, local: str, manual: str) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"{report}: report captured by nsys {captured}, local nsys is {local} "
        f"(an nsys opens only reports of its own version or older)",
        f"export it on a machine with {_needs(captured)}: `{manual}`",
    )


def export_report(report: Path, out: Path, nsys: str, local: str, captured: str) -> None:
    """Run ``nsys export`` to a temporary name; rename on success, delete on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp.sqlite")
    cmd = nsysbin.export_command(report, tmp, nsys)
    spin = _Spinner(f"exporting {report.name} with nsys {local}")
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
    except OSError as e:
        raise EnvironmentProblem(f"cannot run {nsys} ({e})", "check --nsys / GPUDIAG_NSYS") from e
    deadline = time.monotonic() + EXPORT_TIMEOUT_S
    text = ""
    try:
        while True:
            try:
                text, _ = proc.communicate(timeout=0.15)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.communicate()
                    raise EnvironmentProblem(
                        f"{report}: nsys export did not finish in {EXPORT_TIMEOUT_S:.0f} s",
                        f"set GPUDIAG_NSYS_TIMEOUT=<seconds>, or run `{_manual(report)}` yourself",
                    ) from None
                spin.tick()
    finally:
        spin.done()
        if proc.returncode != 0:
            with contextlib.suppress(OSError):
                tmp.unlink()  # nsys can leave a partial export behind
    if proc.returncode != 0 or not tmp.is_file():
        manual = _manual(report)
        if any(s in text for s in _MISMATCH):
            raise _mismatch(report, captured, local, manual)
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        raise InputError(
            report,
            f"nsys {local} export failed (exit {proc.returncode}): {last[:200]}",
            f"try `{manual}` yourself to see the full message",
        )
    os.replace(tmp, out)


_SPIN = "|/-\\"


class _Spinner:
    """A one-line progress spinner on stderr, only when stderr is a terminal."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.on = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.i = 0

    def tick(self) -> None:
        if self.on:
            self.i += 1
            dt = time.monotonic() - self.t0
            sys.stderr.write(f"\rgpudiag: {self.what} {_SPIN[self.i % 4]} {dt:.0f}s")
            sys.stderr.flush()

    def done(self) -> None:
        if self.on and self.i:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
