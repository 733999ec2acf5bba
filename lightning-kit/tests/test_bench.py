"""The benchmark runs and prints sane numbers. It asserts no timings: those belong in its report, not in tests."""

import math
import pickle
import re
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from conftest import CONFIGS, IMAGE_PROJECT, SEQUENCE_PROJECT
from image_project.cli import ProjectCLI as ImageCLI
from image_project.data import cifar10
from sequence_project.cli import ProjectCLI as SequenceCLI

from lightning_kit import bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import image_folder  # the maintainers' benchmark of the image folder reader, not installed

# Each project's benchmark: the library's command with the project's command line.
BENCH = {"image": partial(bench.main, cli_class=ImageCLI), "sequence": partial(bench.main, cli_class=SequenceCLI)}
PROJECTS = {"image": IMAGE_PROJECT, "sequence": SEQUENCE_PROJECT}


def write_the_data_of_every_config(folder: Path, task: str) -> None:
    """The data the ``task`` project's shipped configs read, tiny, where they read it (data/ under the working
    folder)."""
    rng = np.random.default_rng(0)
    if task == "image":
        cifar = folder / "data" / cifar10.CIFAR10_FOLDER  # extracted, as after the first download
        cifar.mkdir(parents=True)
        for name in cifar10.CIFAR10_BATCHES:
            labels, data = rng.integers(0, 10, 8).tolist(), rng.integers(0, 256, (8, 3072), dtype=np.uint8)
            (cifar / name).write_bytes(pickle.dumps({"labels": labels, "data": data}, protocol=2))
        image_folder.write_image_folder(folder / "data" / "images", count=40)
    else:
        tokens, labels = rng.integers(0, 16, (64, 32)), rng.integers(0, 2, 64)
        (folder / "data").mkdir()
        np.savez(folder / "data" / "sequences.npz", tokens=tokens, labels=labels)


def measured(out: str) -> bool:
    """Every measurement of the report is there, positive and finite; whether it has TensorBoard's cost (f)."""
    rates = {
        label: float(value.replace(",", ""))
        for label, value in re.findall(r"^\((\w)\) .*?([\d,]+) samples/s", out, re.M)
    }
    assert set(rates) == {"a", "b", "c", "d"}, out
    assert all(rate > 0 for rate in rates.values()), out
    ratios = [float(value) for value in re.findall(r"ratio .*?([\d.]+)$", out, re.M)]
    assert len(ratios) == 3 and all(math.isfinite(ratio) and ratio > 0 for ratio in ratios), out
    step_lines = re.findall(r"^\(e\) .*$", out, re.M)
    per_step = [float(value) for line in step_lines for value in re.findall(r"([\d.]+) ms", line)]
    assert len(per_step) == 3 and all(value > 0 for value in per_step), out
    # (f), with the default logger alone: TensorBoard's files against the CSV alone, both per step, and its difference.
    boards = [re.findall(r"(-?[\d.]+) ms", line) for line in re.findall(r"^\(f\) .*$", out, re.M)]
    assert all(len(values) == 3 and float(values[0]) > 0 and float(values[1]) > 0 for values in boards), out
    paired = [float(value) for value in re.findall(r"^ +median of paired runs +([\d.]+)$", out, re.M)]
    assert len(paired) == 1 + len(boards) and all(math.isfinite(value) and value > 0 for value in paired), out
    return bool(boards)


@pytest.mark.slow
def test_benchmark_reports_every_measurement(in_tmp_path, synthetic_config, capsys):
    BENCH["image"](
        ["--config", synthetic_config, "--accelerator", "cpu", "--steps", "4", "--warmup", "2", "--repeats", "1"]
    )
    assert measured(capsys.readouterr().out), "the default logger's TensorBoard files are measured (f)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "config"),
    [(task, path.name) for task, project in PROJECTS.items() for path in sorted(project.glob("configs/*.yaml"))],
)
def test_the_benchmark_runs_with_every_shipped_config(in_tmp_path, task, config, capsys):
    """Each config each project ships, alone, as its own comment shows it used, with its data in place."""
    write_the_data_of_every_config(in_tmp_path, task)
    tiny = ["--steps", "2", "--warmup", "1", "--repeats", "1", "--data.batch_size", "4"]
    BENCH[task](["--config", str(PROJECTS[task] / "configs" / config), "--accelerator", "cpu", *tiny])
    measured(capsys.readouterr().out)


def test_a_missing_data_folder_is_one_line(in_tmp_path):
    """The image project's folder of images, and the sequence project's file of sequences, not there: one line."""
    with pytest.raises(SystemExit) as exit_info:
        BENCH["image"](["--config", str(CONFIGS / "image_folder.yaml"), "--accelerator", "cpu"])
    assert str(exit_info.value.code).startswith("error: --data.root data/images is not a folder")
    from_file = str(SEQUENCE_PROJECT / "configs" / "from_file.yaml")
    with pytest.raises(SystemExit) as exit_info:
        BENCH["sequence"](["--config", from_file, "--accelerator", "cpu", "--repeats", "1"])
    assert str(exit_info.value.code).startswith("error: ") and "data/sequences.npz" in str(exit_info.value.code)


def test_a_model_without_a_net_is_one_line(in_tmp_path):
    """The benchmark swaps the network a model trains (its ``net``): a model without one stops it in one line."""
    model = ["--model", "lightning.pytorch.demos.boring_classes.BoringModel"]
    data = ["--data", "lightning.pytorch.demos.boring_classes.BoringDataModule", "--accelerator", "cpu"]
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*model, *data])
    message = str(exit_info.value.code)
    assert message.startswith("error: the model BoringModel has no net") and "\n" not in message, message


def test_image_folder_benchmark_reports_the_first_and_the_cached_load(capsys):
    image_folder.main(["40"])
    out = capsys.readouterr().out
    assert out.startswith("image folder: 40 images (20 JPEG, 20 PNG)"), out
    [(first, rate)] = re.findall(r"^first load: .*? ([\d.]+) s +([\d,]+) images/s$", out, re.M)
    [cached] = re.findall(r"^cached load: .*? ([\d.]+) s$", out, re.M)
    [ratio] = re.findall(r"^ +ratio first/cached +([\d.]+)$", out, re.M)
    values = [float(first), float(rate.replace(",", "")), float(cached), float(ratio)]
    assert all(math.isfinite(value) and value > 0 for value in values), out


@pytest.mark.parametrize(
    "arguments, said",
    [
        (["--steps", "0"], "argument --steps: expected a positive number of timed steps, got '0'"),
        (["--steps", "-3"], "argument --steps: expected a positive number of timed steps, got '-3'"),
        (["--steps", "1.5"], "argument --steps: expected a positive number of timed steps, got '1.5'"),
        (["--warmup", "-1"], "argument --warmup: expected a number of untimed steps, 0 or more, got '-1'"),
        (["--repeats", "0"], "argument --repeats: expected a positive number of runs, got '0'"),
    ],
)
def test_a_wrong_count_of_steps_is_one_line_before_anything_is_built(capsys, arguments, said):
    with pytest.raises(SystemExit) as stop:
        bench.main([*arguments, "--config", "nowhere.yaml"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "count, said",
    [
        ("0", "argument count: expected a positive number of images, at most 1,000,000"),
        # Written to disk before they are timed: a count past the bound filled the disk, and the queue the memory.
        ("100000000000", "at most 1,000,000, got '100000000000'"),
    ],
)
def test_a_wrong_count_of_images_is_one_line(capsys, count, said):
    with pytest.raises(SystemExit) as stop:
        image_folder.main([count])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and said in err, err
