"""The template's ``configs/wandb.yaml``: every run logged to Weights & Biases too, offline, with no account and
no network, beside the run folder the library's commands read."""

import os
import subprocess
import sys

import pytest
from conftest import CONFIGS, HANG_GUARD_S

# A fit logged to W&B, then resumed for a second epoch: each its own process, in the project's folder, as a person
# runs them (one process keeps one W&B run until it ends).
TRAINED = "import sys; from image_project.cli import main; main(sys.argv[1:])"


@pytest.mark.slow
def test_the_wandb_config_logs_each_run_offline_beside_its_run_folder(tmp_path, fast_args):
    pytest.importorskip("wandb", reason="W&B's client comes with the wandb extra (in the test extra)")
    home = tmp_path / "home"  # W&B's settings and cache: none of the person's, and no key
    environment = {
        **{name: value for name, value in os.environ.items() if not name.startswith("WANDB_")},
        "HOME": str(home),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
    }
    command = [sys.executable, "-c", TRAINED, *fast_args, "--config", str(CONFIGS / "wandb.yaml")]
    for more in (["--max_epochs", "1"], ["--max_epochs", "2", "--ckpt_path", "last"]):
        run = subprocess.run(
            [*command, *more],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            stdin=subprocess.DEVNULL,
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        assert "wandb sync runs/wandb/offline-run-" in run.stdout + run.stderr, "it says how to upload the run"

    # Each fit is a W&B run of its own, holding the metrics the run folder holds and the hyperparameters.
    logged = sorted((tmp_path / "runs" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logged) == 2, logged
    for record in logged:
        data = record.read_bytes()
        for name in (b"train/loss", b"val/loss", b"val/acc", b"epoch", b"lr"):
            assert name in data, (record, name)

    # The library's commands read the run folders as before: the resumed fit continued the first's checkpoints, and
    # W&B's folder is no run of the table.
    folders = sorted(path.name for path in (tmp_path / "runs" / "lightning_logs").iterdir())
    assert folders == ["version_0", "version_1"]
    table = subprocess.run(
        [sys.executable, "-m", "lightning_kit.runs", "--format", "csv"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
    )
    assert table.returncode == 0, table.stderr
    rows = [line.split(",")[0] for line in table.stdout.splitlines()[1:]]
    assert rows == ["lightning_logs/version_0", "lightning_logs/version_1"], table.stdout
