"""Lightning's private names the library relies on: ``OVERRIDES``, LightningCLI's private methods that ``cli.KitCLI``
overrides (Lightning offers no hook there), and ``PRIVATES``, read or called through the functions below.
"""

from types import MethodType
from typing import NamedTuple

from . import Private


class Override(NamedTuple):
    """A private method of ``owner`` (a class of ``lightning.pytorch``) that the library's subclass overrides."""

    owner: str
    method: str
    parameters: tuple[str, ...]  # the names the override takes, ``self`` first
    use: str
    versions: str
    since: str | None = None  # a version before which the base class has no such method, and none is needed


OVERRIDES = (
    Override(
        "lightning.pytorch.cli.LightningCLI",
        "_prepare_subcommand_parser",
        ("self", "klass", "subcommand", "kwargs"),
        "adds --untrained_weights to the evaluations' parsers only",
        "lightning 2.5.2 to 2.6.6",
    ),
    Override(
        "lightning.pytorch.cli.LightningCLI",
        "_parse_ckpt_path",
        ("self",),
        "turned off: the checkpoint's hyperparameters overrode the flags given; its run's config.yaml is read instead",
        "lightning 2.5.5 to 2.6.6 (before 2.5.5 LightningCLI reads no hyperparameters from a checkpoint)",
        since="2.5.5",
    ),
    Override(
        "lightning.pytorch.cli.LightningCLI",
        "_run_subcommand",
        ("self", "subcommand"),
        "wraps before_<subcommand>, the Trainer's method, after_<subcommand>: a refusal in one line, no empty folder",
        "lightning 2.5.2 to 2.6.6",
    ),
)


def _launcher_class() -> type:
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    return _SubprocessScriptLauncher


def device_dtype_mixin() -> type:
    """The class that gives every LightningModule its ``device`` property, from the private ``_device`` it keeps."""
    from lightning.fabric.utilities.device_dtype_mixin import _DeviceDtypeModuleMixin

    return _DeviceDtypeModuleMixin


def _ddp_strategy():
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(find_unused_parameters=True)


def _signal_connector():
    import lightning as L

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    return trainer._signal_connector


PRIVATES = (
    Private(
        "lightning.fabric.utilities.device_dtype_mixin._DeviceDtypeModuleMixin",
        "its device property is replaced while the audit simulates, so that self.device says cuda:N to the model",
        "lightning 2.5.2 to 2.6.6",
        device_dtype_mixin,
        type,
    ),
    Private(
        "_DeviceDtypeModuleMixin._device",
        "the device Lightning moved the module to, which the simulated device property reads",
        "lightning 2.5.2 to 2.6.6",
        lambda: __import__("lightning").LightningModule()._device,
        __import__("torch").device,
    ),
    Private(
        "DDPStrategy._ddp_kwargs",
        "the options a DDP strategy passes to DistributedDataParallel, which the audit's DDP pass takes",
        "lightning 2.5.2 to 2.6.6",
        lambda: _ddp_strategy()._ddp_kwargs,
        dict,
    ),
    Private(
        "lightning.pytorch.strategies.launchers._SubprocessScriptLauncher",
        "tells a DDP run whose other processes Lightning started (ProcessWatch watches them)",
        "lightning 2.5.2 to 2.6.6",
        _launcher_class,
        type,
    ),
    Private(
        "_SubprocessScriptLauncher.procs",
        "the processes of the other ranks, whose end ProcessWatch waits for",
        "lightning 2.5.2 to 2.6.6",
        lambda: _launcher_class()(None, num_processes=2, num_nodes=1).procs,
        list,
    ),
    Private(
        "Trainer._signal_connector.received_sigterm",
        "Lightning's own stop request, which InterruptCheckpoint sets (what Lightning's SIGTERM handler sets)",
        "lightning 2.5.2 to 2.6.6",
        lambda: _signal_connector().received_sigterm,
        bool,
    ),
    Private(
        "Trainer._signal_connector.teardown",
        "puts back the signal handlers Lightning installed, where a run ends by an error of the library's",
        "lightning 2.5.2 to 2.6.6",
        lambda: _signal_connector().teardown,
        MethodType,
    ),
)


def other_rank_processes(launcher) -> list | None:
    """The processes Lightning's launcher started for the other ranks; None where another launcher (or none) did."""
    return launcher.procs if isinstance(launcher, _launcher_class()) else None


def ask_to_stop(trainer, stop: bool) -> bool:
    """Set Lightning's own stop request (what its SIGTERM handler sets); return the previous one."""
    connector = trainer._signal_connector
    previous, connector.received_sigterm = connector.received_sigterm, stop
    return previous


def put_back_signal_handlers(trainer) -> None:
    """Put back the signal handlers that were there before Lightning installed its own for the run."""
    trainer._signal_connector.teardown()


def ddp_options(strategy) -> dict:
    """The options ``strategy`` (Lightning's ``DDPStrategy``) passes to ``DistributedDataParallel``."""
    return dict(strategy._ddp_kwargs)
