"""Reporting: the best epoch and its checkpoint at the end of fit, and the predictions CSV."""

import csv
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import RUNS, build, checkpoint, epoch_metrics, exit_message, main

from lightning_kit.errors import UserError


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
    metrics without calling an epoch the best, and names the latest checkpoint as such."""
    from image_project.cli import ProjectCLI

    from lightning_kit.cli import main as kit_main

    class NoMonitor(ProjectCLI):
        monitor = None

    best = [f"--trainer.callbacks+={__name__}.RightOnlyIn", "--trainer.callbacks.init_args.best", "0"]
    kit_main(NoMonitor, [*fast_args, "--max_epochs", "2", *best])
    out = capsys.readouterr().out
    assert "fit finished: val/loss=" in out and "val/acc=0.0000" in out and "best epoch" not in out, out
    assert f"latest checkpoint: {checkpoint(0)}" in out, out


def write_metrics(folder: Path, header: str, *rows: str) -> Path:
    """A run folder's metrics.csv, as CSVLogger writes it: ``epoch,step,`` then ``header``'s columns."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.csv").write_text("".join(f"{line}\n" for line in (f"epoch,step,{header}", *rows)))
    return folder


@pytest.mark.parametrize(
    ("name", "stage", "per_step"),
    [
        ("val/mae", "val", False),
        ("val_mae", "val", False),
        ("mae/val", "val", False),
        ("validation-mae", "val", False),
        ("train/loss_epoch", "train", False),
        ("train/loss_step", "train", True),
        ("train_acc", "train", False),
        ("val/f1/macro", "val", False),
        ("lr-Adam", None, False),
    ],
)
def test_a_logged_name_says_its_stage_however_written(name, stage, per_step):
    """``val/mae``, ``val_mae``, ``mae/val`` are of one stage; ``_step`` says a metric is logged per step; a name
    without a stage has none."""
    from lightning_kit.metric_logs import parse_name

    assert parse_name(name) == (stage, per_step)


@pytest.mark.parametrize("epoch", ["inf", "1e30", "-1", "1.5"])
def test_an_epoch_that_is_no_epoch_number_is_one_line(tmp_path, capsys, epoch):
    """An infinite, huge, negative or fractional epoch in metrics.csv, not an OverflowError: the table of runs
    says it in the run's note, naming the line."""
    from lightning_kit.runs.command import main as runs_main

    write_metrics(tmp_path, "val/loss", "0,9,1.0", f"{epoch},19,0.5")
    (tmp_path / "config.yaml").write_text("model: {}\n")
    runs_main([str(tmp_path), "--format", "csv"])
    row = next(csv.DictReader(capsys.readouterr().out.splitlines()))
    assert "metrics.csv unreadable: line 3 is not a metrics row (epoch " in row["note"], row


def predicted(tmp_path: Path, *batches, module_classes=None, data=None) -> list[list[str]]:
    """The rows of the predictions CSV that CSVPredictionWriter writes for ``batches``, ``(output, batch)`` each,
    driven as Lightning's predict loop drives it; ``data`` is the data module (its class names, its labels)."""
    from lightning_kit.callbacks import CSVPredictionWriter

    writer = CSVPredictionWriter(str(tmp_path / "predictions.csv"))
    trainer = SimpleNamespace(world_size=1, global_rank=0, datamodule=data)
    module = SimpleNamespace(class_names=module_classes) if module_classes else SimpleNamespace()
    writer.on_predict_start(trainer, module)
    start = 0
    try:
        for number, (output, batch) in enumerate(batches):
            size = len(batch[0]) if isinstance(batch, tuple) else len(next(iter(batch.values())))
            writer.write_on_batch_end(trainer, module, output, list(range(start, start + size)), batch, number, 0)
            start += size
    except BaseException as err:
        writer.on_exception(trainer, module, err)
        raise
    writer.on_predict_end(trainer, module)
    with (tmp_path / "predictions.csv").open(newline="") as file:
        return list(csv.reader(file))


X = torch.zeros(2, 3)  # a batch of two inputs


