"""The best epoch: the epoch and validation metrics of the best checkpoint, which the end of ``fit`` prints."""

from typing import Any

import lightning as L

from ..metric_logs import parse_name


class BestEpoch(L.Callback):
    """The epoch and validation metrics of the checkpoint callback's best checkpoint, for the end of ``fit``.

    Recorded when the checkpoint callback saves a new best (its ``best_model_path`` or ``best_model_score`` changes),
    so the metrics printed belong to the checkpoint it names; a callback that monitors nothing has no best. Kept in
    checkpoints across a resume. Epochs count from 0, as in Lightning's checkpoint names and ``metrics.csv``.
    """

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.metrics: dict[str, float] = {}
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
            if parse_name(name).stage == "val" and value.numel() == 1
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
