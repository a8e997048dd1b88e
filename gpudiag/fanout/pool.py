"""Fans per-rank work out: the ``map`` given to diagnosis (local processes, or a Dask cluster).

A *mapper* is any callable ``mapper(fn, items) -> [fn(item) for item in items]``, in order.
:func:`local_map` runs the items in forked worker processes when there are several;
:func:`dask_map` runs one task per item on the workers of an existing ``distributed``
scheduler, which read the trace files themselves. ``fn`` and the items must be picklable,
and what ``fn`` returns is all that crosses back. Either mapper reports each finished item
to an optional *progress* hook ``progress(done, total, result)`` (``result`` is ``None``
for the first call, made before any item runs).
"""

from __future__ import annotations

import functools
import gc
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from gpudiag import __version__
from gpudiag.errors import EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")
R = TypeVar("R")
Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]
Progress = Callable[[int, int, Any], None]
# distributed's Client and Future (typed as Any: that package is optional and partly untyped)
Client = Any

# Below this much JSON in all (a .gz file counted as GZIP_RATIO times its size) one worker
# serves: forking a pool and shipping results back costs ~0.05-0.1 s, about what decoding
# ~10-20 MB of JSON takes (benchmarks/README.md, "no process pool for small inputs").
SERIAL_BELOW_BYTES = 16 << 20
GZIP_RATIO = 10
# How long to wait for the scheduler to answer and for a first worker to be there.
CONNECT_TIMEOUT_S = 10.0
INSTALL_HINT = "pip install 'gpudiag[dask]' (on the client and on every worker)"
SHARED_HINT = (
    "mount the traces' filesystem on every worker at the path the client sees, "
    "or analyse here without --scheduler"
)


def serial_map(
    fn: Callable[[T], R], items: Sequence[T], progress: Progress | None = None
) -> list[R]:
    """``[fn(item) for item in items]`` in this process."""
    out: list[R] = []
    if progress is not None:
        progress(0, len(items), None)
    for item in items:
        out.append(fn(item))
        if progress is not None:
            progress(len(out), len(items), out[-1])
    return out


