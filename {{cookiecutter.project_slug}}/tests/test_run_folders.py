"""What is read from a run folder is data: it runs no code, cannot exhaust memory or hang, and evaluation knows
what it evaluates."""

import csv
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import HANG_GUARD_S, PROJECT

from {{ cookiecutter.project_slug }} import trust
from {{ cookiecutter.project_slug }}.checkpoints import INFLATION_LIMIT, CheckpointError, latest_checkpoint, read_checkpoint
from {{ cookiecutter.project_slug }}.cli import build_all, main
from {{ cookiecutter.project_slug }}.export import main as export

RUN = Path("runs/lightning_logs/version_0")
LAST = RUN / "checkpoints" / "last.ckpt"
# A module that leaves a mark when it is imported: proof that code ran.
MARKS_IMPORT = """
import lightning as L

open("imported", "w").close()


class Data(L.LightningDataModule):
    pass
"""


@pytest.fixture
def run_copy(trained_once, in_tmp_path, monkeypatch) -> Path:
    """A copy of a short run in the test's folder, which is importable as code would be beside train.py."""
    shutil.copytree(trained_once / "runs", in_tmp_path / "runs")
    monkeypatch.syspath_prepend(str(in_tmp_path))
    return in_tmp_path


def _exit_message(run, *args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run(list(args))
    return str(exit_info.value.code)


@pytest.fixture
def run_folder_with_code(run_copy) -> str:
    """The copied run, its config.yaml naming a data module in a module inside the run folder."""
    (RUN / "helper.py").write_text(MARKS_IMPORT)
    config = yaml.safe_load((RUN / "config.yaml").read_text())
    config["data"] = {"class_path": "runs.lightning_logs.version_0.helper.Data"}
    (RUN / "config.yaml").write_text(yaml.safe_dump(config))
    return "runs.lightning_logs.version_0.helper.Data"


@pytest.mark.parametrize(
    "command",
    [
        lambda cls: (main, "validate", "--ckpt_path", "last"),
        lambda cls: (main, "fit", "--ckpt_path", "last", "--max_epochs", "2"),
        lambda cls: (main, "test", "--ckpt_path", str(LAST), "--config", str(RUN / "config.yaml")),
        lambda cls: (main, "predict", "--ckpt_path", str(LAST), "--data", cls),
        lambda cls: (build_all, "--config", str(RUN / "config.yaml")),
        lambda cls: (export, "--ckpt_path", str(LAST), "--onnx", "no"),
    ],
    ids=["validate-last", "resume", "test-given-config", "predict-named", "audit", "export"],
)
def test_code_in_a_run_folder_is_never_imported(run_folder_with_code, command):
    """A run folder whose config.yaml names a module inside it is refused in one line, and the module never runs,
    even when the class is named on the command line."""
    run, *args = command(run_folder_with_code)
    message = _exit_message(run, *args)
    assert message.startswith("error: ") and "refused, nothing was imported" in message, message
    assert "code in the run or data folder" in message and "\n" not in message
    assert not Path("imported").exists()


def test_a_checkpoint_naming_code_in_a_run_folder_is_refused(run_folder_with_code, fast_args):
    """A checkpoint whose hyperparameters name a module in a run folder is refused before anything is imported."""
    tampered = torch.load(LAST, weights_only=True)
    tampered["datamodule_hyper_parameters"] = {"_class_path": run_folder_with_code}
    torch.save(tampered, "tampered.ckpt")
    message = _exit_message(main, "validate", *fast_args, "--ckpt_path", "tampered.ckpt")
    assert "tampered.ckpt names runs.lightning_logs.version_0.helper.Data" in message
    assert not Path("imported").exists()


OWN_DATA = """
from {{ cookiecutter.project_slug }}.cli import DataModule


class MyData(DataModule):
    \"\"\"A data module of the person's own, beside train.py, not in the project's package.\"\"\"
"""


@pytest.mark.slow
def test_your_own_data_module_can_be_evaluated_and_exported_when_named_or_trusted(
    in_tmp_path, fast_args, monkeypatch, capsys
):
    """Trained with --data mymodule.MyData, its checkpoint is evaluated and exported when the class is named again
    or its module is in TRUSTED_MODULES; otherwise one line says how to allow it."""
    Path("mymodule.py").write_text(OWN_DATA)
    monkeypatch.syspath_prepend(str(in_tmp_path))
    own = ["--data", "mymodule.MyData", "--data.dataset", "synthetic"]
    main([*fast_args, *own, "--max_epochs", "1"])
    message = _exit_message(main, "test", *fast_args, "--ckpt_path", str(LAST))
    assert "names code outside this project (mymodule.MyData)" in message
    assert "--data mymodule.MyData" in message and "'mymodule' to TRUSTED_MODULES in " in message
    for subcommand in ("validate", "test", "predict"):
        main([subcommand, *fast_args, "--ckpt_path", str(LAST), "--data", "mymodule.MyData"])
    export(["--ckpt_path", str(LAST), "--onnx", "no", "--data", "mymodule.MyData"])
    assert (RUN / "model.pt2").is_file()
    monkeypatch.setattr(trust, "TRUSTED_MODULES", ("mymodule",))
    main(["test", *fast_args, "--ckpt_path", str(LAST)])
    out = capsys.readouterr().out
    assert out.count("test/acc") == 2 and "val/acc" in out and "predictions for " in out


def test_a_checkpoint_that_would_inflate_far_beyond_its_size_is_refused_unread(in_tmp_path, capsys):
    """A small archive of compressed zeros would inflate to many times its size: refused from its directory."""
    bomb = RUN / "checkpoints" / "last.ckpt"
    bomb.parent.mkdir(parents=True)
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"")
        with archive.open("archive/data/0", "w") as record:
            for _ in range(32):
                record.write(bytes(1 << 20))  # 32 MB of zeros, some 32 kB stored
    assert bomb.stat().st_size * INFLATION_LIMIT < 32 << 20
    with pytest.raises(CheckpointError, match=rf"would inflate from .* more than {INFLATION_LIMIT} times its size"):
        read_checkpoint(bomb)
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        latest_checkpoint(RUN.parent)
    assert f"passing over {bomb}: " in capsys.readouterr().out


