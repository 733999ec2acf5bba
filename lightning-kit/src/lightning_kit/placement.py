"""The device audit's command: audit what ``train.py`` builds from the same arguments.

``python -m lightning_kit.placement --model their.Module --data their.DataModule`` for any Lightning project; a
project with a ``KitCLI`` of its own runs ``main(args, ProjectCLI)`` as ``python -m <package>.placement``. The audit
itself is ``gpu_audit/``; its exit statuses are ``gpu_audit.verdict``'s, and a stage that does not fit
``--gpu_memory`` (``gpu_audit/gpu_memory.py``) is 1, as a GPU's out-of-memory error would be.
"""

import sys
from typing import Any

from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from .building import build_cli, expand_shortcuts
from .cli import GenericCLI, KitCLI
from .command_line import CommandLine
from .errors import RefusedArgumentError, UserError, command, invoked_as
from .gpu_audit import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_PASSED, EXIT_USAGE, run_audit, simulated
from .gpu_audit.gpu_memory import judged, parse_capacity
from .gpu_audit.simulated import SimulationUnavailableError
from .installation import check_installation
from .parser import given_arguments, named_refusal


@command
def main(args: list[str] | None = None, cli_class: type[KitCLI] = GenericCLI, prog: str | None = None) -> None:
    """Audit what ``cli_class`` builds from the arguments; ``prog`` names the command in messages."""
    check_installation(cli_class.__module__)
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["fit"]:
        args = args[1:]
    # The Trainer is built only for its settings (callbacks, logger, clipping, DDP's options ...): on the CPU, in one
    # process. A DDP strategy builds there, and the audit's DDP pass takes its options (find_unused_parameters, ...).
    settings_only = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "1"]
    try:
        given, capacity = _gpu_memory(CommandLine(expand_shortcuts(args)))
        replaced = _device_flags_given(given, settings_only)
    except ValueError as err:  # ConfigError is one
        sys.exit(_usage(f"error: {err}"))
    try:
        # A class that cannot be built is not audited (3), never a placement bug (1).
        # Imported and built as a GPU machine's process does, before Lightning gives it its GPU: a CUDA guard at a
        # module's top or in a constructor takes its GPU branch (device = "cuda" if torch.cuda.is_available() ...).
        with simulated.simulating(0, building=True):
            cli = build_cli(
                cli_class,
                [*given, *settings_only],
                prog=prog or invoked_as("python -m lightning_kit.placement"),
                not_built=EXIT_INCOMPLETE,
                settings=_ddp_or_auto,
            )
    except SystemExit as stop:
        sys.exit(stop.code if isinstance(stop.code, int) else _usage(stop.code))
    model, datamodule, trainer = cli.model, cli.datamodule, cli.trainer
    net = getattr(model, "net", None)
    if replaced:  # said, so that an audit of other settings than these is not read as an audit of them
        print(
            f"note: {', '.join(replaced)} {'is' if len(replaced) == 1 else 'are'} not used: the audit runs on its "
            "own devices, one simulated GPU and then each rank of a 2-GPU DDP run"
        )
    print(
        f"Auditing {type(model).__name__}{f' ({type(net).__name__})' if net is not None else ''} with "
        f"{type(datamodule).__name__ if datamodule is not None else 'its own dataloaders'} on a simulated GPU, then "
        "as each rank of a 2-GPU DDP run ..."
    )
    try:
        # In a forked copy of this process: what ends a process there is a NOT AUDITED line here.
        verdict = run_audit(model, datamodule, trainer=trainer, isolate=True, say=lambda line: print(line, flush=True))
    except (SimulationUnavailableError, UserError) as err:  # UserError: the data refused, as on any device
        sys.exit(_usage(f"error: {err}"))
    for line in verdict.report():
        print(line)
    refusal = _refused_value(verdict, given_arguments(cli.config, cli.fixed_model_class()))  # built: no subcommand
    if refusal is not None:  # not the model's placement but a value given on the command line: a usage error
        sys.exit(_usage(f"error: {refusal}"))
    fits = True
    if capacity is not None:
        lines, fits = judged(verdict, capacity)
        print(*lines, sep="\n")
    if verdict.exit_code == EXIT_PASSED and not fits:
        sys.exit(EXIT_FAILED)
    if verdict.exit_code == EXIT_PASSED:
        stages = "Every stage the data defines" if verdict.skipped else "Every stage"
        hooks = len(verdict.hooks)
        print(f"{stages} ran on the simulated GPUs ({hooks} hooks and steps): the model will run on a GPU.")
    sys.exit(verdict.exit_code)


def _gpu_memory(args: CommandLine) -> tuple[CommandLine, int | None]:
    """``args`` without ``--gpu_memory SIZE`` (or ``--gpu_memory=SIZE``), and the bytes it names (None: not given)."""
    sizes, rest = args.split(lambda flag, value: flag == "--gpu_memory")
    if not sizes:
        return rest, None
    if sizes[-1] is None:
        raise ValueError("--gpu_memory needs a size (24GB) or a GPU's name (A10G)")
    return rest, parse_capacity(sizes[-1])


def _device_flags_given(args: CommandLine, settings_only: list[str]) -> list[str]:
    """The flags of ``settings_only`` (the Trainer's devices) and the strategy that ``args`` gives, each once, as
    given; not DDP's, whose options are the DDP pass's."""
    given = {flag: value for flag, value in args.pairs if flag in (*settings_only[::2], "--trainer.strategy")}
    if _is_ddp(given.get("--trainer.strategy")):
        del given["--trainer.strategy"]
    return [f"{flag} {value}" for flag, value in given.items()]


def _ddp_or_auto(config) -> None:
    """A strategy other than DDP is built as ``auto``: the audit runs its own, and takes only DDP's options (one that
    Lightning lacks is refused before, as ``train.py`` refuses it)."""
    if not _is_ddp(config.trainer.strategy):
        config.trainer.strategy = "auto"


def _is_ddp(strategy: Any) -> bool:
    """Whether ``strategy`` is Lightning's DDP, by a registered name (``ddp_find_unused_parameters_true``) or class."""
    if isinstance(strategy, str):
        return strategy in StrategyRegistry and issubclass(StrategyRegistry[strategy]["strategy"], DDPStrategy)
    return str(getattr(strategy, "class_path", "")).rpartition(".")[2] == "DDPStrategy"


def _refused_value(verdict, given: dict) -> RefusedArgumentError | None:
    """Where no bug was found, and a stage stopped in the model's or the data's code on a value given to them (a
    DataLoader's batch_size 0): that value, as one line; None otherwise."""
    if verdict.errors:
        return None
    for outcome in verdict.gaps:
        # "<hook> stopped at <file>:<line>: <Type>: <message>" (explain.py), or a process that died: no value's.
        _, stopped, rest = outcome.gap.partition(" stopped at ")
        reason = rest.partition(": ")[2] if stopped else ""
        if reason and (refusal := named_refusal(outcome.stage, reason, given)) is not None:
            return refusal
    return None


def _usage(message: Any) -> int:
    print(message, file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    main()
