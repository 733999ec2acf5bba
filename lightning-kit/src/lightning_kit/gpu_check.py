"""The GPU check: one command that tries a project on a real CUDA GPU and writes what it found into one file.

    python -m lightning_kit.gpu_check                  # in the project's folder (where train.py is): gpu-check.md
    python -m lightning_kit.gpu_check --project ~/my_project --package my_project --out FILE --overwrite

Its steps, summary and exit statuses are the placement guide's "The GPU check" (``python -m lightning_kit.guide``).
The project's package is ``--package``, else the package of the command line the check was started with (a
project's thin module calls ``main(cli_class=ProjectCLI)``), else the one package in the project's ``src/`` with a
``bench`` module; a project without a train.py trains with ``python -m lightning_kit``.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path

import torch

from .cli import GenericCLI, KitCLI
from .errors import OneLineParser, UserError, command, invoked_as
from .files import check_output_file
from .installation import check_installation
from .run_record import write_whole
from .runs.table import markdown_table

LIBRARY = Path(__file__).resolve().parents[2]  # in a checkout of its repository, the folder of src/ and tests/
OUTPUT_LINES = 40  # of a failed step's output, in the summary
TRAIN = "--accelerator gpu --precision bf16-mixed --max_epochs 1 --trainer.enable_progress_bar false"
BENCH = "--accelerator gpu --steps 20 --warmup 5 --repeats 2"
CONFIG = Path("configs") / "synthetic.yaml"  # in the project's folder
NO_TESTS = 5  # pytest's exit status when no test was collected: a project without tests marked gpu


@dataclass
class Step:
    """One step of the check: its command, its time limit, and what came of it."""

    name: str
    command: list[str]
    cwd: Path
    limit_s: int
    returncode: int | None = None  # None: stopped at its time limit
    seconds: float = 0.0
    output: str = ""
    passing: dict[int, str] = field(default_factory=lambda: {0: "passed"})  # the statuses that pass, as said
    not_run: str | None = None  # why there was nothing to run it on: it is not run, and fails nothing

    @property
    def passed(self) -> bool:
        return self.not_run is not None or self.returncode in self.passing

    @property
    def result(self) -> str:
        if self.not_run is not None:
            return f"not run: {self.not_run}"
        if self.returncode is None:
            return f"stopped after {self.limit_s} s"
        return self.passing.get(self.returncode, f"failed (exit status {self.returncode})")


@dataclass(frozen=True)
class Project:
    folder: Path
    package: str | None  # None: no thin commands of its own, the library's are run
    config: Path
    train: tuple[str, ...]  # what follows ``python`` to train: its train.py, or ``-m lightning_kit`` without one


def library_tests() -> Path | None:
    """The library's tests, where it is a checkout of its repository (an installed wheel has none)."""
    tests, pyproject = LIBRARY / "tests", LIBRARY / "pyproject.toml"
    has_them = (tests / "conftest.py").is_file() and pyproject.is_file()
    return tests if has_them and 'name = "lightning-kit"' in pyproject.read_text(encoding="utf-8") else None


