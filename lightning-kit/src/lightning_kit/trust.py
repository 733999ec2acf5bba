"""Which code a configuration or a checkpoint may make this project import: decided before anything is imported.

A run folder (its ``config.yaml``, its checkpoints) and a data folder are data. The class paths they name are
imported only from the project's own package, this library or one it is built on (``BUILT_ON``), a module named on
the command line or in a ``--config`` file outside a run folder, or one the project trusts (``trusted_modules``).
Code in a run or data folder is never imported, even when named: a shared run folder must not run code by being
evaluated. Where a module lives is found without importing it (no ``__init__.py`` runs).
"""

import importlib.util
import pkgutil
import re
from collections.abc import Iterable, Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import yaml

from .command_line import CONFIG_FLAGS, CommandLine
from .config_files import SUFFIXES, is_config_file, read_config, read_config_file
from .errors import ConfigError, UserError

# The package of the command line running and its KitCLI.trusted_modules (check_command_line).
_trusted: list[str] = []
# The modules of the classes the command line running names (check_command_line): trusted for it alone.
_named: set[str] = set()

# Their classes (loggers, callbacks, optimizers) appear in every run's config.
BUILT_ON = ("lightning", "torch", "torchvision", "torchmetrics")

# Folders that hold runs and data (relative to where the command runs): never code.
DATA_FOLDERS = ("runs", "data")
# Keys whose values name a folder of runs or data.
_FOLDER_KEYS = ("save_dir", "data_dir", "root", "default_root_dir")
_CLASS_KEYS = ("class_path", "_class_path", "_instantiator")
# A dotted name, as jsonargparse imports one: ``package.module.Class``.
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class UntrustedCodeError(UserError):
    """A configuration or a checkpoint names code that may not be imported."""


def check_trusted(settings: Any, source: str | Path, folders: Iterable[Path] = ()) -> None:
    """Raise ``UntrustedCodeError`` unless every module ``settings`` (data from ``source``) would import may be;
    ``folders``: further run or data folders."""
    # Folders of runs and data that ``settings`` names (a logger's save_dir, a data module's data_dir).
    given = [table.get(key) for _, table in _walk(settings) if isinstance(table, dict) for key in _FOLDER_KEYS]
    kept_out = _kept_out_folders([*folders, *(Path(value) for value in given if isinstance(value, str) and value)])
    trusted = (__package__, *BUILT_ON, *_trusted)
    for keys, name in _dotted_strings(settings):
        found = _locate(name)
        if found is None:
            continue  # nothing importable by that name: no code would run
        module, places = found
        inside = next((folder for folder in kept_out for place in places if place.is_relative_to(folder)), None)
        if inside is not None:
            raise UntrustedCodeError(
                f"{source} names {name}, code in the run or data folder {_shown(inside)}: refused, nothing was "
                "imported (code in a run or data folder is never imported: move the module out of it, into the "
                f"project's package, and name its class with {_flag(keys)})"
            )
        if module not in _named and not any(f"{module}.".startswith(f"{package}.") for package in trusted):
            raise UntrustedCodeError(
                f"{source} names code outside this project ({name}): refused, nothing was imported. If you trust "
                f"it, name it on the command line ({_flag(keys)} {name}) or add {module!r} to the trusted_modules "
                "of the project's KitCLI, or to packages in [tool.lightning-kit] of its pyproject.toml"
            )


def check_command_line(args: Iterable[str], trusted: Iterable[str]) -> tuple[list[Path], CommandLine]:
    """Check, before it is parsed, the classes the command line names and the files it gives; for the rest of its
    run, trust the modules it names and ``trusted`` (and those below each), not what the previous command line in the
    process trusted. The ``--config`` files that are a run's saved settings, and the command line without them."""
    _trusted[:] = dict.fromkeys(trusted)
    _named.clear()
    line = CommandLine.of(args)
    configs, values = {}, []
    for flag, value in line.pairs:
        try:
            values.append(yaml.safe_load(value))  # --data '{class_path: x.Y}' is a dict
        except yaml.YAMLError:
            values.append(value)
        if not is_config_file(value):  # a value of --config that is not a file is YAML text, typed by the person
            continue
        if flag in CONFIG_FLAGS:
            configs[Path(value)] = read_config(Path(value))
            if configs[Path(value)] is None:  # not jsonargparse's "Unexpected config: " with nothing after it
                raise ConfigError(f"{flag} {value} is empty: give a YAML file of settings, one `key: value` a line")
        # Any other file jsonargparse would read: a whole group's or class's (--data: no dot), or a .yaml/.json.
        elif flag != "--ckpt_path" and not Path(value).is_dir() and ("." not in flag or value.endswith(SUFFIXES)):
            read_config_file(Path(value))  # too large, not text, or expanding without end: refused before being read
    # One in a run folder is data like any other file of the run: what it names is not named by the person.
    run_configs = [path for path in configs if in_run_folder(path)]
    named = [values, *(settings for path, settings in configs.items() if path not in run_configs)]
    _named.update(found[0] for _, name in _dotted_strings(named) if (found := _locate(name)) is not None)
    check_trusted(values, "the command line")
    for path, settings in configs.items():
        check_trusted(settings, path, [path.parent] if path in run_configs else [])
    _, rest = line.split(lambda flag, value: flag in CONFIG_FLAGS and value is not None and Path(value) in run_configs)
    return run_configs, rest


