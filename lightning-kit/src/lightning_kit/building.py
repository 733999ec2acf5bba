"""What a project's ``train.py fit`` builds from a command line, for the commands built on it (the audit, export,
bench, sweeps, serving): its model, data module and Trainer, built and nothing run, or a fit run in this process."""

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint

from .callbacks import BestCheckpoint, BestEpoch, InterruptCheckpoint, RandomState, RunStatus, StopOnDivergence
from .checkpoints import RunClasses
from .config_files import bound_yaml_loading
from .messages import errors_as_messages, silence_the_unactionable
from .parser import HelpFormatter, KitArgumentParser
from .supervision import ProcessWatch

if TYPE_CHECKING:
    from .cli import KitCLI

# `train.py --accelerator gpu` is short for `train.py fit --trainer.accelerator gpu`.
TRAINER_SHORTCUTS = ("accelerator", "devices", "strategy", "num_nodes", "precision", "max_epochs")


def build(cli_class: type["KitCLI"], args: list[str]) -> tuple[L.LightningModule, L.LightningDataModule]:
    """The model and data module that ``train.py fit`` would build from ``args``, without running anything."""
    return build_all(cli_class, args)[:2]


def build_all(
    cli_class: type["KitCLI"], args: list[str], prog: str | None = None
) -> tuple[L.LightningModule, L.LightningDataModule, L.Trainer]:
    """The model, data module and Trainer ``train.py fit`` would build; ``prog`` names the command."""
    cli = build_cli(cli_class, args, prog)
    return cli.model, cli.datamodule, cli.trainer


def build_cli(
    cli_class: type["KitCLI"],
    args: list[str],
    prog: str | None = None,
    not_built: int = 1,
    settings: Callable[[Namespace], None] | None = None,
) -> "KitCLI":
    """The command line ``train.py fit`` would run on ``args``, built and not run; a class that could not be built
    (``NotBuiltError``) ends the command in its one line with the status ``not_built``. ``settings`` changes the
    parsed configuration before anything is built."""
    with errors_as_messages(not_built):
        return make(cli_class, expand_shortcuts(args), run=False, prog=prog, settings=settings)


def fit(cli_class: type["KitCLI"], args: list[str], callbacks: Sequence[L.Callback] = ()) -> "KitCLI":
    """Run ``train.py fit`` on ``args`` in this process, with ``callbacks`` beside the project's (not in its
    config.yaml). Errors are raised, not shown: the caller records how the run ended first (a sweep's trial)."""
    return make(cli_class, expand_shortcuts(["fit", *args]), run=True, callbacks=callbacks)


def expand_shortcuts(args: list[str]) -> list[str]:
    """Expand ``--<shortcut>`` to ``--trainer.<shortcut>``, in both ``--flag value`` and ``--flag=value`` forms."""
    expanded = []
    for arg in args:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        expanded.append(f"--trainer.{arg[2:]}" if name in TRAINER_SHORTCUTS else arg)
    return expanded


def make(
    cli_class: type["KitCLI"],
    args: list[str],
    run: bool,
    prog: str | None = None,
    callbacks: Sequence[L.Callback] = (),
    settings: Callable[[Namespace], None] | None = None,
) -> "KitCLI":
    """``cli_class``'s command line on ``args``, with the library's defaults (logger, checkpoints, the callbacks of
    every run, and ``callbacks`` beside them); ``run``: the subcommand is run, else its classes are only built."""
    silence_the_unactionable()
    bound_yaml_loading()
    own, named_in = cli_class.own_package(), cli_class.monitor_named_in()
    formatter = type(
        "_ProjectHelpFormatter", (HelpFormatter,), {"own_choices": {"data": f"{own}.", "model.net": f"{own}."}}
    )
    best = []
    if (monitored := cli_class.monitored()) is not None:  # the best epoch by the monitored metric, every epoch
        monitor, mode = monitored
        best.append(
            BestCheckpoint(monitor=monitor, mode=mode, filename="best-{epoch}-{step}", monitor_named_in=named_in)
        )
    return cli_class(
        cli_class.model_class,
        None,  # any LightningDataModule, or none where the model has dataloaders of its own (LightningCLI's way)
        subclass_mode_model=cli_class.subclass_mode_model,
        settings=settings,
        args=args,
        run=run,
        seed_everything_default=cli_class.seed,
        trainer_defaults={
            # metrics.csv for the runs table, TensorBoard's event file beside it: `tensorboard --logdir runs`.
            "logger": {
                "class_path": "lightning_kit.loggers.CSVAndTensorBoardLogger",
                "init_args": {"save_dir": "runs"},
            },
            "callbacks": [
                *best,
                # The latest epoch, every epoch.
                ModelCheckpoint(filename="last"),
                # Before InterruptCheckpoint: the watch ends before a stop's checkpoint is written.
                ProcessWatch(),
                InterruptCheckpoint(),
                StopOnDivergence(check_every=cli_class.refresh_every),
                BestEpoch(),
                RandomState(),
                *callbacks,
                # The classes of the run, named in each checkpoint, held against what evaluates it.
                RunClasses(),
                # Last: a run's end time counts the others' ends. run.json says running, finished, interrupted, ...
                RunStatus(),
            ],
            # A progress bar for people; none in CI logs and other redirected output.
            "enable_progress_bar": sys.stderr.isatty(),
        },
        parser_class=KitArgumentParser,
        parser_kwargs={
            "description": cli_class.description.replace("{command}", cli_class.command),
            "formatter_class": formatter,
            **({"prog": prog} if prog else {}),
        },
    )
