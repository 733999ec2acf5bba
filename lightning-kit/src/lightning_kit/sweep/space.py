"""The search space: a YAML file keyed by train.py's own flags, each a range or a list of choices (``sweep --help``).

Checked before any trial runs, each key and value by building what train.py would build with them (not training).
"""

import contextlib
import difflib
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.cli import SaveConfigCallback
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import Trial

from ..building import build_all
from ..cli import KitCLI
from ..command_line import CommandLine
from ..config_files import read_config_file
from ..errors import ConfigError

RANGE_KEYS = ("low", "high", "log", "step")
# What a float32 (a model's precision) holds: a value past these becomes infinity, or zero.
FLOAT32_MAX, FLOAT32_TINY = 3.4028234663852886e38, 1.1754943508222875e-38
# What a sweep sets itself for every trial, or that would make a trial more than one process.
NOT_SEARCHED = ("trainer.logger", "ckpt_path", "config", "data.fold", "trainer.devices", "trainer.num_nodes")


class SearchSpace:
    """Each flag searched (``model.lr``) and its Optuna distribution, in the file's order."""

    def __init__(self, path: Path, distributions: dict[str, BaseDistribution], text: str | None = None) -> None:
        self.path, self.distributions, self.text = path, distributions, text  # the text is recorded with the study

    @classmethod
    def read(cls, path: str | Path) -> "SearchSpace":
        """The space in the YAML file ``path``; a file that is not one stops with one line naming it and the key."""
        path = Path(path)
        text = read_config_file(path)
        try:
            settings = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not YAML: {' '.join(str(err).split())}") from None
        except ValueError as err:  # a key given twice; a date past the calendar
            raise ConfigError(f"{path}: {err}") from None
        if not isinstance(settings, dict) or not settings:
            raise ConfigError(
                f"{path} must map fit's flags to ranges or lists of choices, e.g. 'model.lr: [0.01, 0.001]'"
            )
        distributions = {str(key): _distribution(path, str(key), value) for key, value in settings.items()}
        return cls(path, distributions, text)

    def suggest(self, trial: Trial) -> dict[str, Any]:
        """Each flag's value for ``trial``, drawn by the study's sampler (or the trial's own, when retried)."""
        values = {}
        for name, d in self.distributions.items():
            if isinstance(d, CategoricalDistribution):
                values[name] = trial.suggest_categorical(name, d.choices)
            else:
                suggest = trial.suggest_int if isinstance(d, IntDistribution) else trial.suggest_float
                values[name] = suggest(name, d.low, d.high, log=d.log, step=d.step)
        return values

    def check(self, cli_class: type[KitCLI], train_args: Sequence[str], known: set[str]) -> None:
        """Refuse, in one line naming the key, a flag train.py does not take or a value it would not accept.

        What train.py builds is built with every choice of each list and both ends of each range: together first,
        then one at a time to name the key when together they fail.
        """
        given = {flag[2:] for flag, _ in CommandLine(train_args).pairs}
        for name in self.distributions:
            if name in given:
                raise ConfigError(f"{self.path}: {name} is searched, and given as --{name} too: leave one of them")
            if name.startswith(NOT_SEARCHED):
                raise ConfigError(f"{self.path}: {name}: the sweep sets it (not searched: {', '.join(NOT_SEARCHED)})")
        classes = [name for name, d in self.distributions.items() if isinstance(d, CategoricalDistribution)]
        for name in self.distributions:
            if known and _plain(name) not in known and not any(name.startswith(f"{chosen}.") for chosen in classes):
                close = difflib.get_close_matches(_plain(name), sorted(known), n=1)
                hint = f"did you mean {close[0]}?" if close else f"see {cli_class.command} --help"
                raise ConfigError(f"{self.path}: {name} is not an argument of {cli_class.command}: {hint}")
        options = {
            name: list(d.choices) if isinstance(d, CategoricalDistribution) else [d.low, d.high]
            for name, d in self.distributions.items()
        }
        count = max(len(values) for values in options.values())
        for corner in ({name: values[k % len(values)] for name, values in options.items()} for k in range(count)):
            if refusal(cli_class, train_args, corner) is None:
                continue
            for name, value in corner.items():
                if (reason := refusal(cli_class, train_args, {name: value})) is not None:
                    raise ConfigError(f"{self.path}: {name}: {_flag_value(value)} is refused: {reason}")
            shown = ", ".join(f"{name}={_flag_value(value)}" for name, value in corner.items())
            raise ConfigError(
                f"{self.path}: the values {shown} are refused together: {refusal(cli_class, train_args, corner)}"
            )


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (``safe_load`` keeps the last, silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *defaults``: the keys given beside it override the merged ones, as meant
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise ValueError(f"{key} is given twice (lines {seen[key]} and {line}): keep one of them")
                seen[key] = line
            except TypeError:  # a key that cannot be one: the base loader says so
                break
        return super().construct_mapping(node, deep=deep)


def flags(values: dict[str, Any]) -> list[str]:
    """train.py's flags for ``values``: ``{"model.lr": 0.01}`` -> ``["--model.lr", "0.01"]``."""
    return [item for name, value in values.items() for item in (f"--{name}", _flag_value(value))]


def _flag_value(value: Any) -> str:
    """A value as the command line takes it: ``null``, ``true``, ``0.001`` (a float's repr), a string as it is."""
    return value if isinstance(value, str) else json.dumps(value)


def _distribution(path: Path, name: str, value: Any) -> BaseDistribution:
    """The Optuna distribution that ``value`` describes for the key ``name`` (Optuna's refuses a bad range)."""
    accepted = "a list of choices, or {low: ..., high: ...} with log: true or step: ... if wanted"
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{path}: {name}: the list of choices is empty; accepted: {accepted}")
        if not all(choice is None or isinstance(choice, bool | int | float | str) for choice in value):
            raise ConfigError(f"{path}: {name}: each choice must be a number, a string, true, false or null")
        if (reason := next(filter(None, map(_number_refusal, value)), None)) is not None:
            raise ConfigError(f"{path}: {name}: a choice is refused: {reason}")
        if len(set(map(repr, value))) < len(value):
            raise ConfigError(f"{path}: {name}: a choice is listed twice: {value}")
        return CategoricalDistribution(value)
    if not isinstance(value, dict) or not {"low", "high"} <= value.keys() or value.keys() - set(RANGE_KEYS):
        raise ConfigError(f"{path}: {name}: {value!r} is not a range; accepted: {accepted}")
    low, high, log, step = (value.get(key) for key in RANGE_KEYS)
    numbers = {"low": low, "high": high, **({"step": step} if step is not None else {})}
    if not all(isinstance(n, int | float) and not isinstance(n, bool) and math.isfinite(n) for n in numbers.values()):
        raise ConfigError(f"{path}: {name}: low, high and step must be finite numbers, got {value}")
    for what, number in numbers.items():
        if (reason := _number_refusal(number)) is not None:
            raise ConfigError(f"{path}: {name}: {what}: {reason}")
    if not isinstance(log, bool | None):
        raise ConfigError(f"{path}: {name}: log must be true or false, got {log!r}")
    integer = all(isinstance(n, int) for n in numbers.values())
    try:
        kind = IntDistribution if integer else FloatDistribution
        return kind(low, high, log=bool(log), step=step if step is not None or not integer else 1)
    except ValueError as err:
        raise ConfigError(f"{path}: {name}: {' '.join(str(err).split())}") from None


def _number_refusal(value: Any) -> str | None:
    """Why ``value`` cannot be a number a model computes with (float32, or a 64-bit integer); None when it can."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return None if abs(value) <= 2**63 - 1 else f"{value} is beyond what a 64-bit integer holds"
    if not math.isfinite(value):
        return f"{value} is not a finite number"
    if abs(value) > FLOAT32_MAX or 0 < abs(value) < FLOAT32_TINY:
        return f"{value!r} is beyond what a model's float32 numbers hold (magnitudes from 1.2e-38 to 3.4e+38, or 0)"
    return None


def argument_names(trainer: L.Trainer) -> set[str]:
    """The flags (without dashes) that train.py took to build ``trainer``, from its SaveConfigCallback's config."""
    saver = next((c for c in trainer.callbacks if isinstance(c, SaveConfigCallback)), None)
    return {_plain(key).removesuffix(".class_path") for key in (saver.config.keys() if saver is not None else ())}


def _plain(name: str) -> str:
    """``name`` without ``init_args``, which the command line lets one leave out: ``data.batch_size``."""
    return ".".join(part for part in name.split(".") if part != "init_args")


def refusal(cli_class: type[KitCLI], train_args: Sequence[str], values: dict[str, Any]) -> str | None:
    """Why train.py refuses ``train_args`` with ``values``, in its own words; None when it takes them."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            build_all(cli_class, [*train_args, *flags(values)])
    except SystemExit as stop:
        message = stop.code if isinstance(stop.code, str) else captured.getvalue()
        return message.strip().removeprefix("error: ")
    return None