def read_run_config(path: Path) -> dict:
    """A run's saved ``config.yaml``, read as data and checked: what it names is imported only where
    ``check_trusted`` admits it (the command line naming it, say)."""
    settings = read_config(path) or {}
    check_trusted(settings, path, [path.parent])
    return settings


def in_run_folder(path: Path) -> bool:
    """Whether ``path`` is in a folder of runs or data, or beside a run's checkpoints or logged hyperparameters."""
    folder = path.resolve().parent
    if any(folder.is_relative_to(root) for root in _kept_out_folders()):
        return True
    return (folder / "checkpoints").is_dir() or (folder / "hparams.yaml").is_file()


def _kept_out_folders(extra: Iterable[Path] = ()) -> list[Path]:
    """The run and data folders, resolved: ``runs/`` and ``data/`` where the command runs, and ``extra``."""
    folders = [Path(name) for name in DATA_FOLDERS] + [Path(folder) for folder in extra]
    cwd = Path.cwd().resolve()
    # A run folder that holds the working folder (a checkpoint given as checkpoints/last.ckpt) is not kept out whole.
    return [resolved for resolved in (folder.resolve() for folder in folders) if not cwd.is_relative_to(resolved)]


def _locate(name: str) -> tuple[str, list[Path]] | None:
    """The deepest module that importing ``name`` would run, and every file and folder it would read, found without
    importing; None where it would run no code (nothing by that name, or only namespace folders: ``data.csv``)."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    module, specs = parts[0], [spec]
    for part in parts[1:]:
        if spec.submodule_search_locations is None:
            break
        child = _find_in(f"{module}.{part}", list(spec.submodule_search_locations))
        if child is None:
            break
        module, spec = f"{module}.{part}", child
        specs.append(child)
    if not any(found.origin not in (None, "namespace") for found in specs):
        return None
    places = [Path(found.origin).resolve() for found in specs if found.has_location and found.origin]
    places += [Path(location).resolve() for found in specs for location in found.submodule_search_locations or ()]
    return module, places


def _find_in(name: str, locations: list[str]) -> ModuleSpec | None:
    """The spec of the module ``name`` in a package's ``locations``, without importing (``PathFinder.find_spec`` needs
    the parent package imported when ``name`` is a namespace package)."""
    portions = []
    for location in locations:
        finder = pkgutil.get_importer(location)
        spec = finder.find_spec(name) if finder is not None and hasattr(finder, "find_spec") else None
        if spec is not None and spec.loader is not None:
            return spec
        if spec is not None:
            portions += spec.submodule_search_locations or []
    if not portions:
        return None
    namespace = ModuleSpec(name, None, is_package=True)
    namespace.submodule_search_locations = portions
    return namespace


def _walk(value: Any) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each value inside ``value``, with the keys that lead to it (``init_args`` and class keys not counted); shared
    objects (YAML anchors) entered once, so nested aliases cannot make this walk explode."""
    seen: set[int] = set()
    stack: list[tuple[tuple[str, ...], Any]] = [((), value)]
    while stack:
        keys, value = stack.pop()
        yield keys, value
        if isinstance(value, dict | list | tuple) and id(value) not in seen:
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
            for key, item in items:
                inner = keys if key is None or key in _CLASS_KEYS or key == "init_args" else (*keys, str(key))
                stack.append((inner, item))


def _dotted_strings(value: Any) -> Iterator[tuple[tuple[str, ...], str]]:
    """Each ``(keys, string)`` in ``value`` that jsonargparse could import: class paths and any other dotted name."""
    for keys, found in _walk(value):
        if isinstance(found, str) and _DOTTED.fullmatch(found.strip()):
            yield keys, found.strip()


def _flag(keys: tuple[str, ...]) -> str:
    """The flag that names a class at ``keys``: ``--data``, ``--model.net``; in a checkpoint, its section's."""
    sections = {"hyper_parameters": ("model",), "datamodule_hyper_parameters": ("data",)}
    if keys and keys[0] in sections:
        keys = sections[keys[0]] + keys[1:]
    return f"--{'.'.join(keys)}" if keys else "--data"


def _shown(path: Path) -> str:
    """``path`` relative to the working folder where it is inside it, for a shorter line."""
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    return str(resolved.relative_to(cwd)) if resolved.is_relative_to(cwd) else str(path)
