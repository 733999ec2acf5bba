"""Which trial a worker runs next: none twice, none lost, and no more than asked for, across every worker.

A trial ends complete, pruned, failed by its own code (``error``: not run again), or stopped, to run again
(``stopped``: a signal, ``kill -9``, a full disk, a lost store): failed in the store and queued again with the same
parameters (Optuna's ``RetryFailedTrialCallback`` pattern), resuming from its predecessor's newest checkpoint.

A trial records the process that took it (host, pid, ``run_record.process_token``). One left running by a process
that is gone is queued again: on this host at once, elsewhere by Optuna's heartbeat. Whatever a worker was doing when
it stopped, the next worker that looks mends the queue (``repair``): every stopped trial has a successor.

A trial's identity is its grid point, or for a drawn trial the trial its retries go back to. A worker runs a trial
only if no other of its identity is counted, or running or waiting with a smaller number; otherwise it records it as
a ``duplicate_of`` that one. So a grid point queued twice (two workers mending at once) is trained once. The store
numbers trials one at a time, so a worker starts a drawn trial only if the finished and the running ones with a
smaller number leave room for it: two workers asking at once for the last trial do not both run one.
"""

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from ..checkpoints import RESUMABLE
from ..messages import report
from ..run_record import process_alive, process_token
from .store import GRACE_PERIOD_S, HEARTBEAT_INTERVAL_S

COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)
OWNER, RETRY_OF, RUN_FOLDER, RESUMED_FROM = "owner", "retry_of", "run_folder", "resumed_from"
# How a failed trial ended: by its own code (not run again), stopped (run again), or a second of one identity.
ERROR, STOPPED, DUPLICATE_OF = "error", "stopped", "duplicate_of"
CROSS_VALIDATION = "cross_validation"
# A trial taken but not claimed by its process for this long was taken by one that stopped at once.
UNCLAIMED = timedelta(seconds=3 * GRACE_PERIOD_S)
POLL_S = 2.0  # how often a worker with nothing to start looks again


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the block records how a trial ended: they arrive after it, whole."""
    main = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held) if main else None
    try:
        yield
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def queue_retry(study: optuna.Study, failed: FrozenTrial) -> None:
    """Queue, once, a trial with ``failed``'s parameters (chosen, or fixed for it) that resumes where it stopped."""
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get(RETRY_OF) == failed.number and DUPLICATE_OF not in trial.user_attrs:
            return
    fixed = {**failed.system_attrs.get("fixed_params", {}), **failed.params}
    retry = optuna.trial.create_trial(
        state=TrialState.WAITING,
        params=failed.params,
        distributions=failed.distributions,
        user_attrs={RETRY_OF: failed.number},
        system_attrs={"fixed_params": fixed},
        intermediate_values=failed.intermediate_values,
    )
    study.add_trial(retry)


def stop_and_retry(study: optuna.Study, trial: FrozenTrial | Trial, reason: str | None = None) -> bool:
    """Record ``trial`` as stopped (for ``reason``: only a ``Trial`` this process holds), fail it and queue its
    retry; False when it had ended already (by its owner, or failed by another worker)."""
    with signals_held():
        try:
            if reason is not None and isinstance(trial, Trial):
                trial.set_user_attr(STOPPED, reason)
            study.tell(trial.number, state=TrialState.FAIL)
        except (ValueError, RuntimeError):
            return False
        queue_retry(study, study.get_trials(deepcopy=False)[trial.number])
    return True


def reclaim(study: optuna.Study) -> None:
    """Stop the trials whose process is gone, and queue each again: at once on this host, by heartbeat elsewhere."""
    optuna.storages.fail_stale_trials(study)  # queues each through the store's stale-trial callback
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER)
        if isinstance(owner, dict) and process_alive(owner) is False and stop_and_retry(study, trial):
            report(f"trial {trial.number} was left running by process {owner.get('pid')}, now gone: queued again")
        elif owner is None and datetime.now() - trial.datetime_start > UNCLAIMED and stop_and_retry(study, trial):
            # Taken, then killed before it recorded its process (or any heartbeat): no one will ever end it.
            report(f"trial {trial.number} was taken by a process that never started it: queued again")


def identity(trials: list[FrozenTrial], trial: FrozenTrial | Trial, grid_names: list[str]) -> Any:
    """``trial``'s grid point as text (None if of no point); for a drawn trial, the trial its retries go back to."""
    if not grid_names:
        return [trials[trial.number], *_retried(trials, trial)][-1].number
    params = {**trials[trial.number].system_attrs.get("fixed_params", {}), **trials[trial.number].params}
    return json.dumps([params[name] for name in grid_names]) if set(grid_names) <= params.keys() else None


def _retried(trials: list[FrozenTrial], trial: FrozenTrial | Trial) -> Iterator[FrozenTrial]:
    """The trials that ``trial`` retries, newest first (each of a smaller number)."""
    number = trial.number
    while isinstance(retried := trials[number].user_attrs.get(RETRY_OF), int) and 0 <= retried < number:
        number = retried
        yield trials[number]


