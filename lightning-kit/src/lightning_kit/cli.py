"""The command line: LightningCLI, with the everyday Trainer flags as top-level shortcuts.

A project subclasses ``KitCLI`` with its classes and defaults, and runs it with ``main``::

    class ProjectCLI(KitCLI):
        model_class = Classifier
        default_classes = {"model.net": ReferenceCNN, "data": ImageDataModule}
        data_links = {"model.num_classes": "num_classes", "model.net.init_args.num_classes": "num_classes"}

    main(ProjectCLI)  # train.py

``GenericCLI`` takes any ``LightningModule`` and ``LightningDataModule`` by class path (``--model their.Module
--data their.DataModule``), for a project without a ``KitCLI`` of its own.
"""

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import CheckpointIO

from .accelerators import check_accelerator, check_named_choices
from .building import expand_shortcuts, make
from .callbacks import BestEpoch, CSVPredictionWriter, StepLogging, skip_empty_batch_hooks
from .checkpoints import AtomicCheckpointIO, check_architecture, class_path, read_checkpoint
from .command_line import CommandLine
from .errors import DataUnavailableError, command, invoked_as
from .evaluation import (
    EVALUATIONS,
    UNTRAINED_FLAG,
    check_evaluation,
    check_new_log_dir,
    checkpoint_run_settings,
    choose_checkpoint,
    config_flags,
    lost_run_folder,
    no_empty_folders_left,
    run_config_of_checkpoint,
    warn_about_changes,
)
from .gpu_audit.explain import count_as_user_code
from .gpu_audit.lightning import SIMULATED, HookTracker, SimulatedGPUStrategy, mixed_precision, simulated_run
from .installation import check_installation
from .messages import errors_as_messages, report
from .parser import (
    REFUSALS,
    check_given_against_data,
    check_no_nul,
    check_run_arguments,
    constructor_failure,
    empty_split,
    noted_failure,
    noting_failures,
    run_refusal,
)
from .project import ProjectFile, project_file, read_project
from .supervision import check_cpu_processes, leave_process_group
from .trust import check_command_line

SUBCOMMANDS = ("fit", "validate", "test", "predict")

DESCRIPTION = """\
Train and evaluate the model. Without a subcommand, `fit` is run.
Shortcuts: --accelerator, --devices, --strategy, --num_nodes, --precision and
--max_epochs stand for --trainer.<name>. Example: {command} --accelerator gpu
--accelerator simgpu runs on a simulated GPU, to find what would fail on a real one."""