def local_map(jobs: int | None = None, progress: Progress | None = None) -> Mapper:
    """A mapper over up to ``jobs`` forked processes (default: every CPU).

    Without ``jobs``, an input whose files hold less than :data:`SERIAL_BELOW_BYTES` of JSON
    in all is analysed in this process: a pool would cost more than it saves.
    """

    def run(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        workers = min(len(items), jobs or os.cpu_count() or 1)
        if jobs is None and workers > 1 and _json_bytes(items) < SERIAL_BELOW_BYTES:
            workers = 1
        if workers <= 1:
            return serial_map(fn, items, progress)
        # Objects that exist before the fork are moved out of the collector's reach, so a
        # collection in a worker does not write to (and copy) every page it shares with us.
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        gc.freeze()
        try:
            with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as ex:
                return _gather_local([ex.submit(fn, item) for item in items], progress)
        finally:
            gc.unfreeze()

    return run


def _json_bytes(items: Sequence[Any]) -> float:
    """About how much JSON the items' files hold; infinite when some item has no file."""
    total = 0.0
    for item in items:
        path = getattr(item, "path", None)
        if not isinstance(path, (str, os.PathLike)):
            return float("inf")
        try:
            size = os.stat(path).st_size
        except OSError:
            return float("inf")  # let the worker that reads it say why
        total += size * GZIP_RATIO if str(path).lower().endswith(".gz") else size
    return total


def _gather_local(futures: list[Future[R]], progress: Progress | None) -> list[R]:
    """Results in order, reported to ``progress`` as they finish.

    At the first failure the items not started are cancelled and the failure of the
    earliest item is raised.
    """
    from concurrent.futures import FIRST_COMPLETED, wait

    total, done = len(futures), 0
    if progress is not None:
        progress(0, total, None)
    pending = set(futures)
    while pending:
        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
        failed = [f for f in futures if f in finished and f.exception() is not None]
        if failed:
            for f in pending:
                f.cancel()
            raise cast(BaseException, failed[0].exception())
        for f in finished:
            done += 1
            if progress is not None:
                progress(done, total, f.result())
    return [f.result() for f in futures]


# ---- Dask ------------------------------------------------------------------------------


def dask_map(
    scheduler: str | Client,
    progress: Progress | None = None,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> Mapper:
    """A mapper that runs one task per item on the workers of a ``distributed`` scheduler.

    ``scheduler`` is an address (``tcp://HOST:PORT``) or a connected ``distributed.Client``
    (left open). Before anything is submitted the scheduler must answer and have a worker
    within ``timeout_s``, and every worker must run this gpudiag version. Each item whose
    ``path`` a worker cannot read fails with "the workers cannot read PATH"; a task whose
    workers keep dying (Dask retries it on others) fails naming its item. Results are
    gathered as they finish and released on the workers at once.
    """

    def run(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        client, owned = _connect(scheduler, timeout_s)
        try:
            _check_workers(client, timeout_s)
            return _run_tasks(client, fn, items, progress)
        finally:
            if owned:
                client.close(timeout=timeout_s)

    return run


def _address(scheduler: str | Client) -> str:
    return scheduler if isinstance(scheduler, str) else str(scheduler.scheduler_info()["address"])


def _connect(scheduler: str | Client, timeout_s: float) -> tuple[Client, bool]:
    """A client of the scheduler and whether we opened it (and so must close it)."""
    try:
        import distributed
    except ImportError as e:
        raise EnvironmentProblem(
            f"analysing on a Dask scheduler needs the `distributed` package, which is not "
            f"installed ({e})",
            INSTALL_HINT,
        ) from e
    if isinstance(scheduler, distributed.Client):
        return scheduler, False
    _check_address(scheduler)
    try:
        return distributed.Client(scheduler, timeout=timeout_s, set_as_default=False), True
    except (OSError, TimeoutError) as e:
        raise EnvironmentProblem(
            f"cannot reach the Dask scheduler at {scheduler} (no answer within {timeout_s:g} s)",
            "is the scheduler running there? Without --scheduler (and without "
            "DASK_SCHEDULER_ADDRESS or [tool.gpudiag] scheduler) gpudiag analyses here",
        ) from e


def _check_address(address: str) -> None:
    """Refuse a malformed address before a Client exists (a half-built one hangs on exit)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        scheme, location = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(location)
    except (ValueError, TypeError) as e:
        raise UsageError(
            f"{address!r} is not a Dask scheduler address ({e})",
            "give tcp://HOST:PORT, as `dask scheduler` prints it (to --scheduler, "
            "DASK_SCHEDULER_ADDRESS or [tool.gpudiag] scheduler)",
        ) from e


def _check_workers(client: Client, timeout_s: float) -> None:
    """At least one worker, and every worker on this client's gpudiag version."""
    addr = _address(client)
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except (OSError, TimeoutError) as e:
        raise EnvironmentProblem(
            f"the Dask scheduler at {addr} has no workers (none joined within {timeout_s:g} s)",
            f"start some with `dask worker {addr}`",
        ) from e
    # eval is a builtin: a worker with any gpudiag, or none, can run it and answer.
    found = client.run(eval, "__import__('gpudiag').__version__", on_error="return")
    missing = {w: v for w, v in found.items() if isinstance(v, BaseException)}
    if missing:
        w, err = sorted(missing.items())[0]
        raise EnvironmentProblem(
            f"gpudiag cannot be imported on {len(missing)} Dask worker(s), e.g. {w} "
            f"({type(err).__name__}: {_first_line(err)}); this client runs {__version__}",
            f"install the same gpudiag on every worker: pip install 'gpudiag[dask]=={__version__}'",
        )
    skew: dict[str, list[str]] = {}
    for w, v in found.items():
        if v != __version__:
            skew.setdefault(str(v), []).append(w)
    if skew:
        theirs = "; ".join(f"gpudiag {v} on {_workers(ws)}" for v, ws in sorted(skew.items()))
        raise EnvironmentProblem(
            f"version skew: this client runs gpudiag {__version__}, the Dask workers run "
            f"{theirs}; refusing to mix versions in one analysis",
            f"install gpudiag {__version__} on every worker (or the workers' version here): "
            f"pip install 'gpudiag[dask]=={__version__}'",
        )


def _workers(addrs: list[str]) -> str:
    addrs = sorted(addrs)
    more = f" and {len(addrs) - 2} more" if len(addrs) > 2 else ""
    return ", ".join(addrs[:2]) + more


def _run_tasks(
    client: Client, fn: Callable[[T], R], items: Sequence[T], progress: Progress | None
) -> list[R]:
    """One task per item; results in item order, gathered (and released) as they finish."""
    from distributed import as_completed

    n = len(items)
    if progress is not None:
        progress(0, n, None)
    if not n:
        return []
    run_id = uuid.uuid4().hex[:8]
    futures: list[Any] = client.map(
        functools.partial(_on_worker, fn, version=__version__),
        items,
        key=[f"gpudiag-analyze-{run_id}-{i}" for i in range(n)],
        pure=False,
    )
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * n
    done = 0
    try:
        for batch in as_completed(futures, loop=client.loop).batches():
            for f in batch:
                if f.status != "finished":
                    raise _task_error(f, items[index[f.key]])
            values = client.gather(list(batch))
            for f, value in zip(batch, values, strict=True):
                results[index[f.key]] = value
                f.release()
                done += 1
                if progress is not None:
                    progress(done, n, value)
    finally:
        if done < n:
            client.cancel(futures)
    return results


def _task_error(f: Any, item: Any) -> BaseException:
    """The error to raise for a task that did not finish, named by its item."""
    from distributed.scheduler import KilledWorker

    label = getattr(item, "label", None) or str(item)
    if f.status == "error":
        err = f.exception()
        if isinstance(err, KilledWorker):
            return EnvironmentProblem(
                f"{label}: the Dask workers analysing it died {err.allowed_failures + 1} times "
                f"(last {err.last_worker.address})",
                "a worker that runs out of memory is killed and restarted: give each worker "
                "thread ~1.3x the trace's uncompressed JSON, or read the worker logs",
            )
        return err if isinstance(err, BaseException) else RuntimeError(str(err))
    return EnvironmentProblem(
        f"{label}: its Dask task was {f.status} (the scheduler or client went away?)",
        "check the scheduler, then run the analysis again",
    )


def _on_worker(fn: Callable[[T], R], item: T, version: str) -> R:
    """Runs on a worker: refuse another gpudiag, name an unreadable path, then ``fn(item)``."""
    if version != __version__:
        raise EnvironmentProblem(
            f"version skew: the client runs gpudiag {version}, this Dask worker {__version__}",
            f"install gpudiag {version} on every worker",
        )
    path = getattr(item, "path", None)
    if isinstance(path, (str, os.PathLike)):
        _check_readable(Path(path))
    return fn(item)


def _check_readable(path: Path) -> None:
    """Raise "the workers cannot read PATH" unless this process can read ``path``."""
    reason = None
    try:
        os.stat(path)
        if not os.access(path, os.R_OK):
            reason = "permission denied"
    except OSError as e:
        reason = (e.strerror or type(e).__name__).lower()
    if reason is not None:
        raise EnvironmentProblem(
            f"the workers cannot read {path} ({reason} on Dask worker {_worker_address()}); "
            "paths must be on a filesystem the workers share",
            SHARED_HINT,
        )


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return "?"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
