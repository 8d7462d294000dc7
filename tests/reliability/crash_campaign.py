"""SIGKILL ``patchcraft apply`` at random moments and check nothing is lost.

Each run is the real command line entry point, ``patchcraft.cli.main(["apply",
TREE])``, in a child forked from a process that already imported patchcraft
(so a run costs the apply itself, not an interpreter start-up; a few runs
of ``python -m patchcraft`` are killed too).

When to kill: an uninterrupted run is measured once per lane (its duration,
and how long its write phase lasts). Then each run draws either

* a moment anywhere in the run (uniform over the measured duration), or
* a moment in the write phase, where a kill can actually hurt: the parent
  watches the models directory, and when the child's first temporary file
  appears it waits a delay drawn uniformly over the measured write phase
  (first temporary file seen to last one renamed, plus a fifth), or
* a moment in the rename phase: when the first file to patch has been
  replaced (its inode changed), a delay drawn over the measured rename
  phase (first to last rename, plus half), where a kill leaves some files
  patched and others not.
  Keying on that event, not on the clock, keeps the draws in the write
  phase on a loaded machine too.

After every run each file of the tree must be byte-identical to the
original or to the fully patched version (the output of an uninterrupted
apply). Then "re-running apply completes the job" is checked: an
uninterrupted apply from that exact state must leave the fully patched
tree, no temporary and no lock file, and the reference exit code. The
outcome of a re-run depends only on the bytes it starts from, so it is run
once per distinct post-kill state. Half of the runs start from the state
the previous kill left (a killed re-run), the rest from the original.

Two lanes (two trees) run side by side, one per core, from one
single-threaded loop (fork and threads do not mix).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from reliability_kit import compare, reduced_release, restore, snapshot, temp_files

VERSION = "0.5.10"
#: Real files of 0.5.10: apertus is CRLF, qwen3's inner model lives in qwen2,
#: qwen2_classification starts with a UTF-8 BOM (and has no EAGLE-3 setter).
KEEP = ("apertus", "qwen2", "qwen3", "qwen2_classification")
#: Shares of the kill draws: anywhere, in the write phase, in the rename phase.
DRAWS = (("anywhere in the run", 0.35), ("in the write phase", 0.35), ("in the rename phase", 0.30))
POLL = 0.0005

Sabotage = Optional[Callable[[], None]]


def fork_apply(package: Path, sabotage: Sabotage = None) -> int:
    """Start ``patchcraft apply PACKAGE`` in a forked child; return its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        # pytest's capture replaced sys.stdout/stderr with files of its own: use the real ones
        sys.stdin, sys.stdout, sys.stderr = (
            open(fd, mode, closefd=False) for fd, mode in ((0, "r"), (1, "w"), (2, "w"))
        )
        _close_inherited_descriptors()
        os.nice(5)  # the watching parent must see the short write phase: it runs first
        if sabotage is not None:
            sabotage()
        from patchcraft import cli

        cli.main(["apply", "--color", "never", str(package)])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os._exit(code)


