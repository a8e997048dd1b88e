"""Safe file access: inputs are regular files read within limits; outputs never damage a file.

Inputs (traces, manifests, telemetry, saved diagnoses) are checked *before* they are
opened: a FIFO named ``rank-0.json`` would block the reader forever and a link to
``/dev/zero`` would fill memory, so anything but a regular file is refused with one line
naming it. Files are opened with ``O_NONBLOCK`` and checked again on the open descriptor,
so a file swapped for a FIFO between the check and the open cannot hang the reader either.

Outputs (``-o``, ``--save-baseline``, ``--junit``, ``--markdown``) follow the rules of
docs/cli.md: ``-`` is stdout; a regular file, or a path that does not exist yet, is written
to a temporary file beside it and renamed into place (a reader never sees half a report),
with the mode the umask gives a new file (an existing file keeps its own); a character
device, a FIFO or a symbolic link is written through directly and never replaced; a
directory, a block device or a socket is refused. Failures are one line: a bad path is a
usage error (exit 2), a path that cannot be written here (permissions, read-only or full
file system) an environment problem (exit 3).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from gpudiag._support import lazyre
from gpudiag.errors import EnvironmentProblem, InputError, UsageError

READ_HINT = "check the path and its permissions (ls -l), or give the files that can be read"
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a file mode is, in words (``a FIFO (named pipe)``)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _read_error(path: Path | str, e: OSError) -> InputError:
    if isinstance(e, PermissionError):
        return InputError(path, "permission denied", READ_HINT)
    if isinstance(e, FileNotFoundError):
        return InputError(path, "no such file or directory", "check the path")
    return InputError(path, f"cannot read ({e.strerror or e})", READ_HINT)


def _refuse(path: Path | str, mode: int) -> InputError:
    link = ", through a symbolic link" if _is_link(path) else ""
    return InputError(
        path,
        f"not a regular file ({kind_of(mode)}{link})",
        "give the trace, report or run directory itself; gpudiag reads regular files only",
    )


def _is_link(path: Path | str) -> bool:
    try:
        return os.path.islink(path)
    except OSError:  # pragma: no cover - islink does not raise
        return False


def check_regular(path: Path | str) -> os.stat_result:
    """The file's status; InputError unless it is a regular file that exists."""
    try:
        st = os.stat(path)  # follows links: the target is what would be read
    except OSError as e:
        raise _read_error(path, e) from e
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode)
    return st


