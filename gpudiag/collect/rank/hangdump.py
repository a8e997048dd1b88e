"""Inside each rank: gpudiag's own thread answers a hang request with stacks and flight recorder.

The launcher's watchdog asks through the control file (``control.json``, key
``hang_dump: {"id": …}``). The training thread may be stuck — blocked in C (a collective,
a loader's queue) or spinning in pure Python while holding the GIL — so the answer never
waits for it: this thread polls the control file every 0.25 s and, on a new request,
writes

- ``ranks/hang/fr-rank-<R>.pkl``: ``torch._C._distributed_c10d._dump_fr_trace`` without
  C++/Python stack symbolisation (0.1 ms instead of ~1 s per dump on this host);
- ``ranks/hang/rank-<R>.stacks.json``: every thread's Python stack (``sys._current_frames``),
  the process groups' global ranks (gloo's dump does not list them), the step in progress.

A thread spinning in pure Python gives up the GIL every switch interval (5 ms), so this
thread runs; a thread blocked in C has released it. Only C code that holds the GIL for
good (a native extension looping without releasing it) would keep this thread out.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag.rundir import layout as rundir

HANG_DIR = "hang"
POLL_S = 0.25
STACKS_FORMAT = "gpudiag.stacks"
MAX_FRAMES = 64


def hang_dir(run_dir: Path) -> Path:
    """Where ranks write their answers to a hang request."""
    return run_dir / rundir.RANKS_DIR / HANG_DIR


def stacks_path(run_dir: Path, rank: int) -> Path:
    """Rank ``rank``'s thread stacks."""
    return hang_dir(run_dir) / f"rank-{rank}.stacks.json"


def fr_path(run_dir: Path, rank: int) -> Path:
    """Rank ``rank``'s flight-recorder dump (torch's own pickle, unchanged)."""
    return hang_dir(run_dir) / f"fr-rank-{rank}.pkl"


def thread_stacks(skip: int | None = None) -> list[dict[str, Any]]:
    """Every thread's Python stack, innermost frame first; ``skip`` leaves a thread out."""
    names = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        frames: list[dict[str, Any]] = []
        f: Any = frame
        while f is not None and len(frames) < MAX_FRAMES:
            code = f.f_code
            frames.append({"name": code.co_name, "filename": code.co_filename, "line": f.f_lineno})
            f = f.f_back
        t = names.get(ident)
        out.append(
            {
                "ident": ident,
                "name": t.name if t is not None else "",
                "native_id": getattr(t, "native_id", None) if t is not None else None,
                "main": ident == main,
                "frames": frames,
            }
        )
    out.sort(key=lambda s: (not s["main"], s["name"]))
    return out


