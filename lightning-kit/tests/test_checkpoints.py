"""Checkpoints: bad ones refused in one line, foreign code never imported, an archive that would inflate or a FIFO
refused unread, saves renamed into place whole, --ckpt_path last passing over what holds no training, and nothing
existing overwritten."""

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
from conftest import HANG_GUARD_S, PROJECT, RUNS, checkpoint
from image_project.cli import main
from test_simulated_gpu import BATCH, Probe
from torch.utils.data import DataLoader

from lightning_kit.checkpoints import (
    INFLATION_LIMIT,
    AtomicCheckpointIO,
    CheckpointError,
    RunClasses,
    check_architecture,
    latest_checkpoint,
    read_checkpoint,
)
from lightning_kit.files import TEMPORARY_PREFIX


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
        # What the file holds, named; not PyTorch's advice to load it with weights_only=False, which would run it.
        (lambda good, bad: torch.save({"state_dict": Exploit()}, bad), "unsupported GLOBAL posix.system"),
        (lambda good, bad: bad.write_bytes(bytes(range(256)) * 16), "Unsupported operand"),
        (lambda good, bad: bad.write_bytes(b""), "is empty"),
        (lambda good, bad: bad.mkdir(), "is a folder"),
    ],
    ids=["missing", "truncated", "not-lightning", "other-model", "pickled-code", "not-a-pickle", "empty", "folder"],
)
def test_bad_checkpoints_are_refused_with_one_message(trained_run, fast_args, make, message):
    """A missing, truncated or foreign checkpoint stops with one line; nothing runs and nothing is overwritten."""
    bad = Path("bad.ckpt")
    make(trained_run, bad)
    before = {path: _digest(path) for path in Path("runs").rglob("*") if path.is_file()}
    for subcommand in ("fit", "validate"):
        with pytest.raises(SystemExit) as exit_info:
            main([subcommand, *fast_args, "--ckpt_path", str(bad)])
        said = str(exit_info.value.code)
        assert said.startswith("error: ") and message in said and "\n" not in said, said
        assert "weights_only" not in said, said
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


def test_last_is_the_run_lightning_numbered_last_whatever_the_clock_said(in_tmp_path):
    """A clock set back between runs gives the newer run's checkpoint the older time: the run's number decides."""
    older, newer = checkpoint(2), checkpoint(10)
    for path in (older, newer):
        path.parent.mkdir(parents=True)
        torch.save({"global_step": 3}, path)
    os.utime(older, ns=(0, 2_000_000_000 * 1_000_000_000))
    os.utime(newer, ns=(0, 1_000_000_000 * 1_000_000_000))  # saved "earlier": the clock was set back since
    assert latest_checkpoint(RUNS) == newer


def test_last_is_the_newest_run_among_runs_of_a_name_of_their_own_by_their_checkpoints_time(in_tmp_path):
    """A run named by --trainer.logger.init_args.version (`same`, resumed into its folder) is as new as its newest
    checkpoint: newer than a numbered run saved before it, older than one saved after it."""
    named, numbered = RUNS / "same" / "checkpoints" / "last.ckpt", checkpoint(7)
    for path in (named, numbered):
        path.parent.mkdir(parents=True)
        torch.save({"global_step": 3}, path)
    for newer, older in ((named, numbered), (numbered, named)):
        os.utime(older, ns=(0, 1_000_000_000 * 1_000_000_000))
        os.utime(newer, ns=(0, 1_000_000_100 * 1_000_000_000))
        assert latest_checkpoint(RUNS) == newer


def test_a_checkpoint_names_the_model_class_and_another_class_is_refused_its_weights(tmp_path):
    """Every checkpoint of a run names its model's class (RunClasses); a model of another class built for it (a
    run's config.yaml edited since) is refused in one line, though its weights have the same shapes."""
    model = Probe()
    trainer = L.Trainer(
        max_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[RunClasses()], default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, DataLoader([BATCH] * 2, batch_size=None))
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    trained = read_checkpoint(path)
    assert trained.model_class == "test_simulated_gpu.Probe"
    check_architecture(path, trained, Probe())
    with pytest.raises(CheckpointError) as refused:
        check_architecture(path, trained, LookalikeProbe())
    assert str(refused.value) == (
        f"{path} holds the weights of a test_simulated_gpu.Probe, but the model built is a "
        "test_checkpoints.LookalikeProbe (a run's config.yaml edited since, or --model naming another class): build "
        "the test_simulated_gpu.Probe it was trained as"
    )


class LookalikeProbe(Probe):
    """Another class with the same weights."""


def test_a_checkpoint_that_would_inflate_far_beyond_its_size_is_refused_unread(in_tmp_path, capsys):
    """A small archive of compressed zeros would inflate to many times its size: refused from its directory."""
    bomb = checkpoint(0)
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
        latest_checkpoint(RUNS)
    assert f"passing over {bomb}: " in capsys.readouterr().out


CHECK_FIFO = """
import sys
from pathlib import Path
from lightning_kit.checkpoints import CheckpointError, latest_checkpoint, read_checkpoint
for check in (lambda: read_checkpoint(sys.argv[1]), lambda: latest_checkpoint(Path("runs/lightning_logs"))):
    try:
        check()
    except CheckpointError as err:
        print(err)
"""


def test_a_fifo_checkpoint_is_refused_without_being_opened(in_tmp_path):
    """A FIFO as the newest last.ckpt, or given as --ckpt_path, is refused at once: opening it would wait forever."""
    fifo = checkpoint(0)
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
