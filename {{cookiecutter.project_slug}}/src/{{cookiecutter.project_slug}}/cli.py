"""The command line: LightningCLI, with the everyday Trainer flags as top-level shortcuts."""

import inspect
import sys
from collections.abc import Sequence
from pathlib import Path

import lightning as L
from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

from .accelerators import check_accelerator
from .arguments import RUN, TRAINER
from .callbacks import (
    BestCheckpoint,
    BestEpoch,
    CSVPredictionWriter,
    InterruptCheckpoint,
    RandomState,
    RunPlots,
    RunStatus,
    StopOnDivergence,
)
from .checkpoints import AtomicCheckpointIO, check_architecture, read_checkpoint
from .classifier import LOSS_ON_PROGRESS_BAR_EVERY, Classifier
from .config_files import bound_yaml_loading, check_files_given
{%- if cookiecutter.task == "image" %}
from .data.images import ImageDataModule as DataModule
{%- else %}
from .data.sequences import SequenceDataModule as DataModule
{%- endif %}
from .errors import ConfigError
from .evaluation import (
    EVALUATIONS,
    UNTRAINED_FLAG,
    check_evaluation,
    check_new_log_dir,
    checkpoint_run_settings,
    choose_checkpoint,
    config_flags,
    split_run_configs,
)
from .messages import errors_as_messages, one_line, report, silence_the_unactionable
{%- if cookiecutter.task == "image" %}
from .models.cnn import ReferenceCNN as Net
{%- else %}
from .models.attention import AttentionClassifier as Net
{%- endif %}
from .placement.lightning import SIMULATED, HookTracker, SimulatedGPUStrategy, mixed_precision, simulated_run
from .supervision import ProcessWatch, check_cpu_processes, leave_process_group
from .trust import check_command_line

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# `train.py --accelerator gpu` is short for `train.py fit --trainer.accelerator gpu`.
TRAINER_SHORTCUTS = ("accelerator", "devices", "strategy", "num_nodes", "precision", "max_epochs")

DESCRIPTION = """\
Train and evaluate the model. Without a subcommand, `fit` is run.
Shortcuts: --accelerator, --devices, --strategy, --num_nodes, --precision and
--max_epochs stand for --trainer.<name>. Example: train.py --accelerator gpu
--accelerator simgpu runs on a simulated GPU, to find what would fail on a real one."""


# What the network and the Classifier take from the data: argument -> the data module's attribute.
# Each link applies when the data module has the attribute and the network takes the argument:
# a network without one is left as is.
DATA_LINKS = {
    "model.num_classes": "num_classes",
    "model.class_names": "class_names",
    "model.net.init_args.num_classes": "num_classes",
{%- if cookiecutter.task == "image" %}
    "model.net.init_args.image_size": "image_size",
{%- else %}
    "model.net.init_args.vocab_size": "vocab_size",
    "model.net.init_args.max_len": "seq_len",
{%- endif %}
}


