"""Image folders: find the files, decode them to one ``uint8`` tensor quickly, and cache the result.

The layout is torchvision's ``ImageFolder``: ``root/<class>/<images>``, with images at
any depth inside a class folder. Everything here is a plain function, so the data
module that uses them and the benchmark time exactly the same code.
"""

import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only
from PIL import Image, ImageOps

from ..errors import ConfigError
from ..files import NotAFileError, kind_of, open_regular
from . import DataUnavailableError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
LIST_SUFFIX = ".txt"
# Part of every cache file's name: raise it whenever what a cache file holds, or how images are decoded, changes.
CACHE_FORMAT = 2
CACHE_PREFIX = "images-"
# Bad files named in full in an error; the rest are counted.
SHOWN_UNREADABLE = 3
# Values summed at a time by `channel_stats`: 32 MB as int64, whatever the image size.
STATS_CHUNK_VALUES = 1 << 22

_LAYOUT = "root/<class>/<images>"


class UnreadableImageError(DataUnavailableError):
    """Image files that no decoder could read: corrupt, truncated, or not images at all."""


@dataclass(frozen=True)
class ImageFiles:
    """Image files in a fixed order, with their class indices into ``class_names`` when the layout gives them."""

    files: tuple[Path, ...]
    labels: tuple[int, ...] | None  # None when the files carry no labels
    class_names: tuple[str, ...]


def find_classes(root: Path) -> tuple[str, ...]:
    """Sorted names of the class folders of ``root``, the way torchvision's ``ImageFolder`` orders them.

    Hidden folders (``.ipynb_checkpoints``, ``.git``, ...) are not classes, and neither are
    links: a link to a folder inside ``root`` would repeat its images, one leading out of it
    is not followed (see ``list_labelled_images``).
    """
    root = Path(root)
    if not root.exists():
        raise DataUnavailableError(f"{root} does not exist: expected a folder of class folders, {_LAYOUT}")
    if not root.is_dir():
        raise DataUnavailableError(f"{root} is a file, not a folder: expected a folder of class folders, {_LAYOUT}")
    classes = tuple(sorted(_Listing(root).scan(root, recursive=False)))
    if not classes:
        raise DataUnavailableError(f"{root} has no class folders: expected {_LAYOUT}")
    return classes