def process_groups(torch: Any) -> dict[str, dict[str, Any]]:
    """{group name: {desc, ranks}} of this process, global ranks, from torch.distributed."""
    try:
        from torch.distributed import distributed_c10d as c10d

        world = c10d._world
        out = {}
        for pg, ranks in world.pg_group_ranks.items():
            name = world.pg_names.get(pg)
            if name is None:
                continue
            out[str(name)] = {"desc": str(getattr(pg, "group_desc", "")), "ranks": sorted(ranks)}
        return out
    except Exception:
        return {}


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class HangResponder(threading.Thread):
    """Polls the control file; writes stacks and the flight recorder on each new request."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        torch: Any,
        step: Callable[[], int],
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(name="gpudiag-hang", daemon=True)
        self.run_dir = run_dir
        self.rank = rank
        self.torch = torch
        self.step = step
        self.on_error = on_error
        self.seen: set[str] = set()
        self.mtime: int | None = None
        self.stopped = threading.Event()

    def run(self) -> None:
        """Poll until the process ends (daemon thread)."""
        while not self.stopped.wait(POLL_S):
            try:
                self.poll()
            except Exception as e:  # never disturb the job
                if self.on_error is not None:
                    self.on_error(f"hang responder: {type(e).__name__}: {e}")
                return

    def poll(self) -> bool:
        """Answer a new request, if there is one; True when it answered."""
        path = rundir.control_path(self.run_dir)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return False
        if mtime == self.mtime:
            return False
        try:
            req = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False  # being written; the next poll reads it
        self.mtime = mtime
        ask = req.get("hang_dump") if isinstance(req, dict) else None
        if not isinstance(ask, dict) or str(ask.get("id")) in self.seen:
            return False
        rid = str(ask.get("id"))
        self.seen.add(rid)
        self.respond(rid)
        return True

    def respond(self, rid: str) -> None:
        """Write this rank's flight recorder and stacks for request ``rid``."""
        hang_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
        t0 = time.time_ns()
        stacks = thread_stacks(skip=threading.get_ident())
        t1 = time.time_ns()
        fr: dict[str, Any] = {"path": None, "error": None, "time_ns": None}
        try:
            dist = self.torch.distributed
            if dist.is_available() and dist.is_initialized():
                blob = self.torch._C._distributed_c10d._dump_fr_trace(
                    includeCollectives=True, includeStackTraces=False, onlyActive=False
                )
                fr["time_ns"] = time.time_ns()
                p = fr_path(self.run_dir, self.rank)
                _atomic(p, bytes(blob))
                fr["path"] = p.name
            else:
                fr["error"] = "no process group initialised"
        except Exception as e:
            fr["error"] = f"{type(e).__name__}: {e}"
        doc = {
            "format": STACKS_FORMAT,
            "version": 1,
            "rank": self.rank,
            "pid": os.getpid(),
            "request": rid,
            "time_ns": t0,
            "stacks_ns": t1 - t0,
            "step": self.step(),
            "fr_buffer_size": os.environ.get("TORCH_FR_BUFFER_SIZE"),
            "flight_recorder": fr,
            "groups": process_groups(self.torch),
            "threads": stacks,
        }
        _atomic(stacks_path(self.run_dir, self.rank), json.dumps(doc).encode())


_FAULT_FILE: Any = None


def fault_path(run_dir: Path, rank: int) -> Path:
    """Where a rank's Python stacks go if it dies of a fatal signal (abort, segfault)."""
    return run_dir / rundir.RANKS_DIR / f"rank-{rank}.fault.log"


def enable_fault_log(run_dir: Path, rank: int) -> bool:
    """``faulthandler`` into ``fault_path`` unless the job enabled it itself.

    A rank killed by SIGABRT (gloo's C++ abort on a collective mismatch), SIGSEGV, SIGBUS
    or SIGFPE then leaves every thread's Python stack; the job's exit status is unchanged
    (faulthandler re-raises the signal). The file stays empty otherwise.
    """
    global _FAULT_FILE
    import faulthandler

    if faulthandler.is_enabled():
        return False
    path = fault_path(run_dir, rank)
    made = [d for d in (run_dir, path.parent) if not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    _FAULT_FILE = open(path, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(file=_FAULT_FILE, all_threads=True)
    atexit.register(_drop_empty_fault_log, path, made)
    return True


def _drop_empty_fault_log(path: Path, made: list[Path]) -> None:
    """At a normal exit: an empty fault log, and the folders made only for it, go.

    A process that imported torch but never stepped (a tool, a DataLoader worker that
    exits) then leaves nothing behind, as before the fault log existed.
    """
    import faulthandler

    try:
        if path.stat().st_size:
            return
        faulthandler.disable()
        path.unlink()
        for d in reversed(made):
            d.rmdir()  # only when empty: anything else the rank wrote stays
    except OSError:
        pass


def start(
    run_dir: Path,
    rank: int,
    torch: Any,
    step: Callable[[], int],
    on_error: Callable[[str], None] | None = None,
) -> HangResponder:
    """Start the responder thread of this rank."""
    r = HangResponder(run_dir, rank, torch, step, on_error)
    r.start()
    return r


def install(torch: Any, hook: Any) -> None:
    """In a rank: the fault log and the responder thread; failures only become error records."""
    try:
        enable_fault_log(hook.run_dir, hook.rank)
        start(
            hook.run_dir,
            hook.rank,
            torch,
            step=lambda: int(hook.step),
            on_error=lambda msg: hook.record_error("gpudiag", msg),
        )
    except Exception as e:
        hook.record_error("gpudiag", f"hang responder not started: {e}")
