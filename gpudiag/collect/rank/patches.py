"""The patches that put the rank hook into torch, ``os`` and ``sys``.

Every wrapper calls the job's function exactly once and returns its result or raises its
exception unchanged; gpudiag's own work around it runs in try/except, and its first error
turns the whole hook into a pass-through (:meth:`RankHook.disable`). A wrapper carries
``__gpudiag_wrapped__`` so nothing is wrapped twice.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpudiag.collect.rank import hangdump
from gpudiag.collect.rank.bootstrap import ENV_EXEC_STATE

if TYPE_CHECKING:
    from gpudiag.collect.rank.hook import RankHook

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
)


def _wrap_data(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __next__(it: Any) -> Any:
        if not hook.enabled:
            return orig(it)
        rng = None
        try:
            if hook.step_start_ns is None:
                hook.step_start_ns = time.time_ns()
            rng = hook.nvtx.start_range("gpudiag.data") if hook.nvtx is not None else None
        except Exception as e:
            hook.disable(e)
        t0 = time.perf_counter_ns()
        try:
            return orig(it)
        finally:
            try:
                hook.add_data_wait(time.perf_counter_ns() - t0)
                if rng is not None:
                    hook.nvtx.end_range(rng)
                if hook.faults:
                    hook.fault("hook:data")
            except Exception as e:
                hook.disable(e)

    return __next__


def _wrap_comm(hook: RankHook, orig: Callable[..., Any], is_wait: bool) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hook.enabled or hook.comm_depth or (not is_wait and kwargs.get("async_op")):
            return orig(*args, **kwargs)
        hook.comm_depth += 1
        rng = None
        try:
            rng = hook.nvtx.start_range("gpudiag.comm") if hook.nvtx is not None else None
        except Exception as e:
            hook.disable(e)
        t0 = time.perf_counter_ns()
        try:
            return orig(*args, **kwargs)
        finally:
            hook.comm_depth -= 1
            try:
                hook.comm_wait_ns += time.perf_counter_ns() - t0
                if rng is not None:
                    hook.nvtx.end_range(rng)
                if hook.faults:
                    hook.fault("hook:comm")
            except Exception as e:
                hook.disable(e)

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_backward(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if not hook.enabled or hook.backward_depth:
            return orig(*args, **kwargs)
        hook.backward_depth += 1
        if hook.backward_at is None:
            hook.backward_at = time.time_ns()
        t0 = time.perf_counter_ns()
        try:
            return orig(*args, **kwargs)
        finally:
            hook.backward_depth -= 1
            try:
                hook.backward_ns += time.perf_counter_ns() - t0
                if hook.faults:
                    hook.fault("hook:backward")
            except Exception as e:
                hook.disable(e)

    return backward


def _wrap_session_start(hook: RankHook, orig: Callable[..., Any], api: str) -> Callable[..., Any]:
    """Before a job profiler session starts: gpudiag closes its own, then notes the job's."""

    @functools.wraps(orig)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if hook.enabled and not hook.profiler.own_depth and not hook.profiler.job_depth:
            try:
                if os.getpid() == hook.pid:
                    if hook.faults:
                        hook.fault("hook:job_profiler")
                    hook.profiler.on_job_profiler_start(obj, api)
            except Exception as e:
                hook.disable(e)  # closes gpudiag's session too: the job's can start
        hook.profiler.job_depth += 1
        try:
            return orig(obj, *args, **kwargs)
        finally:
            hook.profiler.job_depth -= 1

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_session_stop(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        outer = not hook.profiler.own_depth and not hook.profiler.job_depth
        hook.profiler.job_depth += 1
        try:
            return orig(obj, *args, **kwargs)
        finally:
            hook.profiler.job_depth -= 1
            if outer and hook.profiler.job_sessions:
                try:
                    hook.profiler.on_job_profiler_stop(obj)
                except Exception as e:
                    hook.disable(e)

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_schedule(hook: RankHook, orig: Callable[..., Any], start: bool) -> Callable[..., Any]:
    """``torch.profiler.profile.start``/``stop``: which scheduled job profilers are live."""

    @functools.wraps(orig)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if not hook.profiler.own_depth:
            try:
                if start:
                    hook.profiler.job_schedules[id(obj)] = weakref.ref(obj)
                else:
                    hook.profiler.job_schedules.pop(id(obj), None)
            except Exception as e:
                hook.disable(e)
        return orig(obj, *args, **kwargs)

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_export(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``export_chrome_trace`` of the job's profilers: remember where its trace went."""

    @functools.wraps(orig)
    def wrapper(obj: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        outer = not hook.profiler.own_depth and not hook.profiler.export_depth
        hook.profiler.export_depth += 1
        try:
            result = orig(obj, path, *args, **kwargs)
        finally:
            hook.profiler.export_depth -= 1
        if outer and hook.enabled:
            try:
                api = hook.profiler.job_export_api or "export_chrome_trace"
                hook.profiler.on_job_trace(path, api)
            except Exception as e:
                hook.disable(e)
        return result

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_tb_handler(hook: RankHook, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``tensorboard_trace_handler``: its exports are labelled with the handler's name."""

    @functools.wraps(orig)
    def factory(*args: Any, **kwargs: Any) -> Any:
        handler = orig(*args, **kwargs)

        @functools.wraps(handler)
        def handler_fn(prof: Any) -> Any:
            hook.profiler.job_export_api = "tensorboard_trace_handler"
            try:
                return handler(prof)
            finally:
                hook.profiler.job_export_api = None

        return handler_fn

    factory.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return factory


def _wrap_exec(hook: RankHook, orig: Callable[..., Any], with_env: bool) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(path: Any, args: Any, *rest: Any) -> Any:
        if with_env and rest:
            rest = (hook.before_exec(path, args, rest[0]), *rest[1:])
        else:
            hook.before_exec(path, args, None)
        try:
            return orig(path, args, *rest)
        except BaseException:
            os.environ.pop(ENV_EXEC_STATE, None)  # still this image: the file reopens on use
            raise

    wrapper.__gpudiag_wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _patch(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` (a class attribute or module function) by ``make(original)``."""
    orig = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if orig is None or hasattr(orig, "__gpudiag_wrapped__"):
        return
    setattr(owner, name, make(orig))


def install_profiler_guards(torch: ModuleType, hook: RankHook) -> None:
    """Wrap every way a job starts a profiler session or exports its trace."""
    import torch.autograd.profiler as ap
    import torch.profiler as tp
    from torch.profiler import profiler as tpp

    def start(api: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return lambda orig: _wrap_session_start(hook, orig, api)

    def stop(orig: Callable[..., Any]) -> Callable[..., Any]:
        return _wrap_session_stop(hook, orig)

    kineto = tpp._KinetoProfile
    for name in ("prepare_trace", "start_trace"):
        _patch(kineto, name, start("torch.profiler.profile"))
    _patch(kineto, "stop_trace", stop)
    for name in ("_prepare_trace", "_start_trace"):
        _patch(ap.profile, name, start("torch.autograd.profiler.profile"))
    _patch(ap.profile, "__exit__", stop)
    for cls, api in (("emit_nvtx", "emit_nvtx"), ("emit_itt", "emit_itt")):
        c = getattr(ap, cls, None)
        if c is not None:
            _patch(c, "__enter__", start(f"torch.autograd.profiler.{api}"))
            _patch(c, "__exit__", stop)
    with suppress(ImportError):
        import torch.autograd.profiler_legacy as legacy

        _patch(legacy.profile, "_start_trace", start("torch.autograd.profiler_legacy.profile"))
        _patch(legacy.profile, "__exit__", stop)
    _patch(tpp.profile, "start", lambda o: _wrap_schedule(hook, o, True))
    _patch(tpp.profile, "stop", lambda o: _wrap_schedule(hook, o, False))
    _patch(kineto, "export_chrome_trace", lambda o: _wrap_export(hook, o))
    _patch(ap.profile, "export_chrome_trace", lambda o: _wrap_export(hook, o))
    tb = tpp.tensorboard_trace_handler
    wrapped = _wrap_tb_handler(hook, tb)
    for mod in (tp, tpp):
        if getattr(mod, "tensorboard_trace_handler", None) is tb:
            setattr(mod, "tensorboard_trace_handler", wrapped)  # noqa: B010


def install_all(torch: ModuleType, hook: RankHook) -> None:
    """Register the optimizer hook and patch DataLoader, backward, collectives, profilers, exec."""
    hook.torch = torch
    if hook.faults:
        hook.fault("hook:install")
    if os.environ.get("GPUDIAG_NVTX", "1") != "0":
        try:
            import nvtx

            hook.nvtx = nvtx
        except Exception:
            hook.nvtx = None
    try:
        install_profiler_guards(torch, hook)
    except Exception as e:
        # Without the guards a job that profiles itself could crash: gpudiag does not profile.
        hook.profiler.window = None
        hook.fail(f"profiler guards not installed ({type(e).__name__}: {e}); no gpudiag window")
    import torch.optim.optimizer as topt

    topt.register_optimizer_step_post_hook(hook.on_optimizer_step)
    try:
        topt.register_optimizer_step_pre_hook(hook.on_optimizer_pre)
        _install_forward_mark(torch, hook)
    except Exception as e:
        hook.record_error("gpudiag", f"step phases not instrumented: {e}")
    try:
        from torch.utils.data import dataloader

        it_cls = dataloader._BaseDataLoaderIter
        it_cls.__next__ = _wrap_data(hook, it_cls.__next__)  # type: ignore[method-assign]
    except Exception as e:
        hook.record_error("gpudiag", f"DataLoader not instrumented: {e}")
    try:
        import torch.autograd

        torch.autograd.backward = _wrap_backward(hook, torch.autograd.backward)
    except Exception as e:
        hook.record_error("gpudiag", f"backward not instrumented: {e}")
    try:
        _install_comm(torch, hook)
    except Exception as e:
        hook.record_error("gpudiag", f"collectives not instrumented: {e}")
    hangdump.install(torch, hook)
    _patch(os, "execv", lambda o: _wrap_exec(hook, o, with_env=False))
    _patch(os, "execve", lambda o: _wrap_exec(hook, o, with_env=True))
    os.register_at_fork(after_in_child=hook.after_fork_in_child)
    atexit.register(hook.at_exit)
    _chain_excepthook(hook)


def _install_forward_mark(torch: ModuleType, hook: RankHook) -> None:
    """A global module forward pre-hook that marks the step's first module call.

    It removes itself when it fires (every later module call of the step takes PyTorch's
    fast path, which any global hook would turn off); the step's end registers it again.
    """
    from torch.nn.modules import module as nn_module

    handle: list[Any] = []

    def mark(module: Any, args: Any) -> None:
        try:
            hook.on_forward_pre(module, args)
            if handle:
                handle.pop().remove()
        except Exception as e:
            hook.disable(e)

    def arm() -> None:
        if not handle:
            handle.append(nn_module.register_module_forward_pre_hook(mark))

    hook.arm_forward = arm
    arm()


def _install_comm(torch: ModuleType, hook: RankHook) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    hook.dist_initialized = dist.is_initialized
    for name in COLLECTIVES:
        orig = getattr(c10d, name, None)
        if orig is None or hasattr(orig, "__gpudiag_wrapped__"):
            continue
        w = _wrap_comm(hook, orig, is_wait=False)
        setattr(c10d, name, w)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, w)
    work = getattr(torch._C._distributed_c10d, "Work", None)
    if work is not None:
        work.wait = _wrap_comm(hook, work.wait, is_wait=True)


def _chain_excepthook(hook: RankHook) -> None:
    prev = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        with suppress(Exception):
            if os.getpid() == hook.pid:
                hook.record_error("job", f"{tp.__name__}: {value}")
        prev(tp, value, tb)

    sys.excepthook = excepthook
