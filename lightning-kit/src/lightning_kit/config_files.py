"""Configuration files read as data with bounds: a file too large, not text, or expanding without end is refused.

Nine YAML aliases of nine aliases, a few lines deep, stand for billions of values ("billion laughs"), which the
command line would copy and print without end: every YAML text jsonargparse loads is counted before it expands.
"""

from pathlib import Path
from typing import Any

import yaml
from jsonargparse import get_loader, set_loader

from .errors import ConfigError, UserError, first_line
from .files import NotAFileError, open_regular

# A configuration holds settings: a few kilobytes. The bounds leave room for long lists (class names).
MAX_BYTES = 1 << 20
MAX_VALUES = 100_000
SUFFIXES = (".yaml", ".yml", ".json")
# Nesting deeper than this is no configuration, and PyYAML's recursive composer would overflow on it.
MAX_DEPTH = 100


def read_config_file(path: Path) -> str:
    """The text of the configuration file ``path``, refused in one line naming it if too large or not text."""
    try:
        with open_regular(path) as file:  # a FIFO or device is refused, never waited on
            data = file.read(MAX_BYTES + 1)
    except NotAFileError as err:
        raise ConfigError(f"configuration file {path} is {err.kind}, not a regular file: give a YAML file") from None
    except OSError as err:
        raise ConfigError(f"configuration file {path} cannot be read ({err.strerror or err})") from err
    if len(data) > MAX_BYTES:
        raise ConfigError(f"configuration file {path} is over {MAX_BYTES >> 20} MiB, more than a configuration holds")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        raise ConfigError(f"configuration file {path} is not a text file: give a YAML file")
    check_yaml(text, str(path))
    return text


def read_config(path: Path) -> Any:
    """A configuration file as data; a FIFO or device is refused unopened."""
    try:
        return yaml.safe_load(read_config_file(path))  # refused unread when too large, not text, or expanding
    except yaml.YAMLError as err:  # (not UTF-8: refused as not text)
        raise UserError(f"--config {path} cannot be read as YAML: {first_line(err)}") from err


def is_config_file(value: str) -> bool:
    """Whether ``value`` names something there, not YAML text."""
    try:
        return "\n" not in value and Path(value).exists()
    except (OSError, ValueError):  # a name too long or with a NUL: YAML text
        return False


def check_yaml(text: str, source: str) -> None:
    """Refuse YAML ``text`` that is too large, nests too deep, or whose aliases expand too far: composed (aliases
    kept as references), never constructed, so counting takes time in the size of the text."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{source} is over {MAX_BYTES >> 20} MiB, more than a configuration holds")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError as err:
        raise ConfigError(f"{source} nests deeper than a configuration does ({MAX_DEPTH} levels)") from err
    except yaml.YAMLError:
        return  # not YAML: the loader reports it
    if node is not None and _expanded(node, {}, 0, source) > MAX_VALUES:
        raise ConfigError(
            f"{source}: its aliases (*name) expand to over {MAX_VALUES} values, more than a configuration holds"
        )


def _expanded(node: yaml.Node, counted: dict[int, int], depth: int, source: str) -> int:
    """The number of values ``node`` stands for once every alias in it is expanded."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"{source} nests deeper than a configuration does ({MAX_DEPTH} levels)")
    if id(node) in counted:
        return counted[id(node)]
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded(item, counted, depth + 1, source) for item in node.value)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            total += _expanded(key, counted, depth + 1, source) + _expanded(value, counted, depth + 1, source)
    counted[id(node)] = total = min(total, MAX_VALUES + 1)  # past the bound, the count no longer matters
    return total


def bound_yaml_loading() -> None:
    """Make jsonargparse check every YAML text before loading it with its own loader; once, however often called."""
    load = get_loader("yaml")
    if getattr(load, "__name__", "") == "load_yaml":
        return

    def load_yaml(text: str, path: str = "") -> Any:
        check_yaml(text, path or "a YAML value")
        return load(text)

    set_loader("yaml", load_yaml, exceptions=(yaml.YAMLError,))
