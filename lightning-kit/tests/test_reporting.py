"""Reporting: the best epoch and its checkpoint at the end of fit, the run's plots, and the predictions CSV."""

import csv
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
from conftest import RUNS, build, checkpoint, epoch_metrics, exit_message, main

from lightning_kit.plots import CONFUSION_CORNER, EPOCH_AXIS, read_confusion


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
    # The resumed run's confusion matrix is the best checkpoint's too (epoch 0, all right), kept in the checkpoint.
    _, matrix = read_confusion(RUNS / "version_1" / "confusion_matrix.csv")
    assert sum(map(sum, matrix)) > 0 and all(
        count == 0 for r, row in enumerate(matrix) for c, count in enumerate(row) if r != c
    )


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
        header, *rows = list(csv.reader(file))
    matrix = [[int(count) for count in row[1:]] for row in rows]
    assert len(matrix) == len(matrix[0]) and sum(map(sum, matrix)) > 0
    assert header[0] == CONFUSION_CORNER and len(header) == len(matrix) + 1


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


@pytest.mark.slow
def test_the_confusion_matrix_is_the_best_checkpoints_by_class_name(in_tmp_path, fast_args):
    """All right in epoch 0 (the best), all wrong in epoch 1 (the last): the matrix saved is epoch 0's, its CSV
    headed by "true \\ predicted" and the class names, in its first row and column, and its plot says so."""
    best = [f"--trainer.callbacks+={__name__}.RightOnlyIn", "--trainer.callbacks.init_args.best", "0"]
    drawn = []
    with mock.patch("lightning_kit.plots._save", wraps=_saved(drawn)):
        main([*fast_args, "--max_epochs", "2", *best])
    names = build(fast_args)[0].class_names
    with (RUNS / "version_0" / "confusion_matrix.csv").open() as file:
        header, *rows = list(csv.reader(file))
    assert header == [CONFUSION_CORNER, *names] and CONFUSION_CORNER == "true \\ predicted"
    assert [row[0] for row in rows] == names
    matrix = [[int(count) for count in row[1:]] for row in rows]
    assert sum(map(sum, matrix)) > 0 and all(
        count == 0 for r, row in enumerate(matrix) for c, count in enumerate(row) if r != c
    )
    assert read_confusion(RUNS / "version_0" / "confusion_matrix.csv") == (names, matrix)
    confusion = drawn[-1]
    assert confusion["title"] == "Validation confusion matrix, epoch 0 (the best checkpoint's)", confusion
    assert confusion["xticks"] == names and confusion["yticks"] == names


def _saved(drawn: list):
    """``plots._save`` that also records what each figure shows: its title, axis labels, tick labels and lines."""
    from lightning_kit import plots

    save = plots._save

    def recording(figure, path):
        axes = figure.axes[0]
        drawn.append(
            {
                "path": Path(path).name,
                "title": axes.get_title(),
                "xlabel": axes.get_xlabel(),
                "xticks": [label.get_text() for label in axes.get_xticklabels()],
                "yticks": [label.get_text() for label in axes.get_yticklabels()],
                "lines": [list(line.get_xdata()) for line in axes.lines],
            }
        )
        return save(figure, path)

    return recording


def test_plots_count_epochs_from_0_as_checkpoints_do(tmp_path):
    """metrics.csv's epochs 0 and 1 are drawn at 0 and 1, on an axis that says so; a headerless confusion matrix
    of an older run is named by label numbers, for the last epoch."""
    from lightning_kit.plots import plot_run

    (tmp_path / "metrics.csv").write_text(
        "epoch,step,train/acc,train/loss,val/acc,val/loss\n0,9,0.5,1.2,,\n0,9,,,0.6,1.0\n1,19,0.7,0.8,0.8,0.6\n"
    )
    (tmp_path / "confusion_matrix.csv").write_text("3,1\n0,4\n")
    drawn = []
    with mock.patch("lightning_kit.plots._save", wraps=_saved(drawn)):
        plot_run(tmp_path)
    curves = [figure for figure in drawn if figure["path"] in ("loss.png", "accuracy.png")]
    assert len(curves) == 2 and all(figure["xlabel"] == EPOCH_AXIS == "epoch (from 0)" for figure in curves)
    assert all(line == [0, 1] for figure in curves for line in figure["lines"]), curves
    confusion = drawn[-1]
    assert confusion["title"] == "Validation confusion matrix, epoch 1 (the last)" and confusion["xticks"] == ["0", "1"]


def test_the_runs_curves_count_epochs_from_0(tmp_path):
    from lightning_kit.runs.curves import plot_curves
    from lightning_kit.runs.folders import Run

    run = Run(folder=tmp_path, name="a")
    run.history = {"val/acc": {0: 0.5, 1: 0.6}, "val/loss": {0: 1.0, 1: 0.9}}
    drawn = []
    with mock.patch("lightning_kit.runs.curves._save", wraps=_saved(drawn)):
        plot_curves([run], tmp_path / "curves.png")
    assert drawn[0]["xlabel"] == EPOCH_AXIS and drawn[0]["lines"] == [[0, 1]]


