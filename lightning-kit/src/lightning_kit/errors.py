"""Mistakes a user can fix: the command line shows each as one line, ``error: ...``, not a traceback."""

import argparse
import signal
import sys


class UserError(Exception):
    """Something the user can fix: a flag, a file, the data or the machine. Its message says what and how."""


class DataUnavailableError(UserError):
    """The configured data set is not on disk and could not be fetched."""


class ConfigError(UserError, ValueError):
    """An argument's value is outside what is accepted; the message names the flag and the accepted range."""


class RefusedArgumentError(ConfigError):
    """A value given to the model's or the data's class that the class refused (in its constructor, or once running):
    a mistake on the command line, like the parser's own, so the command line exits with 2 after its one line."""


def exception_chain(err: BaseException | None) -> list[BaseException]:
    """``err`` and the exceptions it was raised from (``__cause__``) or during (``__context__``), outermost first;
    each once, however the chain loops back on itself."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def invoked_as(default: str) -> str:
    """How this process's command was typed, for messages: ``python -m <module>`` when run with ``-m``
    (a project's ``python -m my_project.placement``), else ``default``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None and spec.name else default


def signal_name(number: int) -> str:
    """A signal's name for messages: ``SIGKILL``, or ``signal 64`` for a number that has none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose every mistake is one line, ``error: <what> (options: <prog> --help)``, exit 2:
    not the usage and the message."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (options: {self.prog} --help)\n")
