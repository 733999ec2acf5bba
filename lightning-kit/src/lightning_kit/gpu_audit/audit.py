"""The audit's runner: ``fit`` for two short epochs, then ``validate``, ``test`` and ``predict``, by Lightning's own
``Trainer``, once on one simulated GPU and once as each process of a two-GPU DDP run (``PASSES``), writing only into
a temporary folder.
"""

import copy
import functools
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint, ModelSummary, ProgressBar, Timer
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.seed import isolate_rng
from torch.utils.data import DataLoader

from ..errors import UserError, first_line
from ..guide import cite
from ..loggers import CSVAndTensorBoardLogger
from ..upstream.lightning import ddp_options
from . import ranks, simulated
from .explain import _hook, count_as_user_code, explain, file_line
from .isolation import Progress, announced, in_a_child
from .lightning import HookTracker, SimulatedGPUStrategy, StageMemory, mixed_precision, simulating
from .restore import as_found
from .simulated import SimulationUnavailableError
from .simulated.collectives import note, process_group, recorded
from .verdict import STAGES, STEP_OF_STAGE, AuditIncompleteError, DevicePlacementError, Outcome, Verdict

PASSES = ((0, 1), (0, 2), (1, 2))  # one GPU; then each process of a two-GPU DDP run
EPOCHS, BATCHES = 2, 2
# The Trainer settings of each pass's short schedule (the benchmark's plain run takes the same).
SCHEDULE = {
    "max_epochs": EPOCHS,
    **{f"limit_{loop}_batches": BATCHES for loop in ("train", "val", "test", "predict")},
    "num_sanity_val_steps": 1,
    "val_check_interval": 1.0,
    "check_val_every_n_epoch": 1,
    "log_every_n_steps": 1,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
LOADER_OF_STAGE = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}


def audit(
    model: L.LightningModule, data: Any = None, *, trainer: L.Trainer | None = None, isolate: bool = False
) -> Verdict:
    """Train ``model`` on simulated GPUs; raise ``DevicePlacementError`` for the first bug found.

    Args:
        model: The LightningModule itself (never a copy), given back as it was (``restore.py``).
        data: A ``LightningDataModule``, or one batch as the DataLoader yields it (for every stage), or None when
            ``model`` defines its own dataloaders.
        trainer: A Trainer whose callbacks, gradient clipping and accumulation, and precision to audit with.
        isolate: Audit in a forked copy of this process (``isolation.py``), where it can fork.

    Raises:
        DevicePlacementError: An operation would fail on a GPU.
        AuditIncompleteError: No bug was found, but part of the run could not be audited.
    """
    verdict = run_audit(model, data, trainer=trainer, stop_at_bug=True, isolate=isolate)
    if verdict.errors:
        raise verdict.errors[0]
    if verdict.gaps:
        raise AuditIncompleteError(verdict)
    return verdict


def run_audit(
    model: L.LightningModule,
    data: Any = None,
    *,
    trainer: L.Trainer | None = None,
    stop_at_bug: bool = False,
    isolate: bool = False,
    say: Callable[[str], None] | None = None,
) -> Verdict:
    """Run every stage of ``model`` on the simulated GPUs and return what was found; raises only for our own bugs.

    ``stop_at_bug`` ends the run at the first bug; ``say`` is told of a long stage (``isolation.announced``).
    """
    _check_arguments(model, data, trainer)
    simulated.enable()
    count_as_user_code(model, data)

    describe = functools.partial(_hook, model=model)
    if isolate:
        verdict = in_a_child(lambda progress: _run(model, data, trainer, stop_at_bug, progress), describe, say)
        if verdict is not None:
            return verdict
    progress = Progress()
    with announced(progress, say, describe):
        return _run(model, data, trainer, stop_at_bug, progress)


