"""The project a command runs for: the nearest ``pyproject.toml`` up, read with bounds and the standard library only
(``installation`` reads it where the library's requirements are missing): the library it requires, and
``[tool.lightning-kit]``, which configures the library's commands (README).
"""

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, first_line
from .files import NotAFileError, open_regular

FILE = "pyproject.toml"
TABLE = "lightning-kit"  # [tool.lightning-kit]
DISTRIBUTION = "lightning-kit"
MAX_BYTES = 1 << 20
# How far up from a folder a project's file is looked for (a package in src/<name>/ finds it two folders up).
MAX_LEVELS = 32
# The library's name at the start of a requirement (PEP 503); the rest is parsed by hand, in one pass: a pattern of
# the whole requirement backtracked for minutes on a line of blanks.
_NAME = re.compile(r"lightning[-_.]kit(?![\w.-])", re.IGNORECASE)
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_SETTINGS = {"packages", "monitor", "mode"}


@dataclass(frozen=True)
class ProjectFile:
    """A project's ``pyproject.toml``: where it is, the library it requires, and its ``[tool.lightning-kit]``."""

    path: Path
    name: str | None = None  # [project].name
    requirement: str | None = None  # the first requirement of the library: its dependency, else an extra's
    url: str | None = None  # the URL it names the library by (git+https://...@<commit>, file:///...)
    specifier: str | None = None  # or the version specifier it names (>=0.1,<0.2)
    # [tool.lightning-kit], checked: the packages trusted as the project's, the metric monitored and its mode.
    packages: tuple[str, ...] = ()
    monitor: tuple[str, str] | None = None


def find_project(start: str | Path | None = None) -> ProjectFile | None:
    """The project of ``project_file(start)``; None where there is none or it cannot be read (``read_project``)."""
    path = project_file(start)
    try:
        return read_project(path) if path is not None else None
    except (ConfigError, OSError):
        return None


def project_file(start: str | Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` (default: cwd) not inside a project's runs/ or data/."""
    try:
        folder = Path(start if start is not None else os.getcwd()).resolve()
    except OSError:  # the working folder was removed
        return None
    folders = [folder, *folder.parents][:MAX_LEVELS]
    for position, candidate in enumerate(folders):
        if os.path.isfile(candidate / FILE) and not any(
            above.name in ("runs", "data") and os.path.isfile(above.parent / FILE) for above in folders[position:]
        ):
            return candidate / FILE
    return None


def read_project(path: Path) -> ProjectFile:
    """``path`` read as a project's file; ``ConfigError`` in one line naming it and what is wrong."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the library requires tomli there
        import tomli as tomllib
    try:
        with open_regular(path) as file:  # a FIFO is refused, never waited on
            data = file.read(MAX_BYTES + 1)
    except NotAFileError as err:
        raise ConfigError(str(err)) from err
    except OSError as err:
        raise ConfigError(f"{path} cannot be read ({first_line(err)})") from err
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path} is over {MAX_BYTES >> 20} MiB: no project's pyproject.toml is that large")
    try:
        content = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ConfigError(f"{path} is not TOML: {first_line(err)}") from err
    project = content.get("project") if isinstance(content.get("project"), dict) else {}
    tool = content.get("tool") if isinstance(content.get("tool"), dict) else {}
    name = project.get("name") if isinstance(project.get("name"), str) else None
    extras = project.get("optional-dependencies")
    groups = [project.get("dependencies"), *(extras.values() if isinstance(extras, dict) else ())]
    requirement = url = specifier = None  # the library's first requirement whose marker holds here
    for text in (text for group in groups if isinstance(group, list) for text in group if isinstance(text, str)):
        if (found := library_requirement(text)) is not None and marker_applies(found[2]):
            requirement, (url, specifier, _) = text.strip(), found
            break
    return ProjectFile(path, name, requirement, url, specifier, *_settings(path, tool.get(TABLE)))


def library_requirement(text: str) -> tuple[str | None, str | None, str] | None:
    """A PEP 508 requirement of the library as ``(url, specifier, marker)``; None for another package or none."""
    requirement, _, marker = text.partition(";")
    head = requirement.strip()
    if (named := _NAME.match(head)) is None:
        return None
    rest = head[named.end() :].lstrip()
    if rest.startswith("["):
        _, closed, rest = rest.partition("]")
        if not closed:
            return None
        rest = rest.lstrip()
    if rest.startswith("@"):
        url = rest[1:].strip()
        return (url, None, marker.strip()) if url and not any(part.isspace() for part in url) else None
    return None, rest or None, marker.strip()


def marker_applies(marker: str) -> bool:
    """Whether a requirement's environment marker holds here, by ``packaging``; one it cannot read is taken to."""
    if not marker.strip():
        return True
    try:
        from packaging.markers import InvalidMarker, Marker
    except ModuleNotFoundError:  # installed with --no-deps: Python's version, the one kind the library writes, is read
        found = re.fullmatch(r"\s*python_version\s*(<|<=|>=|>)\s*['\"](\d+)\.(\d+)['\"]\s*", marker)
        if found is None:
            return True
        here, there = sys.version_info[:2], (int(found[2]), int(found[3]))
        return {"<": here < there, "<=": here <= there, ">=": here >= there, ">": here > there}[found[1]]
    try:
        return Marker(marker).evaluate()
    except (InvalidMarker, ValueError, TypeError):
        return True


def _settings(path: Path, table: Any) -> tuple[tuple[str, ...], tuple[str, str] | None]:
    """``[tool.lightning-kit]``'s packages and monitor, each checked: one line naming the key and what it takes."""
    if table is None:
        return (), None
    where = f"{path}: [tool.{TABLE}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table of settings")
    if unknown := sorted(set(table) - _SETTINGS):
        raise ConfigError(f"{where} has no setting {unknown[0]!r}: it takes {', '.join(sorted(_SETTINGS))}")
    packages = table.get("packages", [])
    if not isinstance(packages, list) or not all(isinstance(p, str) and _MODULE.fullmatch(p) for p in packages):
        raise ConfigError(f'{where} packages must be a list of module names, such as ["forecaster"]')
    monitor = table.get("monitor")
    if monitor is not None and not (isinstance(monitor, str) and monitor.strip()):
        raise ConfigError(f'{where} monitor must be the name of a logged metric, such as "val/loss"')
    mode = table.get("mode")
    if mode is None and monitor is not None:
        # No default: Lightning's is "min", a KitCLI's "max"; a guess keeps the worst checkpoint of half the metrics.
        raise ConfigError(f'{where} monitor needs mode: "min" for a loss or an error, "max" for an accuracy')
    if mode is not None and mode not in ("min", "max"):
        raise ConfigError(f'{where} mode must be "min" or "max", got {mode!r}')
    if mode is not None and monitor is None:
        raise ConfigError(f"{where} mode says how to judge the monitored metric: give monitor too")
    return tuple(packages), (monitor.strip(), mode) if monitor else None
