"""The benchmark runs and prints sane numbers. It asserts no timings: those belong in its report, not in tests."""

import math
{%- if cookiecutter.task == "image" %}
import pickle
{%- endif %}
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import CONFIGS

from lightning_kit import bench
{%- if cookiecutter.task == "image" %}
from image_project.data import cifar10
{%- endif %}


def write_the_data_of_every_config(folder: Path) -> None:
    """The data the shipped configs read, tiny, where they read it (data/ under the working folder)."""
    rng = np.random.default_rng(0)
{%- if cookiecutter.task == "image" %}
    cifar = folder / "data" / cifar10.CIFAR10_FOLDER  # extracted, as after the first download
    cifar.mkdir(parents=True)
    for name in cifar10.CIFAR10_BATCHES:
        batch = {"labels": rng.integers(0, 10, 8).tolist(), "data": rng.integers(0, 256, (8, 3072), dtype=np.uint8)}
        (cifar / name).write_bytes(pickle.dumps(batch, protocol=2))
    bench.write_image_folder(folder / "data" / "images", count=40)
{%- else %}
    tokens, labels = rng.integers(0, 16, (64, 32)), rng.integers(0, 2, 64)
    (folder / "data").mkdir()
    np.savez(folder / "data" / "sequences.npz", tokens=tokens, labels=labels)
{%- endif %}


def measured(out: str) -> None:
    """Every measurement of the report is there, positive and finite."""
    rates = {
        label: float(value.replace(",", ""))
        for label, value in re.findall(r"^\((\w)\) .*?([\d,]+) samples/s", out, re.M)
    }
    assert set(rates) == {"a", "b", "c", "d"}, out
    assert all(rate > 0 for rate in rates.values()), out
    ratios = [float(value) for value in re.findall(r"ratio .*?([\d.]+)$", out, re.M)]
    assert len(ratios) == 3 and all(math.isfinite(ratio) and ratio > 0 for ratio in ratios), out
    per_step = [float(value) for value in re.findall(r"([\d.]+) ms", out)]
    assert len(per_step) == 3 and all(value > 0 for value in per_step), out


@pytest.mark.slow
def test_benchmark_reports_every_measurement(in_tmp_path, synthetic_config, capsys):
    bench.main(
        ["--config", synthetic_config, "--accelerator", "cpu", "--steps", "4", "--warmup", "2", "--repeats", "1"]
    )
    measured(capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(path.name for path in CONFIGS.glob("*.yaml")))
def test_the_benchmark_runs_with_every_shipped_config(in_tmp_path, config, capsys):
    """Each config the project ships, alone, as its own comment shows it used, with its data in place."""
    write_the_data_of_every_config(in_tmp_path)
    tiny = ["--steps", "2", "--warmup", "1", "--repeats", "1", "--data.batch_size", "4"]
    bench.main(["--config", str(CONFIGS / config), "--accelerator", "cpu", *tiny])
    measured(capsys.readouterr().out)


def test_a_missing_data_folder_is_one_line(in_tmp_path):
    with pytest.raises(SystemExit) as exit_info:
{%- if cookiecutter.task == "image" %}
        bench.main(["--config", str(CONFIGS / "image_folder.yaml"), "--accelerator", "cpu"])
    assert str(exit_info.value.code).startswith("error: --data.root data/images is not a folder")
{%- else %}
        bench.main(["--config", str(CONFIGS / "from_file.yaml"), "--accelerator", "cpu", "--repeats", "1"])
    assert str(exit_info.value.code).startswith("error: ") and "data/sequences.npz" in str(exit_info.value.code)
{%- endif %}
{%- if cookiecutter.task == "image" %}


def test_image_folder_benchmark_reports_the_first_and_the_cached_load(capsys):
    bench.main(["--image_folder", "40"])
    out = capsys.readouterr().out
    assert out.startswith("image folder: 40 images (20 JPEG, 20 PNG)"), out
    [(first, rate)] = re.findall(r"^first load: .*? ([\d.]+) s +([\d,]+) images/s$", out, re.M)
    [cached] = re.findall(r"^cached load: .*? ([\d.]+) s$", out, re.M)
    [ratio] = re.findall(r"^ +ratio first/cached +([\d.]+)$", out, re.M)
    values = [float(first), float(rate.replace(",", "")), float(cached), float(ratio)]
    assert all(math.isfinite(value) and value > 0 for value in values), out
{%- endif %}
