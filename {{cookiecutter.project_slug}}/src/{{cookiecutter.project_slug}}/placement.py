"""The device audit: prove on a machine without a GPU that the model will run on one.

The audit trains the model for real, with Lightning's own ``Trainer``, on a simulated
CUDA GPU (see ``simulated_gpu.py``): ``fit`` for two short epochs (sanity check,
every hook and callback, backward, optimizer and LR scheduler steps, gradient
clipping, checkpoint saving), then ``validate``, ``test`` and ``predict``. Then it
does it all again as the second process of a two-GPU DDP run, on a second simulated
GPU, where code that assumes GPU 0, and values logged with ``sync_dist=True`` that
are not on the GPU, fail as they would under DDP. Whatever would stop a GPU run
stops the audit at the same operation, reported with the hook, your file and line,
what CUDA would say, and the fix.

From the command line, with the same arguments as ``train.py``:

    python -m {{ cookiecutter.project_slug }}.placement --config configs/synthetic.yaml

Exit status: 0 every stage passed; 1 a placement bug was found; 2 the command line or
configuration is wrong; 3 no bug was found but part of the run could not be audited
(the report says which part and why). A stage the data has nothing for (an image folder
without a ``test/`` split, a data module without a ``test_dataloader``) is skipped, with
a note: the audit covers what the model and the data define.

In tests: ``audit(model, datamodule)`` (or ``audit(model, batch)``) raises
``DevicePlacementError`` for a bug, ``AuditIncompleteError`` when part could not be
audited, and otherwise returns the ``Verdict``.

The same simulated GPU also trains from ``train.py``: ``--accelerator simgpu``.

This module and ``simulated_gpu.py`` are the only places in the project that place
tensors by hand: they play the part Lightning plays on a real GPU.
"""

import copy
import importlib.util
import logging
import os
import random
import re
import sys
import sysconfig
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint, ModelSummary, ProgressBar, Timer
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader, Dataset

from . import simulated_gpu
from .simulated_gpu import SimulatedDeviceError, SimulationUnavailableError

SIMULATED = simulated_gpu.DEVICE_TYPE  # --accelerator simgpu
STAGES = ("fit", "validate", "test", "predict")
STEP_OF_STAGE = {"fit": "training_step", "validate": "validation_step", "test": "test_step", "predict": "predict_step"}
LOADER_OF_STAGE = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}
# One GPU, then the second process of two under DDP.
PASSES = ((0, 1), (1, 2))
EPOCHS, BATCHES = 2, 2
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3

GUIDE = "docs/device-placement.md"
# The fix for each kind of bug, and the rule of the guide that explains it.
FIXES = {
    "mixed devices": (
        "create new tensors on the input's device (torch.arange(n, device=x.device), x.new_zeros(...)), keep "
        "constants and state as buffers, metrics and modules as attributes or in nn.ModuleDict/ModuleList, and "
        "never .cpu() or .to('cpu') inside a step",
        "rules 2 to 9",
    ),
    "another GPU": (
        "every DDP process has its own GPU: take the device from the data or the module (x.device, self.device), "
        "never a fixed one such as cuda:0 or device index 0",
        "rule 11",
    ),
    "generator": ("make the generator on the device it draws for: torch.Generator(device=x.device)", "rule 10"),
    "hard-coded device": (
        "take the device from the data or the module (x.device, self.device): a device written into the code "
        "breaks --accelerator cpu, and under DDP every process but the first would use another's GPU",
        "rule 11",
    ),
    "numpy": (
        "log tensors with self.log, which reads them when it needs to; where NumPy is really needed, "
        "collect .detach().cpu() copies and convert them at the end of the epoch",
        "rule 6",
    ),
    "sync_dist": (
        "under DDP, NCCL all-reduces GPU tensors only: log the tensor as it is (no .cpu()), or a Python number",
        "rule 12",
    ),
}


