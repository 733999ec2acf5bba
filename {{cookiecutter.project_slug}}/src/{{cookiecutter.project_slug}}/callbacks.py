"""Callbacks this project adds to Lightning's: interruption checkpoints, plots, prediction files."""

import contextlib
import csv
import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .errors import UserError
from .files import check_output_file
from .plots import CONFUSION_FILE, plot_run


class InterruptCheckpoint(L.Callback):
    """Stop ``fit`` cleanly on Ctrl-C or SIGTERM, and save ``on_exception.ckpt`` to resume from.

    SIGTERM is what SLURM and most schedulers send before they kill a job. Either
    signal, received by any process of a DDP run, asks every process to stop: after
    the training step under way, or, during validation, once the validation has
    finished. A run resumed with ``--ckpt_path last`` then continues exactly as one
    that never stopped. A second Ctrl-C stops at once, without a checkpoint. Nothing
    is saved by a run that stopped before it trained a step, or that failed.

    (Lightning's own ``OnExceptionCheckpoint`` is not used: with it installed, every
    new ``fit`` silently resumes from the last checkpoint it can find.)
    """

    FILENAME = "on_exception.ckpt"
    # The checkpoint the last stop saved (None: nothing was trained yet), for the command line's message.
    saved: Path | None = None

    def __init__(self) -> None:
        InterruptCheckpoint.saved = None
        self._asked = False  # a signal arrived in this process
        self._held = False  # a stop waits for the validation under way to finish
        self._previous_handlers: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Installed after Lightning's own SIGTERM handler, which would stop in the middle of
        # a validation, and under DDP broadcast from whichever process received the signal.
        self._asked = self._held = False
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            handler = signal.getsignal(signum)
            if signum == signal.SIGINT and handler in (signal.SIG_IGN, None):
                continue  # started as a background job: Ctrl-C belongs to the shell's foreground
            self._previous_handlers[signum] = handler
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._asked and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._asked = True

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self._stop_asked(trainer):
            _ask_lightning_to_stop(trainer, True)  # it stops at its next safe point

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            # Lightning would stop after any validation batch; a run resumed there is not exact.
            self._held = _ask_lightning_to_stop(trainer, False)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.sanity_checking:
            self._held = self._stop_asked(trainer) or self._held

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._held:
            _ask_lightning_to_stop(trainer, True)

    def _stop_asked(self, trainer: L.Trainer) -> bool:
        # Every process takes part, so a signal to any one of them stops all of them.
        return trainer.strategy.reduce_boolean_decision(self._asked, all=False)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        checkpoint_dir = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback is not None else None
        # SIGTERMException is Lightning's stop at a safe point; any other exception may strike mid-step.
        graceful = isinstance(exception, SIGTERMException)
        if graceful and trainer.state.fn == TrainerFn.FITTING and trainer.global_step > 0 and checkpoint_dir:
            try:
                trainer.save_checkpoint(Path(checkpoint_dir) / self.FILENAME)
            except DivergenceError:
                # StopOnDivergence refused the save: a stop it did not see coming (Lightning's own SIGTERM
                # handler, in a thread). The run ends with that line instead, its signal handlers put back.
                self.teardown(trainer, pl_module, "fit")
                trainer._signal_connector.teardown()
                raise
            InterruptCheckpoint.saved = Path(checkpoint_dir) / self.FILENAME


def _ask_lightning_to_stop(trainer: L.Trainer, stop: bool) -> bool:
    """Set Lightning's own stop request (what its SIGTERM handler sets); return the previous one."""
    connector = trainer._signal_connector
    previous, connector.received_sigterm = connector.received_sigterm, stop
    return previous


