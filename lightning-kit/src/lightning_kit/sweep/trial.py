"""One trial: an ordinary ``train.py fit`` in this process, in a run folder of its own under the sweep's."""

import contextlib
import errno
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import optuna
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.exceptions import StorageInternalError
from optuna.study import StudyDirection
from optuna.trial import Trial, TrialState
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError

from ..building import fit
from ..callbacks import DivergenceError, InterruptCheckpoint
from ..cli import KitCLI
from ..errors import ConfigError, exception_chain
from ..messages import report
from .queue import ERROR, RESUMED_FROM, RUN_FOLDER, resume_point, signals_held, stop_and_retry
from .space import SearchSpace, flags

# Each trial trains in this process, on one device (more is refused: command._monitored).
ONE_DEVICE = ["--trainer.devices", "1"]


def fit_only(cli_class: type[KitCLI]) -> type[KitCLI]:
    """``cli_class`` with ``fit``'s command line alone: the other subcommands' parsers took a second a trial."""
    fit = staticmethod(lambda: {"fit": LightningCLI.subcommands()["fit"]})
    return type(cli_class.__name__, (cli_class,), {"__module__": cli_class.__module__, "subcommands": fit})


class InterruptionError(Exception):
    """A stop of the process (``reason``, what was said: ``detail``) stopped a trial: it is queued again."""

    def __init__(self, number: int, saved: Path | None, reason: str = "", detail: str = ""):
        super().__init__(number, saved, reason)
        self.number, self.saved, self.reason, self.detail = number, saved, reason, detail


SIGNAL, DISK_FULL, STORE_LOST = "Ctrl-C or SIGTERM", "the disk is full", "the store was lost"
AFTER_IT = "after the trial ended"  # what stopped a sweep that had just completed its trial
# The disk, the quota, or the file size limit has no room.
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
# What the store raises when it cannot be reached (Optuna wraps SQLAlchemy's errors in StorageInternalError).
_STORE_ERRORS = (OperationalError, InterfaceError, DisconnectionError, StorageInternalError)


def stop_of_the_process(err: BaseException) -> tuple[str, str] | None:
    """(``SIGNAL``, ``DISK_FULL`` or ``STORE_LOST``, what was said) if ``err`` is a stop of the process or the
    machine, not of the trial's own code; else None.

    Found anywhere in ``err``'s chain: Lightning turns Ctrl-C into ``SystemExit(1)`` raised while handling the
    ``KeyboardInterrupt``; ``torch.save`` on a full disk raises a ``RuntimeError`` while handling the ``OSError``.
    """
    found = None
    for link in exception_chain(err):
        if isinstance(link, KeyboardInterrupt | SIGTERMException):
            return SIGNAL, "a signal"
        if isinstance(link, OSError) and link.errno in _NO_ROOM and found is None:
            found = DISK_FULL, f"{link.strerror or link}" + (f": {link.filename}" if link.filename else "")
        if isinstance(link, _STORE_ERRORS) and found is None:
            found = STORE_LOST, " ".join(str(getattr(link, "orig", None) or link).split()[:30])
    return found


class ReportEpochs(L.Callback):
    """Report the monitored metric to the trial after each epoch that validated; stop ``fit`` (as early stopping
    does) if it is pruned."""

    def __init__(self, trial: Trial, monitor: str) -> None:
        self.trial, self.monitor = trial, monitor
        self.pruned_after: int | None = None
        self._validated = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validated = self._validated or not trainer.sanity_checking

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if not self._validated or value is None:
            return
        self._validated = False
        self.trial.report(float(value), step=trainer.current_epoch)
        if self.trial.should_prune():
            self.pruned_after = trainer.current_epoch
            trainer.should_stop = True


@dataclass
class Plan:
    """What every trial of a sweep shares: the study, the space, train.py's arguments and where the runs go."""

    cli_class: type[KitCLI]
    study: optuna.Study
    space: SearchSpace
    train_args: list[str]  # as given, for the command line that reproduces a trial
    fixed_args: list[str]  # what the sweep adds to every trial's
    folder: Path  # runs/sweeps/<study>
    monitor: str


