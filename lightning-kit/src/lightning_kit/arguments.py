"""What arguments accept: the bounds of one value as jsonargparse types, and the Trainer's table.

A class of the library or of a project says what each of its arguments accepts in its signature, with
jsonargparse's types (``jsonargparse.typing``'s ``PositiveInt``, ``OpenUnitInterval``, ``restricted_number_type``,
or the bounded types here: ``BatchSize``, ``Seed``, ``Workers``...): the command line refuses a value out of its
bounds in one line naming the flag, before the class is built. What relates two arguments (a fold below the number
of folds, heads that divide the width, a size that fits in memory) stays code in the class's constructor.

Lightning's Trainer cannot carry bounds of its own, so its arguments, and LightningCLI's seed, keep a table here
(``TRAINER``, ``RUN``): ``Arguments.check`` holds the values given against it, one line naming the flag.
"""

import math
import numbers
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, restricted_number_type

from .errors import ConfigError

# The seeds NumPy takes, and so Lightning's seed_everything.
SEED_MAX = 2**32 - 1
# The largest integer PyTorch and Lightning count with; any integer argument above it overflows there.
INT64_MAX = 2**63 - 1
# What a float32 (the precision a model computes in) holds: a value past these becomes infinity, or zero.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38
# An argument named in a rule's requirement: <num_heads>.
_NAMED = re.compile(r"<(\w+)>")


@dataclass(frozen=True)
class Accepted:
    """The values an argument accepts: a test, and how the message describes them (``a positive integer``).

    ``a | b`` accepts what either accepts.
    """

    test: Callable[[Any], bool]
    description: str
    alternatives: tuple[str, ...] = ()

    def __or__(self, other: "Accepted") -> "Accepted":
        alternatives = (*(self.alternatives or (self.description,)), *(other.alternatives or (other.description,)))
        return Accepted(
            lambda value: self.test(value) or other.test(value),
            f"{', '.join(alternatives[:-1])} or {alternatives[-1]}",
            alternatives,
        )


def is_integer(value) -> bool:
    """An int or NumPy integer, not a bool (which Python counts as an int)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(minimum: int, maximum: int | None = None) -> Accepted:
    """Integers from ``minimum`` (to ``maximum``)."""
    if maximum is not None:
        description = f"an integer from {minimum} to {maximum}"
    else:
        description = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
    return Accepted(
        lambda value: is_integer(value) and value >= minimum and (maximum is None or value <= maximum), description
    )


def number(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False) -> Accepted:
    """Finite real numbers between ``low`` and ``high``, each bound included unless open."""

    def test(value) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        return (value > low if low_open else value >= low) and (value < high if high_open else value <= high)

    if high == math.inf:
        description = "a positive number" if low == 0 and low_open else f"a number of at least {low}"
    else:
        description = f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    return Accepted(test, description)


def number_refusal(value) -> str | None:
    """Why ``value`` cannot be a number a run computes with, in words; None when it can.

    Refused: NaN and infinity, an integer past 64 bits, and a float past what float32 holds
    (above about 3.4e38, or nearer zero than about 1.2e-38 but not zero): a learning rate of
    1e300 is infinity in the model, and 1e-300 is zero. Booleans and strings are not numbers: None.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if is_integer(value):
        return None if abs(value) <= INT64_MAX else f"{value} is beyond what a 64-bit integer holds ({INT64_MAX})"
    if not math.isfinite(value):
        return f"{value} is not a finite number"
    if abs(value) > FLOAT32_MAX or 0 < abs(value) < FLOAT32_TINY:
        return (
            f"{value!r} is beyond what a model's float32 numbers hold "
            f"(magnitudes from {FLOAT32_TINY:.2g} to {FLOAT32_MAX:.2g}, or 0)"
        )
    return None