def _run(
    model: L.LightningModule, data: Any, trainer: L.Trainer | None, stop_at_bug: bool, progress: Progress
) -> Verdict:
    """The stages, in this process; ``progress`` is told where they are, and each outcome."""
    settings, callbacks, notes = _settings(trainer)
    ddp = settings.pop("ddp_options", None)  # DistributedDataParallel's, for the DDP pass
    verdict = Verdict(notes=notes)
    stages = []
    for stage in STAGES:
        if not is_overridden(STEP_OF_STAGE[stage], model, L.LightningModule):
            continue  # the model has no such step: nothing of it would run on a GPU either
        if _has_data_for(stage, model, data):
            stages.append(stage)
        else:
            verdict.skipped[stage] = f"{type(data if data is not None else model).__name__} has no data for it"
    simulated.forget_notes()
    with _process_state_kept(), tempfile.TemporaryDirectory(prefix="placement-audit-") as root:
        for rank, world_size in PASSES:
            tracker = HookTracker(progress)
            folder = Path(root) / f"rank{rank}-of-{world_size}"
            try:  # the given settings, on one simulated GPU, for the audit's short schedule
                runner = L.Trainer(
                    strategy=SimulatedGPUStrategy(rank, world_size, ddp),
                    callbacks=[
                        *(_redirected(callback, folder) for callback in copy.deepcopy(callbacks)),
                        StageMemory(),
                    ],
                    logger=_logger(trainer, folder, verdict.notes),
                    default_root_dir=folder,
                    profiler=tracker,
                    **SCHEDULE,
                    **settings,
                )
            except Exception as err:  # a callback that cannot be copied, a setting this Lightning refuses
                said = first_line(err, typed=True)
                why = f"the audit's Trainer could not be made with the Trainer's settings and callbacks ({said})"
                for stage in stages:  # every stage of this pass, not audited
                    verdict.outcomes.append(Outcome(stage, rank, world_size, gap=why))
                    progress.ended(verdict.outcomes[-1])
                return verdict
            with as_found(model):
                _check_logged_values(model, runner)
                for stage in stages:
                    outcome = _stage(runner, stage, model, data, rank, world_size, progress)
                    verdict.outcomes.append(outcome)
                    progress.ended(outcome)
                    if outcome.error is not None and stop_at_bug:
                        verdict.notes += _notes()
                        return verdict
            verdict.hooks |= tracker.actions
    ranks.compare(verdict)
    verdict.notes += _notes()
    return verdict


def _stage(
    runner: L.Trainer, stage: str, model: L.LightningModule, data: Any, rank: int, world_size: int, progress: Progress
) -> Outcome:
    """One stage of one pass, run on the simulated GPU: passed, a bug, or why it was not (wholly) audited."""
    outcome = Outcome(stage, rank, world_size)
    progress.at((stage, rank, world_size, ""))
    start = time.perf_counter()
    started = _steps(runner, stage)
    simulated.memory.start_stage()
    try:
        with process_group(rank, world_size), simulating(rank), recorded() as outcome.collectives:
            getattr(runner, stage)(model, **_data_arguments(stage, data))
    except (KeyboardInterrupt, SystemExit, SimulationUnavailableError, UserError):
        raise  # Ctrl-C (which Lightning turns into an exit), no simulated GPU at all, or the data refused on any device
    except Exception as err:
        try:
            explained = explain(err, stage=stage, rank=rank, world_size=world_size, model=model)
        except Exception as failure:  # the audit's own bug: the stage is not audited, never a pass
            stopped, failed = first_line(err, typed=True), first_line(failure, typed=True)
            explained = f"{stage} stopped ({stopped}), and the audit could not explain it ({failed})"
        if isinstance(explained, DevicePlacementError):
            outcome.error = explained
        else:
            outcome.gap = explained
    else:
        if _steps(runner, stage) == started:
            outcome.gap = _no_step(stage, model, data)
    outcome.seconds = time.perf_counter() - start
    outcome.peak = simulated.memory.stage_peak()
    measured = next(callback for callback in runner.callbacks if isinstance(callback, StageMemory))
    outcome.held, outcome.batch_size = measured.held.get(stage, 0), measured.sizes.get(stage)
    return outcome