class RandomState(L.Callback):
    """Keep the random generators' state in every checkpoint, and restore it on resume.

    So dropout and any other random draw continue, after an interruption, exactly as
    they would have in a run that never stopped.
    """

    def state_dict(self) -> dict[str, Any]:
        # Tensors and plain Python values only: checkpoints are read with weights_only=True.
        kind, keys, position, has_gauss, gauss = np.random.get_state()
        state = {
            "torch": torch.get_rng_state(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind, keys, position, has_gauss, gauss = state["numpy"]
        torch.set_rng_state(state["torch"])
        np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


class DivergenceError(UserError):
    """The training loss became NaN or infinite."""


class StopOnDivergence(L.Callback):
    """Stop ``fit`` when the training loss or the weights become NaN or infinite, before such a model is saved.

    Every save is checked before it is written, whoever asks for it: the checkpoint callbacks
    (best and last), the interruption checkpoint, a ``trainer.save_checkpoint`` call. The check
    covers the loss of every step so far (kept on the device, so no step waits for it) and the
    weights being saved. Between saves it runs every ``check_every`` steps, and at once when a
    stop is asked for (Ctrl-C, SIGTERM: a checkpoint is saved next), so a diverged run stops
    with one line, and the last good checkpoints stay as they are.

    ``InterruptCheckpoint`` must come before it in the callbacks: its stop is then seen in the
    same step, and, as it asks every process of a DDP run to stop at the same step, every
    process takes part in the check.
    """

    def __init__(self, check_every: int = 20) -> None:
        self.check_every = check_every
        self._finite: torch.Tensor | None = None  # stays on the device: no step waits for the host

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            finite = torch.isfinite(loss.detach()).all()
            self._finite = finite if self._finite is None else self._finite & finite
        if trainer.global_step % self.check_every == 0 or trainer.received_sigterm:
            self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._check(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Raised here, before the checkpoint is written: nothing non-finite reaches the disk.
        weights = [value for value in checkpoint.get("state_dict", {}).values() if isinstance(value, torch.Tensor)]
        self._check(trainer, all(bool(torch.isfinite(value).all()) for value in weights if value.is_floating_point()))

    def _check(self, trainer: L.Trainer, weights_finite: bool = True) -> None:
        finite = weights_finite and (self._finite is None or bool(self._finite))
        if not trainer.strategy.reduce_boolean_decision(finite, all=True):
            raise DivergenceError(
                f"training diverged: the training loss or the weights became NaN or infinite by epoch "
                f"{trainer.current_epoch}, step {trainer.global_step}. Nothing was saved from then on; "
                "try a lower --model.lr"
            )


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, which goes on judging across a resume.

    A resumed run writes into a new run folder, and for a new folder Lightning's own forgets
    the scores so far: the first epoch after the resume became the best, however it scored.
    This one keeps the best checkpoints' scores and paths (in the earlier run's folder) and
    saves a new best only when it beats them. Lightning never deletes a checkpoint outside
    the callback's own folder, so the earlier run's stay as they are.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict({**state_dict, "dirpath": self.dirpath})


class BestEpoch(L.Callback):
    """The epoch and validation metrics of the checkpoint callback's best checkpoint, for the end of ``fit``.

    Taken from the checkpoint callback itself: when it saves a new best checkpoint (its
    ``best_model_path`` or ``best_model_score`` changes), the metrics of that moment are
    recorded, so the metrics printed belong to the checkpoint it names. Kept in checkpoints,
    so a resumed run still knows the best epoch of the runs it continues.
    """

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.metrics: dict[str, float] = {}
        self._judged: tuple | None = None  # the checkpoint callback's best when last seen; None before fit

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._judged = _best_of(trainer)  # as restored from the checkpoint resumed from

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        judged = _best_of(trainer)
        if self._judged is None or judged == self._judged or not judged[0]:
            return
        # The checkpoint callback has just chosen a new best, and this is that checkpoint being saved.
        self._judged, self.epoch = judged, trainer.current_epoch
        self.metrics = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if name.startswith("val/") and value.numel() == 1
        }
        if "callbacks" in checkpoint:
            checkpoint["callbacks"][self.state_key] = self.state_dict()  # written before this hook ran

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "metrics": self.metrics}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.metrics = state["epoch"], dict(state["metrics"])


def _best_of(trainer: L.Trainer) -> tuple[str, float | None]:
    """The path and score of the checkpoint callback's best checkpoint (a new best may keep the path)."""
    judge = trainer.checkpoint_callback
    score = getattr(judge, "best_model_score", None)
    return getattr(judge, "best_model_path", ""), None if score is None else float(score)


