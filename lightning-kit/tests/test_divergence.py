"""Divergence: a run whose loss or weights stop being finite ends in one line, and no save writes such a model."""

from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import RUNS, checkpoint
from image_project.cli import main


@pytest.mark.slow
def test_a_run_that_diverges_stops_with_one_line_and_saves_nothing_diverged(in_tmp_path, fast_args):
    """A learning rate of 1e10 drives the loss to NaN: the run stops, non-zero, and no checkpoint holds a NaN."""
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, "--max_epochs", "3", "--model.lr", "1e10"])
    message = str(exit_info.value.code)
    assert message.startswith("error: training diverged") and "--model.lr" in message
    for saved in RUNS.rglob("*.ckpt"):
        weights = torch.load(saved, weights_only=True)["state_dict"].values()
        assert all(torch.isfinite(tensor).all() for tensor in weights if tensor.is_floating_point()), saved


class PoisonAt(L.Callback):
    """Make the network's weights NaN before a given step: from that step on, the loss is NaN."""

    def __init__(self, step: int = 3) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


class SaveAt(L.Callback):
    """Call ``trainer.save_checkpoint`` after a given step, as any code may."""

    def __init__(self, step: int = 5) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint("saved_by_hand.ckpt")


@pytest.mark.slow
@pytest.mark.parametrize(
    "save",
    [
        ["--trainer.callbacks+=conftest.SignalAt", "--trainer.callbacks.init_args.train_batch", "4"],
        [f"--trainer.callbacks+={__name__}.SaveAt", "--trainer.callbacks.init_args.step", "5"],
    ],
    ids=["SIGTERM", "save_checkpoint"],
)
def test_no_save_writes_a_diverged_model_between_the_periodic_checks(in_tmp_path, fast_args, save):
    """The loss turns NaN at step 3, a save is asked for at step 5, long before the check every 20 steps:
    the save is refused, the run stops with one line, and no checkpoint anywhere holds a non-finite weight."""
    poison = [f"--trainer.callbacks+={__name__}.PoisonAt", "--trainer.callbacks.init_args.step", "3"]
    steps = ["--trainer.limit_train_batches", "10", "--data.batch_size", "8", "--max_epochs", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, *steps, *poison, *save])
    message = str(exit_info.value.code)
    assert message.startswith("error: training diverged") and "step 5" in message, message
    assert len(message.splitlines()) == 1
    assert not Path("saved_by_hand.ckpt").exists() and not checkpoint(0, "on_exception.ckpt").exists()
    for saved in Path().rglob("*.ckpt"):
        weights = torch.load(saved, weights_only=True)["state_dict"].values()
        assert all(torch.isfinite(tensor).all() for tensor in weights if tensor.is_floating_point()), saved


@pytest.mark.slow
def test_a_loss_gone_nan_stops_the_run_at_the_next_periodic_check(in_tmp_path, fast_args):
    """The loss turns NaN at step 3 and no save is asked for: the check every 20 steps stops the run at step 20,
    not at the end of the epoch's 30 steps."""
    poison = [f"--trainer.callbacks+={__name__}.PoisonAt", "--trainer.callbacks.init_args.step", "3"]
    steps = ["--trainer.limit_train_batches", "30", "--data.batch_size", "8", "--max_epochs", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, *steps, *poison])
    message = str(exit_info.value.code)
    assert message.startswith("error: training diverged") and "step 20." in message, message
