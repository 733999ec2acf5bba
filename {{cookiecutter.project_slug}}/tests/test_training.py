"""Training you can trust: exact resume, interruption, checked checkpoints, predictions, DDP, logs and plots."""

import csv
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
from conftest import HANG_GUARD_S

from {{ cookiecutter.project_slug }}.checkpoints import TEMPORARY_PREFIX, AtomicCheckpointIO, latest_checkpoint
from {{ cookiecutter.project_slug }}.cli import build, main

RUNS = Path("runs/lightning_logs")


def checkpoint(run: int, name: str = "last.ckpt") -> Path:
    return RUNS / f"version_{run}" / "checkpoints" / name


def wait_until_written(path: Path, process: subprocess.Popen) -> None:
    """Return once ``path`` exists, however slow the machine; fail if the run ends first or hangs."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists():
        assert process.poll() is None, f"the run ended before writing {path}:\n{process.communicate()[0]}"
        assert time.monotonic() < deadline, f"no {path} after {HANG_GUARD_S} s: the run hangs"
        time.sleep(0.05)


def epoch_metrics(run: int, evaluation: str | None = None) -> dict[int, dict[str, str]]:
    """{epoch: {column: value}} of a run's metrics.csv (or of an evaluation of it), merging the rows of each epoch."""
    merged: dict[int, dict[str, str]] = {}
    folder = RUNS / f"version_{run}" / (f"{evaluation}/version_0" if evaluation else "")
    with (folder / "metrics.csv").open() as file:
        for row in csv.DictReader(file):
            merged.setdefault(int(row["epoch"]), {}).update({key: value for key, value in row.items() if value})
    return merged


class SignalAt(L.Callback):
    """Send this process a signal after a given training or validation batch: a scheduler's SIGTERM, or Ctrl-C."""

    def __init__(self, epoch: int = 0, train_batch: int = -1, val_batch: int = -1, signum: int = 15) -> None:
        self.epoch, self.train_batch, self.val_batch, self.signum = epoch, train_batch, val_batch, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.train_batch):
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and (trainer.current_epoch, batch_idx) == (self.epoch, self.val_batch):
            os.kill(os.getpid(), self.signum)


