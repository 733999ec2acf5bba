"""A value the user's own classes refuse is one line naming the argument, its value and the class's message, exit 2.

The classes here are a project's that keeps no argument tables (``python -m lightning_kit`` and the audit build them by
class path, ``GenericCLI``): what they refuse, they refuse in their constructor, or PyTorch refuses it once they run
(a DataLoader's batch size, an optimizer's learning rate, a tensor's size). A class that fails on its defaults, or a
run that fails for a reason that names no argument given, is a bug of its own and keeps its traceback.
"""

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_kit import cli as kit_cli
from lightning_kit import placement as command


class Scorer(L.LightningModule):
    """A small regression model; its width and learning rate checked by nn.Linear and by Adam, not by itself."""

    def __init__(self, width: int = 8, lr: float = 0.01, dropout: float = 0.0) -> None:
        super().__init__()
        assert 0 <= dropout < 1, f"dropout is a probability below 1, got {dropout}"
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class Table(L.LightningDataModule):
    """Rows of random features; it checks its split itself, and leaves its sizes to PyTorch."""

    def __init__(self, rows: int = 32, batch_size: int = 8, split: str = "random") -> None:
        super().__init__()
        if split not in ("random", "ordered"):
            raise ValueError(f"split must be 'random' or 'ordered', not {split!r}")
        self.rows, self.batch_size = rows, batch_size

    def setup(self, stage: str) -> None:
        x = torch.randn(self.rows, 4, generator=torch.Generator().manual_seed(0))
        self.rows_set = TensorDataset(x, x.sum(1, keepdim=True))

    def train_dataloader(self):
        return DataLoader(self.rows_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.rows_set, batch_size=self.batch_size)


class Broken(Table):
    """A data module whose constructor fails on its defaults: a bug of its own, not a refused value."""

    def __init__(self, rows: int = 32) -> None:
        super().__init__(rows)
        self.columns = self.missing_attribute


NAMED = ["--model", f"{__name__}.Scorer", "--data", f"{__name__}.Table"]
QUICK = ["--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "1"]


def refused_line(run, args: list[str], capsys) -> str:
    """The one line ``run(args)`` stops with, on stderr, with exit status 2; fails otherwise."""
    with pytest.raises(SystemExit) as stop:
        run(args)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2, (stop.value.code, err[-3000:])
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # Refused in the constructor: the class's own check, or PyTorch's inside it.
        (["--model.width", "-3"], "error: --model.width -3: Scorer refused it: RuntimeError: Trying to create tensor"),
        (["--model.dropout", "1.5"], "error: --model.dropout 1.5: Scorer refused it: AssertionError: dropout is a"),
        (["--data.split", "shuffled"], "error: --data.split 'shuffled': Table refused it: ValueError: split must be"),
        # Refused once running: a DataLoader's, an optimizer's, a tensor's own checks.
        (["--data.batch_size", "0"], "error: --data.batch_size 0: fit stopped on it: ValueError: batch_size should"),
        (["--model.lr", "-0.5"], "error: --model.lr -0.5: fit stopped on it: ValueError: Invalid learning rate: -0.5"),
        (["--data.rows", "-4"], "error: --data.rows -4: fit stopped on it: RuntimeError: Trying to create tensor with"),
    ],
)
def test_a_value_the_users_classes_refuse_is_one_line_with_exit_status_2(given, expected, in_tmp_path, capsys):
    line = refused_line(lambda args: kit_cli.main(kit_cli.GenericCLI, args), ["fit", *NAMED, *QUICK, *given], capsys)
    assert line.startswith(expected), line


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--model.width", "-3"], "Scorer refused it"),
        (["--data.split", "shuffled"], "Table refused it"),
        (["--model.dropout", "2"], "Scorer refused it"),
        (["--data.batch_size", "0"], "fit stopped on it: ValueError: batch_size should be a positive integer"),
        (["--data.rows", "-4"], "fit stopped on it: RuntimeError: Trying to create tensor with negative dimension"),
    ],
    ids=str,
)
def test_the_audit_gives_a_value_the_classes_refuse_exit_status_2_not_1_nor_3(given, said, in_tmp_path, capsys):
    """Exit status 1 of the audit says a placement bug was found, 3 that part could not be audited: a value refused
    when the classes are built, or in the stages the audit runs, is a mistake on the command line."""
    with pytest.raises(SystemExit) as stop:
        command.main([*NAMED, *given])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, (stop.value.code, lines)
    assert lines[0].startswith(f"error: {given[0]} ") and f": {said}" in lines[0], lines