class DevicePlacementError(RuntimeError):
    """An operation that would fail on a GPU.

    Attributes:
        kind: ``"mixed devices"``, ``"another GPU"`` (another DDP process's), ``"generator"``,
            ``"hard-coded device"``, ``"numpy"`` or ``"sync_dist"``.
        stage: ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``.
        rank: 0 on the first simulated GPU; 1 for the second process of a DDP run.
        hook: Where it ran, e.g. ``"Classifier.training_step"`` or ``"callback EMA.on_train_batch_end"``.
        step: The method's own name, e.g. ``"training_step"``.
        operation: The operation that refused, e.g. ``"aten.add.Tensor"``.
        filename: The file of the line in your code where it happened.
        lineno: That line's number.
    """

    def __init__(
        self, message: str, *, kind: str, stage: str, rank: int, hook: str, operation: str, filename: str, lineno: int
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.stage = stage
        self.rank = rank
        self.hook = hook
        self.step = hook.rpartition(".")[2]
        self.operation = operation
        self.filename = filename
        self.lineno = lineno


class AuditIncompleteError(RuntimeError):
    """No bug was found, but part of the run could not be audited; ``verdict`` says which part and why."""

    def __init__(self, verdict: "Verdict") -> None:
        super().__init__("\n".join(verdict.report()))
        self.verdict = verdict


@dataclass
class Outcome:
    """One stage of one pass: passed, failed with a placement bug, or not (wholly) audited."""

    stage: str
    rank: int
    world_size: int
    seconds: float = 0.0
    error: DevicePlacementError | None = None
    gap: str | None = None  # why (the rest of) the stage was not audited

    @property
    def where(self) -> str:
        ddp = f" (DDP rank {self.rank} of {self.world_size})" if self.world_size > 1 else ""
        return f"{self.stage} on {simulated_gpu.device(self.rank)}{ddp}"


@dataclass
class Verdict:
    """What the audit ran and found."""

    outcomes: list[Outcome] = field(default_factory=list)
    hooks: set[str] = field(default_factory=set)  # the hooks and loop steps that ran
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # a stage the data has nothing for: why

    @property
    def errors(self) -> list[DevicePlacementError]:
        """Each bug once, by its line, in the order found."""
        seen, errors = set(), []
        for outcome in self.outcomes:
            error = outcome.error
            if error is not None and (error.filename, error.lineno, error.kind) not in seen:
                seen.add((error.filename, error.lineno, error.kind))
                errors.append(error)
        return errors

    @property
    def gaps(self) -> list[Outcome]:
        return [outcome for outcome in self.outcomes if outcome.gap is not None]

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.errors else EXIT_INCOMPLETE if self.gaps else EXIT_PASSED

    def report(self) -> list[str]:
        lines = []
        for outcome in self.outcomes:
            status = "FAILED" if outcome.error else "NOT AUDITED" if outcome.gap else "ok"
            lines.append(f"  {outcome.where:<44} {status}  ({outcome.seconds:.2f} s)")
        for error in self.errors:
            lines += ["", f"FAILED {error}"]
        for outcome in self.gaps:
            lines += ["", f"NOT AUDITED {outcome.where}: {outcome.gap}"]
        lines += [f"note: {stage} skipped: {why}" for stage, why in self.skipped.items()]
        lines += [f"note: {note}" for note in self.notes]
        return lines


def audit(model: L.LightningModule, data: Any = None, *, trainer: L.Trainer | None = None) -> "Verdict":
    """Train ``model`` on simulated GPUs; raise ``DevicePlacementError`` for the first bug found.

    Args:
        model: The LightningModule, as constructed. It is left as it was: the audit trains copies.
        data: A ``LightningDataModule``, or one batch as the DataLoader yields it (used for
            every stage), or None when ``model`` defines its own dataloaders.
        trainer: A Trainer whose settings to audit with: its callbacks, gradient clipping
            and accumulation, and precision (mixed precision runs as float32).

    Raises:
        DevicePlacementError: An operation would fail on a GPU.
        AuditIncompleteError: No bug was found, but part of the run could not be audited.
    """
    verdict = run_audit(model, data, trainer=trainer, stop_at_bug=True)
    if verdict.errors:
        raise verdict.errors[0]
    if verdict.gaps:
        raise AuditIncompleteError(verdict)
    return verdict


def run_audit(
    model: L.LightningModule, data: Any = None, *, trainer: L.Trainer | None = None, stop_at_bug: bool = False
) -> Verdict:
    """Run every stage of ``model`` on the simulated GPUs and return what was found; raises only for our own bugs.

    With ``stop_at_bug``, the run ends at the first placement bug instead of auditing the remaining stages.
    """
    simulated_gpu.enable()
    settings, callbacks, notes = _settings(trainer)
    verdict = Verdict(notes=notes)
    stages = []
    for stage in STAGES:
        if not _defines(stage, model):
            continue  # the model has no such step: nothing of it would run on a GPU either
        if _has_data_for(stage, model, data):
            stages.append(stage)
        else:
            verdict.skipped[stage] = f"{type(data if data is not None else model).__name__} has no data for it"
    with _global_state_kept(), _quiet(), tempfile.TemporaryDirectory(prefix="placement-audit-") as folder:
        for rank, world_size in PASSES:
            twin = _copy(model)
            tracker = HookTracker()
            pass_folder = Path(folder) / f"rank{rank}"
            runner = L.Trainer(
                strategy=SimulatedGPUStrategy(rank, world_size),
                callbacks=[_redirected(callback, pass_folder) for callback in copy.deepcopy(callbacks)],
                logger=_logger(trainer, pass_folder, verdict.notes),
                default_root_dir=pass_folder,
                profiler=tracker,
                max_epochs=EPOCHS,
                limit_train_batches=BATCHES,
                limit_val_batches=BATCHES,
                limit_test_batches=BATCHES,
                limit_predict_batches=BATCHES,
                num_sanity_val_steps=1,
                val_check_interval=1.0,
                check_val_every_n_epoch=1,
                log_every_n_steps=1,
                enable_progress_bar=False,
                enable_model_summary=False,
                **settings,
            )
            _check_logged_values(twin, runner)
            for stage in stages:
                outcome = Outcome(stage, rank, world_size)
                start = time.perf_counter()
                try:
                    with simulated_gpu.simulating(rank, is_user_code):
                        getattr(runner, stage)(twin, **_data_arguments(stage, data))
                except (KeyboardInterrupt, SystemExit, SimulationUnavailableError):
                    raise  # Ctrl-C (which Lightning turns into an exit), or no simulated GPU at all
                except Exception as err:
                    explained = explain(err, stage=stage, rank=rank, world_size=world_size, model=twin)
                    if isinstance(explained, DevicePlacementError):
                        outcome.error = explained
                    else:
                        outcome.gap = explained
                outcome.seconds = time.perf_counter() - start
                verdict.outcomes.append(outcome)
                if outcome.error is not None and stop_at_bug:
                    return verdict
            verdict.hooks |= tracker.actions
    return verdict


def run_on_simulated_gpu(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``function`` with its tensor arguments on the simulated GPU, and return its result (there).

    For code outside a LightningModule, such as a data module's on-device augmentation.
    Raises ``DevicePlacementError`` where a GPU would fail.
    """
    with simulated_gpu.simulating(0, is_user_code):
        args, kwargs = move_data_to_device((args, kwargs), simulated_gpu.device(0))
        try:
            return function(*args, **kwargs)
        except SimulatedDeviceError as err:
            name = getattr(function, "__qualname__", repr(function))
            raise explain(err, stage="call", rank=0, world_size=1, hook=name) from None


# ----------------------------------------------------------------------------- Lightning's side


class SimulatedGPUAccelerator(Accelerator):
    """Lightning's accelerator for the simulated GPU: ``--accelerator simgpu``."""

    def setup_device(self, device: torch.device) -> None:
        simulated_gpu.enable()
        simulated_gpu.set_device(device)

    def teardown(self) -> None:
        pass

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return {}

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> list[int]:
        if devices in ("auto", -1, "-1"):
            return [0]
        if isinstance(devices, str):
            devices = [int(index) for index in devices.split(",") if index.strip()] if "," in devices else int(devices)
        indexes = list(range(devices)) if isinstance(devices, int) else list(devices)
        if not indexes or max(indexes) >= simulated_gpu.DEVICE_COUNT or min(indexes) < 0:
            last = simulated_gpu.DEVICE_COUNT - 1
            raise ValueError(f"--devices {devices}: the simulated GPU has devices 0 to {last}")
        return indexes

    @staticmethod
    def get_parallel_devices(devices: list[int]) -> list[torch.device]:
        return [simulated_gpu.device(index) for index in devices]

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True

    @classmethod
    def name(cls) -> str:
        return SIMULATED

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(SIMULATED, cls, description="A CUDA GPU simulated on the CPU (the device audit)")


if SIMULATED not in AcceleratorRegistry:
    SimulatedGPUAccelerator.register_accelerators(AcceleratorRegistry)


class SimulatedGPUStrategy(ParallelStrategy):
    """One process on ``simgpu:<rank>``; with ``world_size`` 2, it plays that rank of a DDP run.

    Its data is that rank's share (Lightning's ``DistributedSampler``). Collective
    operations act as if every process held the same values, after checking what NCCL
    checks: that the tensors are on this process's GPU.
    """

    strategy_name = SIMULATED

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        device = simulated_gpu.device(rank)
        super().__init__(accelerator=SimulatedGPUAccelerator(), parallel_devices=[device])
        self._rank, self._world_size = rank, world_size

    @property
    def root_device(self) -> torch.device:
        return simulated_gpu.device(self._rank)

    @property
    def global_rank(self) -> int:
        return self._rank

    @property
    def local_rank(self) -> int:
        return self._rank

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def is_distributed(self) -> bool:
        return self._world_size > 1

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        return {"num_replicas": self._world_size, "rank": self._rank} if self.is_distributed else None

    def setup_environment(self) -> None:
        super().setup_environment()
        rank_zero_only.rank = self._rank

    def model_to_device(self) -> None:
        self.model.to(self.root_device)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not isinstance(tensor, torch.Tensor) or not self.is_distributed:
            return tensor
        self.check_collective(tensor, "all_reduce")
        return tensor * self._world_size if "sum" in str(reduce_op).lower() else tensor

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        if not self.is_distributed:
            return tensor
        self.check_collective(tensor, "all_gather")
        return torch.stack([tensor] * self._world_size)

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        pass

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        # What a GPU run saves, with the values the simulated tensors hold.
        if self.is_global_zero:
            super().save_checkpoint(simulated_gpu.to_cpu(checkpoint), filepath, storage_options)

    def check_collective(self, tensor: torch.Tensor, operation: str) -> None:
        """Raise ``SimulatedDeviceError`` where NCCL would refuse ``tensor``: off this process's GPU."""
        if tensor.device != self.root_device:
            device = simulated_gpu.as_cuda(tensor.device)
            raise SimulatedDeviceError(
                f"{operation} of a tensor on {device} in process {self._rank}, whose GPU is "
                f"{simulated_gpu.as_cuda(self.root_device)}: NCCL refuses it "
                f"(No backend type associated with device type {device.split(':')[0]})",
                kind="sync_dist",
                operation=f"torch.distributed.{operation}",
                devices=(simulated_gpu.as_cuda(self.root_device), device),
                culprit=tensor,
            )


def _check_logged_values(model: L.LightningModule, trainer: L.Trainer) -> None:
    """Under DDP, a value logged with ``sync_dist=True`` must be on the module's device: check at the call."""
    log = model.log

    def checked_log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("sync_dist") and isinstance(value, torch.Tensor) and trainer.world_size > 1:
            trainer.strategy.check_collective(value, "all_reduce")
        return log(name, value, *args, **kwargs)

    model.log = checked_log


class HookTracker(Profiler):
    """Lightning names every hook and loop step to its profiler: mark each exception with the innermost one."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: set[str] = set()

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def summary(self) -> str:
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        self.actions.add(action_name)
        try:
            yield action_name
        except BaseException as err:
            if getattr(err, "_audit_action", None) is None:
                err._audit_action = action_name
            raise


# ----------------------------------------------------------------------------- the run


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
    precision, notes = trainer.precision, []
    if "mixed" in str(precision) or precision == "transformer-engine":
        notes.append(f"precision {precision} ran as 32-true: mixed precision does not change where tensors are")
        precision = "32-true"
    settings = {
        "precision": precision,
        "gradient_clip_val": trainer.gradient_clip_val,
        "gradient_clip_algorithm": trainer.gradient_clip_algorithm,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
    }
    return settings, callbacks, notes


def _logger(trainer: L.Trainer | None, folder: Path, notes: list[str]) -> Logger | None:
    """The logger of ``trainer``'s kind, writing into the audit's folder (Lightning's default without a Trainer).

    A logger that sends its records elsewhere (W&B, MLflow, ...) is not used: a TensorBoard
    logger, or a CSV one without TensorBoard, stands in for it.
    """
    kind = type(trainer.logger) if trainer is not None and trainer.logger is not None else None
    if trainer is not None and kind is None:
        return None
    if kind in (CSVLogger, TensorBoardLogger):
        return kind(folder)
    tensorboard = any(importlib.util.find_spec(name) for name in ("tensorboard", "tensorboardX"))
    stand_in = TensorBoardLogger if tensorboard else CSVLogger
    if kind is not None:
        notes.append(f"{kind.__name__} was replaced by {stand_in.__name__} in a temporary folder")
    return stand_in(folder)


def _redirected(callback: L.Callback, folder: Path) -> L.Callback:
    """Point a callback that writes files into the audit's own folder, so nothing of the user's is touched."""
    if isinstance(callback, ModelCheckpoint):
        callback.dirpath = str(folder / "checkpoints")
    elif isinstance(callback, BasePredictionWriter):
        for name in ("path", "output_dir"):
            value = getattr(callback, name, None)
            if isinstance(value, str | os.PathLike):
                setattr(callback, name, str(folder / "predictions" / Path(value).name))
    return callback


def _defines(stage: str, model: L.LightningModule) -> bool:
    """Whether ``model`` has the stage's step."""
    return is_overridden(STEP_OF_STAGE[stage], model, L.LightningModule)


def _has_data_for(stage: str, model: L.LightningModule, data: Any) -> bool:
    """Whether the data defines ``stage``: its dataloader, and, where the data module says which stages
    it has data for (``has_data_for(stage)``, as an image folder without a test split does), that one."""
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
    loader = DataLoader(_Repeated(data), batch_size=None, collate_fn=_as_is)
    if stage == "fit":
        return {"train_dataloaders": loader, "val_dataloaders": loader}
    return {"dataloaders": loader, **quiet}


class _Repeated(Dataset):
    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return BATCHES

    def __getitem__(self, index: int) -> Any:
        return self.batch


def _as_is(batch: Any) -> Any:
    return batch


def _copy(model: L.LightningModule) -> L.LightningModule:
    """A copy to train, without the Trainer the model may be attached to."""
    memo = {id(model._trainer): None} if model._trainer is not None else {}
    return copy.deepcopy(model, memo)


@contextmanager
def _global_state_kept() -> Iterator[None]:
    """Leave the random generators and Lightning's rank as the audit found them."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    rank = rank_zero_only.rank
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        rank_zero_only.rank = rank


@contextmanager
def _quiet() -> Iterator[None]:
    """Keep Lightning's messages out of the report: its advice for a full run does not apply to two batches."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


# ----------------------------------------------------------------------------- the report


def explain(
    err: BaseException,
    *,
    stage: str,
    rank: int,
    world_size: int,
    model: L.LightningModule | None = None,
    hook: str | None = None,
) -> DevicePlacementError | str:
    """A ``DevicePlacementError`` for what a GPU would refuse in ``err``, or else why the run stopped there."""
    chain = _chain(err)
    device_error = next((_as_device_error(link) for link in chain if _as_device_error(link) is not None), None)
    if device_error is not None:
        chain = chain[: next(i for i, link in enumerate(chain) if _as_device_error(link) is not None) + 1]
    action = next((link._audit_action for link in chain if getattr(link, "_audit_action", None)), None)
    hook = hook or _hook(action, model)
    frame = _user_frame(chain)
    at = f"{_shown(frame.filename)}:{frame.lineno}" if frame else "a line outside your code"
    if device_error is None:
        reason = _limitation(chain) or f"{type(err).__name__}: {_first_line(err)}"
        return f"{hook} stopped at {at}: {reason}"
    kind = device_error.kind
    lines = [
        f"{stage} on {simulated_gpu.device(rank)}"
        + (f" as DDP rank {rank} of {world_size}" if world_size > 1 else "")
        + f", {hook}: {device_error.operation} at {at}",
    ]
    if frame and frame.line:
        lines.append(f"    {frame.line}")
    if kind == "hard-coded device":
        lines.append(f"Found: {device_error}")
    else:
        lines.append(f"On a GPU: {'TypeError' if kind == 'numpy' else 'RuntimeError'}: {device_error}")
    culprit = _culprit(device_error, model)
    if culprit:
        lines.append(culprit)
    fix, rule = FIXES[kind]
    lines.append(f"Fix: {fix}. See {rule} of {GUIDE}.")
    return DevicePlacementError(
        "\n".join(lines),
        kind=kind,
        stage=stage,
        rank=rank,
        hook=hook,
        operation=device_error.operation,
        filename=frame.filename if frame else "",
        lineno=frame.lineno if frame else 0,
    )


def _shown(filename: str) -> str:
    """``filename`` relative to the working folder when it is inside it, as people type paths."""
    path = Path(filename)
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else filename


# PyTorch's own checks of devices, outside the simulated GPU's (an LSTM's hidden state, ...).
_PYTORCH_DEVICE_CHECK = re.compile(
    rf"device.*\b{SIMULATED}(:\d+)?\b.*\bcpu\b|device.*\bcpu\b.*\b{SIMULATED}\b", flags=re.IGNORECASE
)


def _as_device_error(err: BaseException) -> SimulatedDeviceError | None:
    """``err`` if the simulated GPU refused something, or PyTorch did for mixing the simulated GPU with the CPU."""
    if isinstance(err, SimulatedDeviceError):
        return err
    if isinstance(err, RuntimeError) and _PYTORCH_DEVICE_CHECK.search(str(err)):
        message = simulated_gpu.as_cuda(_first_line(err))
        return SimulatedDeviceError(message, kind="mixed devices", operation="PyTorch's own device check")
    return None


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or during, outermost first."""
    chain = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


_STRATEGY_STEPS = {**{step: step for step in STEP_OF_STAGE.values()}, "backward": "backward"}
_ACTIONS = {"run_training_epoch": "the training epoch", "save_checkpoint": "saving a checkpoint"}
_LOOP_STEPS = {
    "train_dataloader_next": "fetching a training batch",
    "val_next": "fetching a validation batch",
    "test_next": "fetching a test batch",
    "predict_next": "fetching a prediction batch",
}


def _hook(action: str | None, model: L.LightningModule | None) -> str:
    """A readable name for a Lightning profiler action.

    ``[Callback]EMA{...}.on_fit_start`` -> ``callback EMA.on_fit_start``.
    """
    if action is None:
        return "setting up"
    match = re.fullmatch(r"\[(\w+)\](.*)\.(\w+)", action, flags=re.DOTALL)
    if match is None:
        return _ACTIONS.get(action, action)
    kind, owner, method = match.groups()
    owner = owner.split("{")[0]
    model_name = type(model).__name__ if model is not None else "LightningModule"
    if kind == "Strategy":
        if method == "backward":
            return f"{model_name}.training_step (backward)"
        return f"{model_name}.{method}" if method in STEP_OF_STAGE.values() else f"Lightning's {method}"
    if kind == "Callback":
        return f"callback {owner}.{method}"
    if kind.startswith("_"):
        return _LOOP_STEPS.get(method, method)
    return f"{owner}.{method}"


_PACKAGE_FOLDERS = (path for path in sys.path if path.endswith(("site-packages", "dist-packages")))
_LIBRARIES = tuple(str(Path(path).resolve()) for path in {*sysconfig.get_paths().values(), *_PACKAGE_FOLDERS} if path)
# This module and the simulated GPU's (whose code may be another copy's: see the end of simulated_gpu.py).
_OURS = (str(Path(__file__).resolve()), str(Path(simulated_gpu.to_cpu.__code__.co_filename).resolve()))
_PROJECT = str(Path(__file__).resolve().parent)


def is_user_code(filename: str) -> bool:
    """Whether ``filename`` is the project's or the user's code, not the standard library's or a package's."""
    path = str(Path(filename).resolve())
    if path in _OURS or filename.startswith("<"):
        return False
    return path.startswith(_PROJECT) or not path.startswith(_LIBRARIES)


def _user_frame(chain: list[BaseException]) -> traceback.FrameSummary | None:
    """The innermost frame of your code (not PyTorch's, Lightning's or another library's) that the error passed."""
    for err in reversed(chain):
        for frame in reversed(traceback.extract_tb(err.__traceback__)):
            if is_user_code(frame.filename):
                return frame
    return None


_NEEDS_A_GPU = re.compile(
    r"Found no NVIDIA driver|Torch not compiled with CUDA|No CUDA GPUs are available|CUDA driver version|"
    r"CUDA error|cuda runtime error",
    flags=re.IGNORECASE,
)


def _limitation(chain: list[BaseException]) -> str | None:
    """What the simulation cannot do that the error shows, in words."""
    for err in chain:
        frames = traceback.extract_tb(err.__traceback__)
        if isinstance(err, simulated_gpu.NotSimulatedError):
            return f"{err}: this part cannot be simulated"
        if _NEEDS_A_GPU.search(str(err)):
            calls = [frame.name for frame in frames if "/torch/cuda/" in frame.filename]
            api = f"torch.cuda.{calls[0]}()" if calls and not calls[0].startswith("_") else "a torch.cuda function"
            return f"it calls {api}, which needs a real GPU: this part cannot be simulated"
        if any("/torch/jit/" in frame.filename for frame in frames):
            reason = _first_line(err)
            return f"a TorchScript module cannot move to the simulated GPU ({reason}): this part cannot be simulated"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "(no message)"


def _culprit(err: SimulatedDeviceError, model: L.LightningModule | None) -> str | None:
    """Name the tensor that is on the wrong device, when it is an attribute of the model."""
    tensor = err.culprit
    if tensor is None or model is None:
        return None
    found = _find_attribute(model, tensor)
    if found is None:
        shape = tuple(tensor.shape)
        return f"The tensor on {err.devices[-1]} is the argument `{err.argument}`, {shape} {tensor.dtype}."
    path, holder = found
    if holder == "attribute":
        return f"It is `{path}`, a plain tensor attribute, which Lightning does not move: register it as a buffer."
    return f"It belongs to `{path}`, kept in a plain {holder}, which Lightning does not move."


_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def _find_attribute(model: torch.nn.Module, tensor: torch.Tensor) -> tuple[str, str] | None:
    """Where in ``model`` a plain attribute holds ``tensor`` (or the storage it views), and in what."""
    storage = tensor.untyped_storage().data_ptr() if tensor.device.type == "cpu" else None

    def same(value: Any) -> bool:
        if not isinstance(value, torch.Tensor):
            return False
        if value is tensor:
            return True
        return storage is not None and value.device.type == "cpu" and value.untyped_storage().data_ptr() == storage

    def holds(value: Any) -> bool:
        if isinstance(value, torch.nn.Module):
            return any(same(t) for t in (*value.parameters(), *value.buffers())) or any(
                same(t) for t in vars(value).values()
            )
        return same(value)

    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if name in _MODULE_INTERNALS:
                continue  # parameters, buffers and submodules: Lightning moves those
            path = f"{prefix}.{name}" if prefix else name
            if same(value):
                return path, "attribute"
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
            for key, item in items:
                if holds(item):
                    return f"{path}[{key!r}]", type(value).__name__
    return None


# ----------------------------------------------------------------------------- the command line


def main(args: list[str] | None = None) -> None:
    """Audit the model, data and Trainer settings that ``train.py`` builds from the same arguments."""
    from .cli import build_all

    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["fit"]:
        args = args[1:]
    # The Trainer is built only for its settings (callbacks, logger, clipping, ...): on the CPU, in one process.
    settings_only = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "auto"]
    settings_only += ["--trainer.num_nodes", "1"]
    try:
        model, datamodule, trainer = build_all([*args, *settings_only])
    except SystemExit as stop:
        sys.exit(stop.code if isinstance(stop.code, int) else _usage(stop.code))
    net = getattr(model, "net", None)
    print(
        f"Auditing {type(model).__name__}{f' ({type(net).__name__})' if net is not None else ''} with "
        f"{type(datamodule).__name__} on a simulated GPU, then as rank 1 of a 2-GPU DDP run ..."
    )
    try:
        verdict = run_audit(model, datamodule, trainer=trainer)
    except SimulationUnavailableError as err:
        sys.exit(_usage(f"error: {err}"))
    for line in verdict.report():
        print(line)
    if verdict.exit_code == EXIT_PASSED:
        stages = "Every stage the data defines" if verdict.skipped else "Every stage"
        hooks = len(verdict.hooks)
        print(f"{stages} ran on the simulated GPUs ({hooks} hooks and steps): the model will run on a GPU.")
    sys.exit(verdict.exit_code)


def _usage(message: Any) -> int:
    print(message, file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    main()
