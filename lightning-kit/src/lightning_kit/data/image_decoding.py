"""Decoding image files to one ``uint8`` tensor quickly, and caching the result by the files' content."""

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import ConfigError, DataUnavailableError, byte_size, first_few, first_line
from ..files import NotAFileError, open_regular, written_whole
from .image_files import report_once

# Part of every cache file's name: raise it whenever what a cache file holds, or how images are decoded, changes.
CACHE_FORMAT = 2
# Values summed at a time by `channel_stats`: 32 MB as int64, whatever the image size.
STATS_CHUNK_VALUES = 1 << 22
# The largest image file worth reading: Pillow refuses more than twice MAX_IMAGE_PIXELS (a decompression bomb), which
# stored raw at 16 bits a channel of RGBA is 8 bytes a pixel; 64 MiB more for metadata (EXIF, ICC profiles). A file
# past it (a video named .jpg, a disk image) is refused unread, not read whole into memory by each thread.
MAX_FILE_BYTES = 2 * Image.MAX_IMAGE_PIXELS * 8 + (64 << 20) if Image.MAX_IMAGE_PIXELS else None


class UnreadableImageError(DataUnavailableError):
    """Image files that no decoder could read: corrupt, truncated, or not images at all."""


class ImageTooLargeError(ValueError):
    """An image with more pixels than allowed, refused before decoding."""