def test_a_class_that_fails_on_its_defaults_is_one_line_naming_it_its_error_and_its_line(in_tmp_path, capsys):
    """A class whose own code raises on its defaults (no argument given accounts for it): one line with the class,
    its error and the line that raised it; fit's status 1, and the audit's 3, not audited (1 says a placement bug
    was found)."""
    classes = ["--model", f"{__name__}.Scorer", "--data", f"{__name__}.Broken"]
    for run, status in (
        ((lambda: kit_cli.main(kit_cli.GenericCLI, ["fit", *classes])), 1),
        (
            lambda: command.main(classes),
            3,
        ),
    ):
        with pytest.raises(SystemExit) as stop:
            run()
        lines = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == status and len(lines) == 1, (stop.value.code, lines)
        assert lines[0].startswith(f"error: {__name__}.Broken could not be built: AttributeError: ")
        assert "missing_attribute" in lines[0] and f"(at {__file__}:" in lines[0], lines


def test_a_run_that_fails_for_a_reason_that_names_no_argument_keeps_its_traceback(in_tmp_path, monkeypatch):
    """A batch size given and a failure of the model's own code that has nothing to do with it: no one line."""

    def failing_step(self, batch, batch_idx):
        raise ValueError("the model's own bug: shapes (8, 3) and (8, 4)")

    monkeypatch.setattr(Scorer, "training_step", failing_step)
    with pytest.raises(ValueError, match="the model's own bug"):
        kit_cli.main(kit_cli.GenericCLI, ["fit", *NAMED, *QUICK, "--data.batch_size", "4"])


class Unreachable(Logger):
    """A logger whose store cannot be reached: its constructor raises, naming the URL it was given."""

    def __init__(self, url: str = "", retries: int = 3) -> None:
        raise ConnectionError(f"cannot connect to {url}")

    name = version = None
    log_hyperparams = log_metrics = None


class Misconfigured(Callback):
    def __init__(self, mode: str = "min", token: str = "") -> None:
        raise ValueError(f"mode can be min or max, got {mode}")


SECRET_URL = "postgresql://me:s3cret@127.0.0.1:1/db"
TOKEN = ["--trainer.callbacks.token", "s3cret-token"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # A flag alone, and a list of loggers in a config file, where jsonargparse tries each type of the union
        # (Logger | Iterable[Logger] | bool) and kept only each type's message, in a traceback.
        (
            ["--trainer.logger", f"{__name__}.Unreachable", "--trainer.logger.url", SECRET_URL],
            f"error: --trainer.logger: {__name__}.Unreachable(url='postgresql://me:***@127.0.0.1:1/db') could not be "
            "built: ConnectionError: cannot connect to postgresql://me:***@127.0.0.1:1/db",
        ),
        (
            ["--config", "loggers.yaml"],
            f"error: --trainer.logger: {__name__}.Unreachable(url='postgresql://me:***@127.0.0.1:1/db') could not be",
        ),
        (
            ["--trainer.callbacks+", f"{__name__}.Misconfigured", "--trainer.callbacks.mode", "foo", *TOKEN],
            f"error: --trainer.callbacks: {__name__}.Misconfigured(mode='foo', token=***) could not be built: "
            "ValueError: mode can be min or max, got foo",
        ),
    ],
    ids=["flag", "config", "callback"],
)
def test_a_logger_or_callback_that_raises_as_it_is_built_is_one_line_naming_its_flag_with_no_password(
    given, expected, in_tmp_path, capsys
):
    Path("loggers.yaml").write_text(
        "trainer:\n  logger:\n    - class_path: lightning_kit.loggers.CSVAndTensorBoardLogger\n"
        f"    - class_path: {__name__}.Unreachable\n      init_args:\n        url: {SECRET_URL}\n"
    )
    with pytest.raises(SystemExit) as stop:
        kit_cli.main(kit_cli.GenericCLI, ["fit", *NAMED, *QUICK, *given])
    out, err = capsys.readouterr()
    assert stop.value.code == 1 and err.strip().startswith(expected) and "\n" not in err.strip(), err[-3000:]
    assert "s3cret" not in out + err and "Traceback" not in err
    assert not any("s3cret" in path.read_text(errors="replace") for path in Path().rglob("*") if path.is_file()
                   and path.name != "loggers.yaml")  # fmt: skip


def test_mlflow_that_cannot_open_its_store_is_one_line_naming_the_logger(in_tmp_path, capsys):
    """A store MLflow cannot open fails at once (a server it cannot reach, after its retries: Unreachable above)."""
    pytest.importorskip("mlflow")
    Path("not-a-folder").write_text("")
    given = ["--trainer.logger", "lightning.pytorch.loggers.MLFlowLogger"]
    given += ["--trainer.logger.tracking_uri", f"sqlite:///{in_tmp_path}/not-a-folder/mlflow.db"]
    with pytest.raises(SystemExit) as stop:
        kit_cli.main(kit_cli.GenericCLI, ["fit", *NAMED, *QUICK, *given])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 1 and "\n" not in err, err[-3000:]
    assert err.startswith("error: --trainer.logger: lightning.pytorch.loggers.mlflow.MLFlowLogger(tracking_uri="), err