# Six training and three validation batches an epoch{% if cookiecutter.task == "sequence" %}, and dropout, so that the random stream matters too{% endif %}.
RESUMABLE = [
    *("--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "3", "--data.batch_size", "16"),
{%- if cookiecutter.task == "sequence" %}
    *("--model.net.init_args.dropout", "0.1"),
{%- endif %}
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, fast_args) -> dict:
    """Two epochs without a stop: the final weights and every epoch's metrics."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        main([*fast_args, *RESUMABLE, "--max_epochs", "2"])
        return {"weights": torch.load(checkpoint(0), weights_only=True), "metrics": epoch_metrics(0)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("epoch", "train_batch", "val_batch", "signum"),
    [(0, 2, -1, signal.SIGTERM), (0, 5, -1, signal.SIGTERM), (0, -1, 1, signal.SIGTERM), (1, 0, -1, signal.SIGINT)],
    ids=["mid-epoch", "last-batch", "mid-validation", "ctrl-c-next-epoch"],
)
def test_resume_from_anywhere_continues_exactly(
    in_tmp_path, fast_args, uninterrupted, epoch, train_batch, val_batch, signum
):
    """Stopped by a signal mid-epoch, at an epoch's last batch or during validation, then resumed: the weights
    are the uninterrupted run's, bit for bit, and so is every epoch's metrics (the resumed epoch's are whole)."""
    stop = [f"--trainer.callbacks+={__name__}.SignalAt", "--trainer.callbacks.init_args.epoch", str(epoch)]
    stop += ["--trainer.callbacks.init_args.train_batch", str(train_batch), "--trainer.callbacks.init_args.val_batch"]
    stop += [str(val_batch), "--trainer.callbacks.init_args.signum", str(int(signum))]
    # Ctrl-C handled as in a terminal, also when the tests run as a background job (SIGINT ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit, match="stopped by Ctrl-C or SIGTERM"):
            main([*fast_args, *RESUMABLE, "--max_epochs", "2", *stop])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.load(checkpoint(0, "on_exception.ckpt"), weights_only=True)["global_step"] > 0
    main([*fast_args, *RESUMABLE, "--max_epochs", "2", "--ckpt_path", "last"])

    resumed = torch.load(checkpoint(1), weights_only=True)
    expected = uninterrupted["weights"]
    assert resumed["global_step"] == expected["global_step"]
    assert resumed["state_dict"].keys() == expected["state_dict"].keys()
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
    metrics = epoch_metrics(0) if checkpoint(0).parent.parent.joinpath("metrics.csv").exists() else {}
    for run_epoch, values in epoch_metrics(1).items():
        metrics.setdefault(run_epoch, {}).update(values)
    assert metrics == uninterrupted["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_interrupting_a_run_leaves_a_checkpoint_to_resume_from(train_process, synthetic_config, in_tmp_path, stop):
    """SIGTERM (what SLURM sends before a kill) or Ctrl-C stops at a step boundary and saves on_exception.ckpt.

    In its own process, as a terminal's Ctrl-C or a scheduler's signal reaches it, also when the tests
    themselves run as a background job.
    """
    long_run = (
        *("--config", synthetic_config, "--accelerator", "cpu", "--data.batch_size", "4"),
        *("--trainer.limit_train_batches", "30", "--trainer.limit_val_batches", "2"),
        *("--trainer.num_sanity_val_steps", "0", "--max_epochs", "1000"),
    )
    process = train_process(*long_run)
    # Signalled as soon as the first epoch's last.ckpt appears: the run is then training, not starting up.
    wait_until_written(checkpoint(0, "last.ckpt"), process)
    process.send_signal(stop)
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode != 0, output
    assert "stopped by Ctrl-C or SIGTERM: runs/lightning_logs/version_0/checkpoints/on_exception.ckpt saved" in output
    saved = torch.load(checkpoint(0, "on_exception.ckpt"), weights_only=True)
    assert saved["global_step"] > 0
    # Not a terminal, so no progress bar: no line per step in CI logs.
    assert "it/s" not in output and "Epoch 0" not in output, output
    if stop == signal.SIGINT:
        return  # resuming is the same for both signals: tested once

    # Ten more steps from wherever it stopped, mid-epoch or at an epoch's end.
    more_steps = str(saved["global_step"] + 10)
    resume = train_process(*long_run, "--trainer.max_steps", more_steps, "--ckpt_path", "last")
    output = resume.communicate(timeout=HANG_GUARD_S)[0]
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
def trained_run(trained_once, in_tmp_path) -> Path:
    """The last checkpoint of a short fit, in a copy of its run folder in the test's own folder."""
    shutil.copytree(trained_once / "runs", in_tmp_path / "runs")
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
        (lambda good, bad: bad.write_bytes(b""), "is empty"),
        (lambda good, bad: bad.mkdir(), "is a folder"),
    ],
    ids=["missing", "truncated", "not-lightning", "other-model", "pickled-code", "empty", "folder"],
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
def test_a_checkpoint_naming_foreign_code_is_refused_before_anything_is_imported(trained_run, fast_args, monkeypatch):
    """Hyperparameters naming a class outside the project would be imported to rebuild the model: refused first."""
    Path("sneaky.py").write_text("open('imported', 'w').close()\nclass Net: ...\n")
    monkeypatch.syspath_prepend(".")
    tampered = torch.load(trained_run, weights_only=True)
    tampered["hyper_parameters"]["net"] = {"class_path": "sneaky.Net"}
    torch.save(tampered, "tampered.ckpt")
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", *fast_args, "--ckpt_path", "tampered.ckpt"])
    assert "names code outside this project" in str(exit_info.value.code) and "sneaky.Net" in str(exit_info.value.code)
    assert not Path("imported").exists()


def test_checkpoints_are_renamed_into_place_whole(tmp_path):
    """A save that fails half-way leaves the previous checkpoint as it was and no partial file; a killed save's
    leftover is removed by the next save in that folder."""
    target = tmp_path / "last.ckpt"
    writer = AtomicCheckpointIO()
    writer.save_checkpoint({"step": 1}, target)
    abandoned = tmp_path / f"{TEMPORARY_PREFIX}999999999.last.ckpt"  # a process that no longer exists
    abandoned.write_bytes(b"partial")

    def half_written(obj, file, *args, **kwargs):
        file.write(b"partial")
        raise OSError("No space left on device")

    with mock.patch("torch.save", half_written), pytest.raises(OSError, match="No space left"):
        writer.save_checkpoint({"step": 2}, target)
    assert torch.load(target, weights_only=True) == {"step": 1}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["last.ckpt"]


def test_last_passes_over_checkpoints_that_hold_no_training(in_tmp_path, capsys):
    """--ckpt_path last takes the newest checkpoint of a run that trained, saying what it passed over."""
    good, untrained, truncated = (checkpoint(run) for run in (0, 1, 2))
    for path, steps in ((good, 5), (untrained, 0)):
        path.parent.mkdir(parents=True)
        torch.save({"global_step": steps}, path)
    truncated.parent.mkdir(parents=True)
    truncated.write_bytes(good.read_bytes()[:20])
    for age, path in enumerate((truncated, untrained, good)):  # newest first, a second apart: set, not slept for
        os.utime(path, ns=(0, (1_000_000_000 - age) * 1_000_000_000))
    assert latest_checkpoint(RUNS) == good
    out = capsys.readouterr().out
    assert f"passing over {truncated}: it cannot be read" in out
    assert f"passing over {untrained}: it was saved before any training step" in out


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
        [f"--trainer.callbacks+={__name__}.SignalAt", "--trainer.callbacks.init_args.train_batch", "4"],
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
    stop = [f"--trainer.callbacks+={__name__}.SignalAt", "--trainer.callbacks.init_args.epoch", "1"]
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
def test_nothing_existing_is_overwritten(trained_run, fast_args):
    """An earlier run's folder is never reused, and predictions replace a file only when asked to."""
    metrics_before = _digest(RUNS / "version_0" / "metrics.csv")
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, "--max_epochs", "1", "--trainer.logger.init_args.version", "0"])
    assert "holds an earlier run" in str(exit_info.value.code)
    assert _digest(RUNS / "version_0" / "metrics.csv") == metrics_before

    predict = ["predict", *fast_args, "--ckpt_path", str(trained_run), "--predictions.path", "out.csv"]
    main(predict)
    Path("out.csv").write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        main(predict)
    assert "out.csv exists" in str(exit_info.value.code) and Path("out.csv").read_text() == "mine\n"
    main([*predict, "--predictions.overwrite", "true"])
    assert Path("out.csv").read_text().startswith("index,")


