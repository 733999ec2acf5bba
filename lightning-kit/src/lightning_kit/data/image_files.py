"""Image files: which files a folder, a list or a path names, with their labels, each listed once.

The layout is torchvision's ``ImageFolder``: ``root/<class>/<images>``, images at any depth in a class folder.
"""

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_utilities.core.rank_zero import rank_zero_only

from ..errors import DataUnavailableError, first_few, first_line
from ..files import kind_of, open_regular

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
LIST_SUFFIX = ".txt"
_LAYOUT = "root/<class>/<images>"


@dataclass(frozen=True)
class ImageFiles:
    """Image files in a fixed order, with their class indices into ``class_names`` when the layout gives them."""

    files: tuple[Path, ...]
    labels: tuple[int, ...] | None  # None when the files carry no labels
    class_names: tuple[str, ...]


def find_classes(root: Path) -> tuple[str, ...]:
    """Sorted names of the class folders of ``root``, as torchvision's ``ImageFolder`` orders them; hidden folders
    (``.git``) are not classes, and neither are links (see ``_Listing``)."""
    return _top(Path(root))[1]


def _top(root: Path) -> tuple["_Listing", tuple[str, ...]]:
    """One listing of ``root``'s own entries (the images directly in it found), and its class folders."""
    if not root.exists():
        raise DataUnavailableError(f"{root} does not exist: expected a folder of class folders, {_LAYOUT}")
    if not root.is_dir():
        raise DataUnavailableError(f"{root} is a file, not a folder: expected a folder of class folders, {_LAYOUT}")
    listing = _Listing(root)
    classes = tuple(sorted(listing.scan(root, recursive=False)))
    if not classes:
        raise DataUnavailableError(f"{root} has no class folders: expected {_LAYOUT}")
    return listing, classes


