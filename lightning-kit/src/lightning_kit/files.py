"""Files a user names: read only when plain files (a FIFO may wait forever, a device never end), written only where
a file can go."""

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from .errors import ConfigError, UserError, first_line

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotAFileError(UserError):
    """A path that should name a file names a folder, a FIFO, a device or a socket."""

    def __init__(self, path: str | Path, kind: str) -> None:
        super().__init__(f"{path} is {kind}, not a file")
        self.path, self.kind = path, kind


def kind_of(mode: int) -> str | None:
    """What a path of this ``st_mode`` is, in words; ``None`` for a plain file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a plain file")


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for binary reading where it is a plain file, else ``NotAFileError``; checked again once open
    (without waiting: ``O_NONBLOCK``), so a FIFO put in its place meanwhile is refused too."""
    kind = kind_of(os.stat(path).st_mode)
    if kind is not None:
        raise NotAFileError(path, kind)
    nonblocking = getattr(os, "O_NONBLOCK", 0)
    descriptor = os.open(path, os.O_RDONLY | nonblocking | getattr(os, "O_BINARY", 0))
    try:
        kind = kind_of(os.fstat(descriptor).st_mode)
        if kind is not None:
            raise NotAFileError(path, kind)
        if nonblocking:
            os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def check_output_file(path: str | Path, flag: str, *, overwrite: bool, overwrite_flag: str) -> None:
    """Refuse, in one line naming ``flag`` and before the long work starts, an output ``path`` that could not be
    written: a folder, in a folder no file can be created in (tried), or there already unless ``overwrite``."""
    text = os.fspath(path)
    path = Path(text)
    if not text.strip():
        raise ConfigError(f"{flag} is empty: give the path of a file to write")
    if text.endswith(("/", os.sep)) or (path.is_dir() and not path.is_symlink()):
        raise ConfigError(f"{flag} {text} names a folder: give the path of a file to write (in it, if you like)")
    if path.is_symlink() or path.exists():
        kind = None if path.is_symlink() else kind_of(path.stat().st_mode)
        if kind is not None:
            raise ConfigError(f"{flag} {path} is {kind}, not a file: give the path of a file to write")
        if not overwrite:
            what = "is a link" if path.is_symlink() else "exists"
            raise UserError(f"{flag} {path} {what}: give another {flag}, or {overwrite_flag} to replace it")
    folder = path.parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent  # the nearest folder that is there; those below it are made when writing
    try:
        tempfile.TemporaryFile(prefix=".probe.", dir=folder).close()
    except OSError as err:
        reason = f"{folder} is not a folder" if isinstance(err, NotADirectoryError) else first_line(err)
        raise ConfigError(
            f"{flag} {path} cannot be written ({reason}): give a file in a folder you can write to"
        ) from err


def check_folder_path(path: str | Path, what: str, flag: str) -> None:
    """Refuse, in one line naming ``flag``, a folder ``path`` (``what`` it is for) that cannot be made: a part that is
    not a folder, or a link to nothing (making it would create folders where it points); a link to a folder is used."""
    path = Path(path)
    for part in [*reversed(path.parents), path]:
        if part == part.parent or part == Path("."):
            continue
        if part.is_symlink() and not part.exists():
            raise ConfigError(
                f"{what} {path} cannot be made: {part} is a link to {os.readlink(part)}, which is not there "
                f"(it is not followed): remove the link, make its folder, or give another {flag}"
            )
        if part.exists() and not part.is_dir():
            kind = kind_of(part.stat().st_mode) or "a file"
            raise ConfigError(
                f"{what} {path} cannot be made: {part} is {kind}, not a folder: move it away, or give another {flag}"
            )


# The temporary files of writes in progress (``written_whole``): hidden, named by the writing process.
TEMPORARY_PREFIX = ".saving."


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to, renamed to ``path`` when the block ends and removed if it fails:
    a reader never sees half a file; one a killed process left is removed by the next write in that folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for left in path.parent.glob(f"{TEMPORARY_PREFIX}*"):
        pid = left.name[len(TEMPORARY_PREFIX) :].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            left.unlink(missing_ok=True)
    temporary = path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}.{path.name}")
    # Whatever stands at that name (a planted link, a reused pid's leftover) is removed, not written through.
    temporary.unlink(missing_ok=True)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists on this host (another user's too)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's process
    except (OSError, OverflowError):  # ProcessLookupError among them
        return False
    return True
