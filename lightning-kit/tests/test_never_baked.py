"""A Lightning project that was never baked, as the library's README walks it: ``examples/forecaster`` (its own
package, dict batches, regression metrics), from the audit to the server, each command as the README writes it.

The commands are read from the README's section "A Lightning project that was never baked" and run in order on a copy
of the example whose pyproject.toml names this library's folder (as a user points it at their copy). The library's
commands run in this process (``main`` of each, the arguments as written); ``pytest`` and the server, in processes of
their own. The install, ``pip install -e ".[test]"``, is the template's tests' business: they install the example into
a fresh environment from a folder and from a git URL (``tests/test_install.py`` at the repository's top).
"""

import csv
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HANG_GUARD_S
from test_serve import request, start_server, stop

from lightning_kit import cli, export, installation, placement
from lightning_kit.runs import command as runs
from lightning_kit.serve.model_file import read_model
from lightning_kit.sweep import command as sweep

LIBRARY = Path(__file__).resolve().parents[1]
EXAMPLE = LIBRARY / "examples" / "forecaster"
SECTION = "## A Lightning project that was never baked"
NAMED = "lightning-kit[serve] @ git+https://github.com/org/template#subdirectory=lightning-kit"

pytestmark = pytest.mark.slow


def readme_commands() -> list[list[str]]:
    """The first bash block of the README's section on a project never baked, a command per line, comments removed."""
    text = (LIBRARY / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = section[section.index("```bash\n") + len("```bash\n") : section.index("\n```", section.index("```bash"))]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


# Each library command of the README, run in this process by the main its `python -m` runs.
MAINS = {
    "lightning_kit": lambda args: cli.main(cli.GenericCLI, args),
    "lightning_kit.placement": placement.main,
    "lightning_kit.sweep": sweep.main,
    "lightning_kit.runs": runs.main,
    "lightning_kit.export": export.main,
}


@pytest.fixture
def forecaster(tmp_path, monkeypatch) -> Path:
    """A copy of the example in the test's folder, naming this library's folder, importable, and the working folder."""
    project = shutil.copytree(EXAMPLE, tmp_path / "forecaster", ignore=shutil.ignore_patterns("runs", "__pycache__"))
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    assert text.count(NAMED) == 1, "the example names the library as the README says"
    pyproject.write_text(text.replace(NAMED, f"lightning-kit[serve] @ {LIBRARY.as_uri()}"), encoding="utf-8")
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project / "src"))
    for name in [name for name in sys.modules if name == "forecaster" or name.startswith("forecaster.")]:
        monkeypatch.delitem(sys.modules, name)
    return project


def run_in_process(module: str, args: list[str], capsys) -> str:
    """``python -m module args`` run by its main in this process; its output, and it must end with status 0."""
    try:
        MAINS[module](args)
    except SystemExit as stop:
        assert stop.code in (0, None), f"python -m {module} {shlex.join(args)} exited with {stop.code}"
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "warning: lightning-kit" not in err, err[-3000:]
    return out


def test_the_readme_walks_a_project_never_baked_from_the_audit_to_the_server(forecaster, capsys):
    commands = readme_commands()
    assert [command[:2] for command in commands[:2]] == [["pip", "install"], ["python", "-m"]], commands
    assert installation.problem() is None, "the copy names the library installed here"
    outputs = []
    for command in commands[1:]:
        if command == ["pytest"]:
            outputs.append(their_pytest(forecaster))
        elif command[:3] == ["python", "-m", "lightning_kit.serve"]:
            outputs.append(served(forecaster, command[3:]))
        else:
            assert command[:2] == ["python", "-m"] and command[2] in MAINS, command
            outputs.append(run_in_process(command[2], command[3:], capsys))
    said = dict(zip((" ".join(command[2:4]) for command in commands[1:]), outputs, strict=True))

    assert "the model will run on a GPU" in said["lightning_kit.placement --config"]
    # Trained, then resumed from its newest run: the best epoch by the metric its pyproject.toml monitors.
    first, resumed = Path("runs/lightning_logs/version_0"), Path("runs/lightning_logs/version_1")
    assert json.loads((first / "run.json").read_text())["monitor"] == "val/mae"
    assert re.search(r"fit finished: best epoch \d+: val/loss=\S+ val/mae=\S+ val/r2=\S+", said["lightning_kit fit"])
    assert json.loads((resumed / "run.json").read_text())["resumed_from"] == str(first / "checkpoints" / "last.ckpt")
    assert (resumed / "validate").is_dir() and (resumed / "test").is_dir(), "evaluations of the newest run"
    with (resumed / "predictions.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 76 and list(rows[0]) == ["index", *(f"prediction_{k}" for k in range(4))], rows[0]
    # The sweep judged by val/mae, its trials ordinary runs; the table shows the runs' own metrics.
    table = said["lightning_kit.runs"]
    assert "val/mae" in table and "val/acc" not in table and "minimize val/mae" in table, table
    assert len(list(Path("runs/sweeps/sweep").glob("trial_*/run.json"))) == 3
    assert list(first.glob("events.out.tfevents.*")), "the curves are TensorBoard's: its event file beside metrics.csv"
    # Exported from the newest run, its inputs taken from a batch of the data; served, it answers the model's outputs.
    _, info = read_model(resumed / "model.pt2")
    assert [(one.name, one.shape) for one in info.inputs] == [("history", (24, 2))], info
    answer, expected = said["lightning_kit.serve runs/lightning_logs/version_1/model.pt2"]
    assert torch.allclose(torch.tensor(answer["outputs"]), expected, atol=1e-5), (answer, expected)


def their_pytest(project: Path) -> str:
    """The project's own pytest session, in which the library's plugin sets up the simulated GPU."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project, env={**_environment(project)}, capture_output=True, text=True, timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def served(project: Path, args: list[str]) -> tuple[dict, torch.Tensor]:
    """The server of the README's model file: one request of a window of the test split, and what the model says."""
    from forecaster import Forecaster, SineWaves

    model_file = project / args[0]
    server, url = start_server(model_file.parent, *args[1:])
    try:
        data = SineWaves()
        data.setup("test")
        history = data.test_set[0]["history"]
        status, _, answer = request(url, json.dumps({"history": history.tolist()}).encode(), "application/json")
        assert status == 200, answer
    finally:
        assert stop(server) == 0
    checkpoint = torch.load(project / "runs/lightning_logs/version_1/checkpoints/last.ckpt", weights_only=True)
    model = Forecaster()
    model.load_state_dict(checkpoint["state_dict"])
    with torch.no_grad():
        return answer, model.eval()(history[None])[0]


def _environment(project: Path) -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(project / "src"), os.environ.get("PYTHONPATH", "")])}
