"""The audit's verdict is earned: the GPU branch runs, the model itself is audited, every mixed operation is a bug.

``gpu_branch_cases.py`` holds the models (code guarded by CUDA's questions, hooks of every kind,
parametrizations and pruning, convolutions and other composite operations with a CPU operand, CPU tensors
made one or more calls away), each with what the audit must find. One process imports them and audits
each in a forked child of its own (``run_audit(..., isolate=True)``), so that no case sees another's
state; each test below holds one case's verdict against what it must be.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S
from gpu_branch_cases import CASES

HERE = Path(__file__).resolve().parent


def line_ending_with(marker: str) -> list:
    """``[file name, line]`` of the line of the cases (or their helper) that ends with the comment ``marker``."""
    for name in ("gpu_branch_cases.py", "gpu_branch_helpers.py"):
        for number, line in enumerate((HERE / name).read_text().splitlines(), 1):
            if line.rstrip().endswith(marker):
                return [name, number]
    raise AssertionError(f"no line ends with {marker!r}")


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    """Every case's verdict, each audited in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(
        [sys.executable, str(HERE / "gpu_branch_cases.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE,
        stdin=subprocess.DEVNULL,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return {row["case"]: row for row in map(json.loads, run.stdout.splitlines())}


@pytest.mark.parametrize("name", list(CASES))
def test_each_model_gets_the_verdict_it_earns(verdicts, name):
    found, expected = verdicts[name], CASES[name].expected
    assert found["forked"], "the case was audited in a process of its own"
    assert found["status"] == expected.status, found["report"]
    if expected.status == 1:
        assert (found["kind"], found["rank"]) == (expected.kind, expected.rank), found["report"]
        if expected.at is not None:  # else in a backward pass, which the report names
            assert found["at"] == line_ending_with(expected.at), found["report"]
    if expected.made is not None:
        assert found["made"] == line_ending_with(expected.made), found["report"]
        assert f"Fix at {found['made'][0]}:{found['made'][1]}:" in found["report"] or found["made"] == found["at"]
    if expected.stage is not None:
        assert found["stage"] == expected.stage, found["report"]
    if expected.said is not None:
        assert expected.said in found["report"], found["report"]
    if expected.note is not None:
        assert any(expected.note in note for note in found["notes"]), found["notes"]
    if expected.status == 0:  # every stage the model defines, on one GPU and as each DDP rank
        assert " ok " in found["report"] and "simgpu:1 (DDP rank 1 of 2)" in found["report"], found["report"]