def _close_inherited_descriptors() -> None:
    """Close what the test process had open (pytest's output pipes among them)."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:
                pass


def outcome_of(status: int) -> tuple[bool, int]:
    """(killed, exit code) from a ``waitpid`` status."""
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status) == signal.SIGKILL, -os.WTERMSIG(status)
    return False, os.WEXITSTATUS(status)


@dataclass
class Job:
    """One child in flight: a run to kill, or a re-run to let finish."""

    kind: str  # "kill" | "complete" | "calibrate"
    pid: int
    started: float
    deadline: float = float("inf")
    after_write: Optional[float] = None  # kill this long after the write phase starts
    write_seen: Optional[float] = None
    write_end: Optional[float] = None  # its temporary files are all renamed
    after_rename: Optional[float] = None  # kill this long after the first file is replaced
    rename_seen: Optional[float] = None
    inodes: dict = field(default_factory=dict)


@dataclass
class Lane:
    """One tree and the reference an uninterrupted apply produced on it."""

    package: Path
    original: dict
    patched: dict = field(default_factory=dict)
    exit_code: int = 0
    duration: float = 0.0
    write_phase: float = 0.0
    rename_phase: float = 0.0
    job: Optional[Job] = None
    post_kill: Optional[dict] = None

    @property
    def models(self) -> Path:
        return self.package / "srt" / "models"

    @property
    def changed(self) -> list[str]:
        return sorted(rel for rel in self.original if self.original[rel] != self.patched.get(rel))


@dataclass
class CrashFigures:
    runs: int = 0
    outcomes: Counter = field(default_factory=Counter)
    draws: Counter = field(default_factory=Counter)
    starts: Counter = field(default_factory=Counter)
    lost: int = 0
    lost_files: list = field(default_factory=list)
    temp_left: int = 0
    lock_left: int = 0
    file_checks: int = 0
    rerun_states: int = 0
    rerun_failures: list = field(default_factory=list)
    exit_mismatches: list = field(default_factory=list)
    reference_exit: int = 0
    files_per_tree: int = 0
    files_patched: int = 0
    duration: float = 0.0
    write_phase: float = 0.0
    rename_phase: float = 0.0
    #: Runs added past ``runs`` because none had yet landed between two replacements (``campaign(top_up=)``).
    top_ups: int = 0

    def as_dict(self) -> dict:
        return {
            "runs": self.runs,
            "top_ups": self.top_ups,
            "outcomes": dict(self.outcomes),
            "kill_draws": dict(self.draws),
            "start_states": dict(self.starts),
            "files_per_tree": self.files_per_tree,
            "file_checks": self.file_checks,
            "lost": self.lost,
            "temp_files_left_by_kills": self.temp_left,
            "lock_files_left_by_kills": self.lock_left,
            "distinct_post_kill_states_rerun": self.rerun_states,
            "rerun_failures": len(self.rerun_failures),
            "exit_code_mismatches": len(self.exit_mismatches),
            "reference_exit_code": self.reference_exit,
            "files_patched_by_apply": self.files_patched,
            "apply_seconds": round(self.duration, 3),
            "write_phase_seconds": round(self.write_phase, 3),
            "rename_phase_seconds": round(self.rename_phase, 4),
        }


def make_lanes(base: Path, count: int, keep=KEEP, version: str = VERSION) -> list[Lane]:
    lanes = []
    for index in range(count):
        package = reduced_release(version, base / f"lane{index}", keep, executor=False)
        lanes.append(Lane(package=package, original=snapshot(package)))
    return lanes


def _start(lane: Lane, kind: str, sabotage: Sabotage = None) -> Job:
    inodes = {path: path.stat().st_ino for path in lane.models.glob("*.py")}
    lane.job = Job(kind=kind, pid=fork_apply(lane.package, sabotage), started=time.monotonic(), inodes=inodes)
    return lane.job


def _replaced(lane: Lane, job: Job) -> bool:
    """Whether one of the files to patch is no longer the inode it was (it was replaced)."""
    for path, inode in job.inodes.items():
        try:
            if path.stat().st_ino != inode:
                return True
        except FileNotFoundError:
            return True
    return False


def _poll(lane: Lane, now: float) -> Optional[int]:
    """Advance ``lane``'s job: notice its write phase, kill it when due; its status once done."""
    job = lane.job
    assert job is not None
    if job.write_seen is None:
        if temp_files(lane.models):
            job.write_seen = now
            if job.after_write is not None:
                job.deadline = now + job.after_write
    elif job.write_end is None and not temp_files(lane.models):
        job.write_end = now
    if job.rename_seen is None and job.write_seen is not None and _replaced(lane, job):
        job.rename_seen = now
        if job.after_rename is not None:
            job.deadline = now + job.after_rename
    pid, status = os.waitpid(job.pid, os.WNOHANG)
    if not pid and now >= job.deadline:
        os.kill(job.pid, signal.SIGKILL)
        pid, status = os.waitpid(job.pid, 0)
    return status if pid else None


