"""Decoding image files: every kind to its colour in RGB, upright, bad files named or skipped, and the cache read
instead of decoding until a file changes."""

import errno
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ORANGE, png_header, solid
from PIL import Image

from lightning_kit.data import DataUnavailableError, image_decoding
from lightning_kit.data.image_decoding import (
    ImageTooLargeError,
    UnreadableImageError,
    channel_stats,
    decode_image,
    load_images,
)
from lightning_kit.data.image_files import list_labelled_images
from lightning_kit.errors import ConfigError

JPEG_TOLERANCE = 6


def test_every_kind_of_image_decodes_to_its_colour_in_rgb(tmp_path):
    gray = (128, 128, 128)
    files = [
        solid(tmp_path / "rgb.png"),
        solid(tmp_path / "rgb.jpg", quality=95),
        solid(tmp_path / "gray.png", gray, mode="L"),
        solid(tmp_path / "rgba.png", mode="RGBA"),
        solid(tmp_path / "palette.png", mode="P"),
        solid(tmp_path / "twice.png", size=(64, 64)),  # downscaled 2x
        solid(tmp_path / "small.webp", size=(5, 7), lossless=True),  # upscaled
        solid(tmp_path / "rgb.bmp"),
        solid(tmp_path / "rgb.tiff"),
        solid(tmp_path / "anim.gif"),
        tmp_path / "gray16.png",
    ]
    Image.fromarray(np.full((10, 30), 128 * 257, dtype=np.uint16)).save(files[-1])  # 16 bits a channel
    images, kept = load_images(files, size=32, workers=2)
    assert images.dtype == torch.uint8 and images.shape == (len(files), 3, 32, 32)
    assert kept == tuple(range(len(files)))
    expected = torch.tensor([gray if "gray" in file.name else ORANGE for file in files], dtype=torch.float)
    error = (images.float() - expected[:, :, None, None]).abs().amax(dim=(1, 2, 3))
    assert error[1] <= JPEG_TOLERANCE, error
    assert error[[i for i in range(len(files)) if i != 1]].max() <= 1, error


def test_exif_orientation_turns_the_image_upright(tmp_path):
    pixels = np.zeros((16, 32, 3), np.uint8)
    pixels[:, :16] = (255, 0, 0)
    pixels[:, 16:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 3  # rotated 180 degrees: what is stored on the left shows on the right
    path = tmp_path / "turned.jpg"
    Image.fromarray(pixels).save(path, quality=95, exif=exif)
    images, _ = load_images([path], size=16, workers=1)
    assert images[0, 2, 8, 2] > 200 and images[0, 0, 8, 13] > 200


@pytest.fixture
def with_bad_files(tmp_path: Path) -> list[Path]:
    good = solid(tmp_path / "good.png")
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(np.random.default_rng(0).bytes(300))
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(solid(tmp_path / "whole.png", size=(64, 64)).read_bytes()[:70])
    return [garbage, good, truncated]


def test_unreadable_files_stop_the_load_naming_them_and_the_way_out(with_bad_files):
    garbage, _, truncated = with_bad_files
    with pytest.raises(UnreadableImageError) as caught:
        load_images(with_bad_files, size=8, workers=2)
    message = str(caught.value)
    assert message.startswith(f"2 of 3 images cannot be read: {garbage}, {truncated} ({garbage}: ")
    # Pillow's own words for bytes it cannot place name an in-memory object ("<_io.BytesIO object at 0x...>").
    assert f"({garbage}: no image format that Pillow reads)" in message, message
    assert "--data.skip_unreadable true" in message and "\n" not in message


def test_unreadable_files_can_be_skipped_each_reported_on_one_line(with_bad_files, capsys):
    garbage, _, truncated = with_bad_files
    images, kept = load_images(with_bad_files, size=8, workers=2, skip_unreadable=True)
    assert kept == (1,) and images.shape == (1, 3, 8, 8)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines] == [
        f"skipped unreadable image {garbage}",
        f"skipped unreadable image {truncated}",
    ]
    assert all(len(line.split(": ", 1)[1]) > 0 for line in lines)
    with pytest.raises(UnreadableImageError, match=r"^none of the 2 images can be read"):
        load_images([garbage, truncated], size=8, skip_unreadable=True)