def list_labelled_images(root: Path, class_names: Sequence[str] | None = None) -> ImageFiles:
    """Every image inside the class folders of ``root``, sorted, with the index of its class.

    Files are images by their extension (any case, see ``IMAGE_EXTENSIONS``); other
    files and hidden files and folders are ignored. Images directly in ``root`` are an
    error rather than silently left out: they belong to no class.

    Links are followed only to files inside ``root``, never to folders, so no link can
    make the listing loop or leave ``root``; each file is listed once, under its own
    path when it has one in ``root`` (a link to it is then a second name, left out), so
    no image lands in both the training and the validation split. What was left out
    is said in one line.

    With ``class_names`` (the training split's classes, when reading ``val/`` or
    ``test/``) labels index into it, so they mean the same in every split: a class
    folder it does not name is an error, and one of its classes may have no folder. Without it, the classes are
    ``find_classes(root)`` and each must hold at least one image.
    """
    root = Path(root)
    found = find_classes(root)
    if class_names is None:
        known: tuple[str, ...] = found
    else:
        known = tuple(class_names)
        unknown = [name for name in found if name not in known]
        if unknown:
            raise DataUnavailableError(
                f"{root / unknown[0]} is not one of the training classes ({', '.join(known)}): "
                f"every class folder of {root} must be one of them"
            )
    listing = _Listing(root)
    listing.scan(root, recursive=False)
    if listing.found:
        loose = min(image.path for image in listing.found)
        raise DataUnavailableError(
            f"{loose} is not inside a class folder of {root}: move it into {root}/<class>/, or remove it"
        )
    index = {name: label for label, name in enumerate(known)}
    for name in found:
        listing.scan(root / name, recursive=True, label=index[name])
    images = listing.images()
    files: list[Path] = []
    labels: list[int] = []
    for name in found:
        in_class = sorted(image.path for image in images if image.label == index[name])
        if not in_class and class_names is None:
            raise DataUnavailableError(
                f"{root / name} holds no images ({', '.join(IMAGE_EXTENSIONS)}): add some, or remove the folder"
            )
        files += in_class
        labels += [index[name]] * len(in_class)
    if not files:
        raise DataUnavailableError(f"{root} holds no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    listing.report()
    return ImageFiles(tuple(files), tuple(labels), known)


def list_images(path: Path, class_names: Sequence[str]) -> ImageFiles:
    """The files to predict on, given as one image, a ``.txt`` list of images, or a folder.

    A list names one image per line, relative to the list's own folder unless absolute;
    blank lines and lines starting with ``#`` are skipped, and files keep the list's order.
    A folder whose subfolders are all classes of ``class_names``, and that holds no
    images of its own, is read as labelled (labels from the folder names, as in
    ``list_labelled_images``); any other folder gives every image under it, sorted,
    without labels, following links as ``list_labelled_images`` does. A FIFO, device or
    socket is refused by name without being opened.
    """
    path, classes = Path(path), tuple(class_names)
    accepted = f"give an image, a {LIST_SUFFIX} file listing images, or a folder of images"
    try:
        kind = kind_of(os.stat(path).st_mode)
    except FileNotFoundError:
        raise DataUnavailableError(f"{path} does not exist: {accepted}") from None
    except OSError as err:
        raise DataUnavailableError(f"{path} cannot be read ({err.strerror or err}): {accepted}") from err
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


def load_images(
    files: Sequence[Path],
    size: int,
    cache_dir: Path | None = None,
    workers: int | None = None,
    skip_unreadable: bool = False,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Decode ``files`` into one ``uint8`` tensor ``(N, 3, size, size)``; also the indices of ``files`` it holds.

    Each image is turned upright (EXIF orientation), made RGB (grayscale is repeated,
    alpha dropped, palettes looked up, 16-bit scaled to 8) and resized whole to
    ``size`` x ``size`` with antialiased bilinear filtering: it is squashed, never
    cropped, so a non-square image changes its aspect ratio but loses nothing.
    ``workers`` threads decode (all CPUs when None).

    A file that cannot be decoded stops everything with an ``UnreadableImageError``
    naming the first few, unless ``skip_unreadable``: then each is left out with one
    line on stdout, and the indices returned say which files remain. If none can be
    read, the error comes anyway.

    With ``cache_dir``, the result is kept there as one file named by a hash of
    ``size``, ``skip_unreadable`` and each file's real path and content (BLAKE2b of its
    bytes, read again on every call: about 15% of the time decoding takes), so a
    later call with the same files reads that instead of decoding, and a file rewritten
    in place, whatever its size and time, is decoded anew. Changing, adding or removing
    a file makes a new cache file; the old ones stay until removed (they are all named
    ``images-*.pt``). A cache folder that cannot be written is an error before any
    decoding, not a silent slow run; a cache file that cannot be written once the
    images are decoded (a full disk) is a warning, and this run goes on without it. A
    damaged cache file is decoded again and replaced. Files are written whole (beside
    their name, then renamed) or not at all, so processes sharing the folder (DDP
    ranks) never read a partial one.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"the image size must be a positive integer, got {size!r}")
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"the number of decoding threads must be a positive integer, got {workers!r}")
    files = [Path(file) for file in files]
    if not files:
        raise DataUnavailableError("no image files to load")
    if cache_dir is None:
        return _decode_all(files, size, workers, skip_unreadable)[:2]

    cache_dir = Path(cache_dir)
    # Keyed by content, not by size and time: a file rewritten in place within the clock's resolution, or with
    # its time set back, is not served stale. Hashing costs a read of each file, a fraction of decoding it.
    key = _cache_key(files, _fingerprints(files, workers), size, skip_unreadable)
    cached = _read_cache(_cache_file(cache_dir, key), len(files), size)
    if cached is not None:
        images, kept, skipped = cached
        _report_skipped(files, skipped)
        return images, kept
    scratch = _open_scratch(cache_dir)  # before decoding: an unwritable folder should not cost a whole decode first
    try:
        images, kept, skipped, fingerprints = _decode_all(files, size, workers, skip_unreadable)
        # Keyed by the bytes decoded: a file rewritten since its fingerprint was taken is cached as it was decoded.
        entry = {"images": images, "kept": torch.tensor(kept, dtype=torch.long), "skipped": skipped}
        _write_cache(scratch, _cache_file(cache_dir, _cache_key(files, fingerprints, size, skip_unreadable)), entry)
    finally:
        scratch.unlink(missing_ok=True)
    return images, kept


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) standard deviation of ``uint8`` images ``(N, C, H, W)``, in [0, 1] units.

    Sums of values and of their squares are kept as exact integers, a chunk of images
    at a time, so any number of images costs little memory and no rounding drift; only
    the final division is in float64.
    """
    if images.dtype != torch.uint8 or images.ndim != 4 or images.numel() == 0:
        raise ValueError(f"expected non-empty uint8 images (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
    N, C, H, W = images.shape
    chunk = max(1, STATS_CHUNK_VALUES // (C * H * W))
    total = torch.zeros(C, dtype=torch.long)
    squares = torch.zeros(C, dtype=torch.long)
    for start in range(0, N, chunk):
        values = images[start : start + chunk].to(torch.long)
        total += values.sum(dim=(0, 2, 3))
        squares += values.square().sum(dim=(0, 2, 3))
    count = N * H * W
    means, stds = [], []
    for s, q in zip(total.tolist(), squares.tolist(), strict=True):
        # Var = (count * sum(x^2) - sum(x)^2) / count^2, exact in integers before the division.
        means.append(s / count / 255)
        stds.append(((count * q - s * s) / count**2) ** 0.5 / 255)
    return tuple(means), tuple(stds)


# Listing.


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except OSError as err:
        _unreadable_folder(err)


def _unreadable_folder(err: OSError) -> NoReturn:
    """Stop on a folder that cannot be listed: its images would otherwise be silently missing."""
    raise DataUnavailableError(f"{err.filename} cannot be listed ({err.strerror or err})") from err


def _is_image(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


@dataclass(frozen=True)
class _Found:
    path: Path
    label: int | None
    linked: bool  # reached through a link
    identity: tuple[int, int] | str  # (st_dev, st_ino) of the file; its path when it cannot be examined


class _Listing:
    """One listing of the folder ``root``: links are followed only to files inside it, each file is listed once.

    Folders are entered only where they are, never through a link, so a listing cannot
    loop (a folder reached twice, through a bind mount, is entered once) nor leave ``root``.
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
            for entry in _entries(current):
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
        if not _within(target, self.inside):
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
            more = f" and {len(self.outside) - SHOWN_UNREADABLE} more" if len(self.outside) > SHOWN_UNREADABLE else ""
            parts.append(
                f"{len(self.outside)} link(s) leading out of it, not followed "
                f"({', '.join(self.outside[:SHOWN_UNREADABLE])}{more}); put what they point to inside it"
            )
        if self.repeats:
            parts.append(f"{self.repeats} more name(s) (links) of images it lists, each image listed once")
        if parts:
            _report_once(f"listing {self.root}: left out {'; '.join(parts)}")


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it (both resolved)."""
    try:
        return os.path.commonpath([folder, path]) == folder
    except ValueError:  # on another drive
        return False


def _read_list(list_file: Path) -> tuple[Path, ...]:
    """The images a ``.txt`` file names, in its order; a line naming a file that is not there is an error.

    Each line is a path as the command line would take it: absolute, relative to the list's
    folder, through ``..`` or links. No folder is walked from a list, so it cannot loop; each
    line must name a plain file (a FIFO or device would never finish reading).
    """
    try:
        with open_regular(list_file) as file:
            lines = file.read().decode("utf-8").splitlines()
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
            reason = f"cannot be read ({getattr(err, 'strerror', None) or err})"
        if reason is not None:
            raise DataUnavailableError(f"{list_file}, line {number}: {file} {reason}")
        files.append(file)
    if not files:
        raise DataUnavailableError(
            f"{list_file} lists no images: write one path per line (relative to its folder); '#' starts a comment"
        )
    return tuple(files)


# Decoding.

# Pillow decodes every format here, in threads: it releases the GIL while decoding and resizing. On 2 cores,
# with 10,000 JPEG and PNG images of 48-128 px resized to 32x32, torchvision.io.decode_image was faster (about
# 6,000 images/s against Pillow's 4,000-4,700), but torchvision 0.29 deprecates its decoders for removal and warns
# on every call, and they read neither BMP nor TIFF. Pillow is maintained, reads them all, and its JPEG draft mode
# decodes large photos at 1/2 to 1/8 scale, up to twice as fast. At this image size the Python work around each
# image holds the GIL most of the time, so a second thread adds only 5-10%; large images gain more.
_ORIENTATION = 0x0112  # the EXIF tag saying how a camera held the picture


def _read(path: Path) -> bytes:
    """The bytes of the file at ``path``; a FIFO, device, socket or folder is refused without being opened."""
    with open_regular(path) as file:
        return file.read()


def _fingerprint(data: bytes) -> str:
    """What identifies a file's content in the cache key: BLAKE2b, the fastest strong hash in hashlib."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _decode(data: bytes, size: int) -> np.ndarray:
    """One image file's bytes as ``uint8`` RGB ``(size, size, 3)``; raises whatever Pillow raises for a bad file."""
    with Image.open(io.BytesIO(data)) as opened:
        # A JPEG decodes at the smallest of 1/8, 1/4, 1/2 and full scale that is still at least size x size.
        opened.draft("RGB", (size, size))
        image = opened
        if image.getexif().get(_ORIENTATION, 1) != 1:
            image = ImageOps.exif_transpose(image)
        if image.mode.startswith("I"):
            # Pillow clips 16- and 32-bit integer pixels to 255 when converting; scale them from 16 bits instead.
            pixels = np.asarray(image, dtype=np.int64)
            image = Image.fromarray(np.clip((pixels + 128) // 257, 0, 255).astype(np.uint8))
        if image.mode != "RGB":
            image = image.convert("RGB")
        # Pillow widens its filters when shrinking, so this bilinear resize is antialiased.
        return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR))


