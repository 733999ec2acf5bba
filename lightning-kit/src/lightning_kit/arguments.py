"""What arguments accept: the bounds of one value as jsonargparse types, and the Trainer's table.

A class says what each argument accepts in its signature, with jsonargparse's types (``PositiveInt``...) or the
bounded types here (``BatchSize``, ``Seed``, ``Workers``...): the command line refuses a value out of bounds in one
line naming the flag, before the class is built. What relates two arguments (heads that divide the width, a size
that fits in memory) stays code in the constructor. Lightning's Trainer cannot carry bounds, so its arguments keep a
table here (``TRAINER``), and LightningCLI's seed a check (``parser.check_run_arguments``).
"""

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, restricted_number_type

from .errors import ConfigError, byte_size

# The seeds NumPy takes, and so Lightning's seed_everything.
SEED_MAX = 2**32 - 1
# The largest integer PyTorch and Lightning count with; any integer argument above it overflows there.
INT64_MAX = 2**63 - 1


def is_integer(value) -> bool:
    """An int or NumPy integer, not a bool (which Python counts as an int)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# A value jsonargparse parsed is an instance of its type (an int or float still): KitArgumentParser gives the
# classes plain numbers, which a checkpoint's weights_only load reads back.
Seed = restricted_number_type("Seed", int, [(">=", 0), ("<=", SEED_MAX)])
# Past the data's size a batch is all of it; the bound keeps the count within what loaders index with.
BatchSize = restricted_number_type("BatchSize", int, [(">=", 1), ("<=", 2**31 - 1)])
# Loader processes: more than a few per CPU only contend for it (and each holds a copy of the process).
WORKERS_PER_CPU = 4
Workers = restricted_number_type("Workers", int, [(">=", 0), ("<=", WORKERS_PER_CPU * (os.cpu_count() or 1))])
# A share of the data held out: some of it, never all.
Fraction = OpenUnitInterval
# A learning rate or another number a model computes with in float32: past its largest (3.4028e38, here rounded
# down to be read at a glance), infinity.
PositiveFloat32 = restricted_number_type("PositiveFloat32", float, [(">", 0), ("<=", 3.4e38)])
NonNegativeFloat32 = restricted_number_type("NonNegativeFloat32", float, [(">=", 0), ("<=", 3.4e38)])
# Two or more (jsonargparse keeps one type per bound):
AtLeastTwo = restricted_number_type("AtLeastTwo", int, [(">=", 2)])
# cross-validation's folds (one validates, the others train), and the fold that validates, from 0;
Folds = AtLeastTwo
Fold = NonNegativeInt
# a classifier's classes, or there is nothing to tell apart.
NumClasses = AtLeastTwo
# The height and width of square images: a smaller one leaves a network's three poolings (/8) nothing to pool.
ImageSize = restricted_number_type("ImageSize", int, [(">=", 8)])


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (``MemAvailable``); ``None`` where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(
    needed: int, what: str, flags: Sequence[str], values: Sequence[Any], error: type[Exception] = ConfigError
) -> None:
    """Refuse arguments asking for more memory than is available, with the estimate, before anything is allocated.
    A plain ``nn.Module`` raises a ``ValueError`` (``error``) naming its arguments, which the command line names as
    flags (``parser.constructor_failure``)."""
    available = available_memory()
    if available is None or needed <= available:
        return
    given = ", ".join(f"{flag} {value!r}" for flag, value in zip(flags, values, strict=True))
    raise error(
        f"{what} would need about {byte_size(needed)} of memory at {given}, "
        f"more than the {byte_size(available)} available: lower {' or '.join(flags)}"
    )


# Lightning's Trainer: the arguments it divides by, counts with or treats specially. Lightning checks some itself,
# others only deep inside a run (a division by zero), and names none as the flag a person typed.


def _at_least(least: int) -> Callable[[Any], bool]:
    return lambda value: is_integer(value) and value >= least


def _null_or(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or test(value)


def _positive_or_all(value) -> bool:
    """1 or more, or -1: no limit (epochs, steps), or all (devices)."""
    return is_integer(value) and (value >= 1 or value == -1)


def _batches(value) -> bool:
    """A whole number of batches (3.0 is 3, as Lightning takes it), or a share of them in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    whole = is_integer(value) or (isinstance(value, float) and value.is_integer())
    return value >= 0 if whole else 0 <= value <= 1


def _val_check_interval(value) -> bool:
    """A number of batches, a share of the epoch in (0, 1], or a duration (checked by Lightning)."""
    if isinstance(value, str | dict | timedelta) or _at_least(1)(value):
        return True
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and 0 < value <= 1


