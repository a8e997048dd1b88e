"""The GpudiagError hierarchy: every expected failure carries a message, a hint and an exit code."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INPUT = 4
EXIT_INCONCLUSIVE = 5


class GpudiagError(Exception):
    """An expected failure, shown to the user as one line plus a hint, never a traceback."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors raised in worker processes cross back pickled; subclasses take other
        # constructor arguments, so rebuild from the state rather than from ``args``.
        return (_restore, (type(self), dict(self.__dict__)))


def _restore(cls: type[GpudiagError], state: dict[str, Any]) -> GpudiagError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message", ""))
    err.__dict__.update(state)
    return err


class UsageError(GpudiagError):
    """The command line asks for something inconsistent."""

    exit_code = EXIT_USAGE


class EnvironmentProblem(GpudiagError):
    """This host lacks something the command needs (nsys, NVML, torch)."""

    exit_code = EXIT_ENVIRONMENT


class InputError(GpudiagError):
    """An input cannot be used: unreadable, truncated, unknown format, no ranks."""

    exit_code = EXIT_INPUT

    def __init__(self, path: object, problem: str, hint: str = "") -> None:
        super().__init__(f"{path}: {problem}", hint)
        self.path = str(path)
        self.problem = problem


class GateFailed(GpudiagError):
    """The performance gate found a regression or a threshold breach."""

    exit_code = EXIT_GATE_FAILED


class GateInconclusive(GpudiagError):
    """The gate could not decide (too few steps, a metric unavailable)."""

    exit_code = EXIT_INCONCLUSIVE