def open_input(path: Path | str) -> BinaryIO:
    """Open a regular file for reading in binary; InputError for anything else.

    The check is made on the path and again on the open descriptor (``O_NONBLOCK`` keeps a
    FIFO swapped in between from blocking the open).
    """
    check_regular(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise _read_error(path, e) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: Path | str, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (``what`` names it in errors)."""
    with open_input(path) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise _read_error(path, e) from e
    if len(data) > limit:
        raise InputError(
            path,
            f"larger than {limit >> 20} MiB, far more than any {what}",
            f"this is not a {what}; give the file gpudiag wrote",
        )
    return data


def read_lines(path: Path | str, line_limit: int, what: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line with its newline) of a regular file, each line at most ``line_limit``.

    The last line has no newline when the writer was killed mid-line. Memory holds one line.
    """
    with open_input(path) as f:
        n = 0
        while True:
            try:
                line = f.readline(line_limit + 1)
            except OSError as e:
                raise _read_error(path, e) from e
            if not line:
                return
            n += 1
            if len(line) > line_limit and not line.endswith(b"\n"):
                raise InputError(
                    path,
                    f"line {n} is longer than {line_limit >> 10} KiB: not a {what} record",
                    f"this is not a {what} file; give the file gpudiag wrote",
                )
            yield n, line


def list_dir(d: Path) -> list[Path]:
    """The entries of directory ``d``, sorted ([] if there is none); InputError if unreadable."""
    try:
        return sorted(d / name for name in os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise _read_error(d, e) from e


def walk_dir(root: Path) -> Iterator[Path]:
    """Every entry under ``root`` except hidden ones, sorted; InputError on an unreadable one."""

    def fail(e: OSError) -> None:
        raise _read_error(e.filename or root, e) from e

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        base = Path(dirpath)
        for name in sorted(filenames):
            if not name.startswith("."):
                yield base / name


# ---- outputs


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it the only other way, and put it back
    os.umask(mask)
    return mask


_FD_LINK = lazyre.compile(r"^/(?:dev/fd|proc/self/fd|proc/(\d+)/fd)/(\d+)$")


def _descriptor(path: str) -> int | None:
    """The descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/3``).

    Such a path is written through the open descriptor, never reopened: reopening
    ``/dev/stdout`` of ``cmd >> log`` with truncation would erase the log.
    """
    p = os.path.abspath(path)
    for _ in range(8):
        m = _FD_LINK.match(p)
        if m and (m.group(1) is None or int(m.group(1)) == os.getpid()):
            return int(m.group(2))
        if not os.path.islink(p):
            return None
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return None


def _write_error(path: Path | str, e: OSError) -> EnvironmentProblem:
    why = {
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EROFS: "read-only file system",
        errno.ENOSPC: "no space left on device",
    }
    reason = why.get(e.errno or 0) or (e.strerror or str(e)).lower()
    return EnvironmentProblem(
        f"cannot write {path} ({reason})",
        "choose a file in a directory you can write to, or `-o -` for stdout",
    )


def check_output(path: Path | str) -> str:
    """How ``path`` will be written: ``stdout``, ``replace`` (atomically) or ``direct``.

    UsageError for a directory, a block device, a socket or a missing parent directory.
    """
    p = str(path)
    if p == "-":
        return "stdout"
    try:
        lst = os.lstat(p)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(parent):
            raise UsageError(
                f"cannot write {p}: no such directory {parent}",
                "create the directory first, or choose another output path",
            ) from None
        return "replace"
    except OSError as e:
        raise _write_error(p, e) from e
    if stat.S_ISLNK(lst.st_mode):
        try:
            target = os.stat(p).st_mode
        except FileNotFoundError:
            return "direct"  # a dangling link: writing through it creates its target
        except OSError as e:
            raise _write_error(p, e) from e
    else:
        target = lst.st_mode
    if stat.S_ISDIR(target) or stat.S_ISBLK(target) or stat.S_ISSOCK(target):
        raise UsageError(
            f"cannot write {p}: it is {kind_of(target)}",
            "give a file name (e.g. -o report.html), or `-o -` for stdout",
        )
    if stat.S_ISLNK(lst.st_mode) or not stat.S_ISREG(target):
        return "direct"
    if not os.access(p, os.W_OK):  # a rename would replace it anyway: respect the mode
        raise _write_error(p, PermissionError(errno.EACCES, "read-only file"))
    return "replace"


@contextlib.contextmanager
def write_output(path: Path | str, newline: str | None = None) -> Iterator[TextIO]:
    """A text stream to write an output to, by the rules in the module docstring.

    Nothing is written to the target until the body has finished without an exception:
    a replaced file is renamed into place only then, and a direct target (a link, a FIFO,
    a device) receives the whole text at once at the end.
    """
    with _output(path, "w", newline) as f:
        yield f


@contextlib.contextmanager
def write_output_bytes(path: Path | str) -> Iterator[BinaryIO]:
    """:func:`write_output` for binary outputs (a gzipped timeline)."""
    with _output(path, "wb", None) as f:
        yield f


@contextlib.contextmanager
def _output(path: Path | str, mode: str, newline: str | None) -> Iterator[Any]:
    binary = "b" in mode
    kw: dict[str, Any] = {} if binary else {"encoding": "utf-8", "newline": newline}
    how = check_output(path)
    if how == "stdout":
        yield sys.stdout.buffer if binary else sys.stdout
        sys.stdout.flush()
        return
    if how == "direct":
        buf: Any = io.BytesIO() if binary else io.StringIO(newline=newline)
        yield buf
        fd = _descriptor(str(path))
        try:
            if fd is not None:
                if fd in (1, 2):
                    (sys.stdout if fd == 1 else sys.stderr).flush()
                with os.fdopen(os.dup(fd), mode, **kw) as f:
                    f.write(buf.getvalue())
            else:
                with open(path, mode, **kw) as f:
                    f.write(buf.getvalue())
        except OSError as e:
            raise _write_error(path, e) from e
        return
    target = Path(path)
    try:
        old = os.stat(target)
        perm = stat.S_IMODE(old.st_mode)
    except FileNotFoundError:
        perm = 0o666 & ~_umask()
    except OSError as e:
        raise _write_error(path, e) from e
    import tempfile  # only to write a file (random, which it imports, costs ~2 ms)

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise _write_error(path, e) from e
    try:
        with os.fdopen(fd, mode, **kw) as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), perm)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _write_error(path, e) from e
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