def _reason(err: Exception) -> str:
    """The decoder's own words for a failure, on one line."""
    if isinstance(err, NotAFileError):
        return f"it is {err.kind}, not a file"
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _in_threads(work: Callable[[int], list], count: int, workers: int) -> list:
    """``work(first)`` in ``workers`` threads, each taking every ``workers``-th of ``count`` items; their results."""
    workers = min(workers, count)
    with ThreadPoolExecutor(workers, thread_name_prefix="images") as pool:
        return [result for results in pool.map(work, range(workers)) for result in results]


def _fingerprints(files: list[Path], workers: int) -> list[str | None]:
    """Each file's content fingerprint, ``None`` for one that cannot be read."""
    fingerprints: list[str | None] = [None] * len(files)

    def work(first: int) -> list:
        for index in range(first, len(files), workers):
            with contextlib.suppress(OSError, NotAFileError):  # decoding it says why it cannot be read
                fingerprints[index] = _fingerprint(_read(files[index]))
        return []

    _in_threads(work, len(files), workers)
    return fingerprints


def _decode_all(
    files: list[Path], size: int, workers: int, skip_unreadable: bool
) -> tuple[torch.Tensor, tuple[int, ...], list[tuple[int, str]], list[str | None]]:
    """Decode in ``workers`` threads straight into one preallocated array; also the fingerprints of the bytes read."""
    pixels = np.empty((len(files), size, size, 3), dtype=np.uint8)
    fingerprints: list[str | None] = [None] * len(files)

    def work(first: int) -> list[tuple[int, str]]:
        failed = []
        for index in range(first, len(files), workers):
            try:
                data = _read(files[index])
                fingerprints[index] = _fingerprint(data)
                pixels[index] = _decode(data, size)
            except Exception as err:  # corrupt files make decoders raise almost any type; each is reported
                failed.append((index, _reason(err)))
        return failed

    skipped = sorted(_in_threads(work, len(files), workers))
    if skipped and (not skip_unreadable or len(skipped) == len(files)):
        raise UnreadableImageError(_unreadable_message(files, skipped, skip_unreadable))
    _report_skipped(files, skipped)
    bad = {index for index, _ in skipped}
    kept = tuple(index for index in range(len(files)) if index not in bad)
    if skipped:
        pixels = pixels[list(kept)]
    # One copy into the (N, 3, H, W) layout the models take, rather than one per image.
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous(), kept, skipped, fingerprints


