"""A command line's arguments, read once: which flag each value belongs to, in one grammar.

Before jsonargparse parses a command line it imports the classes it names and reads the files it
passes, so what must be checked first (a class in a run folder, a configuration file too large
to read, a run's saved ``config.yaml``, the checkpoint asked for) is read from the arguments as
given. ``CommandLine`` reads them once, as argparse does: ``--flag value``, ``--flag=value``,
``-c value``; a value may start with one ``-`` (``--model.lr -3``), never with ``--``. Every
check takes it, so no other code walks the strings.
"""

from collections.abc import Iterable

# The flags that pass configuration files (or YAML text) to jsonargparse.
CONFIG_FLAGS = ("--config", "-c")


class CommandLine(tuple):
    """The arguments of a command line (a tuple of strings, as given), read once into spans: a flag with its value
    (``--flag value``, ``--flag=value``), a flag without one, or a value alone. What the command line passes on to
    jsonargparse is this same tuple."""

    spans: tuple[tuple[int, int, str | None, str | None], ...]  # (start, end, flag, value)

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
        line.spans = tuple(spans)
        return line

    @classmethod
    def of(cls, args: Iterable[str]) -> "CommandLine":
        """``args`` as a ``CommandLine``: itself where it is one already (read once, however often asked)."""
        return args if isinstance(args, cls) else cls(args)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """Each ``(flag, value)`` given, in order."""
        return [(flag, value) for _, _, flag, value in self.spans if flag is not None and value is not None]

    def values(self, *flags: str) -> list[str]:
        """The values given to ``flags`` (every flag's, for none), in order."""
        return [value for flag, value in self.pairs if not flags or flag in flags]

    def last(self, flag: str) -> str | None:
        """The last value given to ``flag``; None when it is not given a value."""
        given = self.values(flag)
        return given[-1] if given else None

    def gives(self, *flags: str) -> bool:
        """Whether any of ``flags`` is given, with or without a value (``--config``, ``--config=x``)."""
        return any(flag in flags for _, _, flag, _ in self.spans)

    def config_values(self) -> list[str]:
        """What ``--config`` and ``-c`` are given: files, or YAML text typed by the person."""
        return self.values(*CONFIG_FLAGS)

    def named(self) -> list[tuple[str, str]]:
        """Each argument with what names it, for messages: its flag (``an argument`` for a value of none)."""
        return [(flag or "an argument", arg) for start, end, flag, _ in self.spans for arg in self[start:end]]

    def split(self, taken) -> tuple[list[str | None], "CommandLine"]:
        """The values of the flags for which ``taken(flag, value)`` is true (None for such a flag given no value),
        and this command line without them."""
        values, kept = [], []
        for start, end, flag, value in self.spans:
            if flag is not None and taken(flag, value):
                values.append(value)
            else:
                kept += self[start:end]
        return values, CommandLine(kept)
