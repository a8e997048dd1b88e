"""A second look for free: each trace file's per-rank results, kept on disk between runs.

``gpudiag analyze`` (and ``report``, ``gate``, ``diff``, ``run``) decodes and classifies
every trace file into compact per-rank results (:class:`~gpudiag.analysis.rank.analyse.RankResult`:
steps, collectives, evidence) before the cross-rank work. :func:`cached_map`
wraps the mapper that runs that per-file work: a file whose entry is in the cache is not
read again; the others go through the mapper, and their results are stored.

**Key.** An entry is found by the SHA-256 of: the file's resolved path, size, mtime and
ctime (ns), inode and device (and the same for the ``.nsys-rep`` an export came from); its
format, rank override and load options (the name patterns, the step marker); the
thresholds the per-rank work reads (:data:`RANK_THRESHOLDS`); gpudiag's version and a
fingerprint of its own source files. Any change to one of them is a miss. The key document
itself is stored in the entry and compared on reading, so an entry never answers for
another input.

**Where.** A trace inside a run directory (``ranks/`` or ``nsys/`` beside a
``manifest.json``) is cached in that directory's ``.gpudiag-cache/``; anything else in the
user cache directory: ``$GPUDIAG_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpudiag/ranks``, else
``~/.cache/gpudiag/ranks``. A run directory that is not writable — read-only filesystem, no
permission, or no write bit at all (root ignores permission bits, so a directory laid
out without them, like a CI's read-only copy, is taken as read-only) — is never written:
its traces are cached in the user cache directory instead. When no cache directory can be
written, the analysis runs as without a cache. ``--no-cache`` or ``GPUDIAG_NO_CACHE=1``
turns the cache off.

**Safety.** An entry is written to a temporary file in the cache directory and renamed
into place, so concurrent runs and interrupted writes never leave a partial entry. Each
entry starts with a magic string, the entry format version and the SHA-256 of its payload;
an entry whose header, checksum, key or contents do not check out is ignored (a miss) and
rewritten. The payload is msgpack of plain values and tagged containers, decoded only into
gpudiag's own result dataclasses and enums (of ``gpudiag.analysis`` and
``gpudiag.traces.schema``): reading an entry never runs code it brings. Each cache directory
is bounded (:data:`MAX_BYTES`): after a run stores entries, the least recently used ones
(a hit refreshes an entry's mtime) are removed until it fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from gpudiag import __version__
from gpudiag._support.records import asdict, dataclass
from gpudiag.fanout.work import RankWork

MAGIC = b"GPUDIAG-RANK-CACHE\n"
FORMAT = 1
SUFFIX = ".gdc"
RUN_DIR_CACHE = ".gpudiag-cache"
MAX_BYTES = 256 << 20  # per cache directory; a rank's entry is ~5-100 KB
STALE_TMP_S = 3600.0  # temporary files older than this are from writers that died
# The thresholds that per-rank analysis reads (rank.rank_result and what it calls);
# the load options (name patterns, step marker) are part of each source's key too.
RANK_THRESHOLDS = (
    "comm_op_re",
    "truncated_step_ratio",
    "advice.launch_gap_ns",
    "loader.launch_linked_min_ratio",
    "reading.startup_call_min_ns",
    "reading.startup_repeat_ratio",
    "reading.startup_dominant_ratio",
    "reading.step_gpu_coverage_ratio",
    "reading.autotune_min_trials",
)
NO_CACHE_ENV = "GPUDIAG_NO_CACHE"
DIR_ENV = "GPUDIAG_CACHE_DIR"

Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]


@dataclass
class CacheStats:
    """What one analysis found in the cache (for tests and benchmarks)."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    uncacheable: int = 0
    dirs: set[str] = field(default_factory=set)


def enabled() -> bool:
    """False when ``GPUDIAG_NO_CACHE`` is set to anything but ``0`` or empty."""
    return os.environ.get(NO_CACHE_ENV, "").strip() in ("", "0")


def user_cache_dir() -> Path:
    """``$GPUDIAG_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpudiag/ranks`` (``~/.cache`` by default)."""
    own = os.environ.get(DIR_ENV)
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "gpudiag" / "ranks"