def list_labelled_images(root: Path, class_names: Sequence[str] | None = None) -> ImageFiles:
    """Every image inside the class folders of ``root``, sorted, with the index of its class; each file once.

    Images are files by extension, in any case; hidden ones are ignored; images directly in ``root`` are an error.
    With ``class_names`` (the training split's, for ``val/`` or ``test/``) labels index into it, so they mean the
    same in every split: a class folder it does not name is an error. Without it, every class must hold an image.
    """
    root = Path(root)
    listing, found = _top(root)
    known = found if class_names is None else tuple(class_names)
    unknown = [name for name in found if name not in known]
    if unknown:
        raise DataUnavailableError(
            f"{root / unknown[0]} is not one of the training classes ({', '.join(known)}): "
            f"every class folder of {root} must be one of them"
        )
    if listing.found:
        loose = min(image.path for image in listing.found)
        raise DataUnavailableError(
            f"{loose} is not inside a class folder of {root}: move it into {root}/<class>/, or remove it"
        )
    index = {name: label for label, name in enumerate(known)}
    for name in found:
        listing.scan(root / name, recursive=True, label=index[name])
    # In the order of the class folders, then of the paths.
    place = {index[name]: k for k, name in enumerate(found)}
    images = sorted(listing.images(), key=lambda image: (place[image.label], image.path))
    held = {image.label for image in images}
    empty = [name for name in found if index[name] not in held]
    if empty and class_names is None:
        raise DataUnavailableError(
            f"{root / empty[0]} holds no images ({', '.join(IMAGE_EXTENSIONS)}): add some, or remove the folder"
        )
    if not images:
        raise DataUnavailableError(f"{root} holds no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    listing.report()
    return ImageFiles(tuple(image.path for image in images), tuple(image.label for image in images), known)


def list_images(path: str | Path, class_names: Sequence[str]) -> ImageFiles:
    """The files to predict on: one image, a ``.txt`` list of images (``_read_list``), or a folder. A folder of
    class folders only (of ``class_names``) is labelled; any other gives every image under it, unlabelled.
    A FIFO, device or socket is refused by name without being opened.
    """
    path, classes = Path(path), tuple(class_names)
    accepted = f"give an image, a {LIST_SUFFIX} file listing images, or a folder of images"
    try:
        kind = kind_of(os.stat(path).st_mode)
    except FileNotFoundError:
        raise DataUnavailableError(f"{path} does not exist: {accepted}") from None
    except OSError as err:
        raise DataUnavailableError(f"{path} cannot be read ({first_line(err)}): {accepted}") from err
    if kind == "a folder":
        top = _Listing(path)
        subfolders = top.scan(path, recursive=False)
        if subfolders and set(subfolders) <= set(classes) and not top.found:
            return list_labelled_images(path, classes)
        listing = _Listing(path)
        listing.scan(path, recursive=True)
        files = sorted(image.path for image in listing.images())
        if not files:
            raise DataUnavailableError(f"{path} holds no images ({', '.join(IMAGE_EXTENSIONS)}), at any depth")
        listing.report()
        return ImageFiles(tuple(files), None, classes)
    if kind is not None:
        raise DataUnavailableError(f"{path} is {kind}, not a file: {accepted}")
    if path.suffix.lower() == LIST_SUFFIX:
        return ImageFiles(_read_list(path), None, classes)
    if path.suffix.lower() in IMAGE_EXTENSIONS:
        return ImageFiles((path,), None, classes)
    raise DataUnavailableError(
        f"{path} is neither an image ({', '.join(IMAGE_EXTENSIONS)}) nor a {LIST_SUFFIX} file listing images"
    )


def _is_image(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


@dataclass(frozen=True)
class _Found:
    path: Path
    label: int | None
    linked: bool  # reached through a link
    identity: tuple[int, int] | str  # (st_dev, st_ino) of the file; its path when it cannot be examined


class _Listing:
    """One listing of the folder ``root``. Links are followed only to files inside it, never to folders, so a
    listing neither loops nor leaves ``root``; each file is listed once, under its own path; what was left out is
    said in one line (``report``).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.inside = os.path.realpath(root)
        self.found: list[_Found] = []
        self.outside: list[str] = []  # links leading out of root, not followed
        self.repeats = 0  # second names of files listed once
        self._entered: set[tuple[int, int]] = set()

    def scan(self, folder: Path, recursive: bool, label: int | None = None) -> list[str]:
        """Add the images in ``folder`` (and below it when ``recursive``); the names of its own subfolders."""
        subfolders, pending = [], [Path(folder)]
        if recursive:
            info = os.stat(folder)
            self._entered.add((info.st_dev, info.st_ino))
        while pending:
            current = pending.pop()
            try:
                entries = list(os.scandir(current))  # closed once read to the end
            except OSError as err:  # its images would otherwise be silently missing
                raise DataUnavailableError(f"{err.filename} cannot be listed ({first_line(err)})") from err
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_symlink():
                    self._link(entry, label)
                elif entry.is_dir(follow_symlinks=False):
                    if current == Path(folder):
                        subfolders.append(entry.name)
                    identity = (entry.stat(follow_symlinks=False).st_dev, entry.inode())
                    if recursive and identity not in self._entered:
                        self._entered.add(identity)
                        pending.append(Path(entry.path))
                elif _is_image(entry.name):  # a file, or a FIFO, device or socket that decoding refuses by name
                    self._add(Path(entry.path), label, linked=False)
        return subfolders

    def _link(self, entry: os.DirEntry, label: int | None) -> None:
        target = os.path.realpath(entry.path)
        if not Path(target).is_relative_to(self.inside):
            if _is_image(entry.name) or os.path.isdir(target):
                self.outside.append(f"{entry.path} -> {target}")
        elif _is_image(entry.name) and not os.path.isdir(target):
            self._add(Path(entry.path), label, linked=True)
        # A link to a folder inside root is not followed: that folder is listed where it is.

    def _add(self, path: Path, label: int | None, linked: bool) -> None:
        try:
            info = os.stat(path)
            identity: tuple[int, int] | str = (info.st_dev, info.st_ino)
        except OSError:
            identity = str(path)  # a broken link: listed, and decoding says what is wrong with it
        self.found.append(_Found(path, label, linked, identity))

    def images(self) -> list[_Found]:
        """Each file once, under its own path rather than a link's, else the first of its paths."""
        kept, seen = [], set()
        for found in sorted(self.found, key=lambda found: (found.linked, found.path)):
            if found.identity in seen:
                self.repeats += 1
                continue
            seen.add(found.identity)
            kept.append(found)
        return kept

    def report(self) -> None:
        """One line saying what was left out, if anything."""
        parts = []
        if self.outside:
            parts.append(
                f"{len(self.outside)} link(s) leading out of it, not followed ({first_few(sorted(self.outside))}); "
                "put what they point to inside it"
            )
        if self.repeats:
            parts.append(f"{self.repeats} more name(s) (links) of images it lists, each image listed once")
        if parts:
            report_once(f"listing {self.root}: left out {'; '.join(parts)}")


def _read_list(list_file: Path) -> tuple[Path, ...]:
    """The images a ``.txt`` file names, one a line (blank lines and ``#`` comments skipped), each a path absolute
    or relative to the list's folder, and a plain file (a FIFO or device would never finish reading).
    """
    try:
        with open_regular(list_file) as file:
            lines = file.read().decode("utf-8-sig").splitlines()  # Notepad writes a BOM
    except (OSError, UnicodeDecodeError) as err:
        raise DataUnavailableError(f"{list_file} cannot be read as a UTF-8 list of images ({err})") from err
    files = []
    for number, line in enumerate(lines, start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        file = list_file.parent / entry  # an absolute entry replaces the folder
        try:
            kind = kind_of(os.stat(file).st_mode)
            reason = f"is {kind}, not an image" if kind is not None else None
        except FileNotFoundError:
            reason = "does not exist"
        except (OSError, ValueError) as err:  # ValueError: a NUL byte in the line
            reason = f"cannot be read ({first_line(err)})"
        if reason is not None:
            raise DataUnavailableError(f"{list_file}, line {number}: {file} {reason}")
        files.append(file)
    if not files:
        raise DataUnavailableError(
            f"{list_file} lists no images: write one path per line (relative to its folder); '#' starts a comment"
        )
    return tuple(files)


def report_once(line: str) -> None:
    """Print ``line`` from the first process only (Lightning's rank; a process without Lightning is the only one)."""
    if getattr(rank_zero_only, "rank", 0) == 0:
        sys.stdout.write(f"{line}\n")
        sys.stdout.flush()