def _notes() -> list[str]:
    """A note for each line of the user's code that named CUDA, and each kernel that warn_only warned of."""
    named = [
        f"{file_line(filename, lineno)} names the GPU itself ({how}): that runs on a GPU, but fails with "
        "--accelerator cpu on a machine that has one; take the device from the data or the module (x.device, "
        f"self.device), rule 11 of the placement guide: {cite('rule 11')}"
        for filename, lineno, how in simulated.named_cuda()
    ]
    return named + [
        f"{file_line(*line) if line else 'a backward pass'}: {kernel} has no deterministic CUDA "
        "implementation: with warn_only it runs, and its results may differ a little between runs; rule 20 of the "
        f"placement guide: {cite('rule 20')}"
        for line, kernel in simulated.warned()
    ]


def _check_logged_values(model: L.LightningModule, trainer: L.Trainer) -> None:
    """Under DDP, check at the call that a value logged with ``sync_dist=True`` is on the module's device."""
    log = model.log

    def checked_log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("sync_dist") and not kwargs.get("rank_zero_only") and trainer.world_size > 1:
            # Lightning all-reduces it later, from its own code: recorded at the line that asked for it.
            note(f"self.log({name!r}, sync_dist=True)", value if isinstance(value, torch.Tensor) else ())
            if isinstance(value, torch.Tensor):
                trainer.strategy.check_collective(value, "all_reduce")
        return log(name, value, *args, **kwargs)

    model.log = checked_log


def _settings(trainer: L.Trainer | None) -> tuple[dict[str, Any], list[L.Callback], list[str]]:
    """The Trainer arguments and callbacks of ``trainer`` that the audit runs with, and notes about the rest."""
    if trainer is None:
        return {}, [], []
    from lightning.pytorch.cli import SaveConfigCallback

    callbacks = [
        callback
        for callback in trainer.callbacks
        if not isinstance(callback, ProgressBar | ModelSummary | Timer | SaveConfigCallback)
    ]
    # The precision as given to LightningCLI, where it built ``trainer`` (a CPU Trainer turns 16-mixed into bf16).
    saved = [
        getattr(getattr(callback.config, "trainer", None), "precision", None)
        for callback in trainer.callbacks
        if isinstance(callback, SaveConfigCallback)
    ]
    given, notes = next((precision for precision in saved if precision is not None), trainer.precision), []
    settings: dict[str, Any] = {
        "precision": trainer.precision,
        "gradient_clip_val": trainer.gradient_clip_val,
        "gradient_clip_algorithm": trainer.gradient_clip_algorithm,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "inference_mode": trainer.validate_loop.inference_mode,  # False: autograd in evaluation, as documented
    }
    mixed = mixed_precision(given)
    if mixed is not None:
        del settings["precision"]
        settings["plugins"] = [mixed]
        scaled = ", gradients scaled" if mixed.scaler is not None else ""
        mixed_dtype = "bfloat16" if mixed.precision == "bf16-mixed" else "float16"
        notes.append(f"precision {given} ran as on a CUDA GPU: autocast to {mixed_dtype}{scaled}")
    elif str(given).startswith("transformer-engine"):
        notes.append(f"precision {given} ran as 32-true: Transformer Engine needs a real GPU")
        settings["precision"] = "32-true"
    if isinstance(trainer.strategy, DDPStrategy):
        settings["ddp_options"] = ddp_options(trainer.strategy)
    return settings, callbacks, notes


def _logger(trainer: L.Trainer | None, folder: Path, notes: list[str]) -> Logger | bool:
    """The logger of ``trainer``'s kind, writing into the audit's folder; else Lightning's default (``True``), which
    writes there too, standing in for a logger that sends its records elsewhere (W&B, MLflow, ...)."""
    if trainer is None or trainer.logger is None:
        return trainer is None  # a Trainer without a logger: none
    kind = type(trainer.logger)
    if kind in (CSVLogger, TensorBoardLogger, CSVAndTensorBoardLogger):
        return kind(folder)
    notes.append(f"{kind.__name__} was replaced by Lightning's default logger, in a temporary folder")
    return True


def _redirected(callback: L.Callback, folder: Path) -> L.Callback:
    """Point a callback that writes files into the audit's own folder."""
    if isinstance(callback, ModelCheckpoint):
        callback.dirpath = str(folder / "checkpoints")
    elif isinstance(callback, BasePredictionWriter):
        for name in ("path", "output_dir"):
            value = getattr(callback, name, None)
            if isinstance(value, str | os.PathLike):
                setattr(callback, name, str(folder / "predictions" / Path(value).name))
        if hasattr(callback, "announce"):
            callback.announce = False  # where it wrote: a folder the audit removes
    return callback


