"""The audit's cost against training: each model of the zoo audited, and trained by a plain CPU Trainer on the same
schedule, in fresh processes, alternating. The maintainers' measure of the table in lightning-kit's README; not
installed with the library.

    python lightning-kit/benchmarks/audit_cost.py                 # every model of the zoo whose package is installed
    python lightning-kit/benchmarks/audit_cost.py t5 gpt2 --repeats 5

The plain run is what the audit runs, without the simulated GPU: Lightning's ``Trainer`` on the CPU, with its
default logger and checkpoints, for each of the audit's passes (one GPU, then each process of two under DDP) ``fit``
for two epochs of two batches with one sanity step, then ``validate``, ``test`` and ``predict``. Each measurement
is a process of its own (what an audit in a test session costs, its first calls included), plain and audit
alternating, ``--repeats`` of each; the table gives the median time of each and their ratio, how many operations
the audit ran on the simulated GPU, and each run's peak memory: the process's peak resident size, and how much
the run added to what the process held before it (the imports and the model).

The models are built from configurations with no weights (``zoo.py`` beside this file); those of torchvision and
transformers need those packages (``pip install torchvision transformers``, best in an environment of its own: with
transformers installed, torchmetrics imports it in every process that imports Lightning), and are left out, with a
note, where their package is not installed.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import zoo

from lightning_kit.errors import OneLineParser, UserError, command
from lightning_kit.gpu_audit import run_audit, simulated
from lightning_kit.gpu_audit.audit import PASSES, SCHEDULE
from lightning_kit.messages import errors_as_messages

KINDS = ("plain", "audit")
# A model's processes are bounded: a hang guard, far above the slowest measured (t5's audit, about 20 s).
CHILD_TIMEOUT_S = 30 * 60


def plain_run(model: L.LightningModule, data: L.LightningDataModule) -> None:
    """The audit's schedule on the CPU, as a plain Trainer runs it: every pass, each stage."""
    with tempfile.TemporaryDirectory(prefix="plain-run-") as folder:
        for rank, _ in PASSES:
            trainer = L.Trainer(accelerator="cpu", devices=1, default_root_dir=Path(folder) / f"rank{rank}", **SCHEDULE)
            trainer.fit(model, data)
            trainer.validate(model, data, verbose=False)
            trainer.test(model, data, verbose=False)
            trainer.predict(model, data)


def _resident_kib() -> int:
    """This process's resident size now, in KiB (Linux); 0 where it cannot be read."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def measure(name: str, kind: str) -> dict:
    """One run of ``kind`` (plain or audit) on ``zoo.ZOO[name]``, in this process: its seconds and memory."""
    model, data = zoo.build(name)
    before = _resident_kib()
    start = time.perf_counter()
    if kind == "plain":
        plain_run(model, data)
        operations = None
    else:
        with simulated.count_operations() as counter:
            verdict = run_audit(model, data)
        if verdict.errors or verdict.gaps:
            said = verdict.errors[0] if verdict.errors else f"{verdict.gaps[0].where}: {verdict.gaps[0].gap}"
            raise UserError(f"the audit of {name} did not pass: {str(said).splitlines()[0]}")
        operations = counter.count
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"seconds": seconds, "operations": operations, "peak_kib": peak, "added_kib": max(peak - before, 0)}


def _child(name: str, kind: str) -> dict:
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", name, kind],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=CHILD_TIMEOUT_S,
            env=environment,
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"the {kind} run of {name} was stopped after {CHILD_TIMEOUT_S // 60} minutes") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        said = (done.stderr.strip().splitlines() or ["(no output)"])[-1].removeprefix("error: ")
        raise UserError(f"the {kind} run of {name} failed (exit {done.returncode}): {said}")
    return json.loads(lines[-1])


def benchmark(names: list[str], repeats: int) -> list[dict]:
    """Each model's plain and audit runs, alternating, ``repeats`` of each; prints and returns the table's rows."""
    print(f"{'model':<14}{'kind':<50}{'plain s':>9}{'audit s':>9}{'ratio':>7}{'ops':>9}"
          f"{'peak MiB':>16}{'peak ratio':>11}{'added MiB':>14}")  # fmt: skip
    rows = []
    for name in names:
        runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
        for _ in range(repeats):
            for kind in KINDS:
                runs[kind].append(_child(name, kind))
        median = {kind: {key: statistics.median(run[key] for run in runs[kind]) for key in ("seconds", "peak_kib",
                  "added_kib")} for kind in KINDS}  # fmt: skip
        row = {
            "model": name,
            "kind": zoo.ZOO[name].kind,
            "plain_s": median["plain"]["seconds"],
            "audit_s": median["audit"]["seconds"],
            "ratio": median["audit"]["seconds"] / median["plain"]["seconds"],
            "operations": runs["audit"][0]["operations"],
            "peak_mib": (median["plain"]["peak_kib"] / 1024, median["audit"]["peak_kib"] / 1024),
            "peak_ratio": median["audit"]["peak_kib"] / median["plain"]["peak_kib"],
            "added_mib": (median["plain"]["added_kib"] / 1024, median["audit"]["added_kib"] / 1024),
        }
        rows.append(row)
        peak = f"{row['peak_mib'][0]:.0f} / {row['peak_mib'][1]:.0f}"
        added = f"{row['added_mib'][0]:.0f} / {row['added_mib'][1]:.0f}"
        print(f"{name:<14}{row['kind']:<50}{row['plain_s']:>9.2f}{row['audit_s']:>9.2f}{row['ratio']:>6.2f}x"
              f"{row['operations']:>9,}{peak:>16}{row['peak_ratio']:>10.2f}x{added:>14}", flush=True)  # fmt: skip
    return rows


def selected(names: list[str]) -> list[str]:
    """The models asked for (all of the zoo for none), each known; those whose package is missing left out."""
    for name in names:
        if name not in zoo.ZOO:
            raise UserError(f"no model {name!r} in the zoo; it has {', '.join(zoo.ZOO)}")
    chosen = names or list(zoo.ZOO)
    missing = {name: zoo.missing_package(name) for name in chosen}
    for name, package in missing.items():
        if package is not None:
            print(f"note: {name} left out: it needs {package} (pip install torchvision transformers)")
    kept = [name for name in chosen if missing[name] is None]
    if not kept:
        raise UserError("none of the models asked for can be built here: pip install torchvision transformers")
    return kept


@command
def main(args: list[str] | None = None) -> None:
    """Measure the models ``args`` name (every model of the zoo for none)."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", choices=list(zoo.ZOO), metavar="MODEL", help=", ".join(zoo.ZOO))
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each kind (default 3)")
    options = parser.parse_args(args)
    if options.repeats < 1:
        parser.error(f"--repeats: expected a positive number of runs, got {options.repeats}")
    with errors_as_messages():
        benchmark(selected(options.models), options.repeats)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        with errors_as_messages():
            print(json.dumps(measure(sys.argv[2], sys.argv[3])))
    else:
        main()
