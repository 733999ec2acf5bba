"""One trial: an ordinary ``train.py fit`` in this process, in a run folder of its own under the sweep's."""

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import optuna
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.trial import Trial, TrialState

from ..callbacks import DivergenceError, InterruptCheckpoint
from ..cli import KitCLI, fit
from ..errors import ConfigError
from ..messages import report
from .queue import RESUMED_FROM, RUN_FOLDER, fail_and_retry, resume_point
from .space import SearchSpace, flags

# Each trial trains in this process, on one device unless told otherwise (and then refused: see __main__).
ONE_DEVICE = ["--trainer.devices", "1"]


class _FitOnly:
    """The command line of ``fit`` alone: the parsers of the other subcommands took a second of every trial."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {"fit": LightningCLI.subcommands()["fit"]}

    def before_fit(self) -> None:
        self.fit_started = time.perf_counter()  # for the sweep's own overhead: the time outside trainer.fit


def fit_only(cli_class: type[KitCLI]) -> type[KitCLI]:
    """``cli_class`` with the command line of ``fit`` alone, timing the fit."""
    return type(cli_class.__name__, (_FitOnly, cli_class), {"__module__": cli_class.__module__})


class InterruptionError(Exception):
    """Ctrl-C or SIGTERM stopped a trial: it is queued again, to resume from ``saved`` (None: from its start)."""

    def __init__(self, number: int, saved: Path | None) -> None:
        super().__init__(number, saved)
        self.number, self.saved = number, saved


class ReportEpochs(L.Callback):
    """Report the monitored metric to the trial after each epoch that validated, and stop ``fit`` if it is pruned.

    Stopped the way early stopping stops a run: at the end of the epoch, its checkpoints,
    metrics and plots written. Also times ``fit`` from the callbacks' setup, for a fit that raised.
    """

    def __init__(self, trial: Trial, monitor: str) -> None:
        self.trial, self.monitor = trial, monitor
        self.pruned_after: int | None = None
        self.seconds = 0.0
        self._validated = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._started = time.perf_counter()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.seconds += time.perf_counter() - self._started

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
    fit_seconds: float = field(default=0.0)


def run_trial(plan: Plan, trial: Trial) -> None:
    """Train ``trial``'s parameters as train.py would, and tell the study how it ended.

    A trial that diverges (its learning rate too high, say) is pruned, not failed: that is
    the answer to what it tried. Ctrl-C or SIGTERM fail it and queue it again, to resume
    from the checkpoint it saved (``InterruptionError``). Anything else fails it and stops the sweep.
    """
    values = plan.space.suggest(trial)
    folder = plan.folder / f"trial_{trial.number:04d}"
    resume = resume_point(plan.study, trial)
    trial.set_user_attr(RUN_FOLDER, str(folder))
    if resume is not None:
        trial.set_user_attr(RESUMED_FROM, resume)
    command = [*shlex.split(plan.cli_class.command), *plan.train_args, *plan.fixed_args, *flags(values)]
    trial.set_user_attr("command", shlex.join(command))
    shown = ", ".join(f"{name}={value}" for name, value in values.items())
    report(f"trial {trial.number}: {shown}" + (f", resuming from {resume}" if resume else ""))
    logger = ["--trainer.logger.init_args.save_dir", str(plan.folder.parent)]
    logger += ["--trainer.logger.init_args.name", plan.folder.name, "--trainer.logger.init_args.version", folder.name]
    reporter = ReportEpochs(trial, plan.monitor)
    args = [*ONE_DEVICE, *plan.train_args, *plan.fixed_args, *flags(values), *logger]
    args += ["--ckpt_path", resume] if resume else []
    try:
        cli = fit(fit_only(plan.cli_class), args, callbacks=[reporter])
        plan.fit_seconds += time.perf_counter() - cli.fit_started
    except DivergenceError as err:
        plan.fit_seconds += reporter.seconds  # from the Trainer's setup: no later than the fit's start
        trial.set_user_attr("diverged", str(err))
        plan.study.tell(trial, state=TrialState.PRUNED)
        report(f"trial {trial.number} diverged: pruned ({err})")
        return
    except (SIGTERMException, KeyboardInterrupt):
        fail_and_retry(plan.study, trial)
        raise InterruptionError(trial.number, InterruptCheckpoint.saved) from None
    except BaseException as err:
        _fail(plan.study, trial, err)
        raise
    _tell(plan, trial, cli.trainer, reporter, folder)


def _tell(plan: Plan, trial: Trial, trainer: L.Trainer, reporter: ReportEpochs, folder: Path) -> None:
    if reporter.pruned_after is not None:
        plan.study.tell(trial, state=TrialState.PRUNED)
        report(f"trial {trial.number} pruned after epoch {reporter.pruned_after}: {folder}")
        return
    judge = trainer.checkpoint_callback
    best = getattr(judge, "best_model_score", None)
    if best is None:
        error = ConfigError(
            f"trial {trial.number} ended without a {plan.monitor} to judge it by: a sweep needs validation "
            "(leave --trainer.limit_val_batches and --trainer.check_val_every_n_epoch at their defaults)"
        )
        _fail(plan.study, trial, error)
        raise error
    plan.study.tell(trial, float(best))
    report(f"trial {trial.number} finished: {plan.monitor}={float(best):.4f} in {folder}")


def _fail(study: optuna.Study, trial: Trial, err: BaseException) -> None:
    """Fail ``trial`` for ``err``, recorded with it; a trial that another process failed meanwhile stays as it is."""
    message: Any = err.code if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
    try:
        trial.set_user_attr("error", " ".join(str(message).split())[:500])
        study.tell(trial, state=TrialState.FAIL)
    except (ValueError, RuntimeError):
        pass
