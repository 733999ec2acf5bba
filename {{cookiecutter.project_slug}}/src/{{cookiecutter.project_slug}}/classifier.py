"""The LightningModule: loss, accuracy, optimizer and logging around any classification network."""

import lightning as L
import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy


class Classifier(L.LightningModule):
    """Trains ``net`` to map a batch's inputs to logits over ``num_classes`` classes.

    Nothing here names a device: Lightning moves this module (with ``net``, the
    loss and the metrics, all submodules) and every batch to the accelerator.

    Args:
        net: The network, a plain ``nn.Module`` returning ``(B, num_classes)`` logits.
        num_classes: Number of classes the accuracy is measured over.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    def __init__(self, net: nn.Module, num_classes: int, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net
        # Holds no tensors, so it needs no placing; a loss with class weights would
        # keep them as a buffer, and as a submodule here it would move with the model.
        self.loss_fn = nn.CrossEntropyLoss()
        # One metric object per stage, as attributes: Lightning moves their state.
        self.train_acc = MulticlassAccuracy(num_classes)
        self.val_acc = MulticlassAccuracy(num_classes)
        self.test_acc = MulticlassAccuracy(num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Class probabilities, ``(B, num_classes)``."""
        inputs, _ = batch
        return self(inputs).softmax(dim=-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        inputs, targets = batch
        logits = self(inputs)
        loss = self.loss_fn(logits, targets)
        accuracy = getattr(self, f"{stage}_acc")
        accuracy.update(logits, targets)
        # The metric object is logged, so Lightning computes it once per epoch (synced
        # across processes) instead of every step.
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True, prog_bar=True)
        self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True, prog_bar=True)
        return loss
