"""Reporting: the best epoch and its checkpoint at the end of fit, the run's plots, and the predictions CSV."""

import csv
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
from conftest import RUNS, build, checkpoint, epoch_metrics, main


class RightOnlyIn(L.Callback):
    """Force the validation predictions: all right in epoch ``best``, all wrong in every other."""

    def __init__(self, best: int = 0) -> None:
        self.best = best

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        labels, right = batch[1], trainer.current_epoch == self.best

        def forced(module, inputs, logits):
            wanted = labels if right else (labels + 1) % logits.shape[-1]
            return 10 * torch.nn.functional.one_hot(wanted, logits.shape[-1]).to(logits.dtype)

        self._hook = pl_module.net.register_forward_hook(forced)

    def on_validation_batch_end(self, trainer, pl_module, *args):
        self._hook.remove()


@pytest.mark.slow
def test_a_resumed_run_names_the_checkpoint_of_the_best_metrics(in_tmp_path, fast_args, capsys):
    """Best in epoch 0, stopped in epoch 1 and resumed: the resumed run's best epoch, its metrics and the
    best checkpoint it names are all epoch 0's, in the first run's folder, kept there."""
    best = [f"--trainer.callbacks+={__name__}.RightOnlyIn", "--trainer.callbacks.init_args.best", "0"]
    stop = ["--trainer.callbacks+=conftest.SignalAt", "--trainer.callbacks.init_args.epoch", "1"]
    stop += ["--trainer.callbacks.init_args.train_batch", "1"]
    with pytest.raises(SystemExit, match="stopped by Ctrl-C or SIGTERM"):
        main([*fast_args, "--max_epochs", "3", *best, *stop])
    capsys.readouterr()
    main([*fast_args, "--max_epochs", "3", *best, "--ckpt_path", "last"])
    out = capsys.readouterr().out
    assert "fit finished: best epoch 0: val/loss=" in out and "val/acc=1.0000" in out, out
    named = out.partition("best checkpoint: ")[2].splitlines()[0]
    assert Path(named).parent == checkpoint(0).parent and Path(named).name.startswith("best-epoch=0-"), out
    assert Path(named).is_file()
    assert torch.load(named, weights_only=True)["epoch"] == 0


@pytest.mark.slow
def test_the_best_epoch_follows_a_checkpoint_callback_that_keeps_one_file(in_tmp_path, fast_args, capsys):
    """A checkpoint callback of one's own that writes its best to one file name: the best epoch reported is the
    one whose checkpoint that file holds, though its path never changed."""
    judge = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint"]
    for setting in ("monitor=val/acc", "mode=max", "filename=best"):
        judge.append(f"--trainer.callbacks.init_args.{setting}")
    best = [f"--trainer.callbacks+={__name__}.RightOnlyIn", "--trainer.callbacks.init_args.best", "1"]
    main([*fast_args, "--max_epochs", "3", *judge, *best])
    out = capsys.readouterr().out
    assert "fit finished: best epoch 1: val/loss=" in out and "val/acc=1.0000" in out, out
    assert f"best checkpoint: {checkpoint(0, 'best.ckpt')}" in out, out
    assert torch.load(checkpoint(0, "best.ckpt"), weights_only=True)["epoch"] == 1


@pytest.mark.slow
def test_fit_reports_the_best_epoch(in_tmp_path, fast_args, capsys):
    """The end of fit prints the best checkpoint's validation metrics, not the last epoch's."""
    main([*fast_args, "--max_epochs", "3"])
    per_epoch = epoch_metrics(0)
    best = max(per_epoch, key=lambda epoch: float(per_epoch[epoch]["val/acc"]))
    expected = f"fit finished: best epoch {best}: val/loss={float(per_epoch[best]['val/loss']):.4f}"
    assert expected in capsys.readouterr().out


def test_plots_of_a_damaged_metrics_file_are_one_line_and_never_fail_a_fit(tmp_path, in_tmp_path, fast_args, capsys):
    from lightning_kit.callbacks import reporting
    from lightning_kit.plots import main as plots_main

    (tmp_path / "metrics.csv").write_text("epoch,step,train/loss\n0,9,not-a-number\n")
    with pytest.raises(SystemExit) as exit_info:
        plots_main([str(tmp_path)])
    assert exit_info.value.code == 1 and "line 2, is not a metrics row" in capsys.readouterr().err

    with mock.patch.object(reporting, "plot_run", side_effect=ValueError("damaged")):
        main([*fast_args, "--max_epochs", "1"])
    captured = capsys.readouterr()
    assert "fit finished" in captured.out and "warning: the plots of" in captured.err


@pytest.mark.slow
def test_fit_draws_curves_and_the_confusion_matrix(in_tmp_path, fast_args):
    main([*fast_args, "--max_epochs", "2"])
    run = RUNS / "version_0"
    for name in ("loss.png", "accuracy.png", "confusion_matrix.png"):
        assert (run / name).read_bytes().startswith(b"\x89PNG"), name
    with (run / "confusion_matrix.csv").open() as file:
        matrix = [[int(count) for count in row] for row in csv.reader(file)]
    assert len(matrix) == len(matrix[0]) and sum(map(sum, matrix)) > 0


def test_plots_redraw_from_a_run_folder_and_refuse_an_empty_one(tmp_path, capsys):
    from lightning_kit.plots import main as plots_main

    (tmp_path / "metrics.csv").write_text(
        "epoch,step,train/acc,train/loss,val/acc,val/loss\n0,9,0.5,1.2,,\n0,9,,,0.6,1.0\n1,19,0.7,0.8,0.8,0.6\n"
    )
    plots_main([str(tmp_path)])
    assert {"loss.png", "accuracy.png"} <= {path.name for path in tmp_path.iterdir()}
    with pytest.raises(SystemExit):
        plots_main([str(tmp_path / "empty")])


@pytest.mark.slow
def test_predictions_agree_with_test_accuracy(trained_run, fast_args, synthetic_config):
    """predict writes one row per input; its predicted classes score the accuracy that test reports."""
    main(["test", *fast_args, "--ckpt_path", str(trained_run)])
    test_accuracy = float(epoch_metrics(0, evaluation="test")[0]["test/acc"])
    main(["predict", *fast_args, "--ckpt_path", str(trained_run), "--predictions.path", "out/predictions.csv"])
    with open("out/predictions.csv") as file:
        rows = list(csv.DictReader(file))
    _, datamodule = build(["--config", synthetic_config])
    datamodule.setup("test")
    labels = datamodule.test_dataloader().dataset.tensors[1]
    names = datamodule.class_names
    assert [int(row["index"]) for row in rows] == list(range(len(rows)))
    assert all(row["label"] == names[labels[int(row["index"])]] for row in rows)
    correct = sum(row["predicted"] == row["label"] for row in rows)
    assert correct / len(rows) == pytest.approx(test_accuracy, abs=1e-6)
    probabilities = [float(rows[0][f"p_{name}"]) for name in names]
    assert list(rows[0]) == ["index", "predicted", "label", *(f"p_{name}" for name in names)]
    assert sum(probabilities) == pytest.approx(1, abs=1e-4)
    assert names[max(range(len(probabilities)), key=probabilities.__getitem__)] == rows[0]["predicted"]
