"""Hostile inputs and faults against every command the library ships, each answered in one line and nothing lost.

Each case is what an attacker (or an unlucky user) gives a command: bad values, special files (FIFOs, devices,
folders where files go, files where folders go), links planted in run folders, archives that inflate without
end, files of the wrong kind, foreign code named by a run's own files, stores that cannot be reached, passwords
in URLs. The command runs in this process, in a folder of the test's own that holds a project never baked (the
library's example, its pyproject.toml naming this library) and, where the case needs one, a copy of a short run.
Every case asserts

- the exit status (2 for a mistake on the command line, 1 for any other refusal, 0 where the input is data the
  command reports on: a note in the table of runs, say);
- one line starting ``error:`` saying what is wrong (or, for a status of 0, the note), and no traceback;
- nothing written outside the test's folder, a file behind a link planted there left as it was, and no
  password printed.

Running in this process costs each case a few milliseconds, not the seconds of a process that imports PyTorch:
the few cases that need a process of their own (a size limit, a signal) live with the commands' own tests.
"""

import functools
import gzip
import io
import json
import os
import shutil
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lightning_kit import cli, export, guide, lint_placement, placement
from lightning_kit.runs import command as runs
from lightning_kit.serve import command as serve
from lightning_kit.sweep import command as sweep

LIBRARY = Path(__file__).resolve().parents[1]
EXAMPLE = LIBRARY / "examples" / "forecaster"
NAMED = "lightning-kit[serve] @ git+https://github.com/org/template#subdirectory=lightning-kit"
CONFIG = str(EXAMPLE / "configs" / "forecaster.yaml")
SPACE = str(EXAMPLE / "configs" / "sweep.yaml")
CLASSES = ["--model", "forecaster.Forecaster", "--data", "forecaster.SineWaves"]
RUN = Path("runs/lightning_logs/version_0")
CKPT = str(RUN / "checkpoints" / "last.ckpt")
SECRET = "Hush9q42"
VICTIM_TEXT = "the user's own file\n"

MAINS: dict[str, Callable[[list[str]], object]] = {
    "lightning_kit": lambda args: cli.main(cli.GenericCLI, args),
    "placement": placement.main,
    "sweep": sweep.main,
    "runs": runs.main,
    "export": export.main,
    "serve": lambda args: serve.main(args),
    "guide": guide.main,
    "lint_placement": lambda args: sys.exit(lint_placement.main(args)),
}


@dataclass
class Case:
    command: str
    args: list[str]
    said: str  # in the one line (or, with status 0, in the output)
    status: int = 1
    setup: Callable[[Path], None] | None = None
    run: bool = False  # needs a copy of the short run in runs/
    pyproject: str | None = None  # another [tool.lightning-kit] table for the project's file
    importable: str | None = None  # a folder of the project put first on sys.path (as the working folder would be)
    marks: list = field(default_factory=list)

    def param(self, name: str):
        return pytest.param(self, id=name, marks=self.marks)


# --- what the cases plant ---------------------------------------------------------------------------------------


def fifo(name: str) -> Callable[[Path], None]:
    def plant(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)

    return plant


def file(name: str, content: bytes | str) -> Callable[[Path], None]:
    def plant(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)

    return plant