@pytest.mark.slow
def test_evaluating_a_checkpoint_uses_its_runs_settings(in_tmp_path, fast_args, capsys):
    """validate --ckpt_path, with no --config, evaluates the data the checkpoint was trained on, and writes its
    logs into that run's folder; a flag that changes the data is allowed, and said loudly."""
    trained_with = ["--data.seed", "7", "--data.batch_size", "32"]
    main([*fast_args, "--max_epochs", "1", *trained_with])
    final = epoch_metrics(0)[0]
    run = RUNS / "version_0"
    evaluate = ["validate", "--accelerator", "cpu", "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    main([*evaluate, "--trainer.limit_val_batches", "2"])  # the training's batches: a saved limit is not applied
    with (run / "validate" / "version_0" / "metrics.csv").open() as file:
        evaluated = next(csv.DictReader(file))
    assert float(evaluated["val/acc"]) == pytest.approx(float(final["val/acc"]), abs=1e-6)
    assert sorted(path.name for path in RUNS.iterdir()) == ["version_0"], "no new, empty run folder"
    main([*evaluate, "--data.seed", "8"])
    assert "warning: --data.seed 8 differs from the 7 the checkpoint was trained with" in capsys.readouterr().out


@pytest.mark.slow
def test_a_resumed_run_takes_the_learning_rate_it_is_given(in_tmp_path, fast_args):
    main([*fast_args, "--max_epochs", "1", "--model.lr", "0.001"])
    main([*fast_args, "--max_epochs", "2", "--model.lr", "0.0003", "--ckpt_path", "last"])
    groups = torch.load(checkpoint(1), weights_only=True)["optimizer_states"][0]["param_groups"]
    assert [group["lr"] for group in groups] == [0.0003]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--accelerator", "tpu"], "--accelerator tpu needs torch_xla"),
        (["--accelerator", "cpu", "--devices", "64"], "--devices 64 on the CPU would start 64 processes"),
        (["--model.lr", "-1"], "--model.lr must be a positive number"),
        (["--model.weight_decay", "-0.1"], "--model.weight_decay must be a number of at least 0"),
    ],
    ids=["tpu", "too-many-processes", "negative-lr", "negative-weight-decay"],
)
def test_mistakes_on_the_command_line_are_one_line(in_tmp_path, synthetic_config, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", synthetic_config, *flags])
    assert str(exit_info.value.code).startswith(f"error: {message}")
    assert not Path("runs").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="/sys refuses new files on Linux, to root too")