def test_bad_sizes_and_thread_counts_are_refused(tmp_path):
    files = [solid(tmp_path / "a.png")]
    for arguments in ({"size": 0}, {"size": 8.0}, {"size": 8, "workers": 0}, {"size": True}):
        with pytest.raises(ConfigError):
            load_images(files, **arguments)


def _no_decoding(*args):
    raise AssertionError("decoded although the cache holds the images")


def test_the_cache_is_read_instead_of_decoding_until_a_file_changes(tmp_path, monkeypatch):
    files = [solid(tmp_path / f"{i}.png", (i * 40, 0, 0)) for i in range(4)]
    cache = tmp_path / "cache"
    first = load_images(files, size=8, cache_dir=cache, workers=2)
    assert [path.name for path in cache.iterdir() if not path.name.startswith("images-")] == []
    with monkeypatch.context() as patched:
        patched.setattr(image_decoding, "_decode", _no_decoding)
        second = load_images(files, size=8, cache_dir=cache, workers=2)
    assert torch.equal(first[0], second[0]) and first[1] == second[1]

    solid(files[2], (0, 250, 0), size=(21, 12))
    os.utime(files[2], ns=(1, 1))  # a different size and time, though either would do
    images, _ = load_images(files, size=8, cache_dir=cache, workers=2)
    assert images[2, 1].min() >= 249 and torch.equal(images[[0, 1, 3]], first[0][[0, 1, 3]])
    assert len(list(cache.iterdir())) == 2  # the old file set's cache stays


def test_a_damaged_cache_file_is_ignored_and_rewritten(tmp_path, monkeypatch, capsys):
    files = [solid(tmp_path / "a.png")]
    cache = tmp_path / "cache"
    expected, _ = load_images(files, size=8, cache_dir=cache)
    (cache_file,) = cache.iterdir()
    cache_file.write_bytes(b"not a cache")
    images, _ = load_images(files, size=8, cache_dir=cache)
    assert torch.equal(images, expected)
    assert f"image cache {cache_file} is unreadable" in capsys.readouterr().out
    monkeypatch.setattr(image_decoding, "_decode", _no_decoding)
    assert torch.equal(load_images(files, size=8, cache_dir=cache)[0], expected)


def test_skipped_files_are_reported_again_from_the_cache(with_bad_files, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    load_images(with_bad_files, size=8, cache_dir=cache, skip_unreadable=True)
    reported = capsys.readouterr().out
    with monkeypatch.context() as patched:
        patched.setattr(image_decoding, "_decode", _no_decoding)
        _, kept = load_images(with_bad_files, size=8, cache_dir=cache, skip_unreadable=True)
    assert kept == (1,) and capsys.readouterr().out == reported
    with pytest.raises(UnreadableImageError):  # a cache written while skipping is not one that allows no bad files
        load_images(with_bad_files, size=8, cache_dir=cache)


def test_a_cache_folder_that_cannot_be_made_is_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / "taken").write_text("a file where the cache folder should be")
    cache = tmp_path / "taken" / "cache"
    monkeypatch.setattr(image_decoding, "_decode", _no_decoding)  # refused before any decoding
    with pytest.raises(DataUnavailableError, match="^" + re.escape(f"cannot write the image cache in {cache} (")):
        load_images([solid(tmp_path / "a.png")], size=8, cache_dir=cache)