def repair(study: optuna.Study, grid: list[dict[str, Any]] | None, failed_too: bool = False) -> None:
    """Queue again a stopped trial with no successor; ``failed_too``: a grid's point whose trial failed by its own
    code too (a new run of the sweep tries it again)."""
    trials, names = study.get_trials(deepcopy=False), list(grid[0]) if grid else []
    groups: dict[Any, list[FrozenTrial]] = {}
    for trial in trials:
        if DUPLICATE_OF not in trial.user_attrs and (key := identity(trials, trial, names)) is not None:
            groups.setdefault(key, []).append(trial)
    for group in groups.values():
        if any(trial.state in (*COUNTED, TrialState.WAITING, TrialState.RUNNING) for trial in group):
            continue
        latest = max(group, key=lambda trial: trial.number)
        attrs = latest.user_attrs
        if latest.state == TrialState.FAIL and (ERROR not in attrs or STOPPED in attrs):  # stopped: run again
            queue_retry(study, latest)
            report(f"trial {latest.number} was stopped before its retry was queued: queued again")
        elif failed_too and ERROR in latest.user_attrs:
            report(f"trial {latest.number} failed by its own code ({latest.user_attrs[ERROR]}): running it again")
            study.enqueue_trial({**latest.system_attrs.get("fixed_params", {}), **latest.params})


def resume_point(study: optuna.Study, trial: Trial | FrozenTrial) -> str | None:
    """The checkpoint a retried trial resumes from: the newest its predecessor saved, or that one resumed from."""
    for earlier in _retried(study.get_trials(deepcopy=False), trial):
        folder = earlier.user_attrs.get(RUN_FOLDER)
        found = [path for name in RESUMABLE if folder and (path := Path(folder) / "checkpoints" / name).is_file()]
        if found:  # the newer of last.ckpt and on_exception.ckpt
            return str(max(found, key=lambda path: path.stat().st_mtime_ns))
        if earlier.user_attrs.get(RESUMED_FROM):
            return earlier.user_attrs[RESUMED_FROM]
    return None


def _trial_id(storage: RDBStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of the trial ``number``, by Optuna's public API (a trial's own ``_trial_id`` is private)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def _take_waiting(study: optuna.Study, storage: RDBStorage) -> Trial | None:
    """The first waiting trial this process could take; None when none is waiting (``ask`` would make one)."""
    for waiting in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(taken := _trial_id(storage, study, waiting.number), TrialState.RUNNING):
                return optuna.trial.Trial(study, taken)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def _second_of_its_kind(study: optuna.Study, trial: Trial, grid: list[dict[str, Any]] | None) -> bool:
    """Whether ``trial``, just taken, must not run: another of its identity was counted, or runs or waits before it:
    ``trial`` is recorded as its duplicate, and ends."""
    trials, names = study.get_trials(deepcopy=False), list(grid[0]) if grid else []
    if (mine := identity(trials, trial, names)) is None:
        return False
    for other in trials:
        taken = other.state in (TrialState.RUNNING, TrialState.WAITING)
        before = other.state in COUNTED or (taken and other.number < trial.number)
        if before and DUPLICATE_OF not in other.user_attrs and identity(trials, other, names) == mine:
            with signals_held():
                trial.set_user_attr(DUPLICATE_OF, other.number)
                study.tell(trial, state=TrialState.FAIL)
            return True
    return False


def run_trials(
    study: optuna.Study,
    storage: RDBStorage,
    wanted: int,
    run: Callable[[Trial], None],
    grid: list[dict[str, Any]] | None = None,
) -> None:
    """Run trials with ``run`` until ``wanted`` are complete or pruned (a ``grid``: each of its points ended)."""
    waiting_for = None
    if grid:
        repair(study, grid, failed_too=True)
    while True:
        reclaim(study)
        repair(study, grid)
        trials = study.get_trials(deepcopy=False)
        done = sum(trial.state in COUNTED for trial in trials)
        running = [trial.number for trial in trials if trial.state == TrialState.RUNNING]
        waiting = any(trial.state == TrialState.WAITING for trial in trials)
        if (grid and not waiting and not running) or (not grid and done >= wanted):
            return
        if (grid and not waiting) or (not grid and done + len(running) >= wanted):
            if running != waiting_for:
                report(f"waiting for trials {', '.join(map(str, running))}, running in other processes")
                waiting_for = running
            time.sleep(POLL_S)
            continue
        with signals_held():  # taken and claimed as one: a stop between them would leave it owned by no one
            trial = _take_waiting(study, storage) if grid else study.ask()
            if trial is not None:
                pid = os.getpid()
                trial.set_user_attr(OWNER, {"host": socket.gethostname(), "pid": pid, "process": process_token(pid)})
        if trial is None:
            continue
        if _second_of_its_kind(study, trial, grid):
            continue
        if not grid:
            states = study.get_trials(deepcopy=False, states=(*COUNTED, TrialState.RUNNING))
            ahead = sum(t.state in COUNTED or t.number < trial.number for t in states)
            if ahead >= wanted:  # another worker took the last room first: the next to ask gets this one
                storage.set_trial_state_values(_trial_id(storage, study, trial.number), TrialState.WAITING)
                continue
        with heartbeat(storage, trial):
            run(trial)


@contextmanager
def heartbeat(storage: RDBStorage, trial: Trial) -> Iterator[None]:
    """Record, every ``HEARTBEAT_INTERVAL_S`` while the block runs, that ``trial`` is alive (Optuna's heartbeat, whose
    own thread stops at the first failure to record one)."""
    trial_id = _trial_id(storage, trial.study, trial.number)
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(trial_id)
            except Exception as err:  # the database unreachable for a while: the trial goes on
                report(f"warning: trial {trial.number}'s heartbeat was not recorded: {err}")
            if stop.wait(HEARTBEAT_INTERVAL_S):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat of trial {trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
