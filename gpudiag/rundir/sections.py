"""The manifest's ``extra`` sections, typed: what collect records and traces reads back.

``RunManifest.extra`` is a :class:`ManifestExtra`: one key a section, each section's
fields typed. It stays a JSON object on disk, as every manifest has held it (run
directories already on users' disks load as they are); keys this version does not
name (another version's, a hand edit) are kept as read and written back. A reader never
trusts a section's shape (a manifest is edited by hand at times): it checks what it uses.
docs/run-directory.md, "Manifest additions from `gpudiag run`", lists them.
"""

from typing import Any, Literal, TypedDict

# what a live watcher records under its name (gpudiag/live/: the alerts monitor)
WatcherName = Literal["alerts"]


class NsysSection(TypedDict):
    """``extra.nsys``: the Nsight Systems binary that captured, and its capture range."""

    binary: str
    version: str
    range: str


class FlightRecorderSection(TypedDict, total=False):
    """``extra.flight_recorder``: what ``gpudiag run`` set for torch's flight recorder."""

    buffer_size: int | str  # gpudiag's (an int) or the job's own setting (as set)
    set_by: str  # "gpudiag", or "the job (VARIABLE)"
    torch_dump_prefix: str  # where torch's own dumps land (unless the job chose a path)


class HangSection(TypedDict, total=False):
    """``extra.hang``: the hang watchdog's record when it fired (collect/launch/watchdog.py)."""

    request_id: str
    detected_ns: int
    idle_s: float
    timeout_s: float
    steps: dict[str, int]  # rank (a JSON key) → steps finished
    expected_ranks: list[int]
    answered_ranks: list[int]
    answer_s: float
    report_ns: int | None
    resumed_ns: int | None
    killed: bool
    kill_signal: str  # with --on-hang kill: SIGINT, SIGTERM or SIGKILL
    job_exit_code: int | None


class InterruptedSection(TypedDict):
    """``extra.interrupted``: the job was stopped with Ctrl-C (collect/launch/outcome.py)."""

    signal: str
    job_exit_code: int | None


class RankError(TypedDict):
    """One entry of ``extra.rank_errors``: a rank's error record."""

    rank: int
    where: str | None
    message: str | None


class JobTrace(TypedDict):
    """One entry of ``extra.job_traces``: a trace the job's own profiler exported."""

    rank: int
    path: str | None
    api: str | None
    step: int | None  # gpudiag's step when it was written
    time_ns: int | None
    exists: bool  # checked when the run ended


class JobProfilerSession(TypedDict):
    """One entry of ``extra.job_profiler``: a session of the job's own profiler."""

    rank: int
    api: str | None
    start_step: int | None
    start_ns: int | None
    stop_step: int | None  # None: still open at exit
    stop_ns: int | None


class ProfileWindow(TypedDict):
    """One entry of ``extra.profile_windows``: a rank's ``window`` record."""

    rank: int
    window: list[int] | None  # [start, stop) in gpudiag steps
    status: str | None
    step: int | None
    reason: str | None
    kept: list[int] | None  # [start, stop) of the steps the rank kept
    job_api: str | None
    job_since_step: int | None


class ManifestExtra(TypedDict, total=False):
    """``RunManifest.extra``: the sections ``gpudiag run`` (and ``attach``) add, by name."""

    # gpudiag run: how it was called, and where it wrote
    gpudiag_argv: list[str]
    run_dir: str
    driver_version: str
    nsys: NsysSection
    child_pid: int  # the launched command's PID, written right after launch
    flight_recorder: FlightRecorderSection
    # the job ended: the signals passed on, each rank's steps and errors
    signals_forwarded: list[str]
    steps_per_rank: dict[str, int]  # rank (a JSON key) → steps
    rank_errors: list[RankError]
    job_traces: list[JobTrace]
    job_profiler: list[JobProfilerSession]
    profile_windows: list[ProfileWindow]
    alerts: dict[str, Any]  # the live monitor's summary (docs/run-directory.md, free-form)
    hang: HangSection
    interrupted: InterruptedSection
    # gpudiag attach: the process it sampled
    attached_pid: int
    process_tree: list[int]
    gpu_selection: str