def find_project(
    folder: str | Path, package: str | None, config: str | Path | None, cli_class: type[KitCLI] = GenericCLI
) -> Project:
    """The project in ``folder``: its package (given, ``cli_class``'s, or found), configuration and training."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UserError(f"--project {folder} {what}: give the project's folder (where train.py is)")
    own = cli_class.own_package()
    has_train = (folder / "train.py").is_file()
    if not has_train and own is not None:
        raise UserError(
            f"--project {folder} holds no train.py: run the check in the project's folder, or give it with --project"
        )
    if config is None and not (folder / CONFIG).is_file():
        raise UserError(
            f"{folder / CONFIG} is not there: run the check in the project's folder or give it with --project, "
            "or give the configuration to train with (--config)"
        )
    config = Path(config) if config is not None else folder / CONFIG
    if not config.is_file():
        raise UserError(f"--config {config} is not a file: give the configuration the check trains with")
    package = package or own or _package_with_bench(folder)
    if package is not None and not _has_module(folder, package, "bench"):
        raise UserError(
            f"--package {package} has no bench module (in {folder / 'src'} or on the import path): "
            "give the package whose thin commands (bench.py) the check runs"
        )
    train = (str(folder.resolve() / "train.py"),) if has_train else ("-m", "lightning_kit")
    return Project(folder, package, config, train)


def _package_with_bench(folder: Path) -> str | None:
    src = folder / "src"
    found = sorted(bench.parent.name for bench in src.glob("*/bench.py") if (bench.parent / "__init__.py").is_file())
    if len(found) > 1:
        raise UserError(
            f"{src} holds several packages with a bench module ({', '.join(found)}): name one with --package"
        )
    return found[0] if found else None


def _has_module(folder: Path, package: str, module: str) -> bool:
    """Whether ``package.module`` is in ``folder``'s ``src/`` or on the import path; found, not imported."""
    inside = folder / "src" / package
    if (inside / f"{module}.py").is_file() or (inside / module / "__init__.py").is_file():
        return True
    spec = PathFinder.find_spec(package)
    locations = spec.submodule_search_locations if spec is not None else None
    return bool(locations) and PathFinder.find_spec(f"{package}.{module}", list(locations)) is not None


def steps(folder: Path, project: Project, library: Path | None = None) -> list[Step]:
    """The check's steps for ``project``, writing into ``folder``, and for the library's tests (``library``)."""
    python, config = sys.executable, str(project.config.resolve())
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu"]
    agreement = "the library's tests marked gpu, with the agreement of each placement rule"
    own_tests = "the project's tests marked gpu"
    bench = f"{project.package}.bench" if project.package else "lightning_kit.bench"
    return [
        Step(agreement, [*pytest, f"--junitxml={folder / 'gpu.xml'}", str(library)], cwd=library.parent, limit_s=240)
        if library is not None
        else Step(agreement, [], cwd=folder, limit_s=0, not_run="the library is installed without its tests"),
        Step(
            own_tests,
            [*pytest, f"--junitxml={folder / 'project-gpu.xml'}"],
            cwd=project.folder,
            limit_s=120,
            passing={0: "passed", NO_TESTS: "passed (none is marked gpu)"},
        )
        if (project.folder / "tests").is_dir()
        else Step(own_tests, [], cwd=folder, limit_s=0, not_run="the project has no tests/ folder"),
        Step(
            "one epoch with --accelerator gpu --precision bf16-mixed",
            [python, *project.train, "--config", config, *TRAIN.split()],
            cwd=folder,
            limit_s=100,
        ),
        Step(
            "the benchmark with --accelerator gpu",
            [python, "-m", bench, "--config", config, *BENCH.split()],
            cwd=folder,
            limit_s=100,
        ),
    ]