class ProjectCLI(LightningCLI):
    """LightningCLI with this project's defaults, checked checkpoints and clear answers to common mistakes."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults(
            {"model.net": {"class_path": _class_path(Net)}, "data": {"class_path": _class_path(DataModule)}}
        )
        # `predict` writes its probabilities here: --predictions.path out.csv
        parser.add_lightning_class_args(CSVPredictionWriter, "predictions")
        # The data decides the class count, its names and the input size, so the network and
        # the Classifier cannot disagree with it. Each link applies when the data module has
        # the attribute and the network takes the argument: a network without one is left as is.
        for target, source in DATA_LINKS.items():
            parser.link_arguments(f"data.{source}", target, apply_on="instantiate")

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand in EVALUATIONS:
            parser.add_argument(
                UNTRAINED_FLAG,
                type=bool,
                default=False,
                help=f"{subcommand} the model's fresh, untrained weights: without it, {subcommand} needs --ckpt_path",
            )
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        # Before any parsing: jsonargparse imports the classes it is given.
        check_command_line(args)
        check_files_given(args)  # too large, not text, or expanding without end: refused before being read
        # A run's saved config.yaml given with --config is read first: every other flag and file given wins over it.
        run_configs, args = split_run_configs(args)
        subcommand_given = args[:1] if args and args[0] in SUBCOMMANDS else []
        rest = args[len(subcommand_given) :]
        self._parse_with_class_defaults(parser, [*subcommand_given, *config_flags(run_configs), *rest])
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        ckpt_path = choose_checkpoint(subcommand, config, args)
        # Checked before anything its run folder names is imported, and before the Trainer loads it.
        self._trained = read_checkpoint(ckpt_path, args) if ckpt_path else None
        logger = config.trainer.logger
        settings = checkpoint_run_settings(subcommand, Path(ckpt_path), logger, args, run_configs) if ckpt_path else []
        if settings:
            # Parsed again, the checkpoint run's settings first: the flags given still win.
            self._parse_with_class_defaults(parser, [*subcommand_given, *settings, *rest, "--ckpt_path", ckpt_path])
            config = self.config[subcommand]
        if subcommand in EVALUATIONS:
            check_evaluation(subcommand, config, args)
        _check_run_arguments(config)  # before LightningCLI seeds with them

    def _parse_with_class_defaults(self, parser: LightningArgumentParser, args) -> None:
        """Parse ``args``; a class chosen for ``--data`` or ``--model.net`` starts from its own defaults.

        jsonargparse keeps the default class's values for the arguments that the chosen class
        also takes (``--data my_project.data.digits.Digits`` got ImageDataModule's batch size,
        not its own). Parsed again with the chosen classes as the defaults, it does not.
        """
        printing = _without_print_config(args)
        super().parse_arguments(parser, printing or args)  # --print_config would print before the second parse
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        target = parser._subcommands_action._name_parser_map[subcommand] if subcommand else parser
        chosen = {}
        for key in ("data", "model.net"):
            class_path = config.get(key).class_path
            if class_path != target.get_default(key).class_path:
                chosen[key] = {"class_path": class_path}
        if chosen:
            target.set_defaults(chosen)
        if chosen or printing:
            super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Not LightningCLI's: there the checkpoint's hyperparameters override the flags given (a new
        --model.lr on resume was silently dropped). The checkpoint's run folder's config.yaml gives
        the settings instead, under the flags given (``parse_arguments``)."""

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("weights_only") is None and "weights_only" in config:
            config.weights_only = True  # checkpoints are read as data, never run as code
        check_accelerator(config.trainer)
        if config.trainer.accelerator == SIMULATED:
            simulated_run.start(self.subcommand or "fit")
        check_cpu_processes(config.trainer)
        if self.subcommand:
            check_new_log_dir(config.trainer.logger)
        if self.subcommand == "predict":
            # Before the data is read and the model run: a path that cannot be written would waste that work.
            CSVPredictionWriter.check_path(config.predictions.path, config.predictions.overwrite)

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = list(trainer_config.get("callbacks") or [])
        if trainer_config.get("enable_progress_bar") and not any(isinstance(c, ProgressBar) for c in callbacks):
            # Redrawn every 20 steps, not every step: a bar costs time on each redraw.
            callbacks.append(TQDMProgressBar(refresh_rate=LOSS_ON_PROGRESS_BAR_EVERY))
        plugins = trainer_config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            # Checkpoints written beside their final name and renamed: never left truncated.
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        if trainer_config.get("accelerator") == SIMULATED:
            # Lightning would pick a CPU strategy for an accelerator it does not know. The
            # tracker names the hook in which a GPU would fail.
            kwargs.update(accelerator="auto", strategy=SimulatedGPUStrategy())
            mixed = mixed_precision(trainer_config.get("precision"))
            if mixed is not None:  # autocast on the simulated GPU, by CUDA's rules
                kwargs.update(precision=None, plugins=[*kwargs.get("plugins", plugins), mixed])
            if trainer_config.get("profiler") is None:
                kwargs["profiler"] = HookTracker()
        return super().instantiate_trainer(callbacks=callbacks, **kwargs)

    def after_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        _check_given_against_data(config, self.datamodule, self.model)
        if self._trained is not None:
            check_architecture(self.config_init[self.subcommand].ckpt_path, self._trained, self.model)

    def after_fit(self) -> None:
        log_dir = self.trainer.log_dir  # every process must ask: the answer is broadcast from rank 0
        best = next((callback for callback in self.trainer.callbacks if isinstance(callback, BestEpoch)), None)
        # The best checkpoint's numbers, not the last epoch's, when there is a best.
        metrics = best.metrics if best is not None and best.epoch is not None else self.trainer.callback_metrics
        summary = " ".join(f"{name}={metrics[name]:.4f}" for name in ("val/loss", "val/acc") if name in metrics)
        if best is not None and best.epoch is not None:
            summary = f"best epoch {best.epoch}: {summary}"
        if self.trainer.world_size > 1:
            # Every process reports: the values are synced, so they must agree.
            report(f"rank {self.trainer.global_rank}/{self.trainer.world_size} fit finished: {summary}")
        elif self.trainer.is_global_zero:
            report(f"fit finished: {summary}")
        if self.trainer.is_global_zero and self.trainer.checkpoint_callback is not None:
            report(f"best checkpoint: {self.trainer.checkpoint_callback.best_model_path}")
            report(f"run folder: {log_dir}")


def _check_run_arguments(config) -> None:
    """The Trainer's arguments and the seed, each against what it accepts (``arguments.TRAINER``, ``arguments.RUN``)."""
    TRAINER.check({name: config.trainer.get(name) for name in TRAINER.table if name in config.trainer})
    if "seed_everything" in config:
        RUN.check({"seed_everything": config.seed_everything})


