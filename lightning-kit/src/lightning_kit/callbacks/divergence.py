"""Divergence: stop ``fit`` when the loss or the weights stop being finite, before such a model is saved."""

from typing import Any

import lightning as L
import torch

from ..errors import UserError


class DivergenceError(UserError):
    """The training loss became NaN or infinite."""


class StopOnDivergence(L.Callback):
    """Stop ``fit`` when the training loss or the weights become NaN or infinite, before such a model is saved.

    Every save is checked before it is written, whoever asks for it, on the losses of every step so far (kept on the
    device, so no step waits) and the weights being saved; between saves every ``check_every`` steps, and at once
    when a stop is asked for. ``InterruptCheckpoint`` must come before it, so that every process of a DDP run takes
    part in the check of a stop in the same step.
    """

    def __init__(self, check_every: int = 20) -> None:
        self.check_every = check_every
        # The losses since the last check, kept on the device (no step waits for the host) and checked together.
        self._unchecked: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            # Kept, not checked: a step adds no work on the device, the check does it for all of them at once.
            self._unchecked.append(loss.detach())
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

    def _check(self, trainer: L.Trainer, finite: bool = True) -> None:
        # A check that finds a non-finite value raises, so the losses checked before were all finite.
        losses, self._unchecked = self._unchecked, []
        if losses:
            finite = finite and bool(torch.isfinite(torch.cat([x.reshape(-1) for x in losses])).all())
        if not trainer.strategy.reduce_boolean_decision(finite, all=True):
            raise DivergenceError(
                f"training diverged: the training loss or the weights became NaN or infinite by epoch "
                f"{trainer.current_epoch}, step {trainer.global_step}. Nothing was saved from then on; "
                "try a lower --model.lr"
            )