@pytest.mark.parametrize(
    ("output", "header", "first"),
    [
        (torch.tensor([0.25, -1.5]), ["index", "prediction"], ["0", "0.25"]),
        (
            torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
            ["index", "prediction_0", "prediction_1", "prediction_2"],
            ["0", "1", "2", "3"],
        ),
        (
            torch.arange(12.0).reshape(2, 2, 3),
            ["index", *(f"prediction_{i}_{j}" for i in range(2) for j in range(3))],
            ["0", "0", "1", "2", "3", "4", "5"],
        ),
        (
            {"mean": torch.tensor([0.5, 1.0]), "quantiles": torch.ones(2, 2)},
            ["index", "mean", "quantiles_0", "quantiles_1"],
            ["0", "0.5", "1", "1"],
        ),
        (
            (torch.tensor([7, 8]), torch.tensor([[0.125], [2.0]], dtype=torch.float64)),
            ["index", "prediction_0", "prediction_1_0"],
            ["0", "7", "0.125"],
        ),
    ],
    ids=["(B,)", "(B,K)", "(B,2,3)", "dict", "tuple"],
)
def test_a_regression_models_predictions_are_written_as_they_are(tmp_path, output, header, first):
    """Outputs of a model that is no classifier, or whose classes have no names: one ``prediction`` column for
    (B,), ``prediction_<k>`` for (B,K), flattened for more dimensions, a dict's keys and a tuple's indices in
    the names; no ``predicted`` nor ``p_`` columns, which would read its values as class probabilities."""
    rows = predicted(tmp_path, (output, (X,)), data=SimpleNamespace(class_names=["a", "b", "c", "d", "e"]))
    assert rows[0] == header and rows[1] == first and len(rows) == 3


def test_labels_are_taken_where_the_data_module_says_and_never_guessed(tmp_path):
    """predict_labelled true: a tuple of two's second item; in a tuple of more (audio, lengths, labels) which item
    holds them is not guessed (the lengths were written as labels): one line asks for its position, which is then
    taken; a dict's by the key it names."""
    audio, lengths, labels = torch.zeros(2, 3), torch.tensor([3, 2]), torch.tensor([7, 9])
    output = torch.tensor([0.5, 1.5])
    cases = [
        ((audio, labels), True, ["0", "0.5", "7"]),
        ((audio, lengths, labels), 2, ["0", "0.5", "7"]),
        ({"audio": audio, "lengths": lengths, "speaker": labels}, "speaker", ["0", "0.5", "7"]),
    ]
    for number, (batch, where, first) in enumerate(cases):
        rows = predicted(tmp_path / str(number), (output, batch), data=SimpleNamespace(predict_labelled=where))
        assert rows[0] == ["index", "prediction", "label"] and rows[1] == first, (where, rows)
    with pytest.raises(UserError) as refused:
        predicted(tmp_path, (output, (audio, lengths, labels)), data=SimpleNamespace(predict_labelled=True))
    assert str(refused.value) == (
        "the data module's predict_labelled is true, but its predict batches hold 3 items: which of them is the "
        "labels? Set predict_labelled to its position (an int), or to false"
    )


STEP_LOGGING_PROJECT = """
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Steps(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self.net(batch[0]), batch[1])
        self.log("train/loss", loss)  # per step: Lightning's default in training_step
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class FourBatches(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=4)
"""


@pytest.mark.parametrize("given", [None, 3])
def test_a_step_metric_is_recorded_in_epochs_shorter_than_the_logging_interval(in_tmp_path, monkeypatch, given):
    """Epochs of 4 batches, fewer than Lightning's logging interval of 50 steps: what training_step logs is
    recorded all the same (each epoch's 4th step); an interval given on the command line is kept (every 3rd)."""
    (in_tmp_path / "steps_project.py").write_text(STEP_LOGGING_PROJECT)
    monkeypatch.syspath_prepend(str(in_tmp_path))
    args = ["--model", "steps_project.Steps", "--data", "steps_project.FourBatches", "--accelerator", "cpu"]
    args += ["--max_epochs", "3", "--trainer.enable_progress_bar", "false"]
    args += ["--trainer.log_every_n_steps", str(given)] if given else []
    from lightning_kit import cli

    cli.main(cli.GenericCLI, ["fit", *args])
    with (RUNS / "version_0" / "metrics.csv").open() as file:
        steps = [int(row["step"]) for row in csv.DictReader(file) if row.get("train/loss")]
    assert steps == ([3, 7, 11] if given is None else [2, 5, 8, 11]), steps


def test_a_predict_step_that_returns_none_writes_no_row(tmp_path, capsys):
    """Lightning lets predict_step return None (a step that writes its own files): no row for that batch, and no
    file where every batch returned None."""
    rows = predicted(tmp_path, (None, (X,)), (torch.tensor([1.0, 2.0]), (X,)))
    assert rows == [["index", "prediction"], ["2", "1"], ["3", "2"]]  # the second batch's inputs
    (tmp_path / "predictions.csv").unlink()
    with pytest.raises(FileNotFoundError):
        predicted(tmp_path, (None, (X,)), (None, (X,)))
    assert "predict_step returned nothing: no " in capsys.readouterr().out


