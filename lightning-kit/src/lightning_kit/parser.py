"""The parser under ``KitCLI``: LightningCLI's, with shorter help and one-line errors, and the checks of what it
parsed: the Trainer's arguments, the values the data sets, and a class that refused its arguments (as it was built,
or once running) as one line naming the argument, its value and the class's own message."""

import inspect
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

from jsonargparse import DefaultHelpFormatter, Namespace, add_instantiator
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import Logger

from .arguments import SEED_MAX, TRAINER, check_trainer, is_integer
from .errors import (
    ConfigError,
    DataUnavailableError,
    NotBuiltError,
    RefusedArgumentError,
    UserError,
    exception_chain,
    nul_refusal,
)
from .passwords import hidden, scrubbed
from .upstream import jsonargparse as said


class HelpFormatter(DefaultHelpFormatter):
    """Lists only the project's classes as choices for ``--data`` and ``--model.net``, where jsonargparse lists every
    imported subclass: for ``--model.net``, hundreds of PyTorch's ``nn.Module``."""

    #: Where the project's choices live: argument -> module prefix (set per command line by ``building.make``).
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
    """LightningCLI's parser, with shorter help and one-line errors; what it writes out (``--print_config``, the
    run's ``config.yaml``) holds no password of a URL (``me:***@host``)."""

    #: Arguments whose default is a class by its path alone (``KitCLI.default_classes``).
    class_defaults: tuple[str, ...] = ()

    def get_defaults(self, *args, **kwargs) -> Namespace:
        """A default class by its path alone: a class chosen in its place (``--data their.Data``) starts from its own
        defaults, where jsonargparse would keep the default class's values for the arguments both take."""
        defaults = super().get_defaults(*args, **kwargs)
        for key in self.class_defaults:
            if isinstance(defaults.get(key), Namespace) and "class_path" in defaults[key]:
                defaults[key] = Namespace(class_path=defaults[key].class_path)
        return defaults

    def dump(self, *args, **kwargs) -> str:
        return scrubbed(super().dump(*args, **kwargs))

    def instantiate(self, namespace: Namespace, *args, **kwargs) -> Namespace:
        """Build the classes from plain numbers, not jsonargparse's bounded types (an ``int`` of the class
        ``BatchSize``), which hyperparameters would keep and a checkpoint's ``weights_only`` load refuse."""
        return super().instantiate(_plain_numbers(namespace), *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        """Exit with one line naming the flag, what it accepts and what was given."""
        if not self.exit_on_error:
            super().error(message, ex)  # raises: parsing inside jsonargparse, not the user's command line
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        required = said.REQUIRED.match(message.strip())
        named = {name.strip().rpartition(".")[2] for name in required[1].split(",")} if required else set()
        if named and named <= {"model", "data"}:
            # A command line with no classes of its own (GenericCLI) was given none to build.
            flags = " and ".join(f"--{name}" for name in sorted(named, reverse=True))
            needed = (
                f"{flags} {'is' if len(named) == 1 else 'are'} needed: the classes to build, by import path "
                "(--model your.Module, and --data your.DataModule unless the module has dataloaders of its own), a "
                "--config that names them, or the --ckpt_path of a checkpoint in a run folder's checkpoints/, whose "
                "config.yaml names them"
            )
            self.exit(2, f"error: {needed} (options: {prog} --help)\n")
        self.exit(2, f"error: {one_line(message)} (options: {prog} --help)\n")


def one_line(message: str) -> str:
    """jsonargparse's nested message as one line naming the flag (``--model.net.init_args.width: Expected a <class
    'int'>. Got value: x``); a number out of its type's bounds, ``--data.batch_size must be v>=1 ..., got 0``."""
    parts: list[str] = []
    for found in said.HEADINGS.finditer(message):
        # A class's arguments are under init_args, but for --model's and --data's own (--data.batch_size).
        parts += [found["key"]] if found["key"] else ["init_args"] if "." in ".".join(parts) else []
    while parts and parts[-1] == "init_args":  # the class path itself refused, not one of its arguments
        parts.pop()
    flag = f"--{'.'.join(parts)}"
    if parts and (refused := said.out_of_bounds(message)) is not None:
        return f"{flag} must be {refused[1]}, got {refused[0]}"
    text = said.HEADINGS.sub("", message)
    reasons = [line.strip(" -") for line in text.splitlines() if line.strip(" -") and not said.NOISE.search(line)]
    reason = " ".join(reasons) or message.strip()
    return f"{flag}: {reason}" if parts else reason


def _plain_numbers(value: Any) -> Any:
    """``value`` with every number of jsonargparse's bounded types made plain."""
    if isinstance(value, Namespace):
        return Namespace(**{key: _plain_numbers(item) for key, item in vars(value).items()})
    if type(value) in (list, tuple):
        return type(value)(map(_plain_numbers, value))
    if isinstance(value, dict):
        return {key: _plain_numbers(item) for key, item in value.items()}
    if said.is_bounded_number(value):  # not an IntEnum or another int of the user's own
        return int(value) if isinstance(value, int) else float(value)
    return value


def check_no_nul(named: Iterable[tuple[str, Any]]) -> None:
    """Refuse a value holding a NUL character, by its flag: given to Python's ``main([...])`` (no shell can pass one),
    or by a --config file (YAML's "\\0"). Checked before anything reads a file, not ValueError's traceback."""
    for flag, value in named:
        if (refusal := nul_refusal(flag if "\0" not in flag else "an argument", value)) is not None:
            raise ConfigError(refusal)


def check_run_arguments(config) -> None:
    """The Trainer's arguments, against ``arguments.TRAINER``; the seed; and ``--trainer.default_root_dir``, which
    Lightning ignores where the first logger has a folder of its own."""
    trainer, seed = config.trainer, config.get("seed_everything")
    check_trainer({name: trainer.get(name) for name in TRAINER if name in trainer})
    if not (isinstance(seed, bool) or seed is None or (is_integer(seed) and 0 <= seed <= SEED_MAX)):
        raise ConfigError(f"--seed_everything must be true, false or an integer from 0 to {SEED_MAX}, got {seed!r}")
    root, loggers = trainer.get("default_root_dir"), trainer.get("logger")
    first = loggers[0] if isinstance(loggers, list) and loggers else loggers
    arguments = first.get("init_args") if isinstance(first, Namespace | dict) else None
    save_dir = arguments.get("save_dir") if isinstance(arguments, Namespace | dict) else None
    if root is not None and save_dir is not None:
        raise ConfigError(
            f"--trainer.default_root_dir {root} is not used: the run is written under its logger's folder, "
            f"{save_dir}: give --trainer.logger.init_args.save_dir {root} instead"
        )


def check_given_against_data(config, datamodule, model: LightningModule, data_links: dict[str, str]) -> None:
    """A value given (other than the class's default) for an argument the data sets (``KitCLI.data_links``) that
    differs from the data's stops the run: the link would replace it without a word."""
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


# What a class raises when it refuses the value of an argument (a check of its own, or of PyTorch it calls).
REFUSALS = (ValueError, TypeError, AssertionError, RuntimeError, IndexError, KeyError, OverflowError)
# Words of a message about devices: the audit's business (a placement bug), never an argument's refusal.
_DEVICES = re.compile(r"\b(device|devices|cuda|simgpu|gpu)\b", re.IGNORECASE)


def given_arguments(config, model_class: type | None = None) -> dict[str, Any]:
    """The arguments given to the model's and the data's classes (and to the classes given as their arguments), by
    flag, where the value is not the class's default: ``{"--data.batch_size": 0, "--model.net.init_args.width": 8}``.
    ``model_class``: the model's class where the configuration names none."""
    return _configured(config, model_class)[0]


def _configured(config, model_class: type | None) -> tuple[dict[str, Any], dict[str, type]]:
    """The arguments given (``given_arguments``), and the classes the configuration builds, by key (``model.net``)."""
    given: dict[str, Any] = {}
    classes: dict[str, type] = {"model": model_class} if model_class is not None else {}

    def visit(node: Namespace, key: str, flag: str, cls: type | None) -> None:
        arguments = node
        if "class_path" in node:
            cls = _loaded_class(node.get("class_path"))
            arguments = node.get("init_args") or Namespace()
            # A class's arguments are under init_args, but for --model's and --data's own (--data.batch_size).
            flag = f"{flag}.init_args" if "." in key else flag
        if cls is not None:
            classes[key] = cls
        parameters = inspect.signature(cls).parameters if cls is not None else {}
        for name, value in vars(arguments).items() if isinstance(arguments, Namespace) else ():
            if isinstance(value, Namespace) and key.count(".") < 4:
                visit(value, f"{key}.{name}", f"{flag}.{name}", None)
                continue
            default = parameters.get(name)
            if default is None or default.default is inspect.Parameter.empty or not _same(value, default.default):
                given[f"{flag}.{name}"] = value

    for key, cls in (("model", model_class), ("data", None)):
        if isinstance(config.get(key), Namespace):
            visit(config.get(key), key, f"--{key}", cls)
    return given, classes


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # an array's comparison, say: not the same
        return False


def _loaded_class(class_path: Any) -> type | None:
    """The class ``class_path`` names, where its module is imported already (the parser imported it): never imports."""
    if not isinstance(class_path, str):
        return None
    module, _, name = class_path.rpartition(".")
    found = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def constructor_failure(err: BaseException, config, model_class: type | None = None) -> BaseException | None:
    """One line for ``err``, raised as the configuration's classes were built, in place of jsonargparse's nest: which
    argument the class refused (``RefusedArgumentError``), or what the class raised and where (``NotBuiltError``).
    None where no class of the configuration raised it (read from the traceback: the outermost ``__init__`` of one),
    or where it raised a one-line mistake itself."""
    root = exception_chain(err, context=False)[-1]
    if isinstance(root, UserError):
        return None
    given, classes = _configured(config, model_class)
    built = _class_being_built(root, classes)
    if built is None:
        return None
    key, cls = built
    given = {flag: value for flag, value in given.items() if _under(flag, key)}
    if not isinstance(root, REFUSALS) or not given:
        frame = traceback.extract_tb(root.__traceback__)[-1] if root.__traceback__ is not None else None
        where = f" (at {frame.filename}:{frame.lineno})" if frame is not None else ""
        return NotBuiltError(f"{cls.__module__}.{cls.__qualname__} could not be built: {_reason(root)}{where}")
    named = _named_in(_reason(root), given) or (given if len(given) == 1 else {})
    if named:
        return RefusedArgumentError(f"{_shown(named)}: {cls.__name__} refused {_it(named)}: {_reason(root)}")
    return RefusedArgumentError(
        f"--{key} ({cls.__module__}.{cls.__qualname__}) refused its arguments {_shown(given)}: {_reason(root)}"
    )


# What the loggers and callbacks raised as they were built, while noted: jsonargparse, trying each type of a union
# (the Trainer's ``logger: Logger | Iterable[Logger] | bool``), keeps only the message of each type's error.
_failures: ContextVar[list[tuple[type, dict[str, Any], Exception]] | None] = ContextVar("failures", default=None)


def _noted(cls: type, *args: Any, **kwargs: Any) -> Any:
    try:
        return cls(*args, **kwargs)
    except Exception as err:
        if (failures := _failures.get()) is not None:
            failures.append((cls, kwargs, err))
        raise


for _built in (Logger, Callback):  # jsonargparse's own hook (from 4.52), for every parser of the process alike
    add_instantiator(_noted, _built, subclasses=True)


@contextmanager
def noting_failures() -> Iterator[list[tuple[type, dict[str, Any], Exception]]]:
    """The class, arguments and error of each logger and callback that raises as it is built, within."""
    token = _failures.set([])
    try:
        yield _failures.get()
    finally:
        _failures.reset(token)


def noted_failure(failures: list[tuple[type, dict[str, Any], Exception]], config) -> BaseException | None:
    """One line for the last logger or callback of ``failures`` (``noting_failures``), naming its flag, the arguments
    given it and its error; a mistake it said in one line itself, as it was; None where there is none."""
    if not failures:
        return None
    cls, kwargs, err = failures[-1]
    if isinstance(err, UserError):
        return err
    parameters = inspect.signature(cls).parameters
    given = ", ".join(
        hidden(f"{name}={value!r}")  # a token=..., an api_key=..., a URL's password
        for name, value in kwargs.items()
        if name not in parameters or not _same(value, parameters[name].default)
    )
    flag = _flag_of(cls, config, [])
    return NotBuiltError(
        f"{flag + ': ' if flag else ''}{cls.__module__}.{cls.__qualname__}({given}) could not be built: {_reason(err)}"
    )


def _flag_of(cls: type, node: Any, keys: list[str]) -> str | None:
    """The flag of ``node``'s class spec (or a list's) that names ``cls``: ``--trainer.logger``."""
    for item in node if isinstance(node, list) else [node]:
        if not isinstance(item, Namespace) or len(keys) > 5:
            continue
        if _loaded_class(item.get("class_path")) is cls:
            return f"--{'.'.join(keys)}"
        for name, value in vars(item).items():
            if (flag := _flag_of(cls, value, [*keys, name])) is not None:
                return flag
    return None


def run_refusal(err: BaseException, config, stage: str, model_class: type | None = None) -> RefusedArgumentError | None:
    """One line for a run that stopped, once running, on a value given to the model or the data (a DataLoader's
    ``batch_size`` 0, an optimizer's negative learning rate); None otherwise."""
    root = exception_chain(err, context=False)[-1]
    if not isinstance(root, REFUSALS) or isinstance(root, UserError) or _DEVICES.search(str(root)):
        return None
    return _refusal(stage, _reason(root), given_arguments(config, model_class))


def named_refusal(stage: str, reason: str, given: dict[str, Any]) -> RefusedArgumentError | None:
    """``run_refusal`` for a stage that stopped for ``reason`` (``"ValueError: batch_size should be ..."``)."""
    if reason.partition(":")[0] not in {cls.__name__ for cls in REFUSALS}:
        return None
    return _refusal(stage, reason, given)


def _refusal(stage: str, reason: str, given: dict[str, Any]) -> RefusedArgumentError | None:
    """One line where ``reason`` names arguments of ``given`` by name or by a value that cannot be a coincidence (a
    negative number, a word), and says nothing of devices (a placement bug: the audit's business)."""
    named = _named_in(reason, given) if not _DEVICES.search(reason) else {}
    return RefusedArgumentError(f"{_shown(named)}: {stage} stopped on {_it(named)}: {reason}") if named else None


def empty_split(err: BaseException, stage: str) -> DataUnavailableError | None:
    """One line for a shuffled DataLoader made over no samples (PyTorch's sampler refuses it as it is made), naming
    the ``*_dataloader`` method that made it; None for any other error."""
    chain = exception_chain(err)
    if not any(isinstance(link, ValueError) and "num_samples=0" in str(link) for link in chain):
        return None
    frames = (frame for link in chain for frame in reversed(traceback.extract_tb(link.__traceback__)))
    made = next((frame for frame in frames if frame.name.endswith("_dataloader")), None)
    where = f"{made.name}() ({made.filename}:{made.lineno})" if made is not None else "a dataloader"
    return DataUnavailableError(
        f"{stage} stopped: {where} made a shuffled DataLoader over no samples (an empty split?): "
        "nothing to train or evaluate on"
    )


def _class_being_built(root: BaseException, classes: dict[str, type]) -> tuple[str, type] | None:
    """The key of the class whose ``__init__`` raised ``root``, and the class."""
    tb = root.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            for key, cls in classes.items():
                if type(frame.f_locals["self"]) is cls:
                    return key, cls
        tb = tb.tb_next
    return None


def _under(flag: str, key: str) -> bool:
    """Whether ``flag`` is an argument of the class at ``key`` itself (not of a class inside it)."""
    rest = flag.removeprefix(f"--{key}.")
    return rest != flag and "." not in rest.removeprefix("init_args.")


def _named_in(message: str, given: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``given`` (three at most) that ``message`` names: by name, or by a value that cannot be a
    coincidence (a negative number, a word)."""
    named = {}
    for flag, value in given.items():
        if _mentions(message, flag.rpartition(".")[2]) or (_telling(value) and _mentions(message, str(value))):
            named[flag] = value
    return dict(list(named.items())[:3])


def _mentions(message: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(text)}(?![\w])", message) is not None


def _telling(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value < 0
    return isinstance(value, str) and len(value.strip()) >= 3 and not value.strip().replace(".", "").isdigit()


def _shown(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{flag} {value!r}" if isinstance(value, str) else f"{flag} {value}" for flag, value in
                     arguments.items())  # fmt: skip


def _it(named: dict[str, Any]) -> str:
    return "it" if len(named) == 1 else "them"


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split()) or "(no message)"
    return f"{type(err).__name__}: {text[:300]}"
