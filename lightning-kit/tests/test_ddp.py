"""DDP on CPU processes: metrics synced and written once, one stop for all, no process left waiting for a dead one."""

import os
import signal
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import HANG_GUARD_S, RUNS, checkpoint, epoch_metrics, wait_until_written
from image_project.cli import main


def test_a_ddp_run_shuts_its_process_group_down(in_tmp_path, fast_args):
    """Lightning leaves a gloo group to interpreter shutdown, which can abort a finished run with a non-zero exit."""
    # DDP sets MASTER_PORT, LOCAL_RANK, ... in this process: later DDP runs would take them as their own.
    with mock.patch.dict(os.environ):
        main([*fast_args, "--max_epochs", "1", "--strategy", "ddp", "--devices", "1"])
        assert not torch.distributed.is_initialized()


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
