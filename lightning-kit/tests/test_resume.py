"""Interruption and resume: a signal stops a run at a safe point with a checkpoint, and the resumed run goes on
exactly as one that never stopped."""

import shutil
import signal

import pytest
import torch
from conftest import HANG_GUARD_S, SEQUENCE_PROJECT, checkpoint, epoch_metrics, wait_until_written
from image_project.cli import main
from sequence_project.cli import main as sequence_main

# Six training and three validation batches an epoch.
RESUMABLE = ["--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "3", "--data.batch_size", "16"]
# Each project's train.py main, and what its runs add: the image project augments its batches, the sequence
# project's network gets dropout, so that the random stream matters to both.
PROJECTS = {
    "image": (main, RESUMABLE),
    "sequence": (sequence_main, [*RESUMABLE, "--model.net.init_args.dropout", "0.1"]),
}


def _project_args(task: str, fast_args: list[str], synthetic_config: str) -> list[str]:
    """``fast_args`` on ``task``'s project: its own offline configuration, and its resumable flags."""
    config = {"image": synthetic_config, "sequence": str(SEQUENCE_PROJECT / "configs" / "synthetic.yaml")}[task]
    return [*(config if arg == synthetic_config else arg for arg in fast_args), *PROJECTS[task][1]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, fast_args, synthetic_config):
    """Two epochs without a stop, once per project: the final weights and every epoch's metrics."""
    runs = {}

    def run(task: str) -> dict:
        if task not in runs:
            folder = tmp_path_factory.mktemp(f"uninterrupted-{task}")
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(folder)
                PROJECTS[task][0]([*_project_args(task, fast_args, synthetic_config), "--max_epochs", "2"])
                runs[task] = {"weights": torch.load(checkpoint(0), weights_only=True), "metrics": epoch_metrics(0)}
        return runs[task]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("task", PROJECTS)
@pytest.mark.parametrize(
    ("epoch", "train_batch", "val_batch", "signum"),
    [(0, 2, -1, signal.SIGTERM), (0, 5, -1, signal.SIGTERM), (0, -1, 1, signal.SIGTERM), (1, 0, -1, signal.SIGINT)],
    ids=["mid-epoch", "last-batch", "mid-validation", "ctrl-c-next-epoch"],
)
def test_resume_from_anywhere_continues_exactly(
    in_tmp_path, fast_args, synthetic_config, uninterrupted, task, epoch, train_batch, val_batch, signum
):
    """Stopped by a signal mid-epoch, at an epoch's last batch or during validation, then resumed: the weights
    are the uninterrupted run's, bit for bit, and so is every epoch's metrics (the resumed epoch's are whole)."""
    stop = ["--trainer.callbacks+=conftest.SignalAt", "--trainer.callbacks.init_args.epoch", str(epoch)]
    stop += ["--trainer.callbacks.init_args.train_batch", str(train_batch), "--trainer.callbacks.init_args.val_batch"]
    stop += [str(val_batch), "--trainer.callbacks.init_args.signum", str(int(signum))]
    # Ctrl-C handled as in a terminal, also when the tests run as a background job (SIGINT ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    run, args = PROJECTS[task][0], _project_args(task, fast_args, synthetic_config)
    try:
        with pytest.raises(SystemExit, match="stopped by Ctrl-C or SIGTERM"):
            run([*args, "--max_epochs", "2", *stop])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.load(checkpoint(0, "on_exception.ckpt"), weights_only=True)["global_step"] > 0
    run([*args, "--max_epochs", "2", "--ckpt_path", "last"])

    resumed = torch.load(checkpoint(1), weights_only=True)
    expected = uninterrupted(task)["weights"]
    assert resumed["global_step"] == expected["global_step"]
    assert resumed["state_dict"].keys() == expected["state_dict"].keys()
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
    metrics = epoch_metrics(0) if checkpoint(0).parent.parent.joinpath("metrics.csv").exists() else {}
    for run_epoch, values in epoch_metrics(1).items():
        metrics.setdefault(run_epoch, {}).update(values)
    assert metrics == uninterrupted(task)["metrics"]


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


@pytest.mark.slow
@pytest.mark.parametrize("how", ["removed", "a link to nowhere"])
def test_a_run_folder_lost_while_the_run_writes_to_it_is_one_line(train_process, synthetic_config, in_tmp_path, how):
    """The run's folder removed (or replaced by a dangling link) mid-run: TensorBoard's writer thread, the CSV
    logger and the run's record all fail to write there; the run ends in one line naming the folder, exit 1."""
    long_run = (
        *("--config", synthetic_config, "--accelerator", "cpu", "--data.batch_size", "4"),
        *("--trainer.limit_train_batches", "5", "--trainer.limit_val_batches", "2"),
        *("--trainer.num_sanity_val_steps", "0", "--max_epochs", "1000"),
    )
    process = train_process(*long_run)
    wait_until_written(checkpoint(0, "last.ckpt"), process)
    folder = checkpoint(0).parent.parent
    shutil.rmtree(folder)
    if how == "a link to nowhere":
        folder.symlink_to(in_tmp_path / "nowhere" / "version_0")
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    assert process.returncode == 1 and "Traceback" not in output, output[-3000:]
    said = "error: the run's folder runs/lightning_logs/version_0 cannot be written ("
    assert [line for line in output.splitlines() if line.startswith(said)], output[-3000:]


@pytest.mark.slow
def test_a_resumed_run_takes_the_learning_rate_it_is_given(in_tmp_path, fast_args):
    main([*fast_args, "--max_epochs", "1", "--model.lr", "0.001"])
    main([*fast_args, "--max_epochs", "2", "--model.lr", "0.0003", "--ckpt_path", "last"])
    groups = torch.load(checkpoint(1), weights_only=True)["optimizer_states"][0]["param_groups"]
    assert [group["lr"] for group in groups] == [0.0003]