def cached_map(
    inner: Mapper,
    user_dir: Path | None = None,
    max_bytes: int = MAX_BYTES,
    stats: CacheStats | None = None,
) -> Mapper:
    """A mapper that answers per-rank work on trace files from the cache, ``inner`` else.

    Only the per-rank work (:class:`~gpudiag.fanout.work.RankWork`, keyed on its thresholds)
    on trace files (items with ``path`` and ``fmt``) is cached; with a timeline it is only
    stored. Any other work goes to ``inner`` as it is.
    """
    st = stats if stats is not None else CacheStats()
    home = user_dir if user_dir is not None else user_cache_dir()

    def run(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if not isinstance(fn, RankWork):
            return inner(fn, items)
        # the timeline's lanes are not kept (they are large): an analysis that draws the
        # timeline reads every file, and stores its results (without lanes) for the next one
        lookup = fn.timeline is None
        th = _rank_thresholds(fn.thresholds)
        code = _code_fingerprint()
        out: list[Any] = [None] * len(items)
        todo: list[int] = []
        where: dict[int, tuple[Path, dict[str, Any], str]] = {}
        for i, item in enumerate(items):
            key = _key_doc(item, th, code)
            d = _dir_for(item, home) if key is not None else None
            if key is None or d is None:
                st.uncacheable += 1
                todo.append(i)
                continue
            digest = hashlib.sha256(_canonical(key)).hexdigest()
            where[i] = (d, key, digest)
            found = _read(d / f"{digest}{SUFFIX}", key) if lookup else None
            if found is None:
                st.misses += 1
                todo.append(i)
            else:
                st.hits += 1
                out[i] = found
        if todo:
            for i, res in zip(todo, inner(fn, [items[i] for i in todo]), strict=True):
                out[i] = res
        touched: set[Path] = set()
        for i in todo:
            if i in where:
                d, key, digest = where[i]
                if _write(d, digest, key, _without_lanes(out[i])):
                    st.stored += 1
                    touched.add(d)
        for d in touched:
            st.dirs.add(str(d))
            evict(d, max_bytes)
        return out

    return run


# ---- the key ---------------------------------------------------------------------------


def _without_lanes(results: Any) -> Any:
    if isinstance(results, list):
        return [
            dataclasses.replace(r, lanes=None) if getattr(r, "lanes", None) is not None else r
            for r in results
        ]
    return results


def _rank_thresholds(th: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in RANK_THRESHOLDS:
        v = th
        for part in name.split("."):
            v = getattr(v, part)
        out[name] = v
    return out


def _identity(path: Path) -> dict[str, Any]:
    st = os.stat(path)
    return {
        "path": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "inode": st.st_ino,
        "device": st.st_dev,
    }


def _key_doc(item: Any, th: dict[str, Any], code: str) -> dict[str, Any] | None:
    """Everything a file's per-rank results depend on; None for anything but a trace file."""
    path, fmt = getattr(item, "path", None), getattr(item, "fmt", None)
    if not isinstance(path, Path) or fmt not in ("kineto", "nsys"):
        return None
    origin = getattr(item, "origin", None)
    options = getattr(item, "options", None)
    try:
        return {
            "format": FORMAT,
            "gpudiag": __version__,
            "code": code,
            "file": _identity(path),
            "origin": _identity(origin) if isinstance(origin, Path) else None,
            "fmt": fmt,
            "rank": getattr(item, "rank", None),
            "options": _plain(options),
            "thresholds": th,
        }
    except (OSError, TypeError, ValueError):
        return None  # unreadable: the loader will say why


def _plain(options: Any) -> dict[str, Any] | None:
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        return asdict(options)
    return None


def _canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


CODE_ROOT = Path(__file__).resolve().parents[1]  # the gpudiag package, every layer of it


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """Size and mtime of every source file of this gpudiag: a code change is a miss."""
    root = CODE_ROOT
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                p = os.path.join(dirpath, name)
                st = os.stat(p)
                h.update(f"{os.path.relpath(p, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


# ---- where -----------------------------------------------------------------------------


def _writable_dir(d: Path) -> bool:
    """An existing directory this process may write into and that is not read-only.

    A directory without any write bit counts as read-only even for root (who could write
    it regardless): that is how read-only copies of inputs are laid out.
    """
    try:
        st = os.stat(d)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and bool(st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        and os.access(d, os.W_OK | os.X_OK)
    )


def _usable(d: Path) -> bool:
    """``d`` exists and is writable, or can be made in a writable parent.

    Any error on the way (a parent this user may not search, a read-only file system) is a
    no: the analysis goes on without the cache.
    """
    try:
        if d.is_dir():
            return _writable_dir(d)
        parent = d.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not _writable_dir(parent):
            return False
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return _writable_dir(d)


_told_unusable: set[str] = set()


def _tell_unusable(home: Path) -> None:
    """Say once per directory and process that the cache is off because it cannot be used."""
    if str(home) in _told_unusable:
        return
    _told_unusable.add(str(home))
    print(
        f"gpudiag: note: cache directory {home} cannot be used (not writable by this user); "
        f"analysing without the cache (set {DIR_ENV} to another directory, or --no-cache)",
        file=sys.stderr,
    )


def _run_dir_of(path: Path) -> Path | None:
    """The run (or node) directory holding ``path`` in its ``ranks/`` or ``nsys/``."""
    from gpudiag.rundir import layout as rundir

    parent = path.parent
    try:
        if (
            parent.name in (rundir.RANKS_DIR, rundir.NSYS_DIR)
            and (parent.parent / rundir.MANIFEST).is_file()
        ):
            return parent.parent
    except OSError:
        pass
    return None


def _dir_for(item: Any, home: Path) -> Path | None:
    """The cache directory for a source: its run directory's, else the user's; None: none."""
    run = _run_dir_of(Path(item.path))
    if run is not None and _writable_dir(run):
        d = run / RUN_DIR_CACHE
        if _usable(d):
            return d
    if _usable(home):
        return home
    _tell_unusable(home)
    return None


# ---- entries ---------------------------------------------------------------------------


def _read(path: Path, key: dict[str, Any]) -> list[Any] | None:
    """The results stored at ``path`` for ``key``; None when absent or not trustworthy."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    head = len(MAGIC) + 4 + 32
    if len(blob) < head or not blob.startswith(MAGIC):
        return None
    version = int.from_bytes(blob[len(MAGIC) : len(MAGIC) + 4], "big")
    digest, payload = blob[len(MAGIC) + 4 : head], blob[head:]
    if version != FORMAT or hashlib.sha256(payload).digest() != digest:
        return None
    try:
        stored_key, data = msgspec.msgpack.decode(payload)
        if _canonical(stored_key) != _canonical(key):
            return None
        results = decode(data)
    except (msgspec.DecodeError, TypeError, ValueError, KeyError, IndexError):
        return None
    if not isinstance(results, list):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # most recently used
    return results


def _write(d: Path, digest: str, key: dict[str, Any], results: Any) -> bool:
    """Store ``results`` atomically; False (and nothing left behind) when it cannot."""
    try:
        payload = msgspec.msgpack.encode([key, encode(results)])
    except (TypeError, ValueError, OverflowError):
        return False  # something this cache does not know how to keep: not cached
    blob = MAGIC + FORMAT.to_bytes(4, "big") + hashlib.sha256(payload).digest() + payload
    import tempfile

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{digest[:16]}.", suffix=".tmp", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, d / f"{digest}{SUFFIX}")
        return True
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False


def evict(d: Path, max_bytes: int = MAX_BYTES) -> int:
    """Remove the least recently used entries of ``d`` until it holds ≤ ``max_bytes``.

    Temporary files of writers that died long ago go too. Returns how many were removed.
    """
    entries: list[tuple[float, int, str]] = []
    removed = 0
    now = time.time()
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if e.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_S:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                elif e.name.endswith(SUFFIX):
                    entries.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return 0
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.unlink(p)
            removed += 1
        total -= size
    return removed


# ---- encoding: plain values and tagged containers, decoded into known classes only ------


# Result classes are gpudiag's own dataclasses and enums from these modules, named by module
# and qualified name; nothing else is ever constructed from an entry.
_RESULT_MODULES = ("gpudiag.analysis.", "gpudiag.traces.schema")


def _result_class(module: Any, qualname: Any) -> type:
    """The class an entry names, if it is one of gpudiag's result types; ValueError else."""
    import importlib

    if not (
        isinstance(module, str)
        and isinstance(qualname, str)
        and module.startswith(_RESULT_MODULES)
        and qualname.isidentifier()
    ):
        raise ValueError(f"not a result type: {module}.{qualname}")
    try:
        cls = getattr(importlib.import_module(module), qualname)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"no result type {module}.{qualname}") from e
    if not (
        isinstance(cls, type)
        and cls.__module__ == module
        and (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum))
    ):
        raise ValueError(f"not a result type: {module}.{qualname}")
    return cls


def _name_of(cls: type) -> list[str]:
    """[module, name] of a class :func:`_result_class` gives back; TypeError for others."""
    name = [cls.__module__, cls.__qualname__]
    try:
        if _result_class(*name) is cls:
            return name
    except ValueError:
        pass
    raise TypeError(f"cannot cache {cls.__module__}.{cls.__qualname__}")


def encode(x: Any) -> Any:
    """``x`` as msgpack-able data: containers become lists tagged with what they were."""
    if isinstance(x, enum.Enum):  # before str and int: str- and int-valued enums are both
        return ["E", *_name_of(type(x)), encode(x.value)]
    if x is None or type(x) in (bool, str):
        return x
    if isinstance(x, np.generic):
        return ["N", x.dtype.str, x.tobytes()]
    if type(x) in (int, float):
        return x
    if type(x) is list:
        return ["L", *map(encode, x)]
    if type(x) is tuple:
        return ["T", *map(encode, x)]
    if type(x) is dict:
        return ["D", *[encode(v) for kv in x.items() for v in kv]]
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject:
            raise TypeError("cannot cache an object array")
        return ["A", x.dtype.str, list(x.shape), np.ascontiguousarray(x).tobytes()]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out: list[Any] = ["C", *_name_of(type(x))]
        for f in dataclasses.fields(x):
            if not f.init:
                raise TypeError(f"cannot cache {type(x).__name__}.{f.name}")
            out += [f.name, encode(getattr(x, f.name))]
        return out
    raise TypeError(f"cannot cache {type(x).__name__}")


def decode(x: Any) -> Any:
    """The value :func:`encode` made ``x`` from; ValueError for anything else."""
    if not isinstance(x, list):
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise ValueError(f"unexpected {type(x).__name__}")
    if not x:
        raise ValueError("untagged list")
    tag, rest = x[0], x[1:]
    if tag == "L":
        return [decode(v) for v in rest]
    if tag == "T":
        return tuple(decode(v) for v in rest)
    if tag == "D":
        if len(rest) % 2:
            raise ValueError("odd dict")
        return {_hashable(decode(k)): decode(v) for k, v in zip(rest[::2], rest[1::2], strict=True)}
    if tag == "A":
        dtype, shape, data = rest
        dt = np.dtype(dtype)
        if dt.hasobject or not isinstance(data, bytes):
            raise ValueError("bad array")
        return np.frombuffer(data, dt).reshape(shape).copy()
    if tag == "N":
        dtype, data = rest
        dt = np.dtype(dtype)
        if dt.hasobject or not isinstance(data, bytes) or len(data) != dt.itemsize:
            raise ValueError("bad scalar")
        return np.frombuffer(data, dt)[0]
    if tag == "E":
        cls = _result_class(rest[0], rest[1])
        if not issubclass(cls, enum.Enum) or len(rest) != 3:
            raise ValueError("not an enum")
        return cls(decode(rest[2]))
    if tag == "C":
        cls = _result_class(rest[0], rest[1])
        body = rest[2:]
        names = body[0::2]
        if len(body) % 2 or not dataclasses.is_dataclass(cls):
            raise ValueError("bad fields")
        if names != [f.name for f in dataclasses.fields(cls)]:
            raise ValueError(f"fields of {rest[1]} changed")
        return cls(**{n: decode(v) for n, v in zip(names, body[1::2], strict=True)})
    raise ValueError(f"unknown tag {tag!r}")


def _hashable(k: Any) -> Any:
    hash(k)  # TypeError for a list or dict key: not something encode wrote
    return k
