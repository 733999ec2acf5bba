"""The library reaches projects with pip: a baked project requires it where it was baked from, and a Lightning
project that was never baked installs it from a path or a git URL and audits its own model with it.

Each test here uses the session's one fresh environment (``fresh_venv`` in conftest.py): a plain
virtual environment into which a project baked from a git URL was installed with
`pip install -e ".[dev]"`, every dependency from the package index; the tests after it install
into it what they need (the library first uninstalled: pip keeps an installed one of the same version
for a git URL's requirement), where the rest is there already.
"""

import re
from pathlib import Path

import pytest
from conftest import FreshVenv, library_requirements

pytestmark = pytest.mark.slow

LIBRARY = "lightning-kit"


def test_a_project_baked_from_a_git_url_installs_the_library_from_that_repository_at_that_commit(
    fresh_venv: FreshVenv, tmp_path
):
    project = Path(fresh_venv.project)
    url = f"{fresh_venv.url}@{fresh_venv.commit}#subdirectory={LIBRARY}"
    found = library_requirements(project)
    assert len(found) == 5, found  # the dependency, and the extras onnx, postgres, serve and dev
    assert all(text.split(" @ ", 1)[1] == url for text in found), found
    assert found[0] == f"{LIBRARY} @ {url}"

    # What the fresh environment's `pip install -e ".[dev]"` installed: the library cloned from the
    # template's repository, checked out at the commit baked, built from its folder there.
    library = fresh_venv.installed[LIBRARY]
    direct = library["direct_url"]
    assert (direct["url"], direct["vcs_info"]["vcs"]) == (fresh_venv.url.removeprefix("git+"), "git"), library
    assert (direct["vcs_info"]["commit_id"], direct["subdirectory"]) == (fresh_venv.commit, LIBRARY), library
    assert Path(library["location"]).resolve().is_relative_to(Path(fresh_venv.folder).resolve()), library
    assert fresh_venv.installed["vision_project"]["direct_url"] == {
        "url": project.as_uri(),
        "dir_info": {"editable": True},
    }
    assert fresh_venv.installed["torch"]["direct_url"] is None, "torch came from the package index"
    print(f"fresh environment: `pip install -e .[dev]` took {fresh_venv.install_seconds} s")

    # Another test may have installed another library since: without it, the same command installs this one
    # again, and the project's commands run on it: the audit of what train.py builds.
    fresh_venv.pip("uninstall", "--yes", LIBRARY, cwd=project)
    fresh_venv.pip("install", "-e", ".[dev]", cwd=project)
    assert fresh_venv.distribution(LIBRARY, project)["direct_url"] == library["direct_url"]
    imported = fresh_venv.run("python", "-c", "import lightning_kit; print(lightning_kit.__file__)", cwd=tmp_path)
    assert imported.returncode == 0 and imported.stdout.startswith(fresh_venv.folder), imported.stdout + imported.stderr
    audit = fresh_venv.run(
        *("python", "-m", "vision_project.placement", "--config", "configs/synthetic.yaml"),
        *("--data.synthetic_size", "200"),
        cwd=project,
    )
    assert audit.returncode == 0, audit.stdout[-6000:] + audit.stderr[-4000:]
    assert "the model will run on a GPU" in audit.stdout, audit.stdout


# A Lightning project of someone else's: its own model and data module, in a package of its own.
THEIR_PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "their-project"
version = "1.0.0"
requires-python = ">=3.10"
dependencies = ["{library}", "lightning>=2.5", "torch>=2.10"]

[project.optional-dependencies]
test = ["pytest>=8"]

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
addopts = ["-p", "no:cacheprovider"]
"""
THEIR_MODELS = '''\
"""A small regression model and its data."""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    """A two-layer network fitted to y = 3x + 1 with noise."""

    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class JitteredRegressor(Regressor):
    """The same model, with the jitter its author added in training: noise made on the CPU."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        jitter = torch.randn(x.shape) * 0.01
        return nn.functional.mse_loss(self(x + jitter), y)  # the misplaced tensor


class Points(L.LightningDataModule):
    """Noisy points of y = 3x + 1, made from a seed."""

    def __init__(self, size: int = 64, batch_size: int = 16, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(self.hparams.seed)
        x = torch.rand(self.hparams.size, 1, generator=generator)
        y = 3 * x + 1 + 0.05 * torch.randn(self.hparams.size, 1, generator=generator)
        split = self.hparams.size * 3 // 4
        self.train_set, self.val_set = TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)