def test_channel_stats_match_a_direct_computation(monkeypatch):
    images = torch.randint(0, 256, (50, 3, 6, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(image_decoding, "STATS_CHUNK_VALUES", 200)  # several chunks, the last one short
    mean, std = channel_stats(images)
    scaled = images.double() / 255
    torch.testing.assert_close(torch.tensor(mean, dtype=torch.double), scaled.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(torch.tensor(std, dtype=torch.double), scaled.std(dim=(0, 2, 3), correction=0))


def test_a_fifo_among_the_images_is_refused_by_name_or_skipped(layout, tmp_path, make_fifo, capsys):
    """A FIFO named like an image is never opened: it stops the load by name, or is skipped as unreadable."""
    fifo = make_fifo(layout / "cat" / "pipe.png")
    files = list_labelled_images(layout).files
    assert fifo in files
    for cache in (None, tmp_path / "cache"):
        with pytest.raises(UnreadableImageError, match=re.escape(f"({fifo}: it is a FIFO (named pipe), not a file)")):
            load_images(files, size=8, cache_dir=cache)
    capsys.readouterr()
    images, kept = load_images(files, size=8, cache_dir=tmp_path / "cache", skip_unreadable=True)
    assert len(kept) == len(files) - 1 == len(images) and files.index(fifo) not in kept
    assert capsys.readouterr().out == f"skipped unreadable image {fifo}: it is a FIFO (named pipe), not a file\n"


def test_a_file_larger_than_any_image_is_refused_unread_by_name_or_skipped(tmp_path, capsys):
    """A file past the largest image Pillow decodes (a video named .jpg) is never read whole into memory."""
    good = solid(tmp_path / "good.png")
    huge = tmp_path / "video.jpg"
    with huge.open("wb") as file:
        file.truncate(image_decoding.MAX_FILE_BYTES + 1)  # sparse: no disk is used, and reading it would take 1.4 GB
    for cache in (None, tmp_path / "cache"):
        with pytest.raises(UnreadableImageError, match=re.escape(f"({huge}: a file of 1.4 GiB, more than any image")):
            load_images([good, huge], size=8, cache_dir=cache)
    capsys.readouterr()
    images, kept = load_images([good, huge], size=8, cache_dir=tmp_path / "cache", skip_unreadable=True)
    assert kept == (0,) and images.shape == (1, 3, 8, 8)
    assert capsys.readouterr().out.startswith(f"skipped unreadable image {huge}: a file of 1.4 GiB")


def test_an_image_rewritten_in_place_with_its_size_and_time_is_decoded_anew(tmp_path):
    """The cache knows a file by its content: the same size and modification time do not make it serve old pixels."""
    path = solid(tmp_path / "a.bmp", (255, 0, 0))  # uncompressed: the same size whatever the colour
    before = os.stat(path)
    red, _ = load_images([path], size=8, cache_dir=tmp_path / "cache")
    solid(path, (0, 0, 255))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    blue, _ = load_images([path], size=8, cache_dir=tmp_path / "cache")
    assert red[0, 0].min() == 255 and blue[0, 2].min() == 255 and blue[0, 0].max() == 0


def test_a_cache_that_cannot_be_written_is_a_warning_and_the_images_still_come(tmp_path, monkeypatch, capsys):
    """A full disk while caching: one warning line, the decoded images, and no cache file, whole or partial."""
    files = [solid(tmp_path / "a.png")]
    cache = tmp_path / "cache"

    def no_space(source, target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", no_space)  # where the finished cache file would be renamed into place
        images, kept = load_images(files, size=8, cache_dir=cache)
    assert images.shape == (1, 3, 8, 8) and kept == (0,)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"warning: the image cache {cache}/images-") and "(No space left on device)" in line
    assert list(cache.iterdir()) == []
    assert torch.equal(load_images(files, size=8, cache_dir=cache)[0], images)
    assert len(list(cache.iterdir())) == 1


def test_a_channel_that_never_varies_gets_the_deviation_of_one_level_not_zero():
    """Images with no green at all normalise to finite values: the channel's deviation is 1/255, not 0."""
    images = torch.zeros(4, 3, 5, 5, dtype=torch.uint8)
    images[:, 0] = torch.randint(0, 256, (4, 5, 5), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    means, stds = channel_stats(images)
    assert means[1] == 0 and stds[1] == 1 / 255 and stds[2] == 1 / 255
    assert stds[0] > 1 / 255


@pytest.mark.parametrize(
    ("side", "said"),
    [(10_000, "10000x10000"), (20_000, "400,000,000")],
    ids=["under Pillow's limit", "over Pillow's limit"],
)
def test_an_image_over_max_pixels_names_that_limit_whatever_pillow_allows(side, said):
    """Pillow refuses over twice its MAX_IMAGE_PIXELS itself, unsized: said as the caller's limit all the same."""
    with pytest.raises(ImageTooLargeError) as refused:
        decode_image(png_header(side, side), 32, 50_000_000)
    assert str(refused.value) == f"an image of {said} pixels, more than 50,000,000"
