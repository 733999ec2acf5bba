"""Bake every combination that matters and check what comes out."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from conftest import HANG_GUARD_S, TEMPLATE, library_requirements, run

COMMON_FILES = {
    ".cookiecutter.json",
    ".cruft.json",
    ".gitignore",
    ".pre-commit-config.yaml",
    "README.md",
    "docs/device-placement.md",
    "pyproject.toml",
    "train.py",
    "configs/sweeps/example.yaml",
    "configs/synthetic.yaml",
    "configs/mlflow.yaml",
    "configs/wandb.yaml",
    "scripts/slurm.sbatch",
    "scripts/sweep.sbatch",
    "src/{pkg}/__init__.py",
    # The project's own code: its LightningModule, its command line, and thin commands that run the library's with it.
    "src/{pkg}/bench.py",
    "src/{pkg}/classifier.py",
    "src/{pkg}/cli.py",
    "src/{pkg}/data/__init__.py",
    "src/{pkg}/export.py",
    "src/{pkg}/models/__init__.py",
    "src/{pkg}/placement.py",
    "src/{pkg}/serve.py",
    "src/{pkg}/sweep.py",
    # Tests of the project's own code; the library's machinery is tested in the library.
    "tests/conftest.py",
    "tests/test_arguments.py",
    "tests/test_cli.py",
    "tests/test_placement_rules.py",
    "tests/test_training.py",
}
TASK_FILES = {
    "image": {
        "configs/cifar10.yaml",
        "configs/image_folder.yaml",
        "src/{pkg}/data/cifar10.py",
        "src/{pkg}/data/images.py",
        "src/{pkg}/data/synthetic.py",
        "src/{pkg}/models/cnn.py",
        "tests/test_cifar10.py",
        "tests/test_cnn.py",
        "tests/test_images.py",
        "tests/test_synthetic.py",
    },
    "sequence": {
        "configs/from_file.yaml",
        "src/{pkg}/data/sequences.py",
        "src/{pkg}/models/attention.py",
        "tests/test_attention.py",
        "tests/test_sequences.py",
    },
}
# Each task with and without the workflow; the license cycles through its choices.
COMBINATIONS = [
    ("image", "yes", "MIT"),
    ("image", "no", "Apache-2.0"),
    ("sequence", "yes", "BSD-3-Clause"),
    ("sequence", "no", "none"),
]
# Template syntax left behind; a GitHub Actions expression `${{ ... }}` is not.
LEFTOVER = re.compile(r"(?<!\$)\{\{|\{%|\{#|cookiecutter\.")


def project_files(root: Path) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and ".pytest_cache" not in path.parts
    }


def expected_files(task: str, github_actions: str, license: str, pkg: str) -> set[str]:
    files = COMMON_FILES | TASK_FILES[task]
    if github_actions == "yes":
        files.add(".github/workflows/ci.yml")
    if license != "none":
        files.add("LICENSE")
    return {name.format(pkg=pkg) for name in files}


def test_defaults_give_an_image_project_with_workflow_and_mit_license(bake):
    root = bake()
    assert root.name == "vision_project"
    assert project_files(root) == expected_files("image", "yes", "MIT", "vision_project")
    assert "MIT License" in (root / "LICENSE").read_text()
    # Baked from this folder: the library is the one beside the template, in the dependencies and each extra of it.
    library = (TEMPLATE / "lightning-kit").as_uri()
    assert library_requirements(root) == [
        f"lightning-kit @ {library}",
        f"lightning-kit[dashboard] @ {library}",
        f"lightning-kit[mlflow] @ {library}",
        f"lightning-kit[onnx] @ {library}",
        f"lightning-kit[postgres] @ {library}",
        f"lightning-kit[serve] @ {library}",
        f"lightning-kit[wandb] @ {library}",
        f"lightning-kit[dashboard,postgres,serve] @ {library}",
    ]


@pytest.mark.parametrize(("task", "github_actions", "license"), COMBINATIONS)
def test_each_combination_has_exactly_its_files_and_no_template_syntax(bake, task, github_actions, license):
    root = bake(task=task, github_actions=github_actions, license=license)
    assert project_files(root) == expected_files(task, github_actions, license, "vision_project")
    for name in project_files(root):
        text = (root / name).read_text(encoding="utf-8")
        assert not LEFTOVER.search(text), f"{name}: {LEFTOVER.search(text).group()!r} left from the template"
        assert not text.startswith("\n"), f"{name} starts with a blank line left by a template tag"
    git = run("git", "init", "-q", ".", cwd=root), run("git", "add", "-A", cwd=root), run("git", "ls-files", cwd=root)
    assert set(git[-1].stdout.split()) == expected_files(task, github_actions, license, "vision_project"), (
        "the project's .gitignore hides some of its own files"
    )
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert pyproject["project"].get("license") == (None if license == "none" else license)
    assert ("torchvision>=0.28" in pyproject["project"]["dependencies"]) == (task == "image")
    if github_actions == "yes":
        workflow = yaml.safe_load((root / ".github/workflows/ci.yml").read_text())
        runs = [step.get("run") for step in workflow["jobs"]["test"]["steps"]]
        assert "python -m pytest" in runs
        assert "python -m vision_project.placement --config configs/synthetic.yaml" in runs
        # Lint is pre-commit's hooks, ruff among them; the GPU job is there to uncomment.
        assert "pre-commit run --all-files --show-diff-on-failure" in runs
        assert not any("ruff" in (run or "") for run in runs)
        assert list(workflow["jobs"]) == ["test"]
        assert "#   runs-on: [self-hosted, gpu]" in (root / ".github/workflows/ci.yml").read_text()


def pre_commit(root: Path, *args: str, home: Path) -> subprocess.CompletedProcess:
    """`pre-commit ARGS` in ``root``, a git repository, with this environment's tools first on PATH.

    The hooks are local and run `ruff`, pre-commit-hooks' scripts and `python` from PATH; the
    store pre-commit keeps (a database, even for local hooks) goes to ``home``, not ~/.cache.
    """
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(home),
        # The hooks' `python` sees the package as `pip install -e .` would make it importable.
        "PYTHONPATH": str(root / "src"),
        "GIT_AUTHOR_NAME": "Template Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Template Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    command = [str(bin_dir / "pre-commit"), *args]
    return subprocess.run(
        command, cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def git_init(root: Path) -> None:
    for command in (("git", "init", "-q", "."), ("git", "add", "-A")):
        done = run(*command, cwd=root)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("task", "github_actions", "license"), COMBINATIONS)
def test_each_combination_is_clean_under_its_own_pre_commit_hooks(bake, tmp_path, task, github_actions, license):
    root = bake(task=task, github_actions=github_actions, license=license)
    git_init(root)
    hooks = pre_commit(root, "run", "--all-files", home=tmp_path / "pre-commit")
    assert hooks.returncode == 0, hooks.stdout + hooks.stderr
    hook_ids = re.findall(r"^\s+- id: (\S+)$", (root / ".pre-commit-config.yaml").read_text(), flags=re.MULTILINE)
    assert len(hook_ids) == 8 and "no-manual-placement" in hook_ids
    passed = re.findall(r"\.Passed$", hooks.stdout, flags=re.MULTILINE)
    assert len(passed) == len(hook_ids), f"each hook checks some file of a fresh project:\n{hooks.stdout}"
    assert run("git", "diff", "--quiet", cwd=root).returncode == 0, "a hook changed a file of the fresh project"


def test_the_placement_hook_names_a_planted_cuda_call(bake, tmp_path):
    root = bake()
    git_init(root)
    planted = Path("src/vision_project/planted.py")
    (root / planted).write_text("import torch\n\nmodel = torch.nn.Linear(2, 2).cuda()\n", encoding="utf-8")
    run("git", "add", str(planted), cwd=root)
    hook = pre_commit(root, "run", "no-manual-placement", "--files", str(planted), home=tmp_path / "pre-commit")
    assert hook.returncode == 1, hook.stdout + hook.stderr
    assert f"{planted.as_posix()}:3: `.cuda()` — delete it" in hook.stdout, hook.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("task", "github_actions", "license"), COMBINATIONS)
def test_each_combination_passes_lint_and_its_own_tests(bake, task, github_actions, license):
    root = bake(task=task, github_actions=github_actions, license=license)
    ruff = Path(sys.executable).with_name("ruff")
    check = run(str(ruff), "check", ".", cwd=root)
    assert check.returncode == 0, check.stdout + check.stderr
    form = run(str(ruff), "format", "--check", ".", cwd=root)
    assert form.returncode == 0, form.stdout + form.stderr
    if github_actions == "no":
        # Its code and tests are the other combination's of its task, byte for byte (only the
        # workflow, licence and metadata differ), and those run there: here the suite is only
        # collected under this combination's own pyproject.toml, so it is not run twice.
        twin = bake(task=task, github_actions="yes", license="MIT")
        for folder in ("src", "tests", "configs"):
            assert tree_bytes(root / folder) == tree_bytes(twin / folder), f"{folder}/ differs between combinations"
        collected = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", cwd=root)
        assert collected.returncode == 0, collected.stdout[-20000:] + collected.stderr[-2000:]
        assert re.search(r"\d+ tests? collected", collected.stdout), collected.stdout[-2000:]
        return
    # Without the warnings summary, so a failure's own report is what the message shows.
    tests = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--disable-warnings", cwd=root)
    assert tests.returncode == 0, tests.stdout[-20000:] + tests.stderr[-2000:]
    assert re.search(r"\d+ passed", tests.stdout.splitlines()[-1]), tests.stdout[-2000:]


def tree_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes (caches left out)."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_answers_are_recorded_without_the_bake_machines_paths(bake):
    root = bake(task="sequence", license="none")
    answers = json.loads((root / ".cookiecutter.json").read_text())
    assert answers["task"] == "sequence" and answers["license"] == "none"
    assert answers["project_slug"] == "vision_project"
    assert not {"_output_dir", "_repo_dir", "_checkout", "__prompts__"} & answers.keys()


AWKWARD = {
    "project_name": "Café Vision",
    "description": 'Detects "things" \\ with a backslash, an apostrophe (it\'s) and {braces}',
    "author_name": 'Seán O\'Connor "Bob"',
    "author_email": "sean.o'connor@example.com",
}


def test_quotes_backslashes_and_non_ascii_stay_data(bake):
    """Awkward answers give valid TOML and JSON holding exactly those values, and Python that compiles."""
    root = bake(**AWKWARD)
    assert root.name == "cafe_vision"
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["description"] == AWKWARD["description"]
    assert project["authors"] == [{"name": AWKWARD["author_name"], "email": AWKWARD["author_email"]}]
    answers = json.loads((root / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert {key: answers[key] for key in AWKWARD} == AWKWARD
    assert AWKWARD["project_name"] in (root / "README.md").read_text(encoding="utf-8")
    assert AWKWARD["author_name"] in (root / "LICENSE").read_text(encoding="utf-8")
    compiled = run(sys.executable, "-m", "compileall", "-q", "src", "tests", "train.py", cwd=root)
    assert compiled.returncode == 0, compiled.stdout


@pytest.mark.parametrize("task", ["image", "sequence"])
def test_train_py_before_the_project_is_installed_says_how_to_install_it(bake, task):
    """`python train.py` in a fresh bake, skipping the README's install step: one line with the command, not a
    ModuleNotFoundError traceback. (A slug no environment here has installed: make demo installs vision_project.)"""
    root = bake(task=task, project_name="Not Installed Yet")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = run(sys.executable, "train.py", "--help", cwd=root, env=env)
    assert done.returncode == 1
    said = 'error: not_installed_yet is not installed: run pip install -e ".[dev]" in this folder first'
    assert done.stderr == said + "\n"
    assert done.stdout == ""