class KitCLI(LightningCLI):
    """LightningCLI with a project's defaults, checked checkpoints and clear answers to common mistakes.

    A project sets the class attributes below in a subclass; the methods are LightningCLI's hooks, which it may
    extend as Lightning's.
    """

    #: The LightningModule; with ``subclass_mode_model``, the base of the classes ``--model`` may name.
    model_class: type[L.LightningModule] = L.LightningModule
    subclass_mode_model: bool = False
    #: The classes used when the command line names none: ``{"model.net": Net, "data": DataModule}``.
    default_classes: ClassVar[dict[str, type]] = {}
    #: What the model takes from the data: argument -> the data module's attribute, where it has one.
    data_links: ClassVar[dict[str, str]] = {}
    #: Modules beyond the project's package whose classes a run's config.yaml or a checkpoint may name.
    trusted_modules: tuple[str, ...] = ()
    #: The metric the best checkpoint is chosen by, and how (``None``: no best checkpoint is kept).
    monitor: tuple[str, str] | None = ("val/acc", "max")
    #: The metrics the end of ``fit`` reports, the best epoch's where there is one.
    summary_metrics: tuple[str, ...] = ("val/loss", "val/acc")
    #: Steps between redraws of the progress bar, and between checks of the loss for divergence.
    refresh_every: int = 20
    seed: int = 42
    description: str = DESCRIPTION
    #: How a person runs this command line, for messages that tell them what to type: ``python train.py``.
    command: str = "python train.py"

    def __init__(self, *args, settings: Callable[[Namespace], None] | None = None, **kwargs) -> None:
        """``settings``: changes the parsed configuration, once checked, before anything is built (the audit's)."""
        self._settings = settings
        super().__init__(*args, **kwargs)

    @classmethod
    def _project_settings(cls) -> ProjectFile:
        """What the project says of itself (``packages``, ``monitor``); here, its package is the command line's."""
        package = cls.__module__.partition(".")[0]
        return ProjectFile(Path("."), packages=() if package in (__package__, "__main__") else (package,))

    @classmethod
    def own_package(cls) -> str | None:
        """The project's top-level package; None for the library's own command line."""
        packages = cls._project_settings().packages
        return packages[0].partition(".")[0] if packages else None

    @classmethod
    def trusted(cls) -> tuple[str, ...]:
        """The modules whose classes a run's config.yaml or a checkpoint may name."""
        return (*cls._project_settings().packages, *cls.trusted_modules)

    @classmethod
    def monitored(cls) -> tuple[str, str] | None:
        """The metric that chooses the best checkpoint, and how."""
        return cls._project_settings().monitor or cls.monitor

    @classmethod
    def monitor_named_in(cls) -> str:
        """Where the monitored metric's name is given, as a message says it."""
        project = cls._project_settings()
        if project.monitor:
            return f"{project.path}'s [tool.lightning-kit] monitor"
        return f"the monitor of {cls.__module__}.{cls.__qualname__}"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({key: {"class_path": class_path(cls)} for key, cls in self.default_classes.items()})
        parser.class_defaults = tuple(self.default_classes)
        # `predict` writes its probabilities here: --predictions.path out.csv
        parser.add_lightning_class_args(CSVPredictionWriter, "predictions")
        # The data decides the class count, its names and the input size, so the model cannot disagree with it.
        for target, source in self.data_links.items():
            parser.link_arguments(f"data.{source}", target, apply_on="instantiate")

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs) -> LightningArgumentParser:
        # Private (upstream.lightning.OVERRIDES): the one point where each subcommand's parser is made on its own.
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
        # Read once, and checked before any parsing: jsonargparse imports the classes it is given.
        args = CommandLine.of(args)
        check_no_nul(args.named())
        no_model = not args.gives("--model", "--config", "-c")  # a --config may name one
        if self.subclass_mode_model and "model" not in self.default_classes and no_model:
            # No model to parse the command line with but the checkpoint's run's (GenericCLI, --ckpt_path alone).
            args = CommandLine([*args, *run_config_of_checkpoint(args.last("--ckpt_path"))])
        # A run's saved config.yaml given with --config is read first: every other flag and file given wins over it.
        run_configs, args = check_command_line(args, self.trusted())
        subcommand_given = args[:1] if args and args[0] in SUBCOMMANDS else []
        rest = args[len(subcommand_given) :]
        run_settings = config_flags(subcommand_given[0] if subcommand_given else None, run_configs)
        super().parse_arguments(parser, [*subcommand_given, *run_settings, *rest])
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        check_no_nul((f"--{key}", value) for key, value in config.items())  # a --config file's (YAML's "\0")
        ckpt_path = choose_checkpoint(subcommand, config)
        # Checked before anything its run folder names is imported, and before the Trainer loads it.
        self._trained = read_checkpoint(ckpt_path) if ckpt_path else None
        settings, trained = (
            checkpoint_run_settings(subcommand, Path(ckpt_path), config, run_settings) if ckpt_path else ([], None)
        )
        if settings:
            # Parsed again, the checkpoint run's settings first: the flags given still win.
            super().parse_arguments(parser, [*subcommand_given, *settings, *rest, "--ckpt_path", ckpt_path])
            config = self.config[subcommand]
        if trained is not None:
            warn_about_changes(trained, config)
        if subcommand in EVALUATIONS:
            check_evaluation(subcommand, config)
        check_run_arguments(config)  # before LightningCLI seeds with them

    def _parse_ckpt_path(self) -> None:
        """Private (upstream.lightning.OVERRIDES): LightningCLI's lets the checkpoint's hyperparameters override the
        flags given (a new --model.lr on resume dropped); here its run's config.yaml is under them."""

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("weights_only") is None and "weights_only" in config:
            config.weights_only = True  # checkpoints are read as data, never run as code
        check_accelerator(config.trainer)
        check_named_choices(config.trainer)
        if self._settings is not None:  # on settings checked as given
            self._settings(config)
        if config.trainer.accelerator == SIMULATED:
            simulated_run.start(self.subcommand or "fit")
        check_cpu_processes(config.trainer)
        if self.subcommand:
            check_new_log_dir(config.trainer)
        if self.subcommand == "predict":
            # Before the data is read and the model run: a path that cannot be written would waste that work.
            CSVPredictionWriter.check_path(config.predictions.path, config.predictions.overwrite)

    def instantiate_classes(self) -> None:
        with noting_failures() as failures:
            try:
                super().instantiate_classes()
            except Exception as err:
                config = self.config[self.subcommand] if self.subcommand else self.config
                failure = constructor_failure(err, config, self.fixed_model_class()) or noted_failure(failures, config)
                if failure is None:
                    raise
                raise failure from err

    def fixed_model_class(self) -> type | None:
        """The model's class where the configuration does not name one (``subclass_mode_model`` off)."""
        return None if self.subclass_mode_model else self.model_class

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        trainer_config = (self.config_init[self.subcommand] if self.subcommand else self.config_init).get("trainer", {})
        callbacks = list(trainer_config.get("callbacks") or [])
        if trainer_config.get("enable_progress_bar") and not any(isinstance(c, ProgressBar) for c in callbacks):
            # Redrawn every 20 steps, not every step: a bar costs time on each redraw.
            callbacks.append(TQDMProgressBar(refresh_rate=self.refresh_every))
        if trainer_config.get("log_every_n_steps") is None:
            callbacks.append(StepLogging())  # short epochs still record what their steps log
        plugins = trainer_config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            # Checkpoints written beside their final name and renamed: never left truncated.
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        if trainer_config.get("accelerator") == SIMULATED:
            # Lightning would pick a CPU strategy for an accelerator it does not know. The tracker names the hook in
            # which a GPU would fail.
            kwargs.update(accelerator="auto", strategy=SimulatedGPUStrategy())
            mixed = mixed_precision(trainer_config.get("precision"))
            if mixed is not None:  # autocast on the simulated GPU, by CUDA's rules
                kwargs.update(precision=None, plugins=[*kwargs.get("plugins", plugins), mixed])
            if trainer_config.get("profiler") is None:
                kwargs["profiler"] = HookTracker()
        trainer = super().instantiate_trainer(callbacks=callbacks, **kwargs)
        skip_empty_batch_hooks(trainer.callbacks)  # the project's, the user's and Lightning's own
        return trainer

    def after_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.trainer.accelerator == SIMULATED:  # a failure on it names the line in the project's own files
            count_as_user_code(self.model, self.datamodule)
        check_given_against_data(config, self.datamodule, self.model, self.data_links)
        if self._trained is not None:
            check_architecture(self.config_init[self.subcommand].ckpt_path, self._trained, self.model)

    def _run_subcommand(self, subcommand: str) -> None:
        # Private (upstream.lightning.OVERRIDES): the run of before_<subcommand>, the Trainer's method and
        # after_<subcommand> as a whole. A run refused once Lightning made its log folder leaves no empty folder.
        with (
            no_empty_folders_left(self.trainer.logger if self.trainer.is_global_zero else None),
            warnings.catch_warnings(),
        ):
            if subcommand in EVALUATIONS:
                # An evaluation writes no checkpoint: Lightning's word on what its checkpoint callback will not reload.
                warnings.filterwarnings("ignore", message="The dirpath has changed from")
            try:
                super()._run_subcommand(subcommand)
            except (OSError, *REFUSALS) as err:
                if isinstance(err, OSError):
                    failure = lost_run_folder(err, self.trainer)
                else:  # a value given to the model or the data that a DataLoader, an optimizer or the class refused
                    failure = run_refusal(err, self.config[subcommand], subcommand, self.fixed_model_class())
                    failure = failure or empty_split(err, subcommand)
                if failure is None:
                    raise
                raise failure from err

    def after_fit(self) -> None:
        log_dir = self.trainer.log_dir  # every process must ask: the answer is broadcast from rank 0
        if self.trainer.fit_loop.epoch_loop.batch_progress.total.ready == 0 and not self.trainer.interrupted:
            # Lightning warns and returns where the training split is empty: that is no finished fit.
            data = self.datamodule if self.datamodule is not None else self.model
            raise DataUnavailableError(
                f"fit trained on no batch: {type(data).__name__}.train_dataloader() yielded none "
                "(an empty training split?): nothing was trained"
            )
        # The best checkpoint's numbers, not the last epoch's, when there is a best.
        best = next((c for c in self.trainer.callbacks if isinstance(c, BestEpoch) and c.epoch is not None), None)
        metrics = best.metrics if best is not None else self.trainer.callback_metrics
        # Without metrics of its own to name (GenericCLI), every validation metric of the module.
        names = self.summary_metrics or sorted(name for name in metrics if name.startswith("val"))
        summary = " ".join(f"{name}={float(metrics[name]):.4f}" for name in names if name in metrics)
        if best is not None:
            summary = f"best epoch {best.epoch}: {summary}"
        if self.trainer.world_size > 1:
            # Every process reports: the values are synced, so they must agree.
            report(f"rank {self.trainer.global_rank}/{self.trainer.world_size} fit finished: {summary}")
        elif self.trainer.is_global_zero:
            report(f"fit finished: {summary}")
        if self.trainer.is_global_zero and self.trainer.checkpoint_callback is not None:
            judge = self.trainer.checkpoint_callback
            # Without a monitored metric there is no best: the checkpoint named is the latest.
            report(f"{'best ' if getattr(judge, 'monitor', None) else 'latest '}checkpoint: {judge.best_model_path}")
            report(f"run folder: {log_dir}")


