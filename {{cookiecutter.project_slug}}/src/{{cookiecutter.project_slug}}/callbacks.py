"""Callbacks this project adds to Lightning's: interruption checkpoints, plots, prediction files."""

import csv
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.trainer.states import TrainerFn

from .plots import CONFUSION_FILE, plot_run


class InterruptCheckpoint(L.Callback):
    """Save ``on_exception.ckpt`` beside the run's other checkpoints when ``fit`` stops early.

    Ctrl-C, and SIGTERM (what SLURM sends before it kills a job), stop Lightning at the
    next step boundary; this checkpoint then holds everything up to that step, and
    ``--ckpt_path last`` resumes from it. (Lightning's own ``OnExceptionCheckpoint``
    is not used: with it installed, every new ``fit`` silently resumes from the last
    checkpoint it can find.)
    """

    FILENAME = "on_exception.ckpt"

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        checkpoint_dir = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback is not None else None
        if trainer.state.fn == TrainerFn.FITTING and checkpoint_dir:
            trainer.save_checkpoint(Path(checkpoint_dir) / self.FILENAME)


class RunPlots(L.Callback):
    """After ``fit``, save the validation confusion matrix and draw the run's plots into its folder."""

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
        plot_run(run_dir)


class CSVPredictionWriter(BasePredictionWriter):
    """Write ``predict``'s output to a CSV file: input index, predicted class, then each class's probability.

    Args:
        path: The CSV file to write. Under several processes, each writes its own
            file, with ``.rank<N>`` before the extension.
    """

    def __init__(self, path: str = "predictions.csv") -> None:
        super().__init__(write_interval="batch")
        self.path = path
        self._file = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(self.path)
        if trainer.world_size > 1:
            path = path.with_suffix(f".rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", newline="")
        self._writer = csv.writer(self._file)
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
        predicted = prediction.argmax(dim=1).tolist()
        if not self._header_written:
            self._writer.writerow(["index", "predicted", *(f"p{k}" for k in range(prediction.shape[1]))])
            self._header_written = True
        for index, label, row in zip(batch_indices, predicted, prediction.float().tolist(), strict=True):
            self._writer.writerow([index, label, *(f"{p:.6f}" for p in row)])

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
