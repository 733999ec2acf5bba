"""The benchmark runs and prints sane numbers. It asserts no timings: those belong in its report, not in tests."""

import math
import re

import pytest

from {{ cookiecutter.project_slug }} import bench


@pytest.mark.slow
def test_benchmark_reports_every_measurement(in_tmp_path, synthetic_config, capsys):
    bench.main(
        ["--config", synthetic_config, "--accelerator", "cpu", "--steps", "4", "--warmup", "2", "--repeats", "1"]
    )
    out = capsys.readouterr().out
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
