"""The GPU check: one command that tries the project on a real CUDA GPU and writes what it found into one file.

    python -m lightning_kit.gpu_check                  # writes gpu-check.md
    python -m lightning_kit.gpu_check --out FILE --overwrite

Run it from the project's folder, on a machine with a CUDA GPU. Each step runs in a process of
its own, with a time limit (under 8 minutes in all):

1. the tests marked ``gpu`` (``pytest -m gpu``): among them, every placement rule's wrong and
   right version trained on the GPU next to the device audit's verdict;
2. one epoch of training with ``--accelerator gpu --precision bf16-mixed`` on synthetic data;
3. the benchmark with ``--accelerator gpu``, short.

The summary (Markdown) names the GPU and PyTorch, each step's result and time, the agreement
table (rule, the audit's verdict and the GPU's for each version), and the end of the output of
a step that failed. Exit status: 0 every step passed, 1 one failed, 2 no CUDA GPU here (one
line, nothing written) or a summary that exists already (without ``--overwrite``).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import torch

PROJECT = Path(__file__).resolve().parents[2]  # src/<package>/gpu_check.py
PACKAGE = __package__
OUTPUT_LINES = 40  # of a failed step's output, in the summary
TRAIN = "--accelerator gpu --precision bf16-mixed --max_epochs 1 --trainer.enable_progress_bar false"
BENCH = "--accelerator gpu --steps 20 --warmup 5 --repeats 2"


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

    @property
    def passed(self) -> bool:
        return self.returncode == 0

    @property
    def result(self) -> str:
        if self.returncode is None:
            return f"stopped after {self.limit_s} s"
        return "passed" if self.passed else f"failed (exit status {self.returncode})"


def steps(folder: Path) -> list[Step]:
    """The check's steps, writing into ``folder``."""
    python, config = sys.executable, str(PROJECT / "configs" / "synthetic.yaml")
    return [
        Step(
            "tests marked gpu, with the agreement of each placement rule",
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", f"--junitxml={folder / 'gpu.xml'}"],
            cwd=PROJECT,
            limit_s=240,
        ),
        Step(
            "one epoch with --accelerator gpu --precision bf16-mixed",
            [python, str(PROJECT / "train.py"), "--config", config, *TRAIN.split()],
            cwd=folder,
            limit_s=100,
        ),
        Step(
            "the benchmark with --accelerator gpu",
            [python, "-m", f"{PACKAGE}.bench", "--config", config, *BENCH.split()],
            cwd=folder,
            limit_s=100,
        ),
    ]


def run(step: Step) -> Step:
    """Run ``step``, with the project's sources importable, and record what came of it."""
    paths = [str(PROJECT / "src"), os.environ.get("PYTHONPATH")]
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


def agreement_rows(junit: Path) -> list[dict[str, str]]:
    """The agreement rows the placement rules' tests recorded in pytest's JUnit XML report."""
    if not junit.is_file():
        return []
    rows = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        for prop in case.iter("property"):
            if prop.get("name") == "agreement":
                row = json.loads(prop.get("value", "{}"))
                row["agrees"] = "yes" if case.find("failure") is None and case.find("error") is None else "NO"
                rows.append(row)
    return rows


COLUMNS = ("rule", "device", "audit wrong", "device wrong", "audit right", "device right", "agrees")


def summary(device: str, steps_run: list[Step], rows: list[dict[str, str]]) -> str:
    """The summary in Markdown: the machine, each step, the agreement table, the output of what failed."""
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
        lines += [f"| {' | '.join(COLUMNS)} |", f"|{' --- |' * len(COLUMNS)}"]
        lines += [f"| {' | '.join(_cell(row.get(column, '-')) for column in COLUMNS)} |" for row in rows]
        lines += ["", f"{sum(row['agrees'] == 'yes' for row in rows)} of {len(rows)} agree."]
    else:
        lines.append("No agreement rows were recorded (see the tests' step).")
    for step in steps_run:
        if not step.passed:
            tail = step.output.strip().splitlines()[-OUTPUT_LINES:]
            lines += ["", f"## {step.name}: {step.result}", "", "```text", *tail, "```"]
    return "\n".join(lines) + "\n"


def _cell(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")[:120]


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check.md"), help="the summary (default gpu-check.md)")
    parser.add_argument("--overwrite", action="store_true", help="replace the summary if it exists")
    options = parser.parse_args(args)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU on this machine (torch.cuda.is_available() is False): the GPU check needs one")
        sys.exit(2)
    if options.out.exists() and not options.overwrite:
        print(f"error: {options.out} exists: give another --out, or --overwrite to replace it")
        sys.exit(2)
    device = f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        done = []
        for step in steps(Path(folder)):
            print(f"{step.name} ...", flush=True)
            done.append(run(step))
            print(f"  {step.result} ({step.seconds:.0f} s)", flush=True)
        rows = agreement_rows(Path(folder) / "gpu.xml")
    write_atomically(options.out, summary(device, done, rows))
    print(f"summary: {options.out}")
    sys.exit(0 if all(step.passed for step in done) else 1)


if __name__ == "__main__":
    main()
