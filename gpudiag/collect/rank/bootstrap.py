"""Tiny entry run before user code (sitecustomize / runpy) so the rank hook is installed first.

``gpudiag run`` prepends ``gpudiag/collect/rank/_site`` to ``PYTHONPATH``; Python's ``site``
imports the ``sitecustomize`` there in every interpreter the job starts. :func:`boot`
then (1) runs the next ``sitecustomize`` further down ``sys.path``, if any, and (2) when
this process may be a rank, adds a ``sys.meta_path`` finder that installs
:mod:`gpudiag.collect.rank.hook` right after the job finishes importing torch. Processes
that never import torch pay for one finder lookup per import and nothing else.

A process is a rank when ``GPUDIAG_RUN_DIR`` is set and it is not torchrun's agent
(no ``LOCAL_RANK`` and a torchrun/``torch.distributed.run`` command line), not a
multiprocessing child (DataLoader workers, spawn start-up) and not a descendant of an
instrumented rank (``GPUDIAG_RANK_PID`` names another process). Without ``RANK`` it is
rank 0 of 1. ``GPUDIAG_RANK_PID`` naming this very process means a rank ``exec``'d a new
image: it continues that rank (same telemetry file, same step count) when the rank's
hook handed its state on in ``GPUDIAG_EXEC_STATE``, and is left alone otherwise.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV_RUN_DIR = "GPUDIAG_RUN_DIR"
ENV_PROFILE = "GPUDIAG_PROFILE_STEPS"
ENV_NODE_RANK = "GPUDIAG_NODE_RANK"
ENV_RANK_PID = "GPUDIAG_RANK_PID"
ENV_PKG_ROOT = "GPUDIAG_PKG_ROOT"
ENV_EXEC_STATE = "GPUDIAG_EXEC_STATE"
ENV_FAULT = "GPUDIAG_FAULT"

_booted = False


def site_dir() -> Path:
    """The directory holding gpudiag's ``sitecustomize.py``."""
    return Path(__file__).resolve().parent / "_site"


def chain_sitecustomize(own_dir: str) -> ModuleType | None:
    """Import the ``sitecustomize`` that ours shadows, if one exists further down sys.path."""
    own = os.path.realpath(own_dir)
    rest = [p for p in sys.path if os.path.realpath(p or ".") != own]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_gpudiag_chained_sitecustomize"] = mod
    spec.loader.exec_module(mod)
    return mod


def _raw_cmdline() -> list[str]:
    """The interpreter's own command line (``sys.argv`` is not final while site runs)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _is_torchrun_agent(argv: Sequence[str]) -> bool:
    raw = _raw_cmdline()
    # `python -m torch.distributed.run ...`: at sitecustomize time sys.argv is only ['-m']
    for i, a in enumerate(raw[:-1]):
        if a == "-m" and raw[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return True
    if not argv:
        return False
    prog = os.path.basename(argv[0])
    if prog in ("torchrun", "torchrun.py"):
        return True
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", "") or ""
    return name in ("torch.distributed.run", "torch.distributed.launch") or (
        argv[0].endswith(("torch/distributed/run.py", "torch/distributed/launch.py"))
    )


def is_rank_process(env: dict[str, str] | None = None, argv: Sequence[str] | None = None) -> bool:
    """Whether this process should be instrumented as a rank (see the module docstring)."""
    env = dict(os.environ) if env is None else env
    argv = sys.argv if argv is None else argv
    if not env.get(ENV_RUN_DIR):
        return False
    owner = env.get(ENV_RANK_PID)
    if owner:
        # Another process: a rank's descendant. This process: an image a rank exec'd.
        return owner == str(os.getpid()) and exec_state(env) is not None
    if "--multiprocessing-fork" in argv:
        return False
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return False
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        return False
    return not ("LOCAL_RANK" not in env and _is_torchrun_agent(argv))


def exec_state(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The state a rank's hook handed to the image it exec'd, if it is this process's."""
    env = dict(os.environ) if env is None else env
    raw = env.get(ENV_EXEC_STATE)
    if not raw:
        return None
    try:
        state = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(state, dict) or state.get("pid") != os.getpid():
        return None
    return state


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Finds torch with the other finders and runs a callback once it has been executed."""

    def __init__(self, callback: Callable[[ModuleType], None]) -> None:
        self.callback = callback
        self.busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PostExecLoader(spec.loader, self.callback)
        _remove_watcher()
        return spec


class _PostExecLoader(importlib.abc.Loader):
    """Delegates to the real loader, restores it on the module, then calls the callback."""

    def __init__(self, inner: Any, callback: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        result: ModuleType | None = self.inner.create_module(spec)
        return result

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        self.callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _remove_watcher() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchWatcher)]


def on_torch_imported(torch: ModuleType) -> None:
    """Decide whether this is a rank now that argv and multiprocessing state are known."""
    try:
        if not is_rank_process():
            return
        from gpudiag.collect.rank import hook

        env = os.environ
        state = exec_state()
        os.environ.pop(ENV_EXEC_STATE, None)
        os.environ[ENV_RANK_PID] = str(os.getpid())  # descendants are not ranks
        try:
            window = hook.parse_window(env.get(ENV_PROFILE, "5:10"))
        except ValueError as e:
            sys.stderr.write(f"gpudiag: {e}; profiling off\n")
            window = None
        h = hook.RankHook(
            run_dir=Path(env[ENV_RUN_DIR]),
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            node_rank=int(env.get("GROUP_RANK", env.get(ENV_NODE_RANK, "0"))),
            window=window,
            faults=env.get(ENV_FAULT),
        )
        if state is not None:
            h.continue_after_exec(state)
        try:
            hook.install(torch, h)
        except Exception as e:
            # Say so where the run's manifest will see it, when the directory is writable.
            h.record_error("gpudiag", f"rank hook not installed: {type(e).__name__}: {e}")
            raise
    except Exception as e:
        sys.stderr.write(f"gpudiag: rank hook not installed ({type(e).__name__}: {e})\n")


def boot(own_dir: str) -> None:
    """Entry point called by gpudiag's ``sitecustomize``."""
    global _booted
    if _booted:
        return
    _booted = True
    try:
        chain_sitecustomize(own_dir)
    except Exception as e:
        sys.stderr.write(f"gpudiag: the job's own sitecustomize failed: {e}\n")
    if not os.environ.get(ENV_RUN_DIR):
        return
    if "torch" in sys.modules:
        on_torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchWatcher(on_torch_imported))
