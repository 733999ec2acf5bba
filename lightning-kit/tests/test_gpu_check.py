"""The GPU check (``python -m <package>.gpu_check``): what can be checked without a GPU.

Without CUDA it stops with one line; its summary holds each step and the agreement table; and
its agreement runner (the tests of ``test_real_gpu.py``) fills that table when run on the
simulated GPU. What only a GPU can show, the GPU's side of each row, is its job on a GPU machine.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S, PROJECT
from test_real_gpu import AGREEMENT, RIGHT

from lightning_kit.gpu_check import Step, agreement_rows, main, summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_without_cuda_the_check_stops_with_one_line(in_tmp_path, capsys):
    """No CUDA GPU: one line saying so, exit status 2, and no summary written."""
    with pytest.raises(SystemExit) as stop:
        main([])
    out = capsys.readouterr()
    assert stop.value.code == 2
    assert out.out.strip().splitlines() == [
        "error: no CUDA GPU on this machine (torch.cuda.is_available() is False): the GPU check needs one"
    ]
    assert not (in_tmp_path / "gpu-check.md").exists()


def test_the_summary_holds_each_step_the_agreement_table_and_what_failed():
    """Each step with its result and time, a row per rule, the count that agree, and a failed step's output."""
    steps = [
        Step("tests marked gpu", ["pytest"], Path("."), 240, returncode=0, seconds=61.2),
        Step("one epoch", ["train.py"], Path("."), 100, returncode=1, seconds=5, output="Trace\nRuntimeError: boom"),
        Step("the benchmark", ["bench"], Path("."), 100, returncode=None, seconds=100),
    ]
    rows = [
        {"rule": "loss weight", "device": "gpu", "audit wrong": "mixed devices at line 3", "device wrong": "x | y"}
        | {"audit right": "ok", "device right": "ok", "agrees": "yes"},
        {"rule": "ctc_loss", "device": "gpu", "audit right": "ok", "device right": "RuntimeError: no", "agrees": "NO"},
    ]
    text = summary("NVIDIA H200 (CUDA 13.0)", steps, rows)
    assert "| tests marked gpu | passed | 61 |" in text
    assert "| one epoch | failed (exit status 1) | 5 |" in text
    assert "| the benchmark | stopped after 100 s | 100 |" in text
    assert "| loss weight | gpu | mixed devices at line 3 | x \\| y | ok | ok | yes |" in text
    assert "| ctc_loss | gpu | - | - | ok | RuntimeError: no | NO |" in text  # a right-only case
    assert "1 of 2 agree." in text
    assert "RuntimeError: boom" in text
    assert "NVIDIA H200" in text


@pytest.mark.slow
def test_the_agreement_runner_fills_the_table_on_the_simulated_gpu(tmp_path):
    """The agreement tests, run on the simulated GPU, record a row for every rule, and every row agrees."""
    junit = tmp_path / "agreement.xml"
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*pytest, "tests/test_real_gpu.py", "-k", "simgpu", f"--junitxml={junit}"],
        cwd=PROJECT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    rows = agreement_rows(junit)
    assert sorted(row["rule"] for row in rows) == sorted([*AGREEMENT, *RIGHT])
    assert {row["device"] for row in rows} == {"simgpu"}
    assert all(row["agrees"] == "yes" for row in rows), rows
