"""How each rank of a run directory ended, and the hang evidence the ranks left behind.

Per rank, from ``ranks/rank-<R>.steps.jsonl``: the steps it finished, whether Python shut
down normally (an ``exit`` or ``exec`` record), the job's error record (time and line);
from ``ranks/rank-<R>.fault.log`` (``faulthandler``, written by gpudiag's rank hook): the
fatal signal and every thread's stack when the rank died of one (a C++ abort, a
segfault). From ``ranks/hang/``: the flight-recorder dumps and stacks the watchdog asked
for, and torch's own timeout dumps (``traces/flightrec.py``).
"""

from __future__ import annotations

import re
from dataclasses import field
from pathlib import Path
from typing import Any

from gpudiag._support import fileio
from gpudiag._support.records import dataclass
from gpudiag.errors import InputError
from gpudiag.rundir import layout as rundir
from gpudiag.rundir.sections import HangSection
from gpudiag.traces.runfiles.flightrec import (
    HANG_DIR,
    Frame,
    FrDump,
    RankStacks,
    ThreadStack,
    dump_notes,
    read_hang_dir,
)

FAULT_LIMIT = 4 << 20
ERROR_CHARS = 2000  # of the error line kept: torch's mismatch line holds two fingerprints (~760)
_FAULT_TITLE = re.compile(r"^Fatal Python error: (.+)$", re.M)
_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-f]+)(?: \[([^\]]*)\])? \(most recent call first\):$"
)
_FILE_LINE = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')


@dataclass(frozen=True)
class RankEnd:
    """How one rank's process ended, as its files tell it."""

    rank: int
    steps: int  # steps it finished (numbered 0 … steps-1): it ended in step ``steps``
    last_ns: int | None  # time of its last record (step end, error, exit)
    exited: bool  # Python shut down normally (exit or exec record)
    error_ns: int | None = None
    error: str | None = None  # the job's error line (first line of the exception)
    fault: str | None = None  # "Aborted", "Segmentation fault", … (faulthandler)
    fault_threads: tuple[ThreadStack, ...] = ()
    cut_step: int | None = None  # its saved trace holds this step partially (cut_at_step)


@dataclass(frozen=True)
class RunEnd:
    """Every rank's end, the hang evidence, and how ``gpudiag run`` saw the job end."""

    ends: tuple[RankEnd, ...]
    dumps: tuple[FrDump, ...] = ()
    stacks: tuple[RankStacks, ...] = ()
    exit_code: int | None = None
    interrupted: bool = False
    hang: HangSection | None = None  # the watchdog's record (manifest extra.hang)
    world_size: int | None = None
    notes: tuple[str, ...] = field(default=())


def parse_fault_log(text: str) -> tuple[str | None, tuple[ThreadStack, ...]]:
    """Faulthandler's text → (the fatal error, every thread's stack innermost first).

    The thread faulthandler calls "Current thread" has ``main`` set.
    """
    m = _FAULT_TITLE.search(text)
    title = m.group(1).strip() if m else None
    threads: list[ThreadStack] = []
    frames: list[Frame] = []
    name, current = "", False

    def close() -> None:
        if name:
            threads.append(ThreadStack(name, current, tuple(frames)))

    for line in text.splitlines():
        t = _THREAD.match(line)
        if t:
            close()
            frames = []
            current = t.group(1) == "Current thread"
            name = t.group(3) or t.group(2)
            continue
        f = _FILE_LINE.match(line)
        if f and name:
            frames.append(Frame(f.group(3).strip(), f.group(1), int(f.group(2))))
    close()
    return title, tuple(threads)


