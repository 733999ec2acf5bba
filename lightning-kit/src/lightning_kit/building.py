"""What a project's ``train.py fit`` builds from a command line, for the commands built on it (the audit, export,
bench, sweeps, serving): its model, data module and Trainer, built and nothing run, or a fit run in this process."""

from collections.abc import Sequence

import lightning as L

from .cli import KitCLI, expand_shortcuts, make
from .messages import errors_as_messages
from .parser import given_arguments as parser_given_arguments


def build(cli_class: type[KitCLI], args: list[str]) -> tuple[L.LightningModule, L.LightningDataModule]:
    """The model and data module that ``train.py fit`` would build from ``args``, without running anything."""
    return build_all(cli_class, args)[:2]


def build_all(
    cli_class: type[KitCLI], args: list[str], prog: str | None = None
) -> tuple[L.LightningModule, L.LightningDataModule, L.Trainer]:
    """The model, data module and Trainer ``train.py fit`` would build; ``prog`` names the command."""
    cli = build_cli(cli_class, args, prog)
    return cli.model, cli.datamodule, cli.trainer


def build_cli(cli_class: type[KitCLI], args: list[str], prog: str | None = None, not_built: int = 1) -> KitCLI:
    """The command line ``train.py fit`` would run on ``args``, built and not run; a class that could not be built
    (``NotBuiltError``) ends the command in its one line with the status ``not_built``."""
    with errors_as_messages(not_built):
        return make(cli_class, expand_shortcuts(args), run=False, prog=prog)


def given_arguments(cli: KitCLI) -> dict:
    """The arguments given to ``cli``'s model and data classes, by flag, where not the class's default."""
    return parser_given_arguments(
        cli.config[cli.subcommand] if cli.subcommand else cli.config, cli._fixed_model_class()
    )


def fit(cli_class: type[KitCLI], args: list[str], callbacks: Sequence[L.Callback] = ()) -> KitCLI:
    """Run ``train.py fit`` on ``args`` in this process, with ``callbacks`` beside the project's (not in its
    config.yaml). Errors are raised, not shown: the caller records how the run ended first (a sweep's trial)."""
    return make(cli_class, expand_shortcuts(["fit", *args]), run=True, callbacks=callbacks)