def warm_up(package: Path) -> None:
    """Import, before forking, all that an apply imports lazily.

    Children then start with the code in memory: no import time in a run,
    and every run, the reference included, runs the very same code.
    """
    import libcst  # noqa: F401
    import rich.console  # noqa: F401
    import rich.table  # noqa: F401
    import rich.text  # noqa: F401

    import patchcraft.cli  # noqa: F401
    import patchcraft.commands._pipeline  # noqa: F401
    import patchcraft.commands.apply  # noqa: F401
    from patchcraft.engine.tree_run import run
    from patchcraft.engine.records import Mode
    from patchcraft.base.target import resolve_target

    run(resolve_target(str(package)), Mode.CHECK)


def calibrate(lanes: list[Lane], sabotage: Sabotage = None) -> None:
    """One uninterrupted apply per lane, side by side: reference bytes and timings."""
    warm_up(lanes[0].package)
    for lane in lanes:
        _start(lane, "calibrate", sabotage)
    while any(lane.job for lane in lanes):
        now = time.monotonic()
        for lane in lanes:
            if lane.job is None:
                continue
            status = _poll(lane, now)
            if status is None:
                continue
            job, lane.job = lane.job, None
            killed, lane.exit_code = outcome_of(status)
            assert not killed
            lane.duration = now - job.started
            assert job.write_seen is not None, "apply wrote nothing: nothing to crash-test"
            lane.write_phase = (job.write_end or now) - job.write_seen
            lane.rename_phase = max((job.write_end or now) - (job.rename_seen or job.write_seen), 0.002)
            lane.patched = snapshot(lane.package)
            restore(lane.package, lane.original)
        time.sleep(POLL)


def _schedule(lane: Lane, rng: random.Random, figures: CrashFigures, sabotage: Sabotage) -> None:
    job = _start(lane, "kill", sabotage)
    draw = rng.choices([name for name, _ in DRAWS], weights=[share for _, share in DRAWS])[0]
    figures.draws[draw] += 1
    if draw == "in the write phase":
        job.after_write = rng.uniform(0.0, lane.write_phase * 1.2)
    elif draw == "in the rename phase" and not sabotage:
        job.after_rename = rng.uniform(0.0, lane.rename_phase * 1.5)
    else:
        job.deadline = job.started + rng.uniform(0.0, lane.duration * 1.05)


#: The outcome the campaign is for: a kill that left some files patched and others not.
BETWEEN = "killed between two file replacements"


def campaign(
    lanes: list[Lane],
    runs: int,
    rng: random.Random,
    sabotage: Sabotage = None,
    until_lost: bool = False,
    top_up: int = 0,
) -> CrashFigures:
    """Run ``runs`` killed applies over the lanes; check every state and every re-run.

    ``top_up``: while no kill has landed between two file replacements, up to that many more runs (same
    draws, same checks). On a loaded machine the parent that watches for the first rename can be scheduled
    too late for every draw of a short campaign; the window must still be reached, so it draws again.
    """
    first = lanes[0]
    figures = CrashFigures(
        reference_exit=first.exit_code, files_patched=len(first.changed), files_per_tree=len(first.original)
    )
    figures.duration = max(lane.duration for lane in lanes)
    figures.write_phase = max(lane.write_phase for lane in lanes)
    figures.rename_phase = max(lane.rename_phase for lane in lanes)
    seen: set = set()
    to_start = runs
    while to_start or any(lane.job for lane in lanes):
        for lane in lanes:
            if lane.job is None and to_start:
                to_start -= 1
                _schedule(lane, rng, figures, sabotage)
        now = time.monotonic()
        for lane in lanes:
            if lane.job is None:
                continue
            status = _poll(lane, now)
            if status is not None:
                job, lane.job = lane.job, None
                _finished(lane, job, status, figures, seen, rng, sabotage)
        if until_lost and figures.lost:
            to_start = 0
        if not to_start and top_up and not figures.outcomes[BETWEEN] and not any(lane.job for lane in lanes):
            to_start, top_up = 1, top_up - 1
            figures.top_ups += 1
        time.sleep(POLL)
    return figures