def test_a_confusion_matrix_csv_that_is_not_one_is_refused(tmp_path):
    (tmp_path / "confusion_matrix.csv").write_text(f"{CONFUSION_CORNER},a,b\na,1,x\nb,0,1\n")
    with pytest.raises(ValueError, match="is not a confusion matrix"):
        read_confusion(tmp_path / "confusion_matrix.csv")
    (tmp_path / "confusion_matrix.csv").write_text(f"{CONFUSION_CORNER},a,b\na,1,0\n")
    with pytest.raises(ValueError, match="2 classes"):
        read_confusion(tmp_path / "confusion_matrix.csv")
    (tmp_path / "confusion_matrix.csv").write_text("1,inf\n0,1\n")
    with pytest.raises(ValueError, match="is not a confusion matrix"):
        read_confusion(tmp_path / "confusion_matrix.csv")


@pytest.mark.slow
def test_a_refused_evaluation_leaves_no_empty_folder(trained_run, fast_args):
    """predict refused once Lightning has made its log folder (the prediction data does not exist): the
    predict/version_0 it made is removed; a folder that was there before, though empty, is kept."""
    run_dir = trained_run.parent.parent
    (run_dir / "predict" / "mine").mkdir(parents=True)
    before = sorted(run_dir.rglob("*"))
    args = ["predict", *fast_args, "--ckpt_path", str(trained_run), "--data.predict_path", "nowhere"]
    assert "nowhere does not exist" in exit_message(main, *args)
    assert sorted(run_dir.rglob("*")) == before
    (run_dir / "predict" / "mine").rmdir()
    (run_dir / "predict").rmdir()
    assert "nowhere does not exist" in exit_message(main, *args)
    assert sorted(run_dir.rglob("*")) == [path for path in before if "predict" not in path.parts]


def test_only_the_folders_a_refused_run_made_and_left_empty_are_removed(tmp_path):
    """A CSV logger's run folder made in a run that fails is removed, with the folders made above it, when empty;
    one the run wrote a file into, one that was there before, one another run made beside it, and every folder
    of a run that ends well, stay."""
    from lightning.pytorch.loggers import CSVLogger

    from lightning_kit.evaluation import no_empty_folders_left

    (tmp_path / "runs" / "version_0" / "old").mkdir(parents=True)
    logger = CSVLogger(tmp_path / "runs" / "version_0", name="test")
    with pytest.raises(RuntimeError), no_empty_folders_left(logger):
        assert Path(logger.experiment.log_dir).name == "version_0"  # Lightning makes it before the data is set up
        (tmp_path / "runs" / "version_0" / "test" / "version_7").mkdir()  # another run's, beside it
        raise RuntimeError("refused")
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == [
        "runs",
        "runs/version_0",
        "runs/version_0/old",
        "runs/version_0/test",
        "runs/version_0/test/version_7",
    ]
    logger = CSVLogger(tmp_path / "runs" / "version_0", name="test", version="kept")
    with pytest.raises(RuntimeError), no_empty_folders_left(logger):
        (Path(logger.log_dir) / "checkpoints").mkdir(parents=True)
        (Path(logger.log_dir) / "metrics.csv").write_text("epoch\n")
        raise RuntimeError("refused")
    assert sorted(path.name for path in Path(logger.log_dir).iterdir()) == ["metrics.csv"]
    logger = CSVLogger(tmp_path / "elsewhere")
    with no_empty_folders_left(logger):  # a run that ends well: what it made stays
        logger.experiment  # noqa: B018  (made on first use)
    assert (tmp_path / "elsewhere" / "lightning_logs" / "version_0").is_dir()
    logger = CSVLogger(tmp_path / "new" / "deeper", name="test")
    with pytest.raises(RuntimeError), no_empty_folders_left(logger):
        logger.experiment  # noqa: B018
        raise RuntimeError("refused")
    assert not (tmp_path / "new").exists()
    logger = CSVLogger(tmp_path / "runs" / "version_0", name="test")
    with pytest.raises(RuntimeError), no_empty_folders_left(logger):  # refused before the logger chose its folder
        raise RuntimeError("refused")
    assert (tmp_path / "runs" / "version_0" / "test" / "version_7").is_dir()


@pytest.mark.slow
def test_without_a_monitored_metric_no_epoch_is_called_the_best(in_tmp_path, fast_args, capsys):
    """A command line whose checkpoints judge no metric (monitor None): the end of fit reports the last epoch's
    metrics without calling an epoch the best, names the latest checkpoint as such, and the confusion matrix
    is the last validation's, titled so."""
    from image_project.cli import ProjectCLI

    from lightning_kit.cli import main as kit_main

    class NoMonitor(ProjectCLI):
        monitor = None

    best = [f"--trainer.callbacks+={__name__}.RightOnlyIn", "--trainer.callbacks.init_args.best", "0"]
    drawn = []
    with mock.patch("lightning_kit.plots._save", wraps=_saved(drawn)):
        kit_main(NoMonitor, [*fast_args, "--max_epochs", "2", *best])
    out = capsys.readouterr().out
    assert "fit finished: val/loss=" in out and "val/acc=0.0000" in out and "best epoch" not in out, out
    assert f"latest checkpoint: {checkpoint(0)}" in out, out
    _, matrix = read_confusion(RUNS / "version_0" / "confusion_matrix.csv")
    assert sum(map(sum, matrix)) > 0 and all(matrix[k][k] == 0 for k in range(len(matrix)))  # epoch 1: all wrong
    assert drawn[-1]["title"] == "Validation confusion matrix, epoch 1 (the last)"