class GenericCLI(KitCLI):
    """The command line of any Lightning project: ``--model their.Module --data their.DataModule``.

    What a project's ``KitCLI`` says in Python, a project without one says in the ``[tool.lightning-kit]`` table of
    the working folder's ``pyproject.toml``: its ``packages`` (trusted) and the metric to ``monitor``, without which
    no best checkpoint is chosen, as the module's metrics are its own.
    """

    subclass_mode_model = True
    monitor = None
    summary_metrics = ()
    command = "python -m lightning_kit"

    @classmethod
    def _project_settings(cls) -> ProjectFile:
        """The working folder's project's ``[tool.lightning-kit]`` (empty without one); a mistake in it is one line."""
        path = project_file()
        return read_project(path) if path is not None else ProjectFile(Path("."))


@command
def main(cli_class: type[KitCLI] = GenericCLI, args: list[str] | None = None) -> None:
    """Run ``cli_class``'s command line on ``args`` (default: ``sys.argv[1:]``); without a subcommand, ``fit``.
    A mistake ends in one line and exit status 1 or 2."""
    args = sys.argv[1:] if args is None else list(args)
    if not args or (args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help")):
        args = ["fit", *args]
    with simulated_run:
        try:
            with errors_as_messages():  # inside: it tells a lost DDP process by the live process group
                check_installation(cli_class.__module__)
                # `python -m lightning_kit` names itself so in messages; a script, by its file's name (train.py).
                make(cli_class, expand_shortcuts(args), run=True, prog=invoked_as("") or None)
        finally:
            leave_process_group()