def _check_given_against_data(config, datamodule, model: Classifier) -> None:
    """A value given for an argument the data sets (``DATA_LINKS``) that differs from the data's stops the run.

    The link would replace it without a word: ``--model.net.init_args.image_size 64`` would train at
    the data's 32. Given means set to other than the class's default, by a flag or a --config file.
    """
    for target, source in DATA_LINKS.items():
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


def _without_print_config(args: list[str]) -> list[str] | None:
    """``args`` without ``--print_config[=flags]``; None when it is not there."""
    kept = [arg for arg in args if arg != "--print_config" and not arg.startswith("--print_config=")]
    return kept if len(kept) < len(args) else None


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# Where this project's choices for --data and --model.net live.
_OWN_CHOICES = {"data": f"{__package__}.data.", "model.net": f"{__package__}.models."}


class _HelpFormatter(DefaultHelpFormatter):
    """Lists only this project's classes as choices for ``--data`` and ``--model.net``.

    jsonargparse lists every imported subclass: for ``--model.net``, each ``nn.Module`` of
    PyTorch and its libraries, some hundreds of lines that bury the options people look for.
    """

    def _get_help_string(self, action) -> str:
        help_string = super()._get_help_string(action)
        if action.dest not in _OWN_CHOICES:
            return help_string
        head, found, listed = help_string.partition(", known subclasses: ")
        if not found:
            return help_string
        listed, _, tail = listed.rpartition(")")
        own = [name for name in listed.split(", ") if name.startswith(_OWN_CHOICES[action.dest])]
        return f"{head}, this project's: {', '.join(own)}; or any other importable class){tail}"


class ProjectArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, with shorter help and one-line errors."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        """Exit with one line naming the flag, what it accepts and what was given, instead of the usage and a nest."""
        if not self.exit_on_error:
            super().error(message, ex)  # raises: parsing inside jsonargparse, not the user's command line
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        self.exit(2, f"error: {one_line(message)} (options: {prog} --help)\n")


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
    with simulated_run:
        try:
            with errors_as_messages():  # inside: it tells a lost DDP process by the live process group
                _make_cli(expand_shortcuts(args), run=True)
        finally:
            leave_process_group()


def build(args: list[str]) -> tuple[Classifier, DataModule]:
    """The model and data module that ``train.py fit`` would build from ``args``, without running anything."""
    model, datamodule, _ = build_all(args)
    return model, datamodule


def build_all(args: list[str], prog: str | None = None) -> tuple[Classifier, DataModule, L.Trainer]:
    """The model, data module and Trainer that ``train.py fit`` would build from ``args``; ``prog`` names the
    command in messages (by default, the script's file name)."""
    with errors_as_messages():
        cli = _make_cli(expand_shortcuts(args), run=False, prog=prog)
    return cli.model, cli.datamodule, cli.trainer


def fit(args: list[str], callbacks: Sequence[L.Callback] = (), cli_class: type[ProjectCLI] = ProjectCLI) -> ProjectCLI:
    """Run ``train.py fit`` on ``args`` in this process, with ``callbacks`` beside the project's (not in its
    config.yaml). Errors are raised, not shown: the caller records how the run ended first (a sweep's trial)."""
    return _make_cli(expand_shortcuts(["fit", *args]), run=True, callbacks=callbacks, cli_class=cli_class)


def _make_cli(
    args: list[str], run: bool, prog: str | None = None, callbacks: Sequence[L.Callback] = (), cli_class=ProjectCLI
) -> ProjectCLI:
    silence_the_unactionable()
    bound_yaml_loading()
    return cli_class(
        Classifier,
        L.LightningDataModule,
        subclass_mode_data=True,
        args=args,
        run=run,
        seed_everything_default=42,
        trainer_defaults={
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
            "callbacks": [
                # The best epoch by validation accuracy, and the latest one, every epoch.
                BestCheckpoint(monitor="val/acc", mode="max", filename="best-{epoch}-{step}"),
                ModelCheckpoint(filename="last"),
                # Before InterruptCheckpoint: the watch ends before a stop's checkpoint is written.
                ProcessWatch(),
                InterruptCheckpoint(),
                StopOnDivergence(check_every=LOSS_ON_PROGRESS_BAR_EVERY),
                BestEpoch(),
                RandomState(),
                RunPlots(),
                *callbacks,
                # Last: a run's end time counts its plots. run.json says running, finished, interrupted, ...
                RunStatus(),
            ],
            # A progress bar for people; none in CI logs and other redirected output.
            "enable_progress_bar": sys.stderr.isatty(),
        },
        parser_class=ProjectArgumentParser,
        parser_kwargs={"description": DESCRIPTION, **({"prog": prog} if prog else {})},
    )