def test_a_classifiers_predictions_keep_their_columns(tmp_path):
    """Class names known (the module's, else the data module's) and an output of (batch, classes): ``file``,
    ``predicted``, ``label``, ``p_<class>``, exactly as the baked projects write them. A regression model's
    labels are written as they are, after its outputs."""
    data = SimpleNamespace(predict_names=["x.png", "y.png"], predict_labelled=True)
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    rows = predicted(tmp_path, (scores, (X, torch.tensor([0, 0]))), module_classes=["cat", "dog"], data=data)
    assert rows == [
        ["file", "predicted", "label", "p_cat", "p_dog"],
        ["x.png", "cat", "cat", "0.900000", "0.100000"],
        ["y.png", "dog", "cat", "0.200000", "0.800000"],
    ]
    by_data = predicted(tmp_path / "data", (scores, (X,)), data=SimpleNamespace(class_names=["cat", "dog"]))
    assert by_data[0] == ["index", "predicted", "p_cat", "p_dog"] and by_data[2][1] == "dog"
    labelled = SimpleNamespace(predict_labelled=True)
    regression = predicted(
        tmp_path / "regression", (torch.tensor([1.5, 2.5]), (X, torch.tensor([1.0, 3.0]))), data=labelled
    )
    assert regression == [["index", "prediction", "label"], ["0", "1.5", "1"], ["1", "2.5", "3"]]


@pytest.mark.parametrize(
    ("batches", "reason"),
    [
        ([(torch.zeros(2, 20_001), (X,))], "holds 20001 values an input, more than the 10000 columns"),
        ([(torch.zeros(2, 3), (X,)), (torch.zeros(2, 4), (X,))], "unlike the first batch's"),
        ([(torch.tensor(1.0), (X,))], "is a single number"),
        ([({"a": torch.zeros(2), "b": torch.zeros(3)}, (X,))], "differ in their first dimension"),
        ([(["text", "more"], (X,))], "is str, which a predictions CSV cannot hold"),
    ],
    ids=["huge", "changing", "scalar", "ragged", "strings"],
)
def test_predictions_that_make_no_table_are_refused_in_one_line(tmp_path, batches, reason):
    """A huge output, one whose columns change between batches, a number for the whole batch, tensors of
    different batch sizes, strings: refused in one line (a UserError, which the command line prints as one),
    and no file is left, partial or temporary."""
    from lightning_kit.errors import UserError

    with pytest.raises(UserError) as refusal:
        predicted(tmp_path, *batches)
    assert reason in str(refusal.value) and "\n" not in str(refusal.value), refusal.value
    assert list(tmp_path.iterdir()) == []


class DictRegressor(L.LightningModule):
    """A regression model with dict batches, as a project of its own writes one: ``(batch, 2)`` forecasts."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(3, 2)

    def predict_step(self, batch, batch_idx):
        return {"forecast": self.head(batch["history"]), "scale": batch["history"].abs().mean(dim=1)}


def test_lightnings_predict_writes_a_dict_output_by_its_keys(tmp_path):
    """Through Lightning's own predict loop (its batch indices, its hooks), a dict batch and a dict output:
    one row per input, in order, its columns named by the output's keys."""
    from torch.utils.data import DataLoader

    from lightning_kit.callbacks import CSVPredictionWriter

    history = torch.arange(15.0).reshape(5, 3)
    loader = DataLoader([{"history": row} for row in history], batch_size=2)
    writer = CSVPredictionWriter(str(tmp_path / "out.csv"))
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[writer], enable_progress_bar=False)
    model = DictRegressor()
    trainer.predict(model, loader, return_predictions=False)
    with (tmp_path / "out.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["index", "forecast_0", "forecast_1", "scale"]
    assert [row["index"] for row in rows] == ["0", "1", "2", "3", "4"]
    with torch.no_grad():
        expected = model.head(history)
    assert [float(row["forecast_1"]) for row in rows] == pytest.approx(expected[:, 1].tolist(), abs=1e-5)
    assert float(rows[4]["scale"]) == pytest.approx(13.0)


def test_the_best_epoch_keeps_validation_metrics_however_named(tmp_path):
    """When the checkpoint callback picks a new best, BestEpoch keeps the validation metrics of that moment,
    ``val/mae`` and ``val_rmse`` alike, and no training metric."""
    from lightning_kit.callbacks import BestEpoch

    judge = SimpleNamespace(monitor="val_rmse", best_model_path="", best_model_score=None)
    metrics = {"val/mae": torch.tensor(0.5), "val_rmse": torch.tensor(0.25), "train_loss": torch.tensor(1.0)}
    trainer = SimpleNamespace(checkpoint_callback=judge, callback_metrics=metrics, current_epoch=3)
    best = BestEpoch()
    best.on_train_start(trainer, SimpleNamespace())
    judge.best_model_path, judge.best_model_score = "best.ckpt", torch.tensor(0.25)
    best.on_save_checkpoint(trainer, SimpleNamespace(), {})
    assert best.epoch == 3 and best.metrics == {"val/mae": 0.5, "val_rmse": 0.25}