def link(name: str, target: str) -> Callable[[Path], None]:
    """A link at ``name``; a ``target`` starting with ``victim`` points at the user's file outside the folder."""

    def plant(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        resolved = folder.parent / "outside" / target if target.startswith("victim") else Path(target)
        path.symlink_to(resolved)

    return plant


def copy_run(name: str) -> Callable[[Path], None]:
    """The short run again, as runs/lightning_logs/<name>."""
    return lambda at: shutil.copytree(at / RUN, at / "runs" / "lightning_logs" / name)


METRICS = str(RUN / "metrics.csv")
ESCAPED_METRICS = "epoch,step,val/\x1b[2Jloss\n0,1,0.5\n"


def folder(name: str) -> Callable[[Path], None]:
    return lambda at: (at / name).mkdir(parents=True, exist_ok=True)


def both(*plants: Callable[[Path], None]) -> Callable[[Path], None]:
    def plant(at: Path) -> None:
        for one in plants:
            one(at)

    return plant


@functools.cache
def _bomb() -> bytes:
    """An archive of one entry that inflates from a megabyte to a gigabyte of zeros."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive,
        archive.open("archive/data.pkl", "w", force_zip64=True) as entry,
    ):
        for _ in range(1024):
            entry.write(bytes(1 << 20))
    return buffer.getvalue()


def zip_bomb(name: str) -> Callable[[Path], None]:
    return lambda at: (at / name).write_bytes(_bomb())


def yaml_bomb(name: str) -> Callable[[Path], None]:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [
        f"{chr(98 + k)}: &{chr(98 + k)} [*{chr(97 + k)}, *{chr(97 + k)}, *{chr(97 + k)}, *{chr(97 + k)}]"
        for k in range(12)
    ]
    return file(name, "\n".join(lines) + "\n")


def run_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """The short run's config.yaml, edited as data."""
    import yaml

    def plant(at: Path) -> None:
        path = at / RUN / "config.yaml"
        settings = yaml.safe_load(path.read_text())
        edit(settings)
        path.write_text(yaml.safe_dump(settings))

    return plant


def data_class(name: str) -> Callable[[dict], None]:
    def edit(settings: dict) -> None:
        settings["data"]["class_path"] = name

    return edit


def space_case(content: str, said: str) -> Case:
    """The sweep run over a space file of ``content``."""
    return Case("sweep", ["--space", "s.yaml", "--trials", "2", "--config", CONFIG], said, 1, file("s.yaml", content))


EVIL = "import pathlib\npathlib.Path('imported').write_text('ran')\nclass Data: pass\n"


# --- the cases ----------------------------------------------------------------------------------------------------

# The example's data with its training split filtered down to nothing.
EMPTY_SPLIT = """
from forecaster import SineWaves
from torch.utils.data import DataLoader, Subset


class NoTrainingShuffled(SineWaves):
    def setup(self, stage):
        super().setup(stage)
        self.train_set = Subset(self.train_set, [])


class NoTraining(NoTrainingShuffled):
    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size)
"""

CASES = {
    # python -m lightning_kit (GenericCLI): the command line, its files and its checkpoints.
    "fit-empty-training-split": Case(
        "lightning_kit",
        ["fit", "--model", "forecaster.Forecaster", "--data", "empty_split.NoTraining", "--max_epochs", "1"],
        "fit trained on no batch: NoTraining.train_dataloader() yielded none",
        1,
        file("empty_split.py", EMPTY_SPLIT),
    ),
    "fit-empty-shuffled-split": Case(
        "lightning_kit",
        ["fit", "--model", "forecaster.Forecaster", "--data", "empty_split.NoTrainingShuffled", "--max_epochs", "1"],
        "train_dataloader() (",
        1,
        file("empty_split.py", EMPTY_SPLIT),
    ),
    "fit-model-not-there": Case("lightning_kit", ["fit", "--model", "nosuch.Module", "--data", "x.Y"], "--model", 2),
    "fit-no-classes": Case("lightning_kit", ["fit"], "--model is needed", 2),
    "fit-no-data": Case("lightning_kit", ["fit", "--model", "forecaster.Forecaster"], "train_dataloader", 1),
    "fit-data-as-model": Case(
        "lightning_kit", ["fit", "--model", "forecaster.SineWaves", "--data", "forecaster.SineWaves"], "--model", 2
    ),
    "fit-batch-size-0": Case("lightning_kit", ["fit", *CLASSES, "--data.batch_size", "0"], "--data.batch_size 0", 2),
    "fit-negative-size": Case("lightning_kit", ["fit", *CLASSES, "--data.size", "-5"], "--data.size -5", 2),
    "fit-negative-width": Case("lightning_kit", ["fit", *CLASSES, "--model.hidden", "-3"], "--model.hidden -3", 2),
    "fit-negative-lr": Case("lightning_kit", ["fit", *CLASSES, "--model.lr", "-1"], "--model.lr -1", 2),
    "fit-width-not-a-number": Case("lightning_kit", ["fit", *CLASSES, "--model.hidden", "wide"], "--model.hidden", 2),
    "fit-width-a-float": Case("lightning_kit", ["fit", *CLASSES, "--model.hidden", "2.5"], "--model.hidden", 2),
    "fit-unknown-argument": Case("lightning_kit", ["fit", *CLASSES, "--model.depth", "3"], "depth", 2),
    "fit-negative-epochs": Case("lightning_kit", ["fit", *CLASSES, "--max_epochs", "-7"], "--max_epochs must be"),
    "fit-seed-out-of-range": Case("lightning_kit", ["fit", *CLASSES, "--seed_everything", "-1"], "seed_everything"),
    "fit-tpu": Case("lightning_kit", ["fit", *CLASSES, "--accelerator", "tpu"], "tpu"),
    "fit-logger-name-a-url": Case(
        "lightning_kit",
        ["fit", *CLASSES, "--trainer.logger.init_args.name", "a://b"],
        "--trainer.logger.init_args.name 'a://b' holds '://'",
    ),
    "fit-password-in-a-tracking-uri-printed": Case(
        "lightning_kit",
        [
            "fit",
            *CLASSES,
            "--trainer.logger",
            "lightning.pytorch.loggers.MLFlowLogger",
            "--print_config",
            "--trainer.logger.init_args.tracking_uri",
            f"postgresql://me:{SECRET}@localhost/runs",
        ],
        "tracking_uri: postgresql://me:***@localhost/runs",
        0,
    ),
    "fit-accelerator-unknown": Case("lightning_kit", ["fit", *CLASSES, "--accelerator", "quantum"], "--accelerator"),
    "fit-strategy-unknown": Case("lightning_kit", ["fit", *CLASSES, "--strategy", "magic"], "--strategy 'magic'"),
    "fit-strategy-a-path": Case("lightning_kit", ["fit", *CLASSES, "--strategy", "../ddp"], "--strategy '../ddp'"),
    "fit-profiler-unknown": Case(
        "lightning_kit", ["fit", *CLASSES, "--trainer.profiler", "bogus"], "--trainer.profiler 'bogus'"
    ),
    "fit-no-gpu-here": Case("lightning_kit", ["fit", *CLASSES, "--accelerator", "gpu"], "GPU"),
    "fit-precision-unknown": Case("lightning_kit", ["fit", *CLASSES, "--precision", "7"], "--trainer.precision", 2),
    "fit-config-missing": Case("lightning_kit", ["fit", "--config", "nowhere.yaml"], "nowhere.yaml", 2),
    "fit-config-fifo": Case("lightning_kit", ["fit", "--config", "c.yaml"], "not a regular file", 1, fifo("c.yaml")),
    "fit-config-device": Case("lightning_kit", ["fit", "--config", "/dev/zero"], "not a regular file"),
    "fit-config-binary": Case(
        "lightning_kit", ["fit", "--config", "c.yaml"], "not a text file", 1, file("c.yaml", b"\x89PNG\r\n\x1a\n\0\0\0")
    ),
    "fit-config-too-large": Case(
        "lightning_kit", ["fit", "--config", "c.yaml"], "over 1 MiB", 1, file("c.yaml", "# pad\n" * 300_000)
    ),
    "fit-config-yaml-bomb": Case("lightning_kit", ["fit", "--config", "c.yaml"], "c.yaml", 1, yaml_bomb("c.yaml")),
    "fit-config-python-object": Case(
        "lightning_kit",
        ["fit", "--config", "c.yaml"],
        "c.yaml",
        1,
        file("c.yaml", "model: !!python/object/apply:os.system ['touch pwned']\n"),
    ),
    "fit-config-not-yaml": Case(
        "lightning_kit", ["fit", "--config", "c.yaml"], "c.yaml", 1, file("c.yaml", "model: [unclosed\n")
    ),
    "fit-runs-a-file": Case("lightning_kit", ["fit", "--config", CONFIG], "runs", 1, file("runs", "not a folder")),
    "fit-logs-a-file": Case(
        "lightning_kit", ["fit", "--config", CONFIG], "lightning_logs", 1, file("runs/lightning_logs", "not a folder")
    ),
    "fit-runs-a-dangling-link": Case(
        "lightning_kit", ["fit", "--config", CONFIG], "runs", 1, link("runs", "victim-folder/runs")
    ),
    "fit-ckpt-missing": Case("lightning_kit", ["fit", "--config", CONFIG, "--ckpt_path", "no.ckpt"], "no.ckpt"),
    "fit-ckpt-text": Case(
        "lightning_kit",
        ["fit", "--config", CONFIG, "--ckpt_path", "c.ckpt"],
        "c.ckpt",
        1,
        file("c.ckpt", "not a checkpoint\n"),
    ),
    "fit-ckpt-device": Case("lightning_kit", ["fit", "--config", CONFIG, "--ckpt_path", "/dev/zero"], "/dev/zero"),
    "fit-ckpt-fifo": Case(
        "lightning_kit", ["fit", "--config", CONFIG, "--ckpt_path", "c.ckpt"], "c.ckpt", 1, fifo("c.ckpt")
    ),
    "fit-ckpt-folder": Case("lightning_kit", ["fit", "--config", CONFIG, "--ckpt_path", "d"], "d", 1, folder("d")),
    "fit-ckpt-zip-bomb": Case(
        "lightning_kit", ["fit", "--config", CONFIG, "--ckpt_path", "b.ckpt"], "b.ckpt", 1, zip_bomb("b.ckpt")
    ),
    "fit-ckpt-last-without-runs": Case("lightning_kit", ["fit", "--config", CONFIG, "--ckpt_path", "last"], "runs"),
    "fit-root-dir-a-file": Case(
        "lightning_kit",
        ["fit", "--config", CONFIG, "--trainer.logger", "false", "--trainer.default_root_dir", "out"],
        "--trainer.default_root_dir",
        1,
        file("out", "x"),
    ),
    "fit-root-dir-a-dangling-link": Case(
        "lightning_kit",
        ["fit", "--config", CONFIG, "--trainer.logger", "false", "--trainer.default_root_dir", "out/run"],
        "is a link to",
        1,
        link("out", "nowhere"),
    ),
    "validate-without-a-checkpoint": Case("lightning_kit", ["validate", "--config", CONFIG], "--ckpt_path"),
    "validate-checkpoint-of-no-run": Case(
        "lightning_kit", ["validate", "--ckpt_path", "c.ckpt"], "--model is needed", 2, file("c.ckpt", "x")
    ),
    "validate-run-names-foreign-code": Case(
        "lightning_kit",
        ["validate", "--config", str(RUN / "config.yaml"), "--ckpt_path", CKPT],
        "names code outside this project (evil.Data)",
        1,
        both(file("evil.py", EVIL), run_config(data_class("evil.Data"))),
        run=True,
    ),
    "validate-run-names-code-in-its-folder": Case(
        "lightning_kit",
        ["validate", "--ckpt_path", CKPT],
        "code in the run or data folder",
        1,
        both(file(f"{RUN}/evil.py", EVIL), run_config(data_class("evil.Data"))),
        run=True,
        importable=str(RUN),
    ),
    "predict-into-a-folder": Case(
        "lightning_kit",
        ["predict", "--ckpt_path", CKPT, "--predictions.path", "out/"],
        "--predictions.path",
        1,
        run=True,
    ),
    "predict-over-a-file": Case(
        "lightning_kit",
        ["predict", "--ckpt_path", CKPT, "--predictions.path", "p.csv"],
        "exists",
        1,
        file("p.csv", VICTIM_TEXT),
        run=True,
    ),
    "predict-into-a-fifo": Case(
        "lightning_kit",
        ["predict", "--ckpt_path", CKPT, "--predictions.path", "p.csv", "--predictions.overwrite", "true"],
        "FIFO",
        1,
        fifo("p.csv"),
        run=True,
    ),
    "pyproject-bad-mode": Case(
        "lightning_kit",
        ["fit", *CLASSES],
        "mode must be",
        1,
        pyproject='packages = ["forecaster"]\nmonitor = "val/mae"\nmode = "lowest"',
    ),
    "pyproject-monitor-misspelt": Case(
        "lightning_kit",
        ["fit", *CLASSES, "--max_epochs", "1"],
        "pyproject.toml's [tool.lightning-kit] monitor) is not one validation logs: it logs val/loss, val/mae",
        1,
        pyproject='packages = ["forecaster"]\nmonitor = "val/mea"\nmode = "min"',
    ),
    "pyproject-unknown-setting": Case(
        "lightning_kit", ["fit", *CLASSES], "has no setting 'trust'", 1, pyproject='trust = ["os"]'
    ),
    # The audit's command: 2 for the command line, never 1 (a placement bug) for a value refused.
    "audit-model-not-there": Case("placement", ["--model", "nosuch.Module", "--data", "x.Y"], "--model", 2),
    "audit-batch-size-0": Case("placement", [*CLASSES, "--data.batch_size", "0"], "--data.batch_size 0", 2),
    "audit-negative-width": Case("placement", [*CLASSES, "--model.hidden", "-3"], "--model.hidden -3", 2),
    "audit-config-fifo": Case("placement", ["--config", "c.yaml"], "not a regular file", 2, fifo("c.yaml")),
    "audit-precision-unknown": Case("placement", [*CLASSES, "--precision", "9"], "precision", 2),
    # Sweeps: their space, their options, their stores.
    "sweep-space-missing": Case("sweep", ["--space", "no.yaml", "--trials", "2", "--config", CONFIG], "no.yaml"),
    "sweep-space-fifo": Case(
        "sweep", ["--space", "s.yaml", "--trials", "2", "--config", CONFIG], "FIFO", 1, fifo("s.yaml")
    ),
    "sweep-space-binary": Case(
        "sweep", ["--space", "s.yaml", "--trials", "2", "--config", CONFIG], "s.yaml", 1, file("s.yaml", b"\0\1\2\3")
    ),
    "sweep-space-a-list": space_case("- model.lr\n", "must map"),
    "sweep-space-unknown-flag": space_case("model.lrr: [0.1, 0.01]\n", "model.lrr is not an argument"),
    "sweep-space-low-above-high": space_case("model.lr: {low: 1, high: 0.1}\n", "`low <= high` must hold"),
    "sweep-space-nan": space_case("model.lr: {low: .nan, high: 0.1}\n", "finite"),
    "sweep-space-empty-choices": space_case("model.hidden: []\n", "empty"),
    "sweep-space-yaml-bomb": Case(
        "sweep", ["--space", "s.yaml", "--trials", "2", "--config", CONFIG], "s.yaml", 1, yaml_bomb("s.yaml")
    ),
    "sweep-space-refused-value": space_case("model.hidden: [16, -4]\n", "model.hidden"),
    "sweep-trials-0": Case("sweep", ["--space", SPACE, "--trials", "0", "--config", CONFIG], "--trials", 2),
    "sweep-trials-huge": Case(
        "sweep", ["--space", SPACE, "--trials", "10000000000", "--config", CONFIG], "--trials", 2
    ),
    "sweep-trials-not-a-number": Case("sweep", ["--space", SPACE, "--trials", "x", "--config", CONFIG], "--trials", 2),
    "sweep-folds-1": Case("sweep", ["--folds", "1", "--config", CONFIG], "--folds", 2),
    "sweep-space-and-folds": Case(
        "sweep", ["--space", SPACE, "--folds", "3", "--config", CONFIG], "--folds: not allowed with argument --space", 2
    ),
    "sweep-study-name-a-path": Case(
        "sweep", ["--space", SPACE, "--trials", "2", "--study", "../up", "--config", CONFIG], "--study", 2
    ),
    "sweep-grid-with-trials": Case(
        "sweep",
        ["--space", "s.yaml", "--trials", "2", "--sampler", "grid", "--config", CONFIG],
        "--trials is not used with --sampler grid",
        1,
        file("s.yaml", "model.hidden: [8, 16]\n"),
    ),
    "sweep-grid-over-a-range": Case(
        "sweep",
        ["--space", SPACE, "--sampler", "grid", "--config", CONFIG],
        "--sampler grid takes lists of choices only",
    ),
    "sweep-storage-a-folder": Case(
        "sweep",
        ["--space", SPACE, "--trials", "1", "--config", CONFIG, "--storage", "sqlite:///d"],
        "d",
        1,
        folder("d"),
    ),
    "sweep-storage-a-dangling-link": Case(
        "sweep",
        ["--space", SPACE, "--trials", "1", "--config", CONFIG, "--storage", "sqlite:///s.db"],
        "a link to nothing",
        1,
        link("s.db", "victim-folder/new.db"),
    ),
    "sweep-storage-not-sqlite": Case(
        "sweep",
        ["--space", SPACE, "--trials", "1", "--config", CONFIG, "--storage", "sqlite:///s.db"],
        "s.db",
        1,
        file("s.db", "not a database"),
    ),
    "sweep-storage-unreachable": Case(
        "sweep",
        [
            "--space",
            SPACE,
            "--trials",
            "1",
            "--config",
            CONFIG,
            "--storage",
            f"postgresql+psycopg://team:{SECRET}@127.0.0.1:9/studies",
        ],
        "cannot be reached",
        1,
    ),
    "sweep-storage-unknown-driver": Case(
        "sweep",
        ["--space", SPACE, "--trials", "1", "--config", CONFIG, "--storage", f"nosuch://team:{SECRET}@host/db"],
        "--storage",
    ),
    "sweep-without-a-monitored-metric": Case(
        "sweep",
        ["--space", SPACE, "--trials", "1", "--config", CONFIG],
        "monitored metric",
        1,
        pyproject='packages = ["forecaster"]',
    ),
    "sweep-help-shows-the-space-format": Case("sweep", ["--help"], "model.lr: {low: 1.0e-4, high: 0.1, log: true}", 0),
    "sweep-a-subcommand-other-than-fit": Case("sweep", ["validate", "--space", SPACE, "--trials", "1"], "fit", 2),
    # The table of runs: a run folder is data, each bad file a note on its row.
    "runs-folder-missing": Case("runs", ["nowhere"], "does not exist"),
    "runs-folder-a-file": Case("runs", ["f"], "is not a folder", 1, file("f", "x")),
    "runs-folder-a-fifo": Case("runs", ["f"], "is not a folder", 1, fifo("f")),
    "runs-sort-unknown": Case("runs", ["--sort", "bogus"], "--sort bogus", 1, run=True),
    "runs-status-unknown": Case("runs", ["--status", "bogus"], "--status", 2, run=True),
    "runs-markdown-into-a-folder": Case("runs", ["--markdown", "out/"], "--markdown", 1, run=True),
    "runs-markdown-over-a-file": Case("runs", ["--markdown", "t.md"], "exists", 1, file("t.md", VICTIM_TEXT), run=True),
    "runs-markdown-through-a-link": Case(
        "runs", ["--markdown", "t.md", "--overwrite"], "lightning_logs", 0, link("t.md", "victim"), run=True
    ),
    # What a run's files and folders are named (a metric, a folder) reaches no terminal as control characters.
    "runs-metric-named-with-escapes": Case("runs", [], "val/?[2Jloss", 0, file(METRICS, ESCAPED_METRICS), run=True),
    "runs-csv-metric-named-with-escapes": Case(
        "runs", ["--format", "csv"], "val/?[2Jloss", 0, file(METRICS, ESCAPED_METRICS), run=True
    ),
    "runs-markdown-metric-named-with-escapes": Case(
        "runs", ["--format", "markdown"], "val/?[2Jloss", 0, file(METRICS, ESCAPED_METRICS), run=True
    ),
    "runs-folder-named-with-escapes": Case("runs", [], "v?[31mred", 0, copy_run("v\x1b[31mred"), run=True),
    "runs-config-yaml-bomb": Case("runs", [], "config.yaml unreadable", 0, yaml_bomb(f"{RUN}/config.yaml"), run=True),
    "runs-config-a-fifo": Case(
        "runs",
        [],
        "config.yaml unreadable",
        0,
        both(lambda at: (at / RUN / "config.yaml").unlink(), fifo(f"{RUN}/config.yaml")),
        run=True,
    ),
    "runs-metrics-binary": Case(
        "runs", [], "metrics.csv unreadable", 0, file(f"{RUN}/metrics.csv", b"\0\xff" * 50), run=True
    ),
    "runs-metrics-inf-epoch": Case(
        "runs", [], "metrics.csv unreadable", 0, file(f"{RUN}/metrics.csv", "epoch,step,val/mae\ninf,1,0.5\n"), run=True
    ),
    "runs-record-not-json": Case("runs", [], "run.json unreadable", 0, file(f"{RUN}/run.json", "{not json"), run=True),
    "runs-record-a-link-out": Case("runs", [], "links outside", 0, link(f"{RUN}/run.json", "victim"), run=True),
    "runs-a-link-to-a-folder-outside": Case(
        "runs", [], "not followed", 0, link("runs/elsewhere", "victim-folder"), run=True
    ),
    "runs-a-link-to-itself": Case("runs", [], "lightning_logs", 0, link("runs/loop", "runs"), run=True),
    # Export: checked before the model is built, written whole or not at all.
    "export-ckpt-missing": Case("export", ["--ckpt_path", "no.ckpt"], "no.ckpt"),
    "export-output-not-pt2": Case(
        "export", ["--ckpt_path", CKPT, "--output", "m.zip"], "must end in .pt2", 1, run=True
    ),
    "export-output-a-folder": Case(
        "export", ["--ckpt_path", CKPT, "--output", "m.pt2/"], "names a folder", 1, run=True
    ),
    "export-output-exists": Case(
        "export", ["--ckpt_path", CKPT, "--output", "m.pt2"], "exists", 1, file("m.pt2", VICTIM_TEXT), run=True
    ),
    "export-output-a-fifo": Case(
        "export", ["--ckpt_path", CKPT, "--output", "m.pt2", "--overwrite"], "FIFO", 1, fifo("m.pt2"), run=True
    ),
    "export-output-in-a-file": Case(
        "export", ["--ckpt_path", CKPT, "--output", "f/m.pt2"], "cannot be written", 1, file("f", "x"), run=True
    ),
    "export-onnx-unknown": Case("export", ["--ckpt_path", CKPT, "--onnx", "maybe"], "--onnx", 2, run=True),
    "export-ckpt-zip-bomb": Case(
        "export", ["--ckpt_path", "b.ckpt", "--config", CONFIG], "b.ckpt", 1, zip_bomb("b.ckpt")
    ),
    # Serving: the model file read with bounds and checked before any port is taken.
    "serve-model-missing": Case("serve", ["no.pt2"], "does not exist"),
    "serve-model-not-pt2": Case("serve", ["m.zip"], "is not a .pt2 file", 1, file("m.zip", "x")),
    "serve-model-a-fifo": Case("serve", ["m.pt2"], "FIFO", 1, fifo("m.pt2")),
    "serve-model-a-folder": Case("serve", ["m.pt2"], "a folder", 1, folder("m.pt2")),
    "serve-model-random-bytes": Case("serve", ["m.pt2"], "is not an exported model", 1, file("m.pt2", os.urandom(999))),
    "serve-model-gzip": Case(
        "serve", ["m.pt2"], "is not an exported model", 1, file("m.pt2", gzip.compress(b"x" * 1000))
    ),
    "serve-model-zip-bomb": Case("serve", ["m.pt2"], "m.pt2", 1, zip_bomb("m.pt2")),
    "serve-port-privileged": Case("serve", ["m.pt2", "--port", "80"], "--port", 2),
    "serve-port-not-a-number": Case("serve", ["m.pt2", "--port", "http"], "--port", 2),
    "serve-host-foreign": Case("serve", ["m.pt2", "--host", "8.8.8.8"], "--host", 2),
    "serve-batch-size-0": Case("serve", ["m.pt2", "--max_batch_size", "0"], "--max_batch_size", 2),
    "serve-timeout-0": Case("serve", ["m.pt2", "--timeout", "0"], "--timeout", 2),
    "serve-batch-timeout-negative": Case("serve", ["m.pt2", "--batch_timeout", "-1"], "--batch_timeout", 2),
    "serve-batch-timeout-inf": Case("serve", ["m.pt2", "--batch_timeout", "inf"], "--batch_timeout", 2),
    "serve-workers-0": Case("serve", ["m.pt2", "--workers_per_device", "0"], "--workers_per_device", 2),
    "serve-neither-model-nor-checkpoint": Case("serve", [], "model", 2),
    # The guide and the linter.
    "guide-rule-not-there": Case("guide", ["40"], "rules 1 to", 2),
    "guide-rule-0": Case("guide", ["0"], "rules 1 to", 2),
    "guide-not-a-rule": Case("guide", ["rm -rf"], "not a rule", 2),
    "guide-range-backwards": Case("guide", ["9-2"], "reversed: give 2-9; the guide has rules 1 to", 2),
    "lint-file-missing": Case("lint_placement", ["nowhere.py"], "nowhere.py"),
    "lint-a-fifo": Case("lint_placement", ["f.py"], "f.py", 1, fifo("f.py")),
    "lint-a-link-to-a-fifo": Case("lint_placement", ["l.py"], "l.py", 1, both(fifo("f.py"), link("l.py", "f.py"))),
    "lint-a-device": Case("lint_placement", ["/dev/zero"], "/dev/zero"),
    "lint-binary": Case("lint_placement", ["b.py"], "b.py", 1, file("b.py", b"\0\x01\x02" * 100)),
    "lint-a-folder-of-no-python": Case("lint_placement", ["d"], "nothing in it was checked", 0, folder("d")),
    "lint-too-large": Case("lint_placement", ["big.py"], "big.py", 1, file("big.py", "x = 1\n" * 2_000_000)),
    "lint-nested-past-the-parser": Case(
        "lint_placement", ["deep.py"], "nests deeper", 1, file("deep.py", "x = " + "+".join(["1"] * 100_000) + "\n")
    ),
    # A NUL character, which no path, URL or name holds (Python's API passes one; a config file's "\0" too): one
    # line naming where it was given, never ValueError's traceback from the first open().
    "nul-fit-config": Case("lightning_kit", ["fit", "--config", "c\0.yaml"], "--config holds a NUL"),
    "nul-fit-ckpt": Case("lightning_kit", ["fit", "--config", CONFIG, "--ckpt_path=a\0b"], "--ckpt_path holds a NUL"),
    "nul-in-a-config-file": Case(
        "lightning_kit",
        ["fit", "--config", CONFIG, "--config", "c.yaml"],
        "--ckpt_path holds a NUL",
        1,
        file("c.yaml", 'ckpt_path: "runs/\\0.ckpt"\n'),
    ),
    "nul-predictions-path": Case(
        "lightning_kit",
        ["predict", "--config", CONFIG, "--ckpt_path", CKPT, "--predictions.path", "p\0.csv"],
        "--predictions.path holds a NUL",
        run=True,
    ),
    "nul-audit-config": Case("placement", ["--config", "\0"], "--config holds a NUL", 2),
    "nul-sweep-space": Case("sweep", ["--space", "s\0.yaml", "--trials", "1"], "--space holds a NUL", 2),
    "nul-sweep-storage": Case("sweep", ["--space", SPACE, "--storage", "sqlite:///\0"], "--storage holds a NUL", 2),
    "nul-runs-folder": Case("runs", ["runs\0"], "FOLDER holds a NUL", 2),
    "nul-runs-csv": Case("runs", ["--csv", "t\0.csv"], "--csv holds a NUL", 2, run=True),
    "nul-export-output": Case("export", ["--ckpt_path", CKPT, "--output", "m\0.pt2"], "--output holds a NUL", 2),
    "nul-serve-model": Case("serve", ["m\0.pt2"], "model holds a NUL", 2),
    "nul-lint": Case("lint_placement", ["a\0.py"], "holds a NUL character"),
    # An empty value is no path, URL or column: refused, not silently taken for the option's default.
    "empty-sweep-storage": Case("sweep", ["--space", SPACE, "--trials", "1", "--storage", ""], "--storage is empty", 2),
    "empty-runs-sort": Case("runs", ["--sort", ""], "--sort is empty", 2, run=True),
    "empty-export-output": Case("export", ["--ckpt_path", CKPT, "--output", ""], "--output is empty", 2, run=True),
    # An empty --ckpt_path (an unset shell variable) is no checkpoint: refused, not a fresh fit or a traceback.
    "empty-fit-ckpt-path": Case("lightning_kit", ["fit", *CLASSES, "--ckpt_path", ""], "--ckpt_path is empty"),
    "empty-predict-ckpt-path": Case("lightning_kit", ["predict", *CLASSES, "--ckpt_path= "], "--ckpt_path is empty"),
    "empty-predictions-path": Case(
        "lightning_kit",
        ["predict", "--ckpt_path", CKPT, "--predictions.path", ""],
        "--predictions.path is empty",
        run=True,
    ),
    "empty-ckpt-path-in-config": Case(
        "lightning_kit",
        ["validate", *CLASSES, "--config", "c.yaml"],
        "--ckpt_path is empty",
        setup=file("c.yaml", 'ckpt_path: ""\n'),
    ),
    # A range's step must move it forward: 0 never ends (a ZeroDivisionError's traceback), a negative one never starts.
    "sweep-space-step-0": space_case("model.hidden: {low: 4, high: 8, step: 0}\n", "`step > 0` must hold"),
    "sweep-space-step-negative": space_case("model.hidden: {low: 4, high: 8, step: -2}\n", "`step > 0` must hold"),
    "sweep-space-float-step-0": space_case("model.lr: {low: 0.1, high: 0.5, step: 0.0}\n", "`step > 0` must hold"),
    # What PyTorch's reader logs of a damaged archive (its traceback) is the one line's reason, not printed.
    "serve-model-empty-zip": Case(
        "serve", ["m.pt2"], "archive does not contain any files", 1, file("m.pt2", b"PK\x05\x06" + bytes(18))
    ),
    # A Trainer flag Lightning takes but does not use with the logger configured: refused, not silently run elsewhere.
    "fit-root-dir-unused": Case(
        "lightning_kit", ["fit", *CLASSES, "--trainer.default_root_dir", "elsewhere"], "give --trainer.logger.init_args"
    ),
    # A size past the machine's memory (the allocator's refusal, or MemoryError): one line, not a traceback.
    "fit-data-past-memory": Case("lightning_kit", ["fit", *CLASSES, "--data.size", "100000000000000"], "out of memory"),
    "fit-width-past-memory": Case(  # in the model's constructor: a value the class refused, naming its flag
        "lightning_kit", ["fit", *CLASSES, "--model.hidden", "100000000"], "--model.hidden 100000000", 2
    ),
    # The audit runs on its own devices: a strategy Lightning lacks is refused as fit refuses it, and the devices
    # given are said not to be used, not silently replaced.
    "audit-strategy-unknown": Case("placement", [*CLASSES, "--strategy", "magic"], "--strategy 'magic'", 2),
    "audit-devices-given": Case(
        "placement",
        [*CLASSES, "--devices", "3", "--accelerator=cpu"],
        "note: --trainer.devices 3, --trainer.accelerator cpu are not used",
        0,
    ),
}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> Path:
    """A short run of the example, trained once for the cases that need a run folder (each works on a copy)."""
    folder = tmp_path_factory.mktemp("short-run")
    prepare(folder, None)
    previous, path = Path.cwd(), list(sys.path)
    os.chdir(folder)
    sys.path.insert(0, str(EXAMPLE / "src"))
    try:
        cli.main(
            cli.GenericCLI,
            [
                "fit",
                "--config",
                CONFIG,
                "--max_epochs",
                "2",
                "--data.size",
                "96",
                "--trainer.enable_progress_bar",
                "false",
            ],
        )
    except SystemExit as stop:
        assert stop.code in (0, None), stop.code
    finally:
        os.chdir(previous)
        sys.path[:] = path
    return folder / "runs"


def prepare(folder: Path, table: str | None) -> None:
    """The example's pyproject.toml in ``folder``, naming this library (and another table, where given)."""
    text = (
        (EXAMPLE / "pyproject.toml").read_text(encoding="utf-8").replace(NAMED, f"lightning-kit @ {LIBRARY.as_uri()}")
    )
    if table is not None:
        text = text[: text.index("[tool.lightning-kit]")] + f"[tool.lightning-kit]\n{table}\n"
    (folder / "pyproject.toml").write_text(text, encoding="utf-8")


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """What ``folder`` holds: each path and a file's bytes (None for what is not a plain file)."""
    return {
        str(path.relative_to(folder)): path.read_bytes() if path.is_file() and not path.is_symlink() else None
        for path in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("case", [case.param(name) for name, case in CASES.items()])
def test_a_hostile_input_is_answered_in_one_line_and_nothing_outside_is_touched(
    case: Case, tmp_path, monkeypatch, capsys, request
):
    if "fifo" in request.node.name and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    here, outside = tmp_path / "project", tmp_path / "outside"
    here.mkdir()
    (outside / "victim-folder").mkdir(parents=True)
    (outside / "victim").write_text(VICTIM_TEXT)
    before = snapshot(outside)
    prepare(here, case.pyproject)
    if case.run:
        shutil.copytree(request.getfixturevalue("short_run"), here / "runs", symlinks=True)
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.syspath_prepend(str(here))  # as `python -m` puts the working folder first
    if case.importable is not None:
        monkeypatch.syspath_prepend(str(here / case.importable))
    if case.setup is not None:
        case.setup(here)

    status, output = run_command(case, capsys)

    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output and SECRET not in output, output[-3000:]
    assert "\x1b" not in output, f"a control sequence from the data reached the terminal: {output[-3000:]!r}"
    assert status == case.status, (status, output[-3000:])
    if case.status:
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1 and case.said in errors[0], output[-3000:]
    else:
        assert case.said in output, output[-3000:]
    assert snapshot(outside) == before, "something outside the project's folder was written"
    assert not (here / "imported").exists() and not (here / "pwned").exists(), "code named by data was run"


def run_command(case: Case, capsys) -> tuple[int, str]:
    """Run the case's command in this process: its exit status and everything it printed."""
    status = 0
    try:
        MAINS[case.command](list(case.args))
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
            status = 1
        else:
            status = stop.code or 0
    out, err = capsys.readouterr()
    return status, out + err


def test_there_are_a_hundred_cases_and_more_across_every_command():
    assert len(CASES) >= 100
    assert {case.command for case in CASES.values()} == set(MAINS)
    assert json.dumps(sorted(CASES))  # names are plain text