def run_trial(plan: Plan, trial: Trial) -> None:
    """Train ``trial``'s parameters as train.py would, and tell the study how it ended: complete; pruned (a trial
    that diverges too: that is the answer to what it tried); stopped, to run again (``stop_of_the_process``: it is
    queued again, and ``InterruptionError`` stops the sweep); or failed by its own code (recorded, and raised)."""
    reporter = ReportEpochs(trial, plan.monitor)
    folder = plan.folder / f"trial_{trial.number:04d}"
    try:
        values = plan.space.suggest(trial)
        resume = resume_point(plan.study, trial)
        trial.set_user_attr(RUN_FOLDER, str(folder))
        if resume is not None:
            trial.set_user_attr(RESUMED_FROM, resume)
        given = [*plan.train_args, *plan.fixed_args, *flags(values)]
        trial.set_user_attr("command", shlex.join([*shlex.split(plan.cli_class.command), *given]))
        shown = ", ".join(f"{name}={value}" for name, value in values.items())
        report(f"trial {trial.number}: {shown}" + (f", resuming from {resume}" if resume else ""))
        logger = {"save_dir": plan.folder.parent, "name": plan.folder.name, "version": folder.name}
        args = [*ONE_DEVICE, *given, *(f"--trainer.logger.init_args.{key}={value}" for key, value in logger.items())]
        args += ["--ckpt_path", resume] if resume else []
        InterruptCheckpoint.saved = None
        cli = fit(fit_only(plan.cli_class), args, callbacks=[reporter])
        _tell(plan, trial, cli.trainer, reporter, folder)
        # A signal at the very end (the last validation held it): the trial is complete, and the sweep stops.
        signalled = cli.trainer.received_sigterm
    except DivergenceError as err:
        with signals_held():
            trial.set_user_attr("diverged", str(err))
            plan.study.tell(trial, state=TrialState.PRUNED)
        report(f"trial {trial.number} diverged: pruned ({err})")
    except BaseException as err:
        if (stop := stop_of_the_process(err)) is None:  # failed by its own code
            message: Any = err.code if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
            with signals_held(), contextlib.suppress(Exception):  # else left running: reclaimed later
                trial.set_user_attr(ERROR, " ".join(str(message).split())[:500])
                plan.study.tell(trial, state=TrialState.FAIL)
            raise
        with contextlib.suppress(Exception):  # the store lost: the next run finds the trial left running, and queues it
            stop_and_retry(plan.study, trial, f"{stop[0]}: {stop[1]}")
        raise InterruptionError(trial.number, InterruptCheckpoint.saved, *stop) from None
    else:
        if signalled:
            raise InterruptionError(trial.number, None, SIGNAL, AFTER_IT)


def _tell(plan: Plan, trial: Trial, trainer: L.Trainer, reporter: ReportEpochs, folder: Path) -> None:
    if reporter.pruned_after is not None:
        with signals_held():
            plan.study.tell(trial, state=TrialState.PRUNED)
        report(f"trial {trial.number} pruned after epoch {reporter.pruned_after}: {folder}")
        return
    # Of this fit's checkpoints, and of every epoch reported before it resumed: Lightning's best score is of the
    # retry's own folder alone.
    best = getattr(trainer.checkpoint_callback, "best_model_score", None)
    scores = [float(best)] if best is not None and math.isfinite(float(best)) else []
    reported = plan.study.get_trials(deepcopy=False)[trial.number].intermediate_values.values()
    scores += [value for value in reported if math.isfinite(value)]
    if not scores:
        raise ConfigError(
            f"trial {trial.number} ended without a {plan.monitor} to judge it by: a sweep needs validation "
            "(leave --trainer.limit_val_batches and --trainer.check_val_every_n_epoch at their defaults)"
        )
    best = max(scores) if plan.study.direction == StudyDirection.MAXIMIZE else min(scores)
    with signals_held():
        plan.study.tell(trial, best)
    report(f"trial {trial.number} finished: {plan.monitor}={best:.4f} in {folder}")