def _outcome(killed: bool, done: set, changed) -> str:
    """Where a run stood when it ended: the four cases the figures count."""
    if not killed:
        return "exited before the kill"
    if not done:
        return "killed before any file was replaced"
    if len(done) < len(changed):
        return BETWEEN
    return "killed after every file was replaced"


def classify(lane: Lane, killed: bool, figures: CrashFigures):
    state = compare(lane.package, lane.original, lane.patched)
    figures.runs += 1
    figures.file_checks += len(lane.original)
    figures.temp_left += state.temp
    figures.lock_left += state.lock
    if state.lost:
        figures.lost += state.lost
        figures.lost_files.append((figures.runs, state.neither, state.missing))
    figures.outcomes[_outcome(killed, set(state.patched) & set(lane.changed), lane.changed)] += 1
    return state


def _finished(
    lane: Lane, job: Job, status: int, figures: CrashFigures, seen: set, rng: random.Random, sabotage: Sabotage
) -> None:
    killed, code = outcome_of(status)
    if job.kind == "kill":
        if not killed and code != lane.exit_code and not sabotage:
            figures.exit_mismatches.append(code)
        state = classify(lane, killed, figures)
        if state.lost:
            restore(lane.package, lane.original)
            return
        lane.post_kill = snapshot(lane.package)
        signature = state.signature()
        if signature not in seen and not sabotage:
            seen.add(signature)
            figures.rerun_states += 1
            _start(lane, "complete")
            return
        _next_start(lane, rng, figures)
        return
    # An uninterrupted re-run from a post-kill state must complete the job.
    state = compare(lane.package, lane.original, lane.patched)
    complete = set(state.patched) == set(lane.changed) and not state.lost and not state.temp and not state.lock
    if killed or code != lane.exit_code or not complete:
        figures.rerun_failures.append((code, sorted(set(lane.changed) - set(state.patched)), state.temp, state.lock))
    _next_start(lane, rng, figures)


def _next_start(lane: Lane, rng: random.Random, figures: CrashFigures) -> None:
    """Continue from the state the kill left (a killed re-run), or from the original."""
    assert lane.post_kill is not None
    finished = all(lane.post_kill.get(rel) == lane.patched[rel] for rel in lane.changed)
    if not finished and rng.random() < 0.5:
        restore(lane.package, lane.post_kill)
        figures.starts["the state a kill left"] += 1
    else:
        restore(lane.package, lane.original)
        figures.starts["the original release"] += 1


# -- the console script itself ------------------------------------------------


def subprocess_runs(lane: Lane, kills: int, rng: random.Random) -> dict:
    """Kill ``python -m patchcraft apply`` itself: a few runs, with interpreter start-up."""
    command = [sys.executable, "-m", "patchcraft", "apply", "--color", "never", str(lane.package)]
    env = {**os.environ, "NO_COLOR": "1"}
    outcomes: Counter = Counter()
    lost = 0
    for index in range(kills):
        restore(lane.package, lane.original)
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.monotonic()
        in_phase = index % 2 == 0
        delay = rng.uniform(0.0, lane.write_phase * 1.2) if in_phase else rng.uniform(0.0, lane.duration)
        deadline = float("inf") if in_phase else started + delay
        while process.poll() is None:
            now = time.monotonic()
            if in_phase and deadline == float("inf") and temp_files(lane.models):
                deadline = now + delay
            if now >= deadline:
                process.send_signal(signal.SIGKILL)
                process.wait()
                break
            time.sleep(POLL)
        state = compare(lane.package, lane.original, lane.patched)
        lost += state.lost
        outcomes[_outcome(process.returncode < 0, set(state.patched), lane.changed)] += 1
        rerun = subprocess.run(command, env=env, capture_output=True, timeout=300)
        after = compare(lane.package, lane.original, lane.patched)
        assert rerun.returncode == lane.exit_code, (rerun.returncode, rerun.stderr)
        assert set(after.patched) == set(lane.changed) and not after.temp and not after.lock and not after.lost
    return {"runs": kills, "outcomes": dict(outcomes), "lost": lost}