class RunPlots(L.Callback):
    """After ``fit``, save the validation confusion matrix and draw the run's plots into its folder.

    A plot that cannot be drawn (a damaged metrics file, say) is reported in one line and
    does not fail the run it belongs to.
    """

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # every process must ask: the answer is broadcast from rank 0
        confusion = getattr(pl_module, "last_val_confusion", None)
        if not trainer.is_global_zero or log_dir is None:
            return
        run_dir = Path(log_dir)
        if confusion is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            with (run_dir / CONFUSION_FILE).open("w", newline="") as file:
                csv.writer(file).writerows(confusion.tolist())
        if trainer.logger is not None:
            trainer.logger.save()
        try:
            plot_run(run_dir, confusion_epoch=getattr(pl_module, "last_val_confusion_epoch", None))
        except (OSError, ValueError, csv.Error) as err:
            sys.stderr.write(f"warning: the plots of {run_dir} were not drawn: {err}\n")


class CSVPredictionWriter(BasePredictionWriter):
    """Write ``predict``'s output to a CSV file, one row per input, in the order of the inputs.

    Columns: ``file`` (or ``index`` for inputs that are not files), ``predicted`` (the class
    name), ``label`` (the true class name, when the inputs have labels), then ``p_<class>``,
    each class's probability. The file is written beside its final name and renamed when
    complete, so a run that fails leaves no partial file; an existing file is replaced only
    when asked to. A path that names a folder, a FIFO or a device, or that cannot be
    written, is refused in one line before predicting (by the command line, before the
    data is read).

    Args:
        path: The CSV file to write. Under several processes, each writes its own
            file, with ``.rank<N>`` before the extension.
        overwrite: Replace ``path`` if it exists (otherwise the run stops before predicting).
            A link there is replaced by the file; what it points to is left as it is.
    """

    def __init__(self, path: str = "predictions.csv", overwrite: bool = False) -> None:
        super().__init__(write_interval="batch")
        self.path = path
        self.overwrite = overwrite
        self._file = None

    @staticmethod
    def check_path(path: str | Path, overwrite: bool) -> None:
        """Refuse, in one line naming the flag, a path that could not be written; the command line checks it first."""
        check_output_file(
            path, "--predictions.path", overwrite=overwrite, overwrite_flag="--predictions.overwrite true"
        )

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(self.path)
        if trainer.world_size > 1:
            path = path.with_suffix(f".rank{trainer.global_rank}{path.suffix}")
        self.check_path(self.path if trainer.world_size == 1 else path, self.overwrite)
        self._target, self._temporary = path, path.with_name(f".writing.{os.getpid()}.{path.name}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._temporary.unlink(missing_ok=True)  # left by a killed run; "x" then refuses a link put in its place
            self._file = self._temporary.open("x", newline="")
        except OSError as err:
            self._not_written(err)
        self._writer = csv.writer(self._file)
        self._rows = 0
        datamodule = trainer.datamodule
        self._names = getattr(datamodule, "predict_names", None)
        self._labelled = getattr(datamodule, "predict_labelled", False)
        self._classes = getattr(pl_module, "class_names", None)
        self._header_written = False

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: torch.Tensor,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        classes = self._classes or [str(k) for k in range(prediction.shape[1])]
        if not self._header_written:
            first = "file" if self._names is not None else "index"
            label = ["label"] if self._labelled else []
            self._writer.writerow([first, "predicted", *label, *(f"p_{name}" for name in classes)])
            self._header_written = True
        predicted = prediction.argmax(dim=1).tolist()
        labels = batch[1].tolist() if self._labelled else [None] * len(predicted)
        rows = []
        for index, guess, label, row in zip(batch_indices, predicted, labels, prediction.float().tolist(), strict=True):
            name = self._names[index] if self._names is not None else index
            true = [classes[label]] if self._labelled else []
            rows.append([name, classes[guess], *true, *(f"{p:.6f}" for p in row)])
        try:
            self._writer.writerows(rows)
        except OSError as err:
            self._not_written(err)
        self._rows += len(predicted)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None:
            try:
                self._file.close()
                self._file = None
                os.replace(self._temporary, self._target)
            except OSError as err:
                self._not_written(err)
            sys.stdout.write(f"predictions for {self._rows} inputs written to {self._target}\n")
            sys.stdout.flush()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # closing flushes: a full disk fails again here
                self._file.close()
            self._file = None
            self._temporary.unlink(missing_ok=True)

    def _not_written(self, err: OSError):
        """Stop with one line: the disk is full, the folder read-only, ... (the temporary file is removed)."""
        self._temporary.unlink(missing_ok=True)
        raise UserError(
            f"--predictions.path {self._target} cannot be written ({err.strerror or err}): "
            "free some space there, or give another --predictions.path"
        ) from err
