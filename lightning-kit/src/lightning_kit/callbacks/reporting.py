"""Reporting: the best epoch's metrics at the end of ``fit``, the run's plots, and the predictions CSV."""

import contextlib
import csv
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from ..errors import UserError
from ..files import check_output_file
from ..plots import CONFUSION_FILE, plot_run, write_confusion


class BestEpoch(L.Callback):
    """The epoch and validation metrics of the checkpoint callback's best checkpoint, for the end of ``fit``.

    Taken from the checkpoint callback itself: when it saves a new best checkpoint (its
    ``best_model_path`` or ``best_model_score`` changes), the metrics of that moment are
    recorded, so the metrics printed belong to the checkpoint it names (a checkpoint callback that
    monitors no metric has no best: nothing is recorded). So is the module's
    validation confusion matrix of that epoch (its ``last_val_confusion``, rows true classes,
    columns predicted), which ``RunPlots`` draws. Kept in checkpoints, so a resumed run still
    knows the best epoch of the runs it continues. Epochs count from 0, as Lightning's
    ``epoch`` in checkpoint names and ``metrics.csv``.
    """

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.metrics: dict[str, float] = {}
        self.confusion: torch.Tensor | None = None  # the best epoch's validation confusion matrix, if any (CPU)
        self._judged: tuple | None = None  # the checkpoint callback's best when last seen; None before fit

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._judged = _best_of(trainer)  # as restored from the checkpoint resumed from

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if getattr(trainer.checkpoint_callback, "monitor", None) is None:
            return  # it judges nothing: its "best" is its latest, and no epoch is the best
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
        self.confusion = _confusion_of(pl_module, trainer.current_epoch)
        if "callbacks" in checkpoint:
            checkpoint["callbacks"][self.state_key] = self.state_dict()  # written before this hook ran

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "metrics": self.metrics, "confusion": self.confusion}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.metrics = state["epoch"], dict(state["metrics"])
        self.confusion = state.get("confusion")  # absent from checkpoints written before it was kept


def _confusion_of(pl_module: L.LightningModule, epoch: int) -> torch.Tensor | None:
    """A copy of the module's validation confusion matrix of ``epoch`` (its ``last_val_confusion``), or None."""
    confusion = getattr(pl_module, "last_val_confusion", None)
    if not isinstance(confusion, torch.Tensor) or getattr(pl_module, "last_val_confusion_epoch", epoch) != epoch:
        return None
    # A host tensor (the counts read once, as the epoch ends): compact in the checkpoint, however many classes.
    return torch.tensor(confusion.detach().tolist(), dtype=torch.long)


def _counts(confusion: torch.Tensor | list) -> list[list[int]]:
    return [[int(count) for count in row] for row in torch.as_tensor(confusion).tolist()]


def _best_of(trainer: L.Trainer) -> tuple[str, float | None]:
    """The path and score of the checkpoint callback's best checkpoint (a new best may keep the path)."""
    judge = trainer.checkpoint_callback
    score = getattr(judge, "best_model_score", None)
    return getattr(judge, "best_model_path", ""), None if score is None else float(score)


class RunPlots(L.Callback):
    """After ``fit``, save the validation confusion matrix and draw the run's plots into its folder.

    The confusion matrix is the best checkpoint's (``BestEpoch``'s, when the run has one), else
    the last validation's; its CSV has a header row and column of class names (the module's
    ``class_names``, else the label numbers). A plot that cannot be drawn (a damaged metrics
    file, say) is reported in one line and does not fail the run it belongs to.
    """

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # every process must ask: the answer is broadcast from rank 0
        confusion, epoch, which = self._confusion(trainer, pl_module)
        if not trainer.is_global_zero or log_dir is None:
            return
        run_dir = Path(log_dir)
        if confusion is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_confusion(run_dir / CONFUSION_FILE, confusion, getattr(pl_module, "class_names", None))
        if trainer.logger is not None:
            trainer.logger.save()
        try:
            plot_run(run_dir, confusion_epoch=epoch, confusion_which=which)
        except (OSError, ValueError, csv.Error) as err:
            sys.stderr.write(f"warning: the plots of {run_dir} were not drawn: {err}\n")

    @staticmethod
    def _confusion(trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[list[list[int]] | None, int | None, str]:
        """The matrix to save, its epoch, and which it is: the best checkpoint's, else the last validation's."""
        best = next((callback for callback in trainer.callbacks if isinstance(callback, BestEpoch)), None)
        if best is not None and best.epoch is not None and best.confusion is not None:
            return _counts(best.confusion), best.epoch, "the best checkpoint's"
        last = getattr(pl_module, "last_val_confusion", None)
        if last is None:
            return None, None, ""
        return _counts(last), getattr(pl_module, "last_val_confusion_epoch", None), "the last"


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