def load_images(
    files: Sequence[Path],
    size: int,
    cache_dir: str | Path | None = None,
    workers: int | None = None,
    skip_unreadable: bool = False,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Decode ``files`` into one ``uint8`` tensor ``(N, 3, size, size)``; also the indices of ``files`` it holds.

    Each image is turned upright (EXIF), made RGB (16-bit scaled to 8) and resized whole, never cropped, with
    antialiased bilinear filtering, by ``workers`` threads (all CPUs when None). An unreadable file stops everything
    with an ``UnreadableImageError`` naming the first few, unless ``skip_unreadable`` (each then reported and left out).

    With ``cache_dir``, the result is kept there as ``images-<key>.pt``, keyed by ``size``, ``skip_unreadable`` and
    each file's real path and content. An unwritable cache folder is an error before decoding; a cache file that
    cannot be written (a full disk), a warning; a damaged one is decoded again. Files are written beside their name
    and renamed, so processes sharing the folder (DDP ranks) never read a partial one.
    """
    workers = (os.cpu_count() or 1) if workers is None else workers
    for value, what in ((size, "the image size"), (workers, "the number of decoding threads")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    files = [Path(file) for file in files]
    if not files:
        raise DataUnavailableError("no image files to load")
    if cache_dir is None:
        return _decode_all(files, size, workers, skip_unreadable)[:2]

    cache_dir = Path(cache_dir)
    # Keyed by content, not by size and time: a file rewritten in place within the clock's resolution, or with
    # its time set back, is not served stale. Hashing (BLAKE2b) costs a read of each file, about 15% of decoding it.
    cache_file = _cache_file(cache_dir, files, _fingerprints(files, workers), size, skip_unreadable)
    cached = _read_cache(cache_file, len(files), size)
    if cached is not None:
        images, kept, skipped = cached
        _report_skipped(files, skipped)
        return images, kept
    _check_writable(cache_dir)  # before decoding: an unwritable folder should not cost a whole decode first
    images, kept, skipped, fingerprints = _decode_all(files, size, workers, skip_unreadable)
    # Keyed by the bytes decoded: a file rewritten since its fingerprint was taken is cached as it was decoded.
    cache_file = _cache_file(cache_dir, files, fingerprints, size, skip_unreadable)
    try:
        with written_whole(cache_file) as temporary:
            torch.save({"images": images, "kept": torch.tensor(kept, dtype=torch.long), "skipped": skipped}, temporary)
    except OSError as err:  # a full disk: a warning, as stopping would throw away the decoding done for a speed-up
        report_once(
            f"warning: the image cache {cache_file} was not written ({first_line(err)}), so the next run "
            "decodes the images again: free some space there, or choose another cache folder"
        )
    return images, kept


# The smallest standard deviation a channel gets, in levels of 0-255: that of a channel that never varies is 0.
MIN_STD_LEVELS = 1.0


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and population standard deviation of ``uint8`` images ``(N, C, H, W)``, in [0, 1] units.

    Exact integer sums, a chunk at a time (little memory, no rounding drift). A channel that never varies gets the
    standard deviation of one level, 1/255, not 0, so normalising by it keeps the values finite.
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
    count, sums = N * H * W, list(zip(total.tolist(), squares.tolist(), strict=True))
    # Var = (count * sum(x^2) - sum(x)^2) / count^2, exact in integers before the division.
    stds = tuple(max(((count * q - s * s) / count**2) ** 0.5, MIN_STD_LEVELS) / 255 for s, q in sums)
    return tuple(s / count / 255 for s, _ in sums), stds


# Pillow decodes every format here, in threads: it releases the GIL while decoding and resizing. On 2 cores,
# with 10,000 JPEG and PNG images of 48-128 px resized to 32x32, torchvision.io.decode_image was faster (about
# 6,000 images/s against Pillow's 4,000-4,700), but torchvision 0.29 deprecates its decoders for removal and warns
# on every call, and they read neither BMP nor TIFF. Pillow is maintained, reads them all, and its JPEG draft mode
# decodes large photos at 1/2 to 1/8 scale, up to twice as fast. At this image size the Python work around each
# image holds the GIL most of the time, so a second thread adds only 5-10%; large images gain more.
_ORIENTATION = 0x0112  # the EXIF tag saying how a camera held the picture


def _read(path: Path) -> bytes:
    """The bytes of the file at ``path``; a FIFO, device, socket or folder is refused without being opened, and a
    file larger than the largest image Pillow decodes could be (``MAX_FILE_BYTES``) without being read."""
    with open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        if MAX_FILE_BYTES is not None and size > MAX_FILE_BYTES:
            raise ImageTooLargeError(f"a file of {byte_size(size)}, more than any image decoded here could be")
        return file.read()


def _fingerprint(data: bytes) -> str:
    """What identifies a file's content in the cache key: BLAKE2b, the fastest strong hash in hashlib."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _decode(data: bytes, size: int, max_pixels: int | None = None) -> np.ndarray:
    """One image file's bytes as ``uint8`` RGB ``(size, size, 3)``; raises whatever Pillow raises for a bad file,
    and ``ImageTooLargeError`` for an image of more than ``max_pixels`` pixels, from its header."""
    with Image.open(io.BytesIO(data)) as opened:
        if max_pixels is not None and opened.width * opened.height > max_pixels:
            raise ImageTooLargeError(f"an image of {opened.width}x{opened.height} pixels, more than {max_pixels:,}")
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
    if isinstance(err, UnidentifiedImageError):  # its message names an in-memory file object, which says nothing here
        return "no image format that Pillow reads"
    return first_line(err)


def decode_image(data: bytes, size: int, max_pixels: int) -> np.ndarray:
    """One image file's bytes as ``uint8`` RGB ``(size, size, 3)``, decoded exactly as ``load_images`` decodes each.

    For bytes from elsewhere (a request to the server): an image of more than ``max_pixels`` pixels (a
    decompression bomb) is refused from its header with ``ImageTooLargeError``; bytes that are no image it reads
    raise ``UnreadableImageError`` with the decoder's reason.
    """
    try:
        return _decode(data, size, max_pixels)
    except ImageTooLargeError:
        raise
    except Image.DecompressionBombError as err:  # over twice Pillow's own limit: refused by Image.open, unsized
        if max_pixels > 2 * Image.MAX_IMAGE_PIXELS:  # a max_pixels above what Pillow opens: Pillow's limit is the one
            raise ImageTooLargeError(_reason(err)) from err
        found = re.search(r"\((\d+) pixels\)", str(err))  # Pillow's "Image size (N pixels) exceeds limit of ..."
        pixels = f"{int(found[1]):,}" if found else f"over {2 * Image.MAX_IMAGE_PIXELS:,}"
        raise ImageTooLargeError(f"an image of {pixels} pixels, more than {max_pixels:,}") from err
    except Exception as err:  # corrupt files make decoders raise almost any type
        raise UnreadableImageError(_reason(err)) from err


def _in_threads(work: Callable[[int], Any], count: int, workers: int) -> list:
    """``work(index)`` for each of ``count`` items, in order, by ``workers`` threads that each take every
    ``workers``-th item: one task a thread, not one an image, which would cost more than hashing a small one."""
    workers = min(workers, count)
    with ThreadPoolExecutor(workers, thread_name_prefix="images") as pool:
        strides = list(pool.map(lambda first: [work(index) for index in range(first, count, workers)], range(workers)))
    return [strides[index % workers][index // workers] for index in range(count)]


def _fingerprints(files: list[Path], workers: int) -> list[str | None]:
    """Each file's content fingerprint, ``None`` for one that cannot be read (decoding it says why)."""

    def fingerprint(index: int) -> str | None:
        with contextlib.suppress(OSError, NotAFileError, ImageTooLargeError):
            return _fingerprint(_read(files[index]))
        return None

    return _in_threads(fingerprint, len(files), workers)


def _decode_all(
    files: list[Path], size: int, workers: int, skip_unreadable: bool
) -> tuple[torch.Tensor, tuple[int, ...], list[tuple[int, str]], list[str | None]]:
    """Decode in ``workers`` threads straight into one preallocated array; also the fingerprints of the bytes read."""
    pixels = np.empty((len(files), size, size, 3), dtype=np.uint8)
    fingerprints: list[str | None] = [None] * len(files)

    def decode(index: int) -> str | None:
        try:
            data = _read(files[index])
            fingerprints[index] = _fingerprint(data)
            pixels[index] = _decode(data, size)
        except Exception as err:  # corrupt files make decoders raise almost any type; each is reported
            return _reason(err)
        return None

    reasons = _in_threads(decode, len(files), workers)
    skipped = [(index, reason) for index, reason in enumerate(reasons) if reason is not None]
    if skipped and (not skip_unreadable or len(skipped) == len(files)):
        raise UnreadableImageError(_unreadable_message(files, skipped, skip_unreadable))
    _report_skipped(files, skipped)
    kept = tuple(index for index, reason in enumerate(reasons) if reason is None)
    if skipped:
        pixels = pixels[list(kept)]
    # One copy into the (N, 3, H, W) layout the models take, rather than one per image.
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).contiguous(), kept, skipped, fingerprints


def _unreadable_message(files: list[Path], skipped: list[tuple[int, str]], skip_unreadable: bool) -> str:
    named = first_few([str(files[index]) for index, _ in skipped])
    first = f"{files[skipped[0][0]]}: {skipped[0][1]}"
    if skip_unreadable:
        return f"none of the {len(files)} images can be read: {named} ({first})"
    return (
        f"{len(skipped)} of {len(files)} images cannot be read: {named} ({first}). "
        "Replace or remove them, or leave them out with --data.skip_unreadable true"
    )


def _report_skipped(files: list[Path], skipped: list[tuple[int, str]]) -> None:
    for index, reason in skipped:
        report_once(f"skipped unreadable image {files[index]}: {reason}")


def _cache_file(
    cache_dir: Path, files: list[Path], fingerprints: list[str | None], size: int, skip_unreadable: bool
) -> Path:
    """Named by a hash of everything the decoded tensor depends on: the files' real paths and contents, the settings."""
    digest = hashlib.sha256(json.dumps([CACHE_FORMAT, size, skip_unreadable]).encode())
    for file, fingerprint in zip(files, fingerprints, strict=True):
        resolved = os.path.realpath(file)
        digest.update(f"{resolved}\0{fingerprint or 'unreadable'}\n".encode(errors="surrogateescape"))
    return cache_dir / f"images-{digest.hexdigest()[:32]}.pt"


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
        report_once(f"image cache {cache_file} is unreadable ({_reason(err)}): decoding the images again")
        return None
    if not consistent:
        report_once(f"image cache {cache_file} does not match its images: decoding them again")
        return None
    return images, kept, skipped


def _check_writable(cache_dir: Path) -> None:
    """Refuse a cache folder that cannot be made, or a file made in."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(prefix=".probe.", dir=cache_dir).close()
    except OSError as err:
        raise DataUnavailableError(
            f"cannot write the image cache in {cache_dir} ({first_line(err)}): "
            "make the folder writable, or choose another cache folder"
        ) from err
