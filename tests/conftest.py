import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import tomllib

TEMPLATE = Path(__file__).resolve().parents[1]

# Every process the tests start (baked projects' suites and trainings, installs, torchrun's nodes) inherits this:
# PyTorch's operations on one thread each. Several run at once, on small networks; with a thread per core in each,
# OpenMP's threads spin waiting for cores the others hold (lightning-kit/tests/conftest.py has the measurement).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Every wall-clock limit in these tests (`from conftest import HANG_GUARD_S`) guards against a
# hang and judges no speed: a busy machine makes the tests slower, never wrong. The slowest single
# wait, a baked project's whole suite with its slow tests, takes under 5 minutes on 2 idle cores (all
# of `make test` took 295 s), 13.5 minutes on 2 cores shared with other test runs, and 38 minutes
# with two CPU-bound processes added (6 minutes of CPU time each time). Two hours is an order of
# magnitude above an idle run and three times the slowest seen: only a process that has stopped
# making progress trips it.
HANG_GUARD_S = 2 * 60 * 60

# Not part of the template: the template's own environment, outputs and caches.
NOT_TEMPLATE = {".git", ".venv", "build"}
CACHES = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".ruff_cache", "*.pyc", "*.egg-info", "build")
IDENTITY = {
    "GIT_AUTHOR_NAME": "Template Test",
    "GIT_AUTHOR_EMAIL": "template-test@example.com",
    "GIT_COMMITTER_NAME": "Template Test",
    "GIT_COMMITTER_EMAIL": "template-test@example.com",
}


@pytest.fixture(scope="session")
def template_dir() -> Path:
    """The template's folder, wherever the tests are run from."""
    return TEMPLATE


@pytest.fixture
def bake(cookies, template_dir):
    """Bake the template with some answers changed; return the generated project's folder."""

    def _bake(**answers: str) -> Path:
        result = cookies.bake(extra_context=answers, template=str(template_dir))
        assert result.exit_code == 0, result.exception
        return Path(result.project_path)

    return _bake


def git_environment(folder: Path) -> dict[str, str]:
    """A git identity, no global or system git settings, and a cookiecutter config (and its caches) in ``folder``."""
    config = folder / "cookiecutterrc.yaml"
    config.write_text(f"cookiecutters_dir: {folder / 'cookiecutters'}\nreplay_dir: {folder / 'replay'}\n")
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    return {
        **inherited,
        **IDENTITY,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "COOKIECUTTER_CONFIG": str(config),
    }