def range_refusal(low, high, step=None) -> str | None:
    """Why ``low``..``high`` (by ``step``) cannot be searched, in words; None when it can (see ``number_refusal``)."""
    for what, value in (("low", low), ("high", high), ("step", step)):
        if value is not None and (reason := number_refusal(value)) is not None:
            return f"{what}: {reason}"
    if not math.isfinite(float(high) - float(low)):
        return f"the range {low}..{high} is wider than a float holds"
    if step is not None and not step > 0:  # by 0 the range never ends, and backwards it never starts
        return f"step must be above 0, got step={step}"
    return None


def one_of(*choices) -> Accepted:
    return Accepted(lambda value: value in choices, f"one of {', '.join(map(str, choices))}")


def kind(*types: type, description: str) -> Accepted:
    """Any value of these types (checked by the library that takes it)."""
    return Accepted(lambda value: isinstance(value, types), description)


NULL = Accepted(lambda value: value is None, "null")
BOOLEAN = kind(bool, description="true or false")
SEED = integer(0, SEED_MAX)

# The bounds of single values that the library's classes and the projects' take, as types jsonargparse checks where
# the value is parsed. A value it parsed is an instance of the type (an int or float still): KitArgumentParser gives
# the classes plain numbers, which a checkpoint's weights_only load reads back.
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


@dataclass(frozen=True)
class Together:
    """A rule over several arguments: ``test`` takes their values in the order of ``names``.

    ``requirement`` names arguments in angle brackets, ``"<num_heads> must divide <d_model>"``; the
    message shows each as its flag, then the values given of those in ``shown`` (by default,
    all). Where the requirement depends on the values, it is a function of them returning such a text.
    """

    names: tuple[str, ...]
    test: Callable[..., bool]
    requirement: str | Callable[..., str]
    shown: tuple[str, ...] | None = None


class Arguments:
    """A class's table of accepted values, and its rules over several arguments at once.

    Args:
        prefix: How a flag is written before the argument's name: ``--data.``.
        table: Each argument's accepted values. Arguments not in a values mapping are not checked.
        rules: Checked, in order, once every argument in the table is accepted.
        flags: Flags for arguments written otherwise than ``prefix + name`` (``{"devices": "--devices"}``).
    """

    def __init__(
        self,
        prefix: str,
        table: Mapping[str, Accepted],
        rules: Sequence[Together] = (),
        flags: Mapping[str, str] | None = None,
    ) -> None:
        self.prefix, self.table, self.rules, self.flags = prefix, dict(table), tuple(rules), dict(flags or {})

    def flag(self, name: str) -> str:
        return self.flags.get(name, f"{self.prefix}{name}")

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise a ``ConfigError`` naming the first argument in ``values`` that is not accepted, or rule not met."""
        for name, accepted in self.table.items():
            if name in values and is_integer(values[name]) and abs(values[name]) > INT64_MAX:
                raise ConfigError(
                    f"{self.flag(name)} {values[name]} is beyond what a 64-bit integer holds ({INT64_MAX})"
                )
            if name in values and not accepted.test(values[name]):
                raise ConfigError(f"{self.flag(name)} must be {accepted.description}, got {values[name]!r}")
        for rule in self.rules:
            if not all(name in values for name in rule.names):
                continue
            given = [values[name] for name in rule.names]
            if not rule.test(*given):
                requirement = rule.requirement if isinstance(rule.requirement, str) else rule.requirement(*given)
                named = _NAMED.sub(lambda found: self.flag(found[1]), requirement)
                got = [repr(values[name]) for name in rule.shown or rule.names]
                raise ConfigError(f"{named}, got {' and '.join(got)}")


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

    A plain ``nn.Module`` names its arguments rather than flags and raises a ``ValueError`` (``error``): the command
    line that built it names the flags given (``parser.constructor_failure``)."""
    available = available_memory()
    if available is None or needed <= available:
        return
    given = ", ".join(f"{flag} {value!r}" for flag, value in zip(flags, values, strict=True))
    raise error(
        f"{what} would need about {_size(needed)} of memory at {given}, "
        f"more than the {_size(available)} available: lower {' or '.join(flags)}"
    )


