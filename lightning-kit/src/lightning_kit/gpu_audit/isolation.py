"""The audit in a forked process, where a death is a verdict: ``not audited: the process died with SIGABRT in ...``.

What the simulated GPU cannot contain (C++ that aborts on its own) would end the process that audits. A fork has
the model and everything imported already; the child sends where it is, each stage's outcome and the verdict
through a pipe. A fork needs POSIX, and an autograd engine whose device threads have not started in this process;
else ``in_a_child`` returns None. The child computes on one thread (GNU OpenMP's pool does not survive a fork).
"""

import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection

import torch

from ..errors import signal_name
from . import simulated
from .verdict import Outcome, Verdict

_CANNOT_FORK = 86  # the child's exit status where this process's autograd engine cannot run in a fork


class Progress:
    """Where the audit is: ``where`` is (stage, rank, world size, the last hook entered), None before the first
    stage. ``send`` (in a forked child, its pipe) is given each change of it and each stage's outcome."""

    def __init__(self, send: Callable[[tuple], None] = lambda message: None) -> None:
        self.where: tuple[str, int, int, str] | None = None
        self.send = send

    def at(self, where: tuple[str, int, int, str]) -> None:
        self.where = where
        self.send(("at", where))

    def at_hook(self, action: str) -> None:
        if self.where is not None:
            self.at((*self.where[:3], action))

    def ended(self, outcome: Outcome) -> None:
        self.send(("outcome", outcome))


# A stage that has run this long is said to be running, and again each STILL_EVERY_S after.
LONG_STAGE_S = 5.0
STILL_EVERY_S = 30.0


@contextlib.contextmanager
def announced(progress: Progress, say: Callable[[str], None] | None, describe: Callable[[str], str]) -> Iterator[None]:
    """While the block runs, ``say`` where the audit is once a stage has run ``LONG_STAGE_S``, from a thread (start it
    after any fork)."""
    if say is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        current, since, due = None, 0.0, LONG_STAGE_S
        while not stop.wait(0.25):
            where = progress.where
            if where is None:
                continue
            now = time.monotonic()
            if where[:3] != current:
                current, since, due = where[:3], now, LONG_STAGE_S
            elif now - since >= due:
                stage, rank, world_size, action = where
                at = f", in {describe(action)}" if action else ""
                say(f"auditing {Outcome(stage, rank, world_size).where}{at}: {now - since:.0f} s so far")
                due += STILL_EVERY_S

    watcher = threading.Thread(target=watch, name="audit-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def can_fork() -> bool:
    return hasattr(os, "fork")  # POSIX alone has it


def in_a_child(
    run: Callable[[Progress], Verdict], describe: Callable[[str], str], say: Callable[[str], None] | None = None
) -> Verdict | None:
    """``run(progress)`` in a forked child: its verdict, or one that says how the child died; None where this
    process cannot fork. ``describe`` names a Lightning action as a hook; ``say`` is told of a long stage."""
    if not can_fork():
        return None
    progress = Progress()
    # The child's temporary files go in a folder the parent removes: a child that dies cannot remove its own.
    with tempfile.TemporaryDirectory(prefix="placement-audit-") as scratch:
        receiver, sender = multiprocessing.Pipe(duplex=False)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child
            receiver.close()
            tempfile.tempdir = scratch
            _child(run, sender)
        sender.close()
        messages = []
        try:
            # Read until the child's end closes (EOFError), or ends in the middle of a message (OSError): it died.
            with receiver, announced(progress, say, describe), contextlib.suppress(EOFError, OSError):
                while True:
                    kind, message = receiver.recv()
                    if kind == "at":
                        progress.where = message
                    else:
                        messages.append((kind, message))
            _, status = os.waitpid(pid, 0)
        except BaseException:  # Ctrl-C while waiting: the child goes too
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            raise
    code = os.waitstatus_to_exitcode(status)  # -N: killed by signal N
    if code == _CANNOT_FORK:
        return None
    for kind, message in messages:
        if kind == "verdict":
            return message
        if kind == "error":
            raise message
    return _died([message for kind, message in messages if kind == "outcome"], progress.where, code, describe)


def _child(run: Callable[[Progress], Verdict], sender: Connection) -> None:
    """The child's whole life, ending in ``os._exit``: no atexit handlers, no test session's teardown."""
    status = 0
    try:
        try:
            torch.set_num_threads(1)
            if not _backward_runs():
                status = _CANNOT_FORK
                return
            sender.send(("verdict", run(Progress(sender.send))))
        except BaseException as err:  # the parent raises it
            sender.send(("error", _picklable(err)))
    except BaseException:  # the pipe itself failed: the parent reports a child without a verdict
        status = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # nothing can be reported about the child's own output
                stream.flush()
        os._exit(status)


def _backward_runs() -> bool:
    """Whether a simulated backward pass can run in this (forked) process."""
    try:
        with simulated.simulating(0):
            weight = simulated.SimulatedTensor(torch.ones(1)).requires_grad_()
            (weight * 2).sum().backward()
    except RuntimeError as err:
        if "fork" in str(err):
            return False
        raise
    return True


def _picklable(err: BaseException) -> BaseException:
    """``err``, or a RuntimeError saying what it was where it cannot travel to the parent."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")
    return err


def _died(outcomes: list[Outcome], where, code: int, describe: Callable[[str], str]) -> Verdict:
    """The verdict of a child that ended without one: what it finished, then the stage it was in, not audited."""
    how = f"died with {signal_name(-code)}" if code < 0 else f"exited with status {code} before its verdict"
    verdict = Verdict(outcomes=outcomes)
    stage, rank, world_size, action = where if where is not None else ("fit", 0, 1, "")
    hook = describe(action) if action else "setting up"
    verdict.outcomes.append(Outcome(stage, rank, world_size, gap=f"the process {how} in {hook}"))
    verdict.notes.append("the stages after it were not audited: the audit's process ended there")
    return verdict
