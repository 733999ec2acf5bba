"""Mistakes a user can fix: the command line shows each as one line, ``error: ...``, not a traceback."""

import argparse
import contextlib
import errno
import functools
import io
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

try:
    import resource
except ImportError:  # not POSIX: no file-size limit cuts an output short
    resource = None


class UserError(Exception):
    """Something the user can fix: a flag, a file, the data or the machine. Its message says what and how."""


class DataUnavailableError(UserError):
    """The configured data set is not on disk and could not be fetched."""


class ConfigError(UserError, ValueError):
    """An argument's value is outside what is accepted; the message names the flag and the accepted range."""


class RefusedArgumentError(ConfigError):
    """A value given to the model's or the data's class that the class refused: a usage error (exit 2)."""


class NotBuiltError(UserError):
    """A class of the configuration raised while built on its defaults: exit 1 (the audit's: 3, not audited)."""


def exception_chain(err: BaseException | None, context: bool = True) -> list[BaseException]:
    """``err`` and the exceptions it was raised from (or, with ``context``, during), outermost first, each once."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or (err.__context__ if context else None)
    return chain


# A line of a message is cut here: what an exception says past it is a dump (a tensor, a graph), not a reason.
LONGEST_LINE = 300


def first_line(err: BaseException, typed: bool = False) -> str:
    """The one way an exception is said in one line: the first line of its message, cut at ``LONGEST_LINE`` (its
    type's name where it says nothing), or an ``OSError``'s reason alone, where the caller names the file.
    ``typed``, for an error of the user's code, whose whole first line is kept: after its type's name."""
    said = err.strerror if isinstance(err, OSError) and err.strerror and not typed else str(err)
    lines = said.strip().splitlines()
    text = lines[0].strip()[:LONGEST_LINE] if lines else ""
    if typed:
        return f"{type(err).__name__}: {text or '(no message)'}"
    return text or type(err).__name__


def byte_size(count: float) -> str:
    """``count`` bytes for people: ``512 bytes``, ``1.9 MiB``."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def first_few(names: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names`` and how many more, for a line: ``a, b, c and 4 more``."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def invoked_as(default: str) -> str:
    """How this process's command was typed: ``python -m <module>`` when run with ``-m``, else ``default``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None and spec.name else default


def signal_name(number: int) -> str:
    """``SIGKILL``, or ``signal 64`` for a number that has no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def printable(text: str) -> str:
    """``text`` on one line, without the control characters (C0, DEL, C1) a file name could carry to a terminal."""
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", text)


def nul_refusal(name: str, value: object) -> str | None:
    """The refusal of ``value`` (or an item of it) for ``name`` where it holds a NUL, which no path can; else None."""
    values = value if isinstance(value, list | tuple) else [value]
    if any(isinstance(one, str | os.PathLike) and "\0" in str(one) for one in values):
        return f"{name} holds a NUL character (\\0), which no file name, URL or name can hold: give it without"
    return None


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose every mistake is one line, exit 2; a NUL in a value, or an empty value for an
    option whose default is not empty (an empty path, URL or column is never meant), is one."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (options: {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(parsed, action.dest, None) if action.dest is not argparse.SUPPRESS else None
            name = "/".join(action.option_strings) or action.metavar or action.dest
            if (refusal := nul_refusal(str(name), value)) is not None:
                self.error(refusal)
            if value == "" and action.option_strings and action.default != "":
                self.error(f"{name} is empty: give a value, or leave the option out for its default")
        return parsed, rest


class OutputError(Exception):
    """The command's standard output cannot take what it writes: a full disk, a file-size limit, a closed pipe."""

    def __init__(self, err: OSError) -> None:
        super().__init__(first_line(err))
        self.errno = err.errno


class _GuardedOutput:
    """Standard output whose failure to write is an ``OutputError``, not an ``OSError`` from wherever it printed."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._stream, name)
        if name not in ("write", "writelines", "flush"):
            return found

        def guarded(*args: Any) -> Any:
            try:
                return found(*args)
            except OSError as err:
                raise OutputError(err) from None

        return guarded


def cut_short(stream: Any) -> bool:
    """Whether ``stream``, a file, stopped at ``ulimit -f``: Python takes the short write there as done, silently."""
    if resource is None:
        return False
    try:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        descriptor = stream.fileno()
        return (
            limit != resource.RLIM_INFINITY
            and stat.S_ISREG(os.fstat(descriptor).st_mode)
            and os.lseek(descriptor, 0, os.SEEK_CUR) >= limit
        )
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no file behind it (a pipe, a capture)
        return False


Main = TypeVar("Main", bound=Callable[..., Any])
INTERRUPTED = 128 + signal.SIGINT  # a command ended by Ctrl-C, as a shell says it


def command(main: Main) -> Main:
    """A command's ``main``: what it prints reaches standard output, or ends in one line (README: "What a command
    prints"); a Ctrl-C is ``interrupted (Ctrl-C)``, exit 130, as a shell says it."""

    @functools.wraps(main)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if isinstance(sys.stdout, _GuardedOutput):  # a command run by another: guarded there
            return main(*args, **kwargs)
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is None:  # started with the stream closed (`>&-`)
                setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115  (the process's own)
            elif hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="backslashreplace")
        original, hook = sys.stdout, threading.excepthook
        sys.stdout, threading.excepthook = _GuardedOutput(original), _file_errors_of_threads
        try:
            try:
                return main(*args, **kwargs)
            finally:  # what is still buffered fails here, whatever main ended with, not at the interpreter's exit
                sys.stdout.flush()
                if cut_short(original):
                    raise OutputError(OSError(errno.EFBIG, os.strerror(errno.EFBIG)))
        except OutputError as err:
            # What is left in the buffer goes nowhere: the flush at exit must not fail on it again (no file: a capture).
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), original.fileno())
            if err.errno == errno.EPIPE:
                raise SystemExit(1) from None
            raise SystemExit(f"error: the standard output cannot be written: {err}") from None
        except KeyboardInterrupt:
            sys.stderr.write("interrupted (Ctrl-C)\n")
            raise SystemExit(INTERRUPTED) from None
        finally:
            threading.excepthook = hook
            if isinstance(sys.stdout, _GuardedOutput):
                sys.stdout = original

    return guarded  # type: ignore[return-value]


def _file_errors_of_threads(args: threading.ExceptHookArgs) -> None:
    """A library's thread (TensorBoard's event writer) stopped by a file it cannot write: one line, no traceback."""
    if isinstance(args.exc_value, OSError):
        err = args.exc_value
        name = os.fsdecode(err.filename) if isinstance(err.filename, str | bytes | os.PathLike) else ""
        owner = type(args.thread).__module__.partition(".")[0] if args.thread is not None else ""
        where = f"a thread of {owner}'s" if owner and owner != "threading" else "a thread"
        sys.stderr.write(f"error: {where} stopped: {first_line(err)}{': ' + name if name else ''}\n")
        return
    sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)