def _size(count: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


# Lightning's Trainer: the arguments it divides by, counts with or treats specially. Lightning
# checks some of these itself, others only deep inside a run (a division by zero), and names
# none as the flag a person typed.
# Lightning takes a float with an integer value (3.0) as that many batches.
_BATCHES = Accepted(
    lambda value: (is_integer(value) or (isinstance(value, float) and value.is_integer())) and value >= 0,
    "a whole number of batches",
)
_BATCH_LIMIT = NULL | _BATCHES | number(0, 1)
_NO_LIMIT = Accepted(lambda value: is_integer(value) and value == -1, "-1 (no limit)")
_ALL = Accepted(lambda value: is_integer(value) and value == -1, "-1 (all)")


def _devices(value) -> bool:
    """Lightning's ``devices``: a count, -1 (all), a string of them (``auto``, ``"0,1"``), or distinct indices."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value) == -1 or int(value) >= 1
    if isinstance(value, str):
        return not value.strip().startswith("-")  # "auto", "0,1": Lightning reads the rest
    if isinstance(value, list | tuple):
        indices = list(value)
        return bool(indices) and all(is_integer(i) and i >= 0 for i in indices) and len(set(indices)) == len(indices)
    return is_integer(value) and (value == -1 or value >= 1)


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
    return is_integer(devices) and devices >= 1


TRAINER = Arguments(
    "--trainer.",
    {
        # Any accelerator Lightning knows, checked by it (and accelerators.check_accelerator); here for the rules.
        "accelerator": Accepted(lambda value: True, "an accelerator"),
        "devices": Accepted(
            _devices, "a positive number of devices, -1 for all, auto, or a list of distinct device indices"
        ),
        "num_nodes": integer(1),
        "fast_dev_run": BOOLEAN | integer(0),
        "max_epochs": NULL | integer(1) | _NO_LIMIT,
        "min_epochs": NULL | integer(0),
        "max_steps": integer(1) | _NO_LIMIT,
        "min_steps": NULL | integer(0),
        "limit_train_batches": _BATCH_LIMIT,
        "limit_val_batches": _BATCH_LIMIT,
        "limit_test_batches": _BATCH_LIMIT,
        "limit_predict_batches": _BATCH_LIMIT,
        "overfit_batches": _BATCHES | number(0, 1),
        "val_check_interval": NULL
        | integer(1)
        | number(0, 1, low_open=True)
        | kind(str, dict, timedelta, description="a duration DD:HH:MM:SS"),
        "check_val_every_n_epoch": NULL | integer(1),
        "num_sanity_val_steps": NULL | integer(0) | _ALL,
        "log_every_n_steps": NULL | integer(1),
        "accumulate_grad_batches": integer(1),
        "gradient_clip_val": NULL | number(0),
        "gradient_clip_algorithm": NULL | one_of("value", "norm"),
        "reload_dataloaders_every_n_epochs": integer(0),
    },
    rules=(
        Together(
            ("min_epochs", "max_epochs"),
            lambda least, most: least is None or most in (None, -1) or least <= most,
            "<min_epochs> must be at most <max_epochs>",
        ),
        Together(
            ("accelerator", "devices"),
            _cpu_devices,
            "<devices> on the CPU is a number of processes, 1 or more (or auto): -1 (all) and lists of indices "
            "are for GPUs",
            shown=("devices",),
        ),
        Together(
            ("min_steps", "max_steps"),
            lambda least, most: least is None or most == -1 or least <= most,
            "<min_steps> must be at most <max_steps>",
        ),
    ),
    # The shortcuts people type (cli.TRAINER_SHORTCUTS).
    flags={name: f"--{name}" for name in ("accelerator", "devices", "num_nodes", "max_epochs")},
)
RUN = Arguments("--", {"seed_everything": BOOLEAN | SEED})