'''
# Their tests: training on the CPU first, as most suites do, then the audit in the same process.
THEIR_TESTS = """\
import lightning as L
import pytest

from lightning_kit import DevicePlacementError, audit
from their_project import models


def test_the_model_learns_on_the_cpu():
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(models.Regressor(), models.Points())
    assert trainer.callback_metrics["val_loss"] < 1.0


def test_the_audit_passes_the_model():
    verdict = audit(models.Regressor(), models.Points())
    assert [(outcome.stage, outcome.rank) for outcome in verdict.outcomes] == [
        ("fit", 0), ("validate", 0), ("fit", 1), ("validate", 1)
    ]


def test_the_audit_finds_the_cpu_tensor_at_its_line():
    with pytest.raises(DevicePlacementError) as caught:
        audit(models.JitteredRegressor(), models.Points())
    assert (caught.value.kind, caught.value.step) == ("mixed devices", "training_step")
    assert caught.value.filename == models.__file__
    assert "# the misplaced tensor" in open(models.__file__).read().splitlines()[caught.value.lineno - 1]
"""
# Their own script: the audit from Python, outside any test session.
THEIR_SCRIPT = """\
from lightning_kit import DevicePlacementError, audit
from their_project import models

print("passed:", [outcome.stage for outcome in audit(models.Regressor(), models.Points()).outcomes])
try:
    audit(models.JitteredRegressor(), models.Points())
except DevicePlacementError as err:
    print(f"found: {err.kind} at {err.filename}:{err.lineno}")
"""


def their_project(folder: Path, library: str) -> Path:
    """Write the project, requiring ``library`` (a requirement, e.g. `lightning-kit @ file:///...`); return it."""
    package = folder / "src" / "their_project"
    package.mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "pyproject.toml").write_text(THEIR_PYPROJECT.format(library=library), encoding="utf-8")
    (package / "__init__.py").write_text('"""Their project: nothing in it comes from the template."""\n')
    (package / "models.py").write_text(THEIR_MODELS, encoding="utf-8")
    (folder / "tests" / "test_models.py").write_text(THEIR_TESTS, encoding="utf-8")
    (folder / "audit_models.py").write_text(THEIR_SCRIPT, encoding="utf-8")
    return folder


def misplaced_line(project: Path) -> int:
    lines = (project / "src" / "their_project" / "models.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if "# the misplaced tensor" in line)


def their_pytest(venv: FreshVenv, project: Path, *options: str):
    return venv.run("python", "-m", "pytest", "-q", *options, cwd=project)


def test_a_project_never_baked_installs_the_library_from_a_path_and_audits_its_own_model(fresh_venv, tmp_path):
    """From Python, from the command line, and in its own pytest session after training on the CPU."""
    library = Path(fresh_venv.template) / LIBRARY
    project = their_project(tmp_path / "their-project", f"{LIBRARY} @ {library.as_uri()}")
    fresh_venv.pip("uninstall", "--yes", LIBRARY, cwd=project)
    fresh_venv.pip("install", "-e", ".[test]", cwd=project)
    installed = fresh_venv.distribution(LIBRARY, project)
    assert installed["direct_url"] == {"url": library.as_uri(), "dir_info": {}}, installed
    line = misplaced_line(project)
    models = project / "src" / "their_project" / "models.py"

    script = fresh_venv.run("python", "audit_models.py", cwd=project)
    assert script.returncode == 0, script.stdout[-4000:] + script.stderr[-4000:]
    assert "passed: ['fit', 'validate', 'fit', 'validate']" in script.stdout, script.stdout
    assert f"found: mixed devices at {models}:{line}" in script.stdout, script.stdout

    command = ("python", "-m", "lightning_kit.placement", "--data", "their_project.models.Points")
    found = fresh_venv.run(*command, "--model", "their_project.models.JitteredRegressor", cwd=project)
    assert found.returncode == 1, found.stdout[-4000:] + found.stderr[-4000:]
    assert f"JitteredRegressor.training_step: aten.add.Tensor at src/their_project/models.py:{line}" in found.stdout
    assert found.stderr.count("Traceback") == 0, found.stderr[-4000:]
    passed = fresh_venv.run(*command, "--model", "their_project.models.Regressor", "--model.hidden", "8", cwd=project)
    assert passed.returncode == 0, passed.stdout[-4000:] + passed.stderr[-4000:]
    assert "the model will run on a GPU" in passed.stdout, passed.stdout
    wrong = fresh_venv.run(*command, "--model", "their_project.models.Regresor", cwd=project)
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr[-4000:]
    assert "--model" in wrong.stderr and "Traceback" not in wrong.stderr, wrong.stderr

    # Their session, in which the library's pytest plugin (installed with it) sets up the simulated GPU first.
    tests = fresh_venv.run("python", "-m", "pytest", cwd=project)
    assert tests.returncode == 0, tests.stdout[-8000:] + tests.stderr[-2000:]
    assert re.search(r"^3 passed", tests.stdout.splitlines()[-1].strip("= "), flags=re.MULTILINE), tests.stdout[-2000:]
    assert re.search(r"^plugins: .*\blightning-kit-", tests.stdout, flags=re.MULTILINE), tests.stdout[:2000]


def test_a_project_never_baked_installs_the_library_from_the_templates_git_url(fresh_venv, tmp_path):
    """The template's repository, a commit and the library's folder in it: `git+URL@COMMIT#subdirectory=...`."""
    url = f"{fresh_venv.url}@{fresh_venv.commit}#subdirectory={LIBRARY}"
    project = their_project(tmp_path / "their-project", f"{LIBRARY} @ {url}")
    # pip takes an installed distribution of the same version for a requirement of a git URL: uninstalled
    # first, the library installed is the one the URL names.
    fresh_venv.pip("uninstall", "--yes", LIBRARY, cwd=project)
    fresh_venv.pip("install", "-e", ".[test]", cwd=project)
    installed = fresh_venv.distribution(LIBRARY, project)
    assert installed["direct_url"]["vcs_info"]["commit_id"] == fresh_venv.commit, installed
    assert installed["direct_url"]["subdirectory"] == LIBRARY, installed
    tests = their_pytest(fresh_venv, project)
    assert tests.returncode == 0, tests.stdout[-8000:] + tests.stderr[-2000:]
    assert re.search(r"^3 passed", tests.stdout.splitlines()[-1]), tests.stdout[-2000:]