def _unreadable_message(files: list[Path], skipped: list[tuple[int, str]], skip_unreadable: bool) -> str:
    named = ", ".join(str(files[index]) for index, _ in skipped[:SHOWN_UNREADABLE])
    more = f" and {len(skipped) - SHOWN_UNREADABLE} more" if len(skipped) > SHOWN_UNREADABLE else ""
    first = f"{files[skipped[0][0]]}: {skipped[0][1]}"
    if skip_unreadable:
        return f"none of the {len(files)} images can be read: {named}{more} ({first})"
    return (
        f"{len(skipped)} of {len(files)} images cannot be read: {named}{more} ({first}). "
        "Replace or remove them, or leave them out with --data.skip_unreadable true"
    )


def _report_skipped(files: list[Path], skipped: list[tuple[int, str]]) -> None:
    for index, reason in skipped:
        _report_once(f"skipped unreadable image {files[index]}: {reason}")


@rank_zero_only
def _report_once(line: str) -> None:
    """Print ``line`` from the first process only: the others of a DDP run list and read the same files."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


# The cache.


def _cache_key(files: list[Path], fingerprints: list[str | None], size: int, skip_unreadable: bool) -> str:
    """A hash of everything the decoded tensor depends on: the files' real paths and contents, and the settings."""
    digest = hashlib.sha256(json.dumps([CACHE_FORMAT, size, skip_unreadable]).encode())
    for file, fingerprint in zip(files, fingerprints, strict=True):
        resolved = os.path.realpath(file)
        digest.update(f"{resolved}\0{fingerprint or 'unreadable'}\n".encode(errors="surrogateescape"))
    return digest.hexdigest()[:32]


