"""Where a rank is, from its main thread's stack: the job's own frames, the collective it waits in.

Library and standard-library frames are skipped; the innermost frames of the job's own code
say where a rank is (the hang and failure verdicts quote them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from gpudiag.traces.runfiles.flightrec import Frame, ThreadStack

_LIBRARY = ("/site-packages/", "/dist-packages/", "<frozen", "/gpudiag/collect/", "/torch/")


_STDLIB = re.compile(r"/lib/python3\.\d+/")


WHERE_FRAMES = 3


def _is_library(f: Frame) -> bool:
    return any(m in f.filename for m in _LIBRARY) or bool(_STDLIB.search(f.filename))


def user_frames(stack: ThreadStack, n: int = WHERE_FRAMES) -> tuple[Frame, ...]:
    """The innermost ``n`` frames of the job's own code (libraries and the stdlib skipped)."""
    own = [f for f in stack.frames if not _is_library(f)]
    return tuple(own[:n])


def where_text(frames: Sequence[Frame]) -> str:
    """``load_batch (train.py:57) ← main (train.py:88)``."""
    return " ← ".join(f"{f.name} ({os.path.basename(f.filename)}:{f.line})" for f in frames)


def collective_of(stack: ThreadStack) -> str | None:
    """The torch.distributed call the thread is blocked in (innermost), if any."""
    for f in stack.frames:
        if f.filename.endswith("distributed_c10d.py") and not f.name.startswith("_"):
            return f.name
    return None
