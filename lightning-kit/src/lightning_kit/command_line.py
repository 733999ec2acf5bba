"""A command line's arguments, read once into which flag each value belongs to.

jsonargparse imports the classes a command line names and reads the files it passes as it parses, so what must be
checked first (a class, a configuration file, a run's saved ``config.yaml``, the checkpoint) is read from the
arguments as given, in argparse's grammar: ``--flag value``, ``--flag=value``, ``-c value``; a value may start with
one ``-`` (``--model.lr -3``), never with ``--``.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The flags that pass configuration files (or YAML text) to jsonargparse.
CONFIG_FLAGS = ("--config", "-c")


class CommandLine(tuple):
    """The arguments as given (a tuple of strings), with their spans: ``(start, end, flag, value)``, flag or value
    None for a value alone or a flag without one."""

    spans: tuple[tuple[int, int, str | None, str | None], ...]
    #: The settings of the ``--config`` files given, by path, as ``trust.read_given`` read each: once.
    read: dict[Path, Any]

    def __new__(cls, args: Iterable[str] = ()) -> "CommandLine":
        line = super().__new__(cls, args)
        spans, position = [], 0
        while position < len(line):
            arg = line[position]
            if not arg.startswith("-"):
                spans.append((position, position + 1, None, arg))
            elif "=" in arg:
                spans.append((position, position + 1, *arg.split("=", 1)))
            elif position + 1 < len(line) and not line[position + 1].startswith("--"):
                spans.append((position, position + 2, arg, line[position + 1]))
                position += 1
            else:
                spans.append((position, position + 1, arg, None))
            position += 1
        line.spans, line.read = tuple(spans), {}
        return line

    @classmethod
    def of(cls, args: Iterable[str]) -> "CommandLine":
        """``args`` as a ``CommandLine``, itself where it is one: read once, however often asked."""
        return args if isinstance(args, cls) else cls(args)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(flag, value) for _, _, flag, value in self.spans if flag is not None and value is not None]

    def values(self, *flags: str) -> list[str]:
        """The values given to ``flags`` (to every flag, for none), in order."""
        return [value for flag, value in self.pairs if not flags or flag in flags]

    def last(self, flag: str) -> str | None:
        return next(reversed(self.values(flag)), None)

    def gives(self, *flags: str) -> bool:
        """Whether any of ``flags`` is given, with or without a value."""
        return any(flag in flags for _, _, flag, _ in self.spans)

    def named(self) -> list[tuple[str, str]]:
        """Each argument with its flag, for messages (``an argument`` for a value of none)."""
        return [(flag or "an argument", arg) for start, end, flag, _ in self.spans for arg in self[start:end]]

    def split(self, taken) -> tuple[list[str | None], "CommandLine"]:
        """The values of the flags for which ``taken(flag, value)`` holds, and this command line without them."""
        values, kept = [], []
        for start, end, flag, value in self.spans:
            if flag is not None and taken(flag, value):
                values.append(value)
            else:
                kept += self[start:end]
        rest = CommandLine(kept)
        rest.read = self.read  # its files were given here: read already
        return values, rest