def run(step: Step, project: Path) -> Step:
    """Run ``step`` with ``project``'s sources importable, and record what came of it."""
    if step.not_run is not None:
        return step
    paths = [str(project.resolve() / "src"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
    start = time.monotonic()
    try:
        done = subprocess.run(
            step.command,
            cwd=step.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=step.limit_s,
        )
        step.returncode, step.output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        output = stopped.output or ""
        step.output = output if isinstance(output, str) else output.decode(errors="replace")
    step.seconds = time.monotonic() - start
    return step


def agreement_rows(junit: Path, name: str = "agreement") -> list[dict[str, str]]:
    """The rows the tests recorded in pytest's JUnit XML report under ``name``: the placement rules' agreement, or
    ``"memory"``, the audit's count of GPU memory beside CUDA's (tests/test_gpu_memory.py)."""
    if not junit.is_file():
        return []
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        for prop in case.iter("property"):
            if prop.get("name") == name:
                row = json.loads(prop.get("value", "{}"))
                row["agrees"] = "yes" if case.find("failure") is None and case.find("error") is None else "NO"
                rows.append(row)
    return rows


# FakeTensor's verdicts last (PyTorch's own device propagation, a second opinion: tests/fake_gpu.py).
COLUMNS = ("rule", "device", "audit wrong", "device wrong", "audit right", "device right", "agrees")
COLUMNS += ("fake wrong", "fake right")
MEMORY_COLUMNS = ("model", "steps", "audit", "CUDA's max_memory_allocated", "agrees")


def summary(device: str, steps_run: list[Step], rows: list[dict[str, str]], memory: list[dict[str, str]] = ()) -> str:
    """The summary in Markdown: the machine, each step, the agreement and memory tables, what failed."""
    lines = [
        "# GPU check",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {device}, torch {torch.__version__}",
        "",
        "| Step | Result | Seconds |",
        "| --- | --- | --- |",
        *(f"| {step.name} | {step.result} | {step.seconds:.0f} |" for step in steps_run),
        "",
        "## Agreement of the device audit with the GPU",
        "",
    ]
    if rows:
        lines += [*_table(COLUMNS, rows), "", f"{sum(row['agrees'] == 'yes' for row in rows)} of {len(rows)} agree."]
    else:
        lines.append("No agreement rows were recorded (see the tests' step).")
    if memory:
        lines += ["", "## GPU memory: the audit's count beside CUDA's", "", *_table(MEMORY_COLUMNS, memory)]
    for step in steps_run:
        if not step.passed:
            tail = step.output.strip().splitlines()[-OUTPUT_LINES:]
            lines += ["", f"## {step.name}: {step.result}", "", "```text", *tail, "```"]
    return "\n".join(lines) + "\n"


def _table(columns: tuple[str, ...], rows: list[dict[str, str]]) -> list[str]:
    cells = [[str(row.get(column, "-")).replace("\n", " ")[:120] for column in columns] for row in rows]
    return markdown_table([list(columns), *cells]).splitlines()


@command
def main(args: list[str] | None = None, cli_class: type[KitCLI] = GenericCLI, prog: str | None = None) -> None:
    """Run the check on the project ``args`` name, with ``cli_class``'s package's commands; ``prog`` names it."""
    check_installation(cli_class.__module__)
    parser = OneLineParser(
        prog=prog or invoked_as("python -m lightning_kit.gpu_check"), description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--project", type=Path, default=Path("."), help="the project's folder (default: this one)")
    parser.add_argument(
        "--package",
        help=(
            "the project's package, whose commands run (default: the command line's own package, else the one "
            "package in src/ with a bench module)"
        ),
    )
    parser.add_argument("--config", type=Path, help=f"what to train with (default: {CONFIG} in the project)")
    parser.add_argument("--out", type=Path, default=Path("gpu-check.md"), help="the summary (default gpu-check.md)")
    parser.add_argument("--overwrite", action="store_true", help="replace the summary if it exists")
    options = parser.parse_args(args)
    # What was given is checked first: a command prepared on a machine without a GPU is right once it gets one.
    try:
        check_output_file(options.out, "--out", overwrite=options.overwrite, overwrite_flag="--overwrite")
        project = find_project(options.project, options.package, options.config, cli_class)
        if not torch.cuda.is_available():
            raise UserError("no CUDA GPU on this machine (torch.cuda.is_available() is False): the GPU check needs one")
    except UserError as err:
        print(f"error: {err}")
        sys.exit(2)
    device = f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        done = []
        for step in steps(Path(folder), project, library_tests()):
            print(f"{step.name} ...", flush=True)
            done.append(run(step, project.folder))
            print(f"  {step.result} ({step.seconds:.0f} s)", flush=True)
        rows = [row for name in ("gpu.xml", "project-gpu.xml") for row in agreement_rows(Path(folder) / name)]
        memory = agreement_rows(Path(folder) / "gpu.xml", "memory")
    write_whole(options.out, summary(device, done, rows, memory))
    print(f"summary: {options.out}")
    sys.exit(0 if all(step.passed for step in done) else 1)


if __name__ == "__main__":
    main()
