"""The forecaster: a GRU over a window of the series, and a linear head that predicts the next values."""

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score


class Forecaster(L.LightningModule):
    """Reads a window ``history`` (batch, length, 2: the value and the phase of the season) and predicts the
    next ``horizon`` values. Batches are dicts: ``{"history": ..., "target": (batch, horizon)}``."""

    def __init__(self, hidden: int = 32, horizon: int = 4, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.gru = nn.GRU(input_size=2, hidden_size=hidden, batch_first=True)
        self.head = nn.Linear(hidden, horizon)
        metrics = MetricCollection(
            {"mae": MeanAbsoluteError(), "rmse": MeanSquaredError(squared=False), "r2": R2Score()}
        )
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        _, last = self.gru(history)  # (layers, batch, hidden)
        return self.head(last[-1])  # (batch, horizon)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self(batch["history"]), batch["target"])
        self.log("train/loss", loss, on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_metrics)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch["history"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str, metrics: MetricCollection) -> None:
        predicted = self(batch["history"])
        self.log(f"{stage}/loss", nn.functional.mse_loss(predicted, batch["target"]))
        metrics.update(predicted, batch["target"])
        self.log_dict(metrics)