def test_an_output_folder_that_cannot_be_written_is_one_line(in_tmp_path, fast_args):
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, "--max_epochs", "1", "--trainer.logger.init_args.save_dir", "/sys/runs"])
    assert str(exit_info.value.code).startswith("error: cannot write /sys/runs")


def test_plots_of_a_damaged_metrics_file_are_one_line_and_never_fail_a_fit(tmp_path, in_tmp_path, fast_args, capsys):
    from {{ cookiecutter.project_slug }} import callbacks
    from {{ cookiecutter.project_slug }}.plots import main as plots_main

    (tmp_path / "metrics.csv").write_text("epoch,step,train/loss\n0,9,not-a-number\n")
    with pytest.raises(SystemExit) as exit_info:
        plots_main([str(tmp_path)])
    assert exit_info.value.code == 1 and "line 2, is not a metrics row" in capsys.readouterr().err

    with mock.patch.object(callbacks, "plot_run", side_effect=ValueError("damaged")):
        main([*fast_args, "--max_epochs", "1"])
    captured = capsys.readouterr()
    assert "fit finished" in captured.out and "warning: the plots of" in captured.err


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
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out


@pytest.mark.slow
def test_tensorboard_logging_with_one_flag(in_tmp_path, fast_args, synthetic_config):
    pytest.importorskip("tensorboard", reason="TensorBoard comes with the dev extra")
    main([*fast_args, "--max_epochs", "1", "--config", str(Path(synthetic_config).with_name("tensorboard.yaml"))])
    assert list(RUNS.glob("version_0/events.out.tfevents.*"))


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_syncs_metrics_and_writes_once(train_process, fast_args):
    """Two processes train as one: their synced validation metrics agree; one run folder, one set of checkpoints."""
    process = train_process(*fast_args, "--max_epochs", "1", "--devices", "2", "--strategy", "ddp")
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == 0, output
    reports = sorted(line.split(" fit finished: ") for line in output.splitlines() if " fit finished: " in line)
    assert [rank for rank, _ in reports] == ["rank 0/2", "rank 1/2"], output
    assert reports[0][1] == reports[1][1] and "val/acc=" in reports[0][1]
    assert [path.name for path in RUNS.iterdir()] == ["version_0"]
    assert sorted(path.name for path in checkpoint(0).parent.iterdir())[-1] == "last.ckpt"
    assert len(list(checkpoint(0).parent.iterdir())) == 2
    assert len(epoch_metrics(0)) == 1


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _start_ddp_and_wait_for_training(train_process, synthetic_config):
    """Two CPU processes of a long DDP run, returned once the first epoch is saved (so both are training)."""
    process = train_process(
        *("--config", synthetic_config, "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp"),
        *("--data.batch_size", "4", "--trainer.limit_train_batches", "10", "--trainer.limit_val_batches", "2"),
        *("--trainer.num_sanity_val_steps", "0", "--max_epochs", "1000"),
    )
    wait_until_written(checkpoint(0), process)
    children = _children(process.pid)
    assert len(children) == 1, f"expected Lightning's process for rank 1, found {children}"
    return process, children[0]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="finds the second process through /proc")
def test_a_signal_to_any_ddp_process_stops_them_all_with_one_checkpoint(train_process, synthetic_config):
    """A scheduler may signal any process: SIGTERM to rank 1 stops both, within a step, and one checkpoint is saved."""
    process, rank_1 = _start_ddp_and_wait_for_training(train_process, synthetic_config)
    os.kill(rank_1, signal.SIGTERM)
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == 1, output
    assert "stopped by Ctrl-C or SIGTERM: runs/lightning_logs/version_0/checkpoints/on_exception.ckpt saved" in output
    assert torch.load(checkpoint(0, "on_exception.ckpt"), weights_only=True)["global_step"] > 0
    assert "Traceback" not in output, output


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="finds the second process through /proc")
def test_when_a_ddp_process_dies_the_others_end_with_one_line(train_process, synthetic_config):
    """A killed rank would leave the other waiting in its next collective for half an hour: it ends at once."""
    process, rank_1 = _start_ddp_and_wait_for_training(train_process, synthetic_config)
    os.kill(rank_1, signal.SIGKILL)
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == 1, output
    assert "error: the process of rank 1 ended with exit code -9" in output
    assert "Traceback" not in output, output