def _has_data_for(stage: str, model: L.LightningModule, data: Any) -> bool:
    """Whether the data defines ``stage``'s dataloader, and (where the data module has ``has_data_for``) data."""
    if not isinstance(data, L.LightningDataModule | type(None)):
        return True  # one batch, for every stage
    has_data_for = getattr(data, "has_data_for", None)
    if callable(has_data_for) and not has_data_for(stage):
        return False
    if stage == "fit":
        return True
    loader = LOADER_OF_STAGE[stage]
    return is_overridden(loader, data, L.LightningDataModule) if data is not None else is_overridden(loader, model)


def _data_arguments(stage: str, data: Any) -> dict[str, Any]:
    quiet = {} if stage in ("fit", "predict") else {"verbose": False}  # no table of results
    if data is None:
        return quiet
    if isinstance(data, L.LightningDataModule):
        return {"datamodule": data, **quiet}
    # The one batch, as every batch of every stage.
    loader = DataLoader([data] * BATCHES, batch_size=None, collate_fn=lambda batch: batch)
    if stage == "fit":
        return {"train_dataloaders": loader, "val_dataloaders": loader}
    return {"dataloaders": loader, **quiet}


def _check_arguments(model: Any, data: Any, trainer: Any) -> None:
    """Raise a one-line ``TypeError`` for arguments of the wrong kind."""
    takes = "audit(model, data=None, trainer=None) takes a LightningModule instance"
    if isinstance(model, L.LightningDataModule) and isinstance(data, L.LightningModule):
        raise TypeError(f"{takes} first and the data second: the two are swapped (audit(model, data))")
    if isinstance(model, type):
        raise TypeError(f"{takes}, not the class {model.__name__}: construct it first, {model.__name__}(...)")
    if isinstance(model, torch.nn.Module) and not isinstance(model, L.LightningModule):
        raise TypeError(
            f"{takes}, not a plain {type(model).__name__} (torch.nn.Module): wrap it in a LightningModule "
            "with training_step and configure_optimizers, as Lightning trains it"
        )
    if not isinstance(model, L.LightningModule):
        raise TypeError(f"{takes}, not {_kind(model)}")
    if isinstance(data, type):
        raise TypeError(f"audit()'s data is a LightningDataModule instance or one batch, not the class {data.__name__}")
    if isinstance(data, L.LightningModule):
        raise TypeError("audit()'s data is a LightningDataModule or one batch, not a second LightningModule")
    if trainer is not None and not isinstance(trainer, L.Trainer):
        raise TypeError(f"audit()'s trainer is a lightning.Trainer or None, not {_kind(trainer)}")


def _kind(value: Any) -> str:
    """``value``'s kind, in words: ``None``, ``a str``, ``the class X``, ``a Y``."""
    if value is None:
        return "None"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    return f"a {type(value).__name__}"


def _steps(runner: L.Trainer, stage: str) -> int:
    """How many batches ``runner`` has started in ``stage``'s loop (training batches, for fit)."""
    loop = runner.fit_loop.epoch_loop if stage == "fit" else getattr(runner, f"{stage}_loop")
    return loop.batch_progress.total.ready


def _no_step(stage: str, model: L.LightningModule, data: Any) -> str:
    """Why a stage that ran no step is not audited."""
    loader = "train_dataloader" if stage == "fit" else LOADER_OF_STAGE[stage]
    owner = type(data if isinstance(data, L.LightningDataModule) else model).__name__
    return (
        f"{stage} ran no {STEP_OF_STAGE[stage]}: {owner}.{loader}() yielded no batch (an empty split?), "
        "so nothing of it ran on the simulated GPU"
    )


@contextmanager
def _process_state_kept() -> Iterator[None]:
    """Leave the random generators and Lightning's loggers' levels as found, and keep Lightning's messages out of the
    report meanwhile: its advice for a full run does not apply to two batches."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with isolate_rng(include_cuda=False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