def _devices(value) -> bool:
    """Lightning's ``devices``: a count, -1 (all), a string of them (``auto``, ``"0,1"``), or distinct indices."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value) == -1 or int(value) >= 1
    if isinstance(value, str):
        return not value.strip().startswith("-")  # "auto", "0,1": Lightning reads the rest
    if isinstance(value, list | tuple):
        indices = list(value)
        return bool(indices) and all(is_integer(i) and i >= 0 for i in indices) and len(set(indices)) == len(indices)
    return _positive_or_all(value)


def _on_cpu(accelerator) -> bool:
    """Whether Lightning runs ``accelerator`` on the CPU: ``cpu``, or ``auto`` (or none) on a machine without a GPU."""
    if isinstance(accelerator, str) and accelerator.lower() == "cpu":
        return True
    if accelerator not in (None, "auto"):
        return False
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    return not (CUDAAccelerator.is_available() or MPSAccelerator.is_available())


def _cpu_devices(accelerator, devices) -> bool:
    """On the CPU, Lightning takes a positive number of processes or ``auto``, not -1 (all) or a list of indices."""
    if not _on_cpu(accelerator):
        return True
    if isinstance(devices, str):
        text = devices.strip()
        return text == "auto" or (text.isdigit() and int(text) >= 1)
    return _at_least(1)(devices)


def _flag(name: str) -> str:
    """The flag of a Trainer argument as people type it: ``--max_epochs`` for a shortcut (cli.TRAINER_SHORTCUTS)."""
    return f"--{name}" if name in ("accelerator", "devices", "num_nodes", "max_epochs") else f"--trainer.{name}"


_BATCH_LIMIT = (_null_or(_batches), "null, a whole number of batches or a number in [0, 1]")
TRAINER: dict[str, tuple[Callable[[Any], bool], str]] = {
    # Any accelerator Lightning knows, checked by it (and accelerators.check_accelerator); here for the rules.
    "accelerator": (lambda value: True, "an accelerator"),
    "devices": (_devices, "a positive number of devices, -1 for all, auto, or a list of distinct device indices"),
    "num_nodes": (_at_least(1), "a positive integer"),
    "fast_dev_run": (
        lambda value: isinstance(value, bool) or _at_least(0)(value),
        "true, false or an integer of at least 0",
    ),
    "max_epochs": (_null_or(_positive_or_all), "null, a positive integer or -1 (no limit)"),
    "min_epochs": (_null_or(_at_least(0)), "null or an integer of at least 0"),
    "max_steps": (_positive_or_all, "a positive integer or -1 (no limit)"),
    "min_steps": (_null_or(_at_least(0)), "null or an integer of at least 0"),
    "limit_train_batches": _BATCH_LIMIT,
    "limit_val_batches": _BATCH_LIMIT,
    "limit_test_batches": _BATCH_LIMIT,
    "limit_predict_batches": _BATCH_LIMIT,
    "overfit_batches": (_batches, "a whole number of batches or a number in [0, 1]"),
    "val_check_interval": (
        _null_or(_val_check_interval),
        "null, a positive integer, a number in (0, 1] or a duration DD:HH:MM:SS",
    ),
    "check_val_every_n_epoch": (_null_or(_at_least(1)), "null or a positive integer"),
    "num_sanity_val_steps": (_null_or(_at_least(-1)), "null, 0 or more, or -1 (all)"),
    "log_every_n_steps": (_null_or(_at_least(1)), "null or a positive integer"),
    "accumulate_grad_batches": (_at_least(1), "a positive integer"),
    "gradient_clip_val": (
        _null_or(lambda v: not isinstance(v, bool) and isinstance(v, numbers.Real) and 0 <= v < math.inf),
        "null or a finite number of at least 0",
    ),
    "gradient_clip_algorithm": (lambda value: value in (None, "value", "norm"), "null, value or norm"),
    "reload_dataloaders_every_n_epochs": (_at_least(0), "an integer of at least 0"),
}


def check_trainer(values: Mapping[str, Any]) -> None:
    """Raise a ``ConfigError`` naming the first Trainer argument in ``values`` not accepted, or rule not met."""
    for name, (test, description) in TRAINER.items():
        if name not in values:
            continue
        value = values[name]
        if is_integer(value) and abs(value) > INT64_MAX:
            raise ConfigError(f"{_flag(name)} {value} is beyond what a 64-bit integer holds ({INT64_MAX})")
        if not test(value):
            raise ConfigError(f"{_flag(name)} must be {description}, got {value!r}")
    for least, most in (("min_epochs", "max_epochs"), ("min_steps", "max_steps")):
        low, high = values.get(least), values.get(most)
        if low is not None and high not in (None, -1) and low > high:
            raise ConfigError(f"{_flag(least)} must be at most {_flag(most)}, got {low!r} and {high!r}")
    if "accelerator" in values and "devices" in values and not _cpu_devices(values["accelerator"], values["devices"]):
        raise ConfigError(
            f"{_flag('devices')} on the CPU is a number of processes, 1 or more (or auto): -1 (all) and lists of "
            f"indices are for GPUs, got {values['devices']!r}"
        )