def _rank_end(path: Path) -> RankEnd | None:
    from gpudiag.traces.runfiles.telemetry import read_steps_file

    header, steps, other = read_steps_file(path)
    rank = int(header["rank"])
    times = [r.get("end_ns") for r in steps] + [r.get("time_ns") for r in other]
    ints = [t for t in times if isinstance(t, int) and not isinstance(t, bool)]
    err = next((r for r in other if r.get("type") == "error" and r.get("where") == "job"), None)
    msg = err.get("message") if err else None
    err_ns = err.get("time_ns") if err else None
    fault: str | None = None
    threads: tuple[ThreadStack, ...] = ()
    fpath = path.parent / f"rank-{rank}.fault.log"
    if fpath.is_file():
        text = fileio.read_input(fpath, FAULT_LIMIT, "faulthandler log").decode("utf-8", "replace")
        if text.strip():
            fault, threads = parse_fault_log(text)
    cuts = [r.get("cut_at_step") for r in other if r.get("type") == "profile"]
    cut = (
        cuts[-1] if cuts and isinstance(cuts[-1], int) and not isinstance(cuts[-1], bool) else None
    )
    return RankEnd(
        rank=rank,
        steps=len(steps),
        cut_step=cut,
        last_ns=max(ints) if ints else None,
        exited=any(r.get("type") in ("exit", "exec") for r in other),
        error_ns=err_ns if isinstance(err_ns, int) and not isinstance(err_ns, bool) else None,
        error=str(msg).splitlines()[0][:ERROR_CHARS] if msg else None,
        fault=fault,
        fault_threads=threads,
    )


def read_run_end(run_dir: Path, manifest: rundir.RunManifest | None) -> RunEnd | None:
    """The run's end and hang evidence; None when it ended well and left no hang evidence."""
    ranks_dir = run_dir / rundir.RANKS_DIR
    ends = []
    notes: list[str] = []
    for p in sorted(ranks_dir.glob("rank-*.steps.jsonl")) if ranks_dir.is_dir() else []:
        try:
            e = _rank_end(p)
        except InputError as err:
            notes.append(f"{p.name}: {err.problem}")
            continue
        if e is not None:
            ends.append(e)
    hang_dir = ranks_dir / HANG_DIR
    dumps: list[FrDump] = []
    stacks: list[RankStacks] = []
    if hang_dir.is_dir():
        dumps, stacks, more = read_hang_dir(hang_dir)
        notes += more
        notes += dump_notes(dumps)
    code = manifest.exit_code if manifest is not None else None
    extra = manifest.extra if manifest is not None else {}
    interrupted = bool(extra.get("interrupted"))
    hang = extra.get("hang") if isinstance(extra.get("hang"), dict) else None
    failed = code not in (None, 0) or any(not e.exited or e.error or e.fault for e in ends)
    if hang is not None and hang.get("resumed_ns") and not failed and (dumps or stacks):
        # a long pause (evaluation, a checkpoint) the watchdog took for a hang: not one
        notes.append(
            f"the hang watchdog found no finished step for {hang.get('idle_s', '?')} s, then "
            "the job went on: the stacks and dumps taken then (ranks/hang/) are not a hang"
        )
        dumps, stacks = [], []
    if not failed and not dumps and not stacks and not interrupted and hang is None:
        return None
    return RunEnd(
        ends=tuple(sorted(ends, key=lambda e: e.rank)),
        dumps=tuple(dumps),
        stacks=tuple(stacks),
        exit_code=code,
        interrupted=interrupted,
        hang=hang,
        world_size=manifest.world_size if manifest is not None else None,
        notes=tuple(notes),
    )


def merge_ends(parts: list[RunEnd]) -> RunEnd | None:
    """One RunEnd for several nodes (or a run directory plus loose dumps)."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    return RunEnd(
        ends=tuple(sorted((e for p in parts for e in p.ends), key=lambda e: e.rank)),
        dumps=tuple(sorted((d for p in parts for d in p.dumps), key=lambda d: d.rank)),
        stacks=tuple(sorted((s for p in parts for s in p.stacks), key=lambda s: s.rank)),
        exit_code=next(
            (p.exit_code for p in parts if p.exit_code not in (None, 0)), first.exit_code
        ),
        interrupted=any(p.interrupted for p in parts),
        hang=next((p.hang for p in parts if p.hang), None),
        world_size=max((p.world_size or 0 for p in parts), default=0) or None,
        notes=tuple(n for p in parts for n in p.notes),
    )


def load_run_end(inputs: Any, manifest: rundir.RunManifest | None) -> RunEnd | None:
    """The run end of every run directory (each node) and the loose dumps given."""
    from gpudiag.traces.runfiles.flightrec import read_dumps

    parts: list[RunEnd] = []
    for d in inputs.run_dirs:
        for node in rundir.node_dirs(d) or [d]:
            e = read_run_end(node, manifest)
            if e is not None:
                parts.append(e)
    if inputs.fr_files:
        dumps = read_dumps(inputs.fr_files)
        notes = tuple(dump_notes(dumps))
        parts.append(RunEnd(ends=(), dumps=tuple(dumps), notes=notes))
    return merge_ends(parts)
