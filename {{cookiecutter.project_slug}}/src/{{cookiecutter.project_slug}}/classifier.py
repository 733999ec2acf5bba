"""The LightningModule: loss, accuracy, optimizer and logging around any classification network."""

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning_kit.arguments import NonNegativeFloat32, NumClasses, PositiveFloat32
from lightning_kit.errors import ConfigError
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

# Showing the training loss every step would cost a call into Lightning's logging
# per step; every 20 is enough to watch it move.
LOSS_ON_PROGRESS_BAR_EVERY = 20


class Classifier(L.LightningModule):
    """Trains ``net`` to map a batch's inputs to logits over ``num_classes`` classes.

    Nothing here names a device: Lightning moves this module (with ``net``, the
    loss and the metrics, all submodules) and every batch to the accelerator.

    Args:
        net: The network, a plain ``nn.Module`` returning ``(B, num_classes)`` logits.
        num_classes: Number of classes the accuracy is measured over (set by the data).
        class_names: The classes' names, in label order (set by the data); kept in checkpoints,
            for predictions and exported models.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        compile: Compile the network with ``torch.compile`` before training: for long runs, where
            the compile time pays back.

    What each argument accepts is in its type, which the command line checks where the value is given.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: NumClasses,
        class_names: list[str] | None = None,
        lr: PositiveFloat32 = 1e-3,
        weight_decay: NonNegativeFloat32 = 0.0,
        compile: bool = False,
    ) -> None:
        super().__init__()
        if class_names is not None:
            class_names = [str(name) for name in class_names]
            if len(class_names) != num_classes or len(set(class_names)) != num_classes:
                raise ConfigError(
                    f"the data's class_names must be {num_classes} different names, one per class, got {class_names}"
                )
        self.save_hyperparameters(ignore=["net"])
        self.class_names = class_names or [str(label) for label in range(num_classes)]
        self.net = net
        # Holds no tensors, so it needs no placing; a loss with class weights would
        # keep them as a buffer, and as a submodule here it would move with the model.
        self.loss_fn = nn.CrossEntropyLoss()
        # One metric object per stage, as attributes: Lightning moves their state. They
        # accumulate on the device and are read once per epoch. Value checks are off
        # (validate_args, nan_strategy): each would make the host wait for the device at
        # every step. "micro" accuracy, the share of correct predictions, is counted
        # without bincount, which would wait too.
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.test_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")
        # The training metrics' running sums go into checkpoints, so a run interrupted
        # mid-epoch reports the whole epoch after resuming. (Validation and test start
        # over on resume: theirs are recomputed from the first batch.)
        self.train_acc.persistent(True)
        self.train_loss.persistent(True)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, "train")
        if batch_idx % LOSS_ON_PROGRESS_BAR_EVERY == 0:
            self.log("train/loss_step", loss, prog_bar=True, logger=False)
        return loss

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

    def configure_model(self) -> None:
        if self.hparams.compile and not isinstance(self.net, torch._dynamo.OptimizedModule):
            self.net = torch.compile(self.net)
{%- if cookiecutter.task == "image" %}

    def setup(self, stage: str) -> None:
        # Per-channel statistics that the data measured on its training split (image folders)
        # become the network's buffers, so they are saved with it. A resumed run's checkpoint,
        # loaded after this, brings back the statistics it was trained with.
        normalization = getattr(self.trainer.datamodule, "normalization", None)
        if stage == "fit" and normalization is not None and hasattr(self.net, "normalize_with"):
            self.net.normalize_with(*normalization)
{%- endif %}

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_train_start(self) -> None:
        # A resumed run's optimizer comes back with the checkpoint's learning rate: the
        # configured one (saved in the run's config.yaml) is the one it goes on with.
        for group in self.trainer.optimizers[0].param_groups if self.trainer.ckpt_path else ():
            if group["lr"] != self.hparams.lr:
                rank_zero_info(f"learning rate {self.hparams.lr:g} from now on (the checkpoint's was {group['lr']:g})")
                group["lr"] = self.hparams.lr
                if "initial_lr" in group:
                    group["initial_lr"] = self.hparams.lr

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        inputs, targets = batch
        logits = self(inputs)
        loss = self.loss_fn(logits, targets)
        accuracy = getattr(self, f"{stage}_acc")
        accuracy.update(logits, targets)
        getattr(self, f"{stage}_loss").update(loss.detach())
        return loss

    def _log_epoch(self, stage: str) -> None:
        """Log the stage's mean loss and accuracy over the epoch (over all processes under DDP), and reset them."""
        for name in ("loss", "acc"):
            metric = getattr(self, f"{stage}_{name}")
            # compute() has already combined all processes; sync_dist only tells Lightning so.
            self.log(f"{stage}/{name}", metric.compute(), prog_bar=True, sync_dist=True)
            metric.reset()