def run(*command: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``command`` in ``cwd``, with no terminal and nothing on stdin; its output captured."""
    return subprocess.run(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def git(*args: str, cwd: Path, env: dict[str, str]) -> str:
    done = run("git", *args, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def commit(folder: Path, message: str, env: dict[str, str]) -> str:
    """Commit everything in folder, in a new repository if it has none; return the commit."""
    if not (folder / ".git").exists():
        git("init", "-q", cwd=folder, env=env)
    git("add", "-A", cwd=folder, env=env)
    git("commit", "-q", "-m", message, cwd=folder, env=env)
    return git("rev-parse", "HEAD", cwd=folder, env=env).strip()


def copy_template(target: Path) -> Path:
    """The template's working tree (the library beside it too), without its git folder, environment, outputs and caches.

    The tests commit it into a repository of their own: what they bake and install is the working
    tree as it is, committed or not (on a fresh clone, that is the commit checked out).
    """

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(CACHES(folder, names)) | (NOT_TEMPLATE & set(names) if Path(folder) == TEMPLATE else set())

    shutil.copytree(TEMPLATE, target, ignore=ignore, symlinks=True)
    return target


def cookiecutter_cli(
    source: str, output: Path, cwd: Path, env: dict[str, str], *options: str, answers: dict[str, str] | None = None
) -> Path:
    """`cookiecutter --no-input SOURCE [key=value ...]` into ``output``, as a user types it; return the project."""
    extra = [f"{key}={value}" for key, value in (answers or {}).items()]
    command = [sys.executable, "-m", "cookiecutter", "--no-input", *options, "-o", str(output), source, *extra]
    done = run(*command, cwd=cwd, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return output / (answers or {}).get("project_slug", "vision_project")


def library_requirements(project: Path) -> list[str]:
    """Every requirement of the library in a project's pyproject.toml: its dependency, then each extra's."""
    metadata = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    texts = [
        *metadata["dependencies"],
        *(text for group in metadata["optional-dependencies"].values() for text in group),
    ]
    return [text for text in texts if re.match(r"lightning-kit\b", text)]


@dataclass
class FreshVenv:
    """A plain virtual environment (no system site-packages) into which a project baked from a git URL was installed
    as its README says for a machine without a GPU, with the pip that Python ships: PyTorch's CPU build first, then
    `pip install -e ".[dev]"`.

    ``install_log`` and ``install_seconds`` are of those installs, which took every dependency from the package
    index; ``installed`` is what the environment held right after them. Each test that uses it installs what it
    needs first: another may have changed it.
    """

    folder: str
    template: str  # the template's git repository, commit ``commit``: a copy of the working tree
    commit: str
    url: str  # what the project was baked from: git+file:///...
    project: str
    install_seconds: float
    install_log: str
    installed: dict
    cpu_torch: str | None = None  # the CPU build of PyTorch installed first ("2.13.0+cpu"); None where none was found

    @property
    def bin(self) -> Path:
        return Path(self.folder) / "bin"

    @property
    def env(self) -> dict[str, str]:
        """This environment first on PATH, as after `source .venv/bin/activate`; nothing of the template's own."""
        kept = {
            key: value
            for key, value in os.environ.items()
            if key not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTEST_ADDOPTS"}
            and not key.startswith(("PYTEST_XDIST", "GIT_"))
        }
        return {
            **kept,
            **IDENTITY,
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "VIRTUAL_ENV": self.folder,
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def run(self, *command: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``command`` with this environment's programs first (``python`` is its interpreter)."""
        program = str(self.bin / command[0]) if (self.bin / command[0]).exists() else command[0]
        return run(program, *command[1:], cwd=cwd, env={**self.env, **(env or {})})

    def pip(self, *args: str, cwd: Path) -> str:
        done = self.run("python", "-m", "pip", *args, cwd=cwd)
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
        return done.stdout

    def library_as_built(self) -> None:
        """Put back the library the build installed where a test since installed another: pip keeps an installed
        library that a project's requirement names by another URL (from a path, say), and says it is satisfied."""
        project = Path(self.project)
        if self.distribution("lightning-kit", project)["direct_url"] != self.installed["lightning-kit"]["direct_url"]:
            self.pip("install", "--no-deps", "--force-reinstall", library_requirements(project)[0], cwd=project)

    def distribution(self, name: str, cwd: Path) -> dict:
        """Where this environment's ``name`` came from (its direct_url.json, or None) and its files' folder."""
        probe = (
            "import importlib.metadata as m, json, sys; d = m.distribution(sys.argv[1]); "
            "url = json.loads(d.read_text('direct_url.json') or 'null'); "
            "print(json.dumps({'version': d.version, 'direct_url': url, 'location': str(d.locate_file(''))}))"
        )
        done = self.run("python", "-c", probe, name, cwd=cwd)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout)


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that every xdist worker of this session sees (the session's base folder), or this process's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold ``lock`` against every other process of this session (an advisory lock, released when the file closes)."""
    with lock.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


# The task baked into the fresh environment: the sequence project, which needs no torchvision (a CPU build of
# torchvision is not on this machine's disk, and PyPI's does not load beside a CPU build of PyTorch).
FRESH_TASK = "sequence"


def cpu_torch_wheel() -> Path | None:
    """A CPU build of PyTorch for this Python among pip's --find-links folders (``PIP_FIND_LINKS``): the stand-in here
    for PyTorch's CPU index (https://download.pytorch.org/whl/cpu), which this machine cannot reach; None if none."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        found = sorted(Path(folder).glob(f"torch-*+cpu-{tag}-{tag}-*.whl")) if Path(folder).is_dir() else []
        if found:
            return found[-1]
    return None


def build_fresh_venv(folder: Path) -> FreshVenv:
    """Bake the template from a git URL and install the project into a new, plain environment as its README says for
    a machine without a GPU: with the pip Python ships (not upgraded), PyTorch's CPU build, then the project."""
    folder.mkdir(parents=True, exist_ok=True)
    env = git_environment(folder)
    # A folder of this session's own: pip keeps the wheel it built of a folder by the folder's URL, and a later
    # session at the same path (pytest numbers its folders anew once they are removed) would install that copy.
    template = copy_template(folder / f"template-{time.time_ns()}")
    first = commit(template, "the template", env)
    url = f"git+{template.as_uri()}"
    project = cookiecutter_cli(url, folder / "projects", folder, env, answers={"task": FRESH_TASK})
    venv = folder / "venv"
    done = run(sys.executable, "-m", "venv", str(venv), cwd=folder)
    assert done.returncode == 0, done.stderr
    state = FreshVenv(str(venv), str(template), first, url, str(project), 0.0, "", {})
    started, logs = time.monotonic(), []
    wheel = cpu_torch_wheel()
    if wheel is not None:
        # `pip install torch --index-url https://download.pytorch.org/whl/cpu`, from the folder that stands in for it.
        state.cpu_torch = wheel.name.split("-")[1]
        torch = f"torch=={state.cpu_torch}"
        done = state.run("python", "-m", "pip", "install", "--find-links", str(wheel.parent), torch, cwd=project)
        logs.append(done.stdout[-4000:] + done.stderr[-4000:])
        assert done.returncode == 0, logs[-1]
    done = state.run("python", "-m", "pip", "install", "-e", ".[dev]", cwd=project)
    state.install_seconds = round(time.monotonic() - started, 1)
    state.install_log = "".join(logs) + done.stdout[-20000:] + done.stderr[-4000:]
    assert done.returncode == 0, state.install_log
    state.installed = {name: state.distribution(name, project) for name in ("lightning-kit", "vision_project", "torch")}
    return state


@pytest.fixture(scope="session")
def fresh_venv_folder(tmp_path_factory) -> Path:
    return shared_folder(tmp_path_factory) / "fresh-venv"


def build_once(folder: Path) -> None:
    """Build the session's fresh environment in ``folder``, unless a process of this session built it (or failed
    to: then ``.failed`` beside it says why). Holds the lock while it builds: a test waits for it there."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    record, failed = folder.with_suffix(".json"), folder.with_suffix(".failed")
    with exclusive(folder.with_suffix(".lock")):
        if record.exists() or failed.exists():
            return
        try:
            state = build_fresh_venv(folder)
        except Exception as err:  # the tests that need it fail with this; Ctrl-C still stops the session
            failed.write_text(f"{type(err).__name__}: {err}")
            return
        record.write_text(json.dumps(asdict(state)))


@pytest.fixture(scope="session", autouse=True)
def fresh_venv_in_the_background(request, fresh_venv_folder: Path) -> Iterator[None]:
    """Start building the fresh environment at the session's start, in a thread, when a test selected needs it.

    The build takes minutes, most of them pip writing torch to disk, which the other tests' CPU overlaps; the tests
    that need it come to it built, instead of one building it while the others wait."""
    builder = None
    if any("fresh_venv" in getattr(item, "fixturenames", ()) for item in request.session.items):
        builder = threading.Thread(target=build_once, args=(fresh_venv_folder,), name="fresh-venv", daemon=True)
        builder.start()
    yield
    if builder is not None:
        builder.join(HANG_GUARD_S)


@pytest.fixture
def fresh_venv(fresh_venv_folder: Path) -> Iterator[FreshVenv]:
    """The session's one fresh environment, held by this test alone (across xdist workers) while it runs.

    Built in the background from the session's start (2 to 3 minutes: every dependency installed from the index);
    each test that asks waits for it and reuses it. A build that failed fails them all at once.
    """
    build_once(fresh_venv_folder)
    record, failed = fresh_venv_folder.with_suffix(".json"), fresh_venv_folder.with_suffix(".failed")
    with exclusive(fresh_venv_folder.with_suffix(".lock")):
        if failed.exists():
            pytest.fail(f"the fresh environment could not be built:\n{failed.read_text()}")
        yield FreshVenv(**json.loads(record.read_text()))
