"""What the person at the command line is told: a mistake of theirs as one line, never a traceback."""

import io
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .arguments import TRAINER
from .callbacks import InterruptCheckpoint
from .errors import NotBuiltError, RefusedArgumentError, UserError, exception_chain, first_line
from .gpu_audit.explain import explain
from .gpu_audit.lightning import simulated_run
from .gpu_audit.verdict import DevicePlacementError
from .passwords import scrubbed
from .stores import DISK_ERRORS, failure_line
from .supervision import ProcessWatch, lost_a_process, lost_process_line


def report(line: str) -> None:
    """Print ``line``, every password hidden, in one write: lines of DDP processes sharing a log never split."""
    sys.stdout.write(f"{scrubbed(line)}\n")
    sys.stdout.flush()


def _trainer_flag_refused_by_lightning(err: BaseException) -> str | None:
    """The Trainer flag Lightning refused against the data (a ``val_check_interval`` past the epoch): a ValueError
    raised in Lightning's code naming it in backticks. Anything else stays a traceback: a bug to report."""
    frames = [frame for frame, _ in traceback.walk_tb(err.__traceback__)]
    in_lightning = frames and f"{os.sep}lightning{os.sep}pytorch{os.sep}" in frames[-1].f_code.co_filename
    if not (isinstance(err, ValueError) and in_lightning):
        return None
    named = [name for name in re.findall(r"`(\w+)`", str(err)) if name in TRAINER]
    return f"--trainer.{named[0]}" if named else None


def disk_line(err: BaseException) -> str | None:
    """One line for a write the disk refused (an ``OSError``, or PyTorch's of a checkpoint), or None."""
    if isinstance(err, OSError) and err.errno in DISK_ERRORS:
        name = err.filename or _file_being_written(err)
        where = f" {name}" if name else ""
        return f"error: cannot write{where}: {first_line(err)}: {DISK_ERRORS[err.errno]}"
    if isinstance(err, RuntimeError) and re.search(r"failed writing file|file write failed|unexpected pos", str(err)):
        return (
            "error: a file (a checkpoint) could not be written whole: the disk is full or the file would pass "
            "the file size limit (ulimit -f): free space or raise the limit, then run the same command again"
        )
    return None


def memory_line(err: BaseException) -> str | None:
    """One line for memory the machine could not give (Python's, PyTorch's CPU allocator's, CUDA's), or None."""
    text = " ".join(str(err).split())
    cpu = isinstance(err, RuntimeError) and "can't allocate memory" in text
    if not (isinstance(err, MemoryError) or cpu or type(err).__name__ == "OutOfMemoryError"):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)  # PyTorch's CPU allocator; CUDA's says "x GiB"
    amount = f" ({int(asked[1]):,} bytes asked)" if asked else ""
    return (
        f"error: out of memory{amount}: a size given is too large for this machine (a data set's size, a batch size, "
        "a network's width): give a smaller one"
    )


def _file_being_written(err: BaseException) -> str | None:
    """The file a failed ``write`` was writing (its error names none): the innermost frame's file open for writing."""
    for frame, _ in reversed(list(traceback.walk_tb(err.__traceback__))):
        for value in frame.f_locals.values():
            mode = getattr(value, "mode", None)
            if isinstance(value, io.IOBase) and isinstance(mode, str) and set(mode) & set("wax+"):
                name = getattr(value, "name", None)
                if isinstance(name, str):
                    return name
    return None


@contextmanager
def errors_as_messages(not_built: int = 1) -> Iterator[None]:
    """Stop with one line, no traceback nor password, for errors the user can fix; NotBuiltError exits ``not_built``."""
    try:
        yield
    except SIGTERMException:
        saved = InterruptCheckpoint.saved
        if ProcessWatch.started_by_lightning:
            sys.exit(0)  # the first process reports the stop, and its status is the run's
        if saved is None:
            sys.exit("stopped by Ctrl-C or SIGTERM before a training step was done: nothing to resume")
        sys.exit(f"stopped by Ctrl-C or SIGTERM: {saved} saved; resume with --ckpt_path last")
    except SystemExit as stop:  # after SIGTERMException, which is one
        if isinstance(stop.code, str):
            sys.exit(scrubbed(stop.code))
        raise
    except Exception as err:
        # The mistake itself, or the one jsonargparse wrapped when it instantiated a class.
        wrapped = (link for link in exception_chain(err, context=False) if isinstance(link, UserError))
        mistake = err if isinstance(err, MisconfigurationException) else next(wrapped, None)
        if isinstance(mistake, RefusedArgumentError | NotBuiltError):  # a status of their own: the line written here
            sys.stderr.write(scrubbed(f"error: {mistake}") + "\n")
            sys.stderr.flush()
            sys.exit(2 if isinstance(mistake, RefusedArgumentError) else not_built)  # 2: a usage error, as the parser's
        if mistake is not None:
            sys.exit(scrubbed(f"error: {mistake}"))
        if isinstance(err, PermissionError):
            denied = f"error: cannot write {err.filename}: permission denied (choose a folder you can write to)"
            sys.exit(scrubbed(denied))
        if (store := failure_line(err)) is not None:
            sys.exit(f"error: {store}")
        if (disk := disk_line(err)) is not None:
            sys.exit(scrubbed(disk))
        if (memory := memory_line(err)) is not None:
            sys.exit(memory)
        if isinstance(err, RuntimeError) and re.search(r"cannot be converted to type \w+ without overflow", str(err)):
            sys.exit(
                f"error: a number given overflows the model's numbers ({first_line(err)}): "
                "give smaller values (a learning rate, a weight decay, a range in a space file)"
            )
        if lost_a_process(err):
            sys.exit(lost_process_line(ProcessWatch.ended() or "another process of the DDP run stopped"))
        if (flag := _trainer_flag_refused_by_lightning(err)) is not None:
            sys.exit(f"error: {flag}: {first_line(err)}")
        found = explain(err, stage=simulated_run.stage, rank=0, world_size=1) if simulated_run.stage else None
        if not isinstance(found, DevicePlacementError):
            raise
        sys.exit(f"error: this would fail on a GPU: {found}")


# What Lightning prints that a user of this project cannot act on, silenced here and nowhere else, with the reason.
_UNACTIONABLE_WARNINGS = (
    # train.py hands LightningCLI the arguments after expanding --accelerator & co: intended.
    ("LightningCLI's args parameter is intended to run from within Python", UserWarning),
    # Lightning 2.6 itself checks isinstance(spec, LeafSpec), which torch 2.10 deprecated.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # jsonargparse 4.49 deprecated parser-wide instantiators, which LightningCLI itself still adds.
    (r"\s*``ArgumentParser.add_instantiator`` was deprecated", DeprecationWarning),
)
# An advertisement; the seed is in config.yaml; an unused GPU gets its own warning.
_UNACTIONABLE_INFO = (
    "💡 Tip: For seamless cloud logging",
    "Seed set to ",
    "GPU available: ",
    "TPU available: ",
    "HPU available: ",
)


def _keep_actionable(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_UNACTIONABLE_INFO)


def silence_the_unactionable() -> None:
    """Silence what Lightning prints that a user of this project cannot act on (above); safe to call often."""
    for message, category in _UNACTIONABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.seed"):
        logging.getLogger(name).addFilter(_keep_actionable)  # added once, however often called