def _cache_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"{CACHE_PREFIX}{key}.pt"


def _read_cache(cache_file: Path, count: int, size: int):
    """The cached images, kept indices and skipped files, or None when there is no usable cache file."""
    if not os.path.lexists(cache_file):
        return None
    try:
        with open_regular(cache_file) as file:
            entry = torch.load(file, weights_only=True)
        images, kept = entry["images"], tuple(entry["kept"].tolist())
        skipped = [(int(index), str(reason)) for index, reason in entry["skipped"]]
        consistent = (
            images.dtype == torch.uint8
            and tuple(images.shape) == (len(kept), 3, size, size)
            and len(kept) + len(skipped) == count
            and sorted([*kept, *(index for index, _ in skipped)]) == list(range(count))
        )
    except Exception as err:  # any damage: decode again and write it anew
        _report_once(f"image cache {cache_file} is unreadable ({_reason(err)}): decoding the images again")
        return None
    if not consistent:
        _report_once(f"image cache {cache_file} does not match its images: decoding them again")
        return None
    return images, kept, skipped


def _write_cache(scratch: Path, cache_file: Path, entry: dict) -> None:
    """Write ``entry`` to ``scratch``, then rename it to ``cache_file``; a failure is a warning, not the run's end.

    The images are decoded by now, and the run can go on without a cache, only the next
    run decodes them again: stopping here would throw that work away for a speed-up.
    A cache folder that cannot be written at all is refused before decoding instead.
    """
    try:
        with scratch.open("wb") as file:
            torch.save(entry, file)
        os.replace(scratch, cache_file)
    except OSError as err:
        _report_once(
            f"warning: the image cache {cache_file} was not written ({err.strerror or err}), so the next run "
            "decodes the images again: free some space there, or choose another cache folder"
        )


def _open_scratch(cache_dir: Path) -> Path:
    """An empty temporary file in ``cache_dir``, made first: an unwritable folder fails before any decoding."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{CACHE_PREFIX}", suffix=".tmp", dir=cache_dir)
    except OSError as err:
        raise DataUnavailableError(
            f"cannot write the image cache in {cache_dir} ({err.strerror or err}): "
            "make the folder writable, or choose another cache folder"
        ) from err
    os.close(handle)
    return Path(name)
