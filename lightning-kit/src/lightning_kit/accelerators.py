"""The accelerator asked for, checked against this machine before anything is built: one line, not a traceback."""

import importlib.util

import torch

from .errors import ConfigError, UserError


def check_accelerator(trainer) -> None:
    """The accelerator of the Trainer's arguments is present here, with its software."""
    accelerator = trainer.accelerator
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(
            f"--accelerator {accelerator} was requested but no CUDA GPU was found on this machine. "
            "Use --accelerator cpu, or --accelerator auto to take a GPU when one is present."
        )
    if accelerator in ("cpu", "gpu", "cuda", "auto"):
        return  # the server's choices, checked without importing Lightning
    from .gpu_audit.lightning import SIMULATED  # registers the simulated GPU with Lightning

    if accelerator == SIMULATED and (
        str(trainer.devices) not in ("1", "auto") or trainer.num_nodes != 1 or trainer.strategy not in ("auto", None)
    ):
        raise ConfigError(  # one process on one device (the device audit plays DDP)
            f"--accelerator {trainer.accelerator} runs one process on one simulated GPU: leave --devices, "
            "--num_nodes and --strategy at their defaults (python -m lightning_kit.placement also audits DDP)"
        )
    if isinstance(accelerator, str):
        from lightning.pytorch.accelerators import AcceleratorRegistry

        known = ("auto", "gpu", *AcceleratorRegistry.available_accelerators())
        if accelerator not in known:
            raise ConfigError(
                f"--accelerator {accelerator!r} is not an accelerator Lightning knows: accepted: {', '.join(known)}"
            )
    # Software missing would stop the run with a traceback from deep in Lightning.
    needs = {"tpu": "torch_xla", "xla": "torch_xla", "hpu": "lightning_habana"}.get(accelerator)
    if needs and importlib.util.find_spec(needs) is None:
        raise ConfigError(
            f"--accelerator {accelerator} needs {needs}, which is not installed: use cpu, gpu, mps, auto or simgpu"
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise UserError("--accelerator mps needs an Apple GPU, and this machine has none: use cpu or auto")


PROFILERS = ("simple", "advanced", "pytorch", "xla")


def check_named_choices(trainer) -> None:
    """The strategy and profiler given by name are ones Lightning has (else: a traceback from the Trainer)."""
    strategy = trainer.get("strategy")
    if isinstance(strategy, str):
        from lightning.pytorch.strategies import StrategyRegistry

        known = ("auto", *StrategyRegistry.available_strategies())
        if strategy.lower() not in known:
            raise ConfigError(
                f"--strategy {strategy!r} is not a strategy Lightning knows: accepted: {', '.join(known)}, "
                "or a Strategy's class path"
            )
    profiler = trainer.get("profiler")
    if isinstance(profiler, str) and profiler.lower() not in PROFILERS:
        raise ConfigError(
            f"--trainer.profiler {profiler!r} is not a profiler Lightning knows: accepted: {', '.join(PROFILERS)}, "
            "or a Profiler's class path"
        )
