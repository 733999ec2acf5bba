"""Which trial a worker runs next: none twice, none lost, and no more than asked for, across every worker.

A trial belongs to the process that took it: its host, process id and the process's start
(``run_record.process_token``) are recorded with it. A trial left running by a process that
is gone is failed and queued again with the same parameters (Optuna's
``RetryFailedTrialCallback`` pattern), and the retry resumes from the newest checkpoint of
the trial it retries. On this host a gone process is seen at once; on another, by
Optuna's heartbeat (``store.GRACE_PERIOD_S`` after the process stopped recording it).

Trial numbers are given by the store, one at a time, so they order the trials: a worker
starts the trial it was given only if the trials finished and those running with a
smaller number leave room for it; otherwise it puts it back and waits. So two workers
asking at once for the last trial do not both run one.
"""

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from ..checkpoints import RESUMABLE
from ..messages import report
from ..run_record import process_alive, process_token
from .store import HEARTBEAT_INTERVAL_S, put_back, trial_id

# The trials a sweep counts: trained to the end, or stopped early as hopeless.
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)
OWNER, RETRY_OF, RUN_FOLDER, RESUMED_FROM = "owner", "retry_of", "run_folder", "resumed_from"
# How often a worker with nothing to start looks again.
POLL_S = 2.0


def claim(trial: Trial) -> None:
    """Record this process as the one running ``trial``."""
    pid = os.getpid()
    trial.set_user_attr(OWNER, {"host": socket.gethostname(), "pid": pid, "process": process_token(pid)})


def queue_retry(study: optuna.Study, failed: FrozenTrial) -> None:
    """Queue a trial with ``failed``'s parameters (chosen, or fixed for it) that resumes where ``failed`` stopped."""
    if any(trial.user_attrs.get(RETRY_OF) == failed.number for trial in study.get_trials(deepcopy=False)):
        return  # queued already, by a worker stopped before it failed ``failed``
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


def fail_and_retry(study: optuna.Study, trial: FrozenTrial | Trial) -> bool:
    """Fail ``trial`` and queue its retry; False when another process failed or finished it first."""
    try:
        study.tell(trial.number, state=TrialState.FAIL)
    except (ValueError, RuntimeError):  # finished meanwhile: by its owner, or failed by another worker
        return False
    queue_retry(study, study.get_trials(deepcopy=False)[trial.number])
    return True


def reclaim(study: optuna.Study) -> None:
    """Fail the trials whose process is gone, and queue each again: at once on this host, by heartbeat elsewhere."""
    optuna.storages.fail_stale_trials(study)  # queues each through the store's stale-trial callback
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER)
        if isinstance(owner, dict) and process_alive(owner) is False and fail_and_retry(study, trial):
            report(f"trial {trial.number} was left running by process {owner.get('pid')}, now gone: queued again")


def resume_point(study: optuna.Study, trial: Trial | FrozenTrial) -> str | None:
    """The checkpoint a retried trial resumes from: the newest its predecessor saved, or that one resumed from."""
    trials = study.get_trials(deepcopy=False)
    number = trial.user_attrs.get(RETRY_OF)
    while isinstance(number, int) and 0 <= number < len(trials):
        earlier = trials[number]
        folder = earlier.user_attrs.get(RUN_FOLDER)
        if folder is not None and (newest := newest_checkpoint(folder)) is not None:
            return newest
        if earlier.user_attrs.get(RESUMED_FROM):
            return earlier.user_attrs[RESUMED_FROM]
        number = earlier.user_attrs.get(RETRY_OF)
    return None


def newest_checkpoint(folder: str) -> str | None:
    """The newer of a run folder's ``last.ckpt`` and ``on_exception.ckpt``, if it has one."""
    found = []
    for name in RESUMABLE:
        path = Path(folder) / "checkpoints" / name
        try:
            found.append((path.stat().st_mtime_ns, str(path)))
        except OSError:
            continue
    return max(found)[1] if found else None


def run_trials(study: optuna.Study, storage: RDBStorage, wanted: int, run: Callable[[Trial], None]) -> int:
    """Run trials with ``run`` until ``wanted`` are complete or pruned, across all workers; return how many ran here."""
    ran, waiting_for = 0, None
    while True:
        reclaim(study)
        trials = study.get_trials(deepcopy=False)
        done = sum(trial.state in COUNTED for trial in trials)
        running = [trial.number for trial in trials if trial.state == TrialState.RUNNING]
        if done >= wanted:
            return ran
        if done + len(running) >= wanted:
            if running != waiting_for:
                report(f"waiting for trials {', '.join(map(str, running))}, running in other processes")
                waiting_for = running
            time.sleep(POLL_S)
            continue
        trial = study.ask()
        claim(trial)
        states = study.get_trials(deepcopy=False, states=(*COUNTED, TrialState.RUNNING))
        ahead = sum(t.state in COUNTED or t.number < trial.number for t in states)
        if ahead >= wanted:  # another worker took the last room first
            put_back(storage, trial)
            continue
        with heartbeat(storage, trial):
            run(trial)
        ran += 1


@contextmanager
def heartbeat(storage: RDBStorage, trial: Trial) -> Iterator[None]:
    """Record, every ``HEARTBEAT_INTERVAL_S`` while the block runs, that ``trial`` is alive (Optuna's heartbeat)."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(trial_id(trial))
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
