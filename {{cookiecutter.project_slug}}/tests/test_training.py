"""Training you can trust: exact resume, interruption, checked checkpoints, predictions, DDP, logs and plots."""

import csv
import hashlib
import os
import signal
import time
from pathlib import Path
from unittest import mock

import pytest
import torch

from {{ cookiecutter.project_slug }}.cli import build, main

RUNS = Path("runs/lightning_logs")


def checkpoint(run: int, name: str = "last.ckpt") -> Path:
    return RUNS / f"version_{run}" / "checkpoints" / name


def epoch_metrics(run: int) -> dict[int, dict[str, str]]:
    """{epoch: {column: value}} of a run's metrics.csv, merging the rows of each epoch."""
    merged: dict[int, dict[str, str]] = {}
    with (RUNS / f"version_{run}" / "metrics.csv").open() as file:
        for row in csv.DictReader(file):
            merged.setdefault(int(row["epoch"]), {}).update({key: value for key, value in row.items() if value})
    return merged


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path, monkeypatch, fast_args):
    """Training 2 epochs equals training 1, stopping, and resuming for 1: same weights, same validation metrics."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir(), resumed.mkdir()
    monkeypatch.chdir(straight)
    main([*fast_args, "--max_epochs", "2"])
    monkeypatch.chdir(resumed)
    main([*fast_args, "--max_epochs", "1"])
    main([*fast_args, "--max_epochs", "2", "--ckpt_path", "last"])

    monkeypatch.chdir(straight)
    expected = torch.load(checkpoint(0), weights_only=True)
    expected_metrics = epoch_metrics(0)[1]
    monkeypatch.chdir(resumed)
    found = torch.load(checkpoint(1), weights_only=True)
    assert found["global_step"] == expected["global_step"]
    assert found["state_dict"].keys() == expected["state_dict"].keys()
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(found["state_dict"][name], tensor), name
    found_metrics = epoch_metrics(1)[1]
    for name in ("val/loss", "val/acc"):
        assert found_metrics[name] == expected_metrics[name], name


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_interrupting_a_run_leaves_a_checkpoint_to_resume_from(train_process, synthetic_config, in_tmp_path, stop):
    """SIGTERM (what SLURM sends before a kill) or Ctrl-C stops at a step boundary and saves on_exception.ckpt."""
    long_run = (
        *("--config", synthetic_config, "--accelerator", "cpu", "--data.batch_size", "4"),
        *("--trainer.limit_train_batches", "300", "--trainer.limit_val_batches", "5"),
        *("--trainer.num_sanity_val_steps", "0"),
    )
    process = train_process(*long_run, "--max_epochs", "20")
    # Signalled as soon as the first epoch's last.ckpt appears: the run is then training, not starting up.
    first_epoch_saved = checkpoint(0, "last.ckpt")
    deadline = time.monotonic() + 120
    while not first_epoch_saved.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(stop)
    output = process.communicate(timeout=120)[0]
    assert process.returncode != 0, output
    assert ("stopped by SIGTERM" if stop == signal.SIGTERM else "Detected KeyboardInterrupt") in output
    saved = torch.load(checkpoint(0, "on_exception.ckpt"), weights_only=True)
    assert saved["global_step"] > 0
    # Not a terminal, so no progress bar: no line per step in CI logs.
    assert "it/s" not in output and "Epoch 0" not in output, output
    if stop == signal.SIGINT:
        return  # resuming is the same for both signals: tested once

    # Ten more steps from wherever it stopped, mid-epoch or at an epoch's end.
    more_steps = str(saved["global_step"] + 10)
    resume = train_process(*long_run, "--max_epochs", "20", "--trainer.max_steps", more_steps, "--ckpt_path", "last")
    output = resume.communicate(timeout=300)[0]
    assert resume.returncode == 0, output
    assert "resuming from runs/lightning_logs/version_0/checkpoints/on_exception.ckpt" in output
    assert torch.load(checkpoint(1), weights_only=True)["global_step"] == saved["global_step"] + 10


def test_a_ddp_run_shuts_its_process_group_down(in_tmp_path, fast_args):
    """Lightning leaves a gloo group to interpreter shutdown, which can abort a finished run with a non-zero exit."""
    # DDP sets MASTER_PORT, LOCAL_RANK, ... in this process: later DDP runs would take them as their own.
    with mock.patch.dict(os.environ):
        main([*fast_args, "--max_epochs", "1", "--strategy", "ddp", "--devices", "1"])
        assert not torch.distributed.is_initialized()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def trained_run(in_tmp_path, fast_args) -> Path:
    main([*fast_args, "--max_epochs", "1"])
    return checkpoint(0)


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch exploited",))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda good, bad: None, "does not exist"),
        (lambda good, bad: bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2]), "cannot be read"),
        (lambda good, bad: torch.save({"weights": torch.zeros(3)}, bad), "is not a Lightning checkpoint"),
        (
            lambda good, bad: torch.save(
                {"state_dict": {"layer.weight": torch.zeros(2)}, "pytorch-lightning_version": "2.5.0"}, bad
            ),
            "holds another model",
        ),
        (lambda good, bad: torch.save({"state_dict": Exploit()}, bad), "cannot be read"),
    ],
    ids=["missing", "truncated", "not-lightning", "other-model", "pickled-code"],
)
def test_bad_checkpoints_are_refused_with_one_message(trained_run, fast_args, make, message):
    """A missing, truncated or foreign checkpoint stops with one line; nothing runs and nothing is overwritten."""
    bad = Path("bad.ckpt")
    make(trained_run, bad)
    before = {path: _digest(path) for path in Path("runs").rglob("*") if path.is_file()}
    for subcommand in ("fit", "validate"):
        with pytest.raises(SystemExit) as exit_info:
            main([subcommand, *fast_args, "--ckpt_path", str(bad)])
        assert str(exit_info.value.code).startswith("error: ") and message in str(exit_info.value.code)
    assert {path: _digest(path) for path in Path("runs").rglob("*") if path.is_file()} == before
    assert not Path("exploited").exists()


@pytest.mark.slow
def test_predictions_agree_with_test_accuracy(trained_run, fast_args, synthetic_config):
    """predict writes one row per input; its predicted classes score the accuracy that test reports."""
    main(["test", *fast_args, "--ckpt_path", str(trained_run)])
    test_accuracy = float(epoch_metrics(1)[0]["test/acc"])
    main(["predict", *fast_args, "--ckpt_path", str(trained_run), "--predictions.path", "out/predictions.csv"])
    with open("out/predictions.csv") as file:
        rows = list(csv.DictReader(file))
    _, datamodule = build(["--config", synthetic_config])
    datamodule.setup("test")
    labels = datamodule.test_dataloader().dataset.tensors[1]
    assert [int(row["index"]) for row in rows] == list(range(len(rows)))
    correct = sum(int(row["predicted"]) == labels[int(row["index"])] for row in rows)
    assert correct / len(rows) == pytest.approx(test_accuracy, abs=1e-6)
    probabilities = [float(value) for key, value in rows[0].items() if key[0] == "p" and key[1:].isdigit()]
    assert sum(probabilities) == pytest.approx(1, abs=1e-4)
    assert max(range(len(probabilities)), key=probabilities.__getitem__) == int(rows[0]["predicted"])


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
    from {{ cookiecutter.project_slug }}.plots import main as plots_main

    (tmp_path / "metrics.csv").write_text(
        "epoch,step,train/acc,train/loss,val/acc,val/loss\n0,9,0.5,1.2,,\n0,9,,,0.6,1.0\n1,19,0.7,0.8,0.8,0.6\n"
    )
    plots_main([str(tmp_path)])
    assert {"loss.png", "accuracy.png"} <= {path.name for path in tmp_path.iterdir()}
    with pytest.raises(SystemExit):
        plots_main([str(tmp_path / "empty")])


@pytest.mark.slow
def test_bf16_mixed_precision_trains_on_the_cpu(in_tmp_path, fast_args, capsys):
    main([*fast_args, "--max_epochs", "1", "--precision", "bf16-mixed"])
    assert "fit finished: val/loss=" in capsys.readouterr().out


@pytest.mark.slow
def test_tensorboard_logging_with_one_flag(in_tmp_path, fast_args, synthetic_config):
    pytest.importorskip("tensorboard", reason="TensorBoard comes with the dev extra")
    main([*fast_args, "--max_epochs", "1", "--config", str(Path(synthetic_config).with_name("tensorboard.yaml"))])
    assert list(RUNS.glob("version_0/events.out.tfevents.*"))


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_syncs_metrics_and_writes_once(train_process, fast_args):
    """Two processes train as one: their synced validation metrics agree; one run folder, one set of checkpoints."""
    process = train_process(*fast_args, "--max_epochs", "1", "--devices", "2", "--strategy", "ddp")
    output = process.communicate(timeout=600)[0]
    assert process.returncode == 0, output
    reports = sorted(line.split(" fit finished: ") for line in output.splitlines() if " fit finished: " in line)
    assert [rank for rank, _ in reports] == ["rank 0/2", "rank 1/2"], output
    assert reports[0][1] == reports[1][1] and "val/acc=" in reports[0][1]
    assert [path.name for path in RUNS.iterdir()] == ["version_0"]
    assert sorted(path.name for path in checkpoint(0).parent.iterdir())[-1] == "last.ckpt"
    assert len(list(checkpoint(0).parent.iterdir())) == 2
    assert len(epoch_metrics(0)) == 1