CHECK_FIFO = """
import sys
from pathlib import Path
from {{ cookiecutter.project_slug }}.checkpoints import CheckpointError, latest_checkpoint, read_checkpoint
for check in (lambda: read_checkpoint(sys.argv[1]), lambda: latest_checkpoint(Path("runs/lightning_logs"))):
    try:
        check()
    except CheckpointError as err:
        print(err)
"""


def test_a_fifo_checkpoint_is_refused_without_being_opened(in_tmp_path):
    """A FIFO as the newest last.ckpt, or given as --ckpt_path, is refused at once: opening it would wait forever."""
    fifo = RUN / "checkpoints" / "last.ckpt"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src")}
    done = subprocess.run(
        [sys.executable, "-c", CHECK_FIFO, str(fifo)],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr
    assert f"checkpoint {fifo} is a FIFO, not a file: refused unopened" in done.stdout
    assert "passing over" in done.stdout and "no checkpoint under" in done.stdout


def _newest_evaluation(subcommand: str) -> dict[str, str]:
    folders = sorted((RUN / subcommand).iterdir(), key=lambda folder: int(folder.name.split("_")[1]))
    with (folders[-1] / "metrics.csv").open() as file:
        return next(csv.DictReader(file))


def _trained_val_loss() -> float:
    with (RUN / "metrics.csv").open() as file:
        return [float(row["val/loss"]) for row in csv.DictReader(file) if row.get("val/loss")][-1]


@pytest.mark.slow
def test_validate_loads_the_given_checkpoint_whatever_the_order_of_config(run_copy):
    """`validate --ckpt_path X --config run/config.yaml` loads X in either order: the run's `ckpt_path: null`
    does not replace it, and the run's own two validation batches give the training's number."""
    config, limit = ["--config", str(RUN / "config.yaml")], ["--trainer.limit_val_batches", "2"]
    for args in ([*config, "--ckpt_path", str(LAST)], ["--ckpt_path", str(LAST), *config]):
        main(["validate", "--accelerator", "cpu", *args, *limit])
        assert float(_newest_evaluation("validate")["val/loss"]) == pytest.approx(_trained_val_loss(), abs=1e-5)


def test_evaluation_without_a_checkpoint_is_refused_unless_asked_for(in_tmp_path, fast_args, capsys):
    """validate, test and predict without a checkpoint would score untrained weights: refused in one line, unless
    --untrained_weights true asks for exactly that."""
    for subcommand in ("validate", "test", "predict"):
        message = _exit_message(main, subcommand, *fast_args)
        assert message.startswith(f"error: {subcommand} needs --ckpt_path") and "--untrained_weights true" in message
    message = _exit_message(main, "test", *fast_args, "--ckpt_path", "x.ckpt", "--untrained_weights", "true")
    assert "contradict" in message
    main(["validate", *fast_args, "--untrained_weights", "true"])
    assert "val/acc" in capsys.readouterr().out


def _rows(path: Path) -> int:
    with path.open() as file:
        return sum(1 for _ in csv.DictReader(file))


@pytest.mark.slow
def test_evaluation_uses_the_whole_split_unless_a_limit_is_given(run_copy, capsys):
    """The run's saved two-batch limit is not applied to an evaluation; a limit on the command line is, and said."""
    assert yaml.safe_load((RUN / "config.yaml").read_text())["trainer"]["limit_predict_batches"] == 2
    main(["predict", "--accelerator", "cpu", "--ckpt_path", str(LAST), "--predictions.path", "all.csv"])
    assert "part of" not in capsys.readouterr().out
    limit = ["--trainer.limit_predict_batches", "3"]
    main(["predict", "--ckpt_path", str(LAST), *limit, "--predictions.path", "three.csv"])
    line = "predict on part of the prediction data only (--trainer.limit_predict_batches 3"
    assert line in capsys.readouterr().out
    batch = yaml.safe_load((RUN / "config.yaml").read_text())["data"]["init_args"]["batch_size"]
    assert _rows(Path("three.csv")) == 3 * batch and _rows(Path("all.csv")) > 3 * batch


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_evaluating_twice_into_the_same_logger_version_is_refused(run_copy, fast_args):
    """A second evaluation with the same logger version would delete the first one's metrics.csv: refused."""
    same = ["validate", *fast_args, "--ckpt_path", str(LAST), "--trainer.logger.init_args.version", "0"]
    main(same)
    first = RUN / "validate" / "version_0" / "metrics.csv"
    before = _digest(first)
    message = _exit_message(main, *same)
    assert "holds an earlier run" in message and "--trainer.logger.init_args.version" in message
    assert _digest(first) == before
