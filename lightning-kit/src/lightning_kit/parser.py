"""The parser under ``KitCLI``: LightningCLI's, with shorter help and one-line errors, and the check of argument tables.

- ``KitArgumentParser``: a mistake on the command line exits with one line naming the flag, what it
  accepts and what was given, instead of the usage and a nest of alternatives;
- ``HelpFormatter``: ``--data`` and ``--model.net`` list the project's classes, not every one imported;
- ``CheckedInstantiator``: builds a class after holding its arguments against its table
  (``KitCLI.argument_tables``), so a plain ``nn.Module`` network needs no checks of its own;
- ``check_run_arguments`` and ``check_given_against_data``: what ``KitCLI`` checks of a parsed
  configuration, the Trainer's arguments and the seed, then each value the data sets.
"""

import inspect
from typing import ClassVar

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser

from .arguments import RUN, TRAINER, Arguments
from .errors import ConfigError
from .messages import one_line


class CheckedInstantiator:
    """Builds a class from the command line after holding its arguments against its table (``KitCLI.argument_tables``).

    The values are the constructor's, its defaults filled in, so a table checks what the class gets;
    the network itself stays a plain ``nn.Module`` that knows nothing of the command line.
    """

    def __init__(self, table: Arguments) -> None:
        self.table = table

    def __call__(self, class_type: type, *args, **kwargs):
        bound = inspect.signature(class_type).bind_partial(*args, **kwargs)
        bound.apply_defaults()
        self.table.check(dict(bound.arguments))
        return class_type(*args, **kwargs)


class HelpFormatter(DefaultHelpFormatter):
    """Lists only the project's classes as choices for ``--data`` and ``--model.net``.

    jsonargparse lists every imported subclass: for ``--model.net``, each ``nn.Module`` of
    PyTorch and its libraries, some hundreds of lines that bury the options people look for.
    """

    #: Where the project's choices live: argument -> module prefix (set per command line by ``_make_cli``).
    own_choices: ClassVar[dict[str, str]] = {}

    def _get_help_string(self, action) -> str:
        help_string = super()._get_help_string(action)
        if action.dest not in self.own_choices:
            return help_string
        head, found, listed = help_string.partition(", known subclasses: ")
        if not found:
            return help_string
        listed, _, tail = listed.rpartition(")")
        own = [name for name in listed.split(", ") if name.startswith(self.own_choices[action.dest])]
        return f"{head}, this project's: {', '.join(own)}; or any other importable class){tail}"


class KitArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, with shorter help and one-line errors."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        """Exit with one line naming the flag, what it accepts and what was given, instead of the usage and a nest."""
        if not self.exit_on_error:
            super().error(message, ex)  # raises: parsing inside jsonargparse, not the user's command line
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        self.exit(2, f"error: {one_line(message)} (options: {prog} --help)\n")


def check_run_arguments(config) -> None:
    """The Trainer's arguments and the seed, each against what it accepts (``arguments.TRAINER``, ``arguments.RUN``)."""
    TRAINER.check({name: config.trainer.get(name) for name in TRAINER.table if name in config.trainer})
    if "seed_everything" in config:
        RUN.check({"seed_everything": config.seed_everything})


def check_given_against_data(config, datamodule, model: LightningModule, data_links: dict[str, str]) -> None:
    """A value given for an argument the data sets (``KitCLI.data_links``) that differs from the data's stops the run.

    The link would replace it without a word: ``--model.net.init_args.image_size 64`` would train at
    the data's 32. Given means set to other than the class's default, by a flag or a --config file.
    """
    for target, source in data_links.items():
        given, data_value = config.get(target), getattr(datamodule, source, None)
        owner = type(model.net) if target.startswith("model.net.") else type(model)
        default = inspect.signature(owner).parameters.get(target.rpartition(".")[2])
        if given is None or data_value is None or given == data_value or (default and given == default.default):
            continue
        data_flag = f"--data.{source}" if source in inspect.signature(type(datamodule)).parameters else None
        raise ConfigError(
            f"--{target} {given!r} disagrees with the data's {source}, {data_value!r}, which it is set from: "
            + (f"give {data_flag} {given!r} instead" if data_flag else f"leave --{target} out")
        )
