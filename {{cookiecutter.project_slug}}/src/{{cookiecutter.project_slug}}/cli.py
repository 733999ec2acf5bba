"""The command line: LightningCLI, with the everyday Trainer flags as top-level shortcuts."""

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .classifier import Classifier
{%- if cookiecutter.task == "image" %}
from .data import DataUnavailableError
from .data.images import ImageDataModule as DataModule
from .models.cnn import ReferenceCNN as Net
{%- else %}
from .data import DataUnavailableError
from .data.sequences import SequenceDataModule as DataModule
from .models.attention import AttentionClassifier as Net
{%- endif %}

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# `train.py --accelerator gpu` is short for `train.py fit --trainer.accelerator gpu`.
TRAINER_SHORTCUTS = ("accelerator", "devices", "strategy", "num_nodes", "precision", "max_epochs")

DESCRIPTION = """\
Train and evaluate the model. Without a subcommand, `fit` is run.
Shortcuts: --accelerator, --devices, --strategy, --num_nodes, --precision and
--max_epochs stand for --trainer.<name>. Example: train.py --accelerator gpu"""


class NoGPUError(RuntimeError):
    """A GPU was asked for on a machine that has none."""


class ProjectCLI(LightningCLI):
    """LightningCLI with this project's defaults and a clear answer when no GPU is present."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model.net": {"class_path": f"{Net.__module__}.{Net.__qualname__}"}})
{%- if cookiecutter.task == "image" %}
        # The data decides the number of classes; the network's default (10) matches CIFAR-10.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
{%- else %}
        # The data decides these sizes, so model and data cannot disagree. A network
        # without these arguments needs its own links here.
        parser.link_arguments("data.vocab_size", "model.net.init_args.vocab_size", apply_on="parse")
        parser.link_arguments("data.seq_len", "model.net.init_args.max_len", apply_on="parse")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="parse")
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="parse")
{%- endif %}

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        accelerator = config.trainer.accelerator
        if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise NoGPUError(
                f"--accelerator {accelerator} was requested but no CUDA GPU was found on this machine. "
                "Use --accelerator cpu, or --accelerator auto to take a GPU when one is present."
            )

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:
            return
        metrics = self.trainer.callback_metrics
        summary = " ".join(f"{name}={metrics[name]:.4f}" for name in ("val/loss", "val/acc") if name in metrics)
        print(f"fit finished: {summary}")
        if self.trainer.checkpoint_callback is not None:
            print(f"best checkpoint: {self.trainer.checkpoint_callback.best_model_path}")


def expand_shortcuts(args: list[str]) -> list[str]:
    """Expand ``--<shortcut>`` to ``--trainer.<shortcut>``, in both ``--flag value`` and ``--flag=value`` forms."""
    expanded = []
    for arg in args:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        expanded.append(f"--trainer.{arg[2:]}" if name in TRAINER_SHORTCUTS else arg)
    return expanded


def main(args: list[str] | None = None) -> None:
    """Run the command line on ``args`` (default: ``sys.argv[1:]``); without a subcommand, ``fit``."""
    args = sys.argv[1:] if args is None else list(args)
    if not args or (args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help")):
        args = ["fit", *args]
    with _errors_as_messages():
        _make_cli(expand_shortcuts(args), run=True)


def build(args: list[str]) -> tuple[Classifier, DataModule]:
    """The model and data module that ``train.py fit`` would build from ``args``, without running anything."""
    with _errors_as_messages():
        cli = _make_cli(expand_shortcuts(args), run=False)
    return cli.model, cli.datamodule


def _make_cli(args: list[str], run: bool) -> ProjectCLI:
    # The expanded arguments replace the command line's, which LightningCLI would otherwise warn about.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended to run from within Python")
    return ProjectCLI(
        Classifier,
        DataModule,
        args=args,
        run=run,
        seed_everything_default=42,
        trainer_defaults={
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
            "callbacks": [ModelCheckpoint(monitor="val/acc", mode="max", save_last=True)],
        },
        parser_kwargs={"description": DESCRIPTION},
    )


@contextmanager
def _errors_as_messages() -> Iterator[None]:
    """Stop with one line, not a traceback, for errors the user can fix from the command line."""
    try:
        yield
    except (NoGPUError, DataUnavailableError, MisconfigurationException) as err:
        sys.exit(f"error: {err}")
