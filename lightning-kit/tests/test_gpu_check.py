"""The GPU check (``python -m lightning_kit.gpu_check``): what can be checked without a GPU.

Without CUDA it stops with one line; it finds the project, its package and its configuration, and
runs each step in the project's environment; its summary holds each step and the agreement table;
and its agreement runner (the tests of ``test_real_gpu.py``) fills that table when run on the
simulated GPU. What only a GPU can show, the GPU's side of each row, is its job on a GPU machine.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S, IMAGE_PROJECT, SEQUENCE_PROJECT
from image_project.cli import ProjectCLI
from test_real_gpu import AGREEMENT, RIGHT

from lightning_kit.errors import UserError
from lightning_kit.gpu_check import (
    CONFIG,
    Project,
    Step,
    agreement_rows,
    find_project,
    library_tests,
    main,
    run,
    steps,
    summary,
)

# The library's folder, whose tests these are.
LIBRARY = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_without_cuda_the_check_stops_with_one_line(in_tmp_path, capsys):
    """No CUDA GPU: one line saying so, exit status 2, and no summary written; a mistake in what was given is named
    first (the command is right once the machine has a GPU)."""
    summary_file = in_tmp_path / "gpu-check.md"
    with pytest.raises(SystemExit) as stop:
        main(["--project", str(IMAGE_PROJECT), "--out", str(summary_file)])
    assert stop.value.code == 2
    assert capsys.readouterr().out.strip().splitlines() == [
        "error: no CUDA GPU on this machine (torch.cuda.is_available() is False): the GPU check needs one"
    ]
    assert not summary_file.exists()
    for given, said in (
        ([], "synthetic.yaml is not there: run the check in the project's folder"),
        (["--project", str(IMAGE_PROJECT), "--config", "run.yaml"], "--config run.yaml is not a file"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(given)
        assert stop.value.code == 2
        line = capsys.readouterr().out.strip()
        assert line.startswith("error: ") and said in line and "\n" not in line, line


def test_the_summary_holds_each_step_the_agreement_table_and_what_failed():
    """Each step with its result and time, a row per rule, the count that agree, and a failed step's output."""
    steps = [
        Step("tests marked gpu", ["pytest"], Path("."), 240, returncode=0, seconds=61.2),
        Step("one epoch", ["train.py"], Path("."), 100, returncode=1, seconds=5, output="Trace\nRuntimeError: boom"),
        Step("the benchmark", ["bench"], Path("."), 100, returncode=None, seconds=100),
        Step("own tests", ["pytest"], Path("."), 120, returncode=5, seconds=3, passing={0: "passed", 5: "none"}),
        Step("library tests", [], Path("."), 0, not_run="no tests"),
    ]
    rows = [
        {"rule": "loss weight", "device": "gpu", "audit wrong": "mixed devices at line 3", "device wrong": "x | y"}
        | {"audit right": "ok", "device right": "ok", "agrees": "yes"},
        {"rule": "ctc_loss", "device": "gpu", "audit right": "ok", "device right": "RuntimeError: no", "agrees": "NO"},
    ]
    memory = [{"model": "mlp", "steps": "2 with Adam", "audit": 10845184, "CUDA's max_memory_allocated": 19233792}]
    text = summary("NVIDIA H200 (CUDA 13.0)", steps, rows, [row | {"agrees": "yes"} for row in memory])
    assert "## GPU memory: the audit's count beside CUDA's" in text
    assert "| mlp | 2 with Adam | 10845184 | 19233792 | yes |" in text
    assert "| tests marked gpu | passed | 61 |" in text
    assert "| one epoch | failed (exit status 1) | 5 |" in text
    assert "| the benchmark | stopped after 100 s | 100 |" in text
    assert "| own tests | none | 3 |" in text and "| library tests | not run: no tests | 0 |" in text
    assert "## own tests" not in text and "## library tests" not in text  # neither failed
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
        cwd=LIBRARY,
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


def test_the_project_is_found_in_its_folder_with_its_package_and_configuration(tmp_path):
    """By default the project's package is the one in src/ with a bench command; a command line's package, or
    --package, names it; it trains with its train.py. A project without a train.py and a KitCLI trains with the
    library's command line, and without a bench command of its own runs the library's benchmark."""
    train = (str(IMAGE_PROJECT / "train.py"),)
    found = find_project(IMAGE_PROJECT, None, None)
    assert found == Project(IMAGE_PROJECT, "image_project", IMAGE_PROJECT / CONFIG, train)
    assert find_project(IMAGE_PROJECT, None, None, ProjectCLI).package == "image_project"
    config = SEQUENCE_PROJECT / "configs" / "from_file.yaml"
    assert find_project(SEQUENCE_PROJECT, "sequence_project", config) == Project(
        SEQUENCE_PROJECT, "sequence_project", config, (str(SEQUENCE_PROJECT / "train.py"),)
    )
    (tmp_path / CONFIG).parent.mkdir()
    (tmp_path / CONFIG).write_text("model: their.Module\n")
    assert find_project(tmp_path, None, None) == Project(tmp_path, None, tmp_path / CONFIG, ("-m", "lightning_kit"))


def test_a_project_that_is_not_there_is_one_line(tmp_path):
    """No train.py for a project's command line, no configuration, a configuration that is not a file, a package
    without a bench command, two packages to choose from: each names its flag."""
    for of_a_project in ((ProjectCLI,), ()):
        with pytest.raises(UserError, match=r"^--project .*nope does not exist: give the project's folder"):
            find_project(tmp_path / "nope", None, None, *of_a_project)
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"^--project .*file is not a folder: give the project's folder"):
        find_project(tmp_path / "file", None, None)
    with pytest.raises(UserError, match=r"^--project .* holds no train\.py"):
        find_project(tmp_path, None, None, ProjectCLI)
    with pytest.raises(UserError, match=r"synthetic\.yaml is not there: run the check in the project's folder"):
        find_project(tmp_path, None, None)
    with pytest.raises(UserError, match=r"^--config .*run\.yaml is not a file"):
        find_project(tmp_path, None, tmp_path / "run.yaml")
    (tmp_path / "train.py").write_text("")
    config = tmp_path / "run.yaml"
    config.write_text("{}")
    with pytest.raises(UserError, match=r"^--package nowhere_to_be_found has no bench module"):
        find_project(tmp_path, "nowhere_to_be_found", config)
    for name in ("first", "second"):
        (tmp_path / "src" / name).mkdir(parents=True)
        (tmp_path / "src" / name / "__init__.py").write_text("")
        (tmp_path / "src" / name / "bench.py").write_text("")
    with pytest.raises(UserError, match=r"several packages with a bench module \(first, second\): name one"):
        find_project(tmp_path, None, config)
    assert find_project(tmp_path, "second", config).package == "second"


def test_the_steps_run_the_projects_commands_in_its_environment(tmp_path):
    """The library's gpu tests, the project's, its train.py and its benchmark, each in its folder; each step sees
    the project's src/ on its import path."""
    project = find_project(SEQUENCE_PROJECT, None, None)
    assert library_tests() == LIBRARY / "tests"
    planned = steps(tmp_path, project, library_tests())
    assert [step.cwd for step in planned] == [LIBRARY, SEQUENCE_PROJECT, tmp_path, tmp_path]
    assert planned[0].command[-1] == str(LIBRARY / "tests") and "gpu" in planned[0].command
    assert planned[1].passing[5]  # a project with no tests marked gpu passes
    assert planned[2].command[1:4] == [str(SEQUENCE_PROJECT / "train.py"), "--config", str(project.config)]
    assert planned[3].command[1:3] == ["-m", "sequence_project.bench"]
    generic = Project(SEQUENCE_PROJECT, None, project.config, ("-m", "lightning_kit"))
    library_commands = [["-m", "lightning_kit"], ["-m", "lightning_kit.bench"]]
    assert [step.command[1:3] for step in steps(tmp_path, generic)[2:]] == library_commands
    assert steps(tmp_path, project)[0].not_run == "the library is installed without its tests"
    where = "import sequence_project; print(sequence_project.__file__)"
    done = run(Step("import", [sys.executable, "-c", where], tmp_path, 60), SEQUENCE_PROJECT)
    assert done.passed and done.output.strip() == str(SEQUENCE_PROJECT / "src" / "sequence_project" / "__init__.py")
    stopped = run(Step("sleep", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, 1), SEQUENCE_PROJECT)
    assert stopped.returncode is None and stopped.result == "stopped after 1 s" and not stopped.passed
