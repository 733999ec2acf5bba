"""Image folders: which files are read with which labels, how they decode, what a bad file or folder says, the cache."""

import errno
import os
import re
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HANG_GUARD_S
from PIL import Image

from {{ cookiecutter.project_slug }}.data import DataUnavailableError, folders
from {{ cookiecutter.project_slug }}.data.folders import (
    ImageFiles,
    UnreadableImageError,
    channel_stats,
    find_classes,
    list_images,
    list_labelled_images,
    load_images,
)
from {{ cookiecutter.project_slug }}.data.images import ImageFolderDataModule
from {{ cookiecutter.project_slug }}.errors import ConfigError

ORANGE = (200, 100, 50)
JPEG_TOLERANCE = 6


def solid(path: Path, colour=ORANGE, size: tuple[int, int] = (20, 12), mode: str = "RGB", **save) -> Path:
    """An image of one colour, in ``mode``, written in the format its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, colour)
    image = image.convert("P", palette=Image.Palette.ADAPTIVE) if mode == "P" else image.convert(mode)
    image.save(path, **save)
    return path


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """Two classes, images at two depths and in mixed case, and what must be ignored: hidden and non-image files."""
    root = tmp_path / "train"
    for name in ("cat/b.png", "cat/a.jpg", "cat/deeper/c.PNG", "dog/z.jpeg"):
        solid(root / name)
    solid(root / "cat" / ".hidden.png")
    solid(root / ".thumbnails" / "x.png")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def test_classes_and_labels_come_from_the_layout_sorted(layout):
    found = list_labelled_images(layout)
    assert find_classes(layout) == ("cat", "dog")
    assert found == ImageFiles(
        files=tuple(layout / name for name in ("cat/a.jpg", "cat/b.png", "cat/deeper/c.PNG", "dog/z.jpeg")),
        labels=(0, 0, 0, 1),
        class_names=("cat", "dog"),
    )


def test_a_split_uses_the_training_classes_and_may_lack_some(layout, tmp_path):
    solid(tmp_path / "val" / "dog" / "d.png")
    found = list_labelled_images(tmp_path / "val", ("bird", "cat", "dog"))
    assert found.labels == (2,) and found.class_names == ("bird", "cat", "dog")


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda root: None, "{root} does not exist"),
        (lambda root: root.write_text("x"), "{root} is a file, not a folder"),
        (lambda root: (root / ".git").mkdir(parents=True), "{root} has no class folders"),
        (lambda root: (root / "cat").mkdir(parents=True), "{root}/cat holds no images"),
        (lambda root: solid(root / "cat" / "a.png") and solid(root / "b.png"), "{root}/b.png is not inside a class"),
    ],
    ids=["missing", "file", "no classes", "empty class", "loose image"],
)
def test_a_bad_training_folder_is_one_line_naming_it(tmp_path, make, expected):
    root = tmp_path / "train"
    make(root)
    with pytest.raises(DataUnavailableError, match="^" + re.escape(expected.format(root=root))):
        list_labelled_images(root)


def test_a_class_unknown_to_training_names_the_folder_and_the_known_classes(layout, tmp_path):
    solid(tmp_path / "val" / "cow" / "a.png")
    with pytest.raises(DataUnavailableError) as caught:
        list_labelled_images(tmp_path / "val", ("cat", "dog"))
    assert str(caught.value).startswith(f"{tmp_path / 'val' / 'cow'} is not one of the training classes (cat, dog)")


def test_predict_reads_a_file_a_list_or_a_folder(layout, tmp_path):
    classes = ("cat", "dog")
    assert list_images(layout / "cat" / "a.jpg", classes) == ImageFiles((layout / "cat" / "a.jpg",), None, classes)
    listing = tmp_path / "todo.txt"
    listing.write_text(f"# to predict\ntrain/dog/z.jpeg\n\n  {layout / 'cat' / 'a.jpg'}  \n")
    assert list_images(listing, classes).files == (layout / "dog" / "z.jpeg", layout / "cat" / "a.jpg")
    assert list_images(layout, classes) == list_labelled_images(layout)
    unlabelled = list_images(layout / "cat", classes)  # its subfolder "deeper" is no class
    assert unlabelled.labels is None
    assert unlabelled.files == tuple(layout / "cat" / name for name in ("a.jpg", "b.png", "deeper/c.PNG"))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("# nothing\n\n", "{list} lists no images"),
        ("train/cat/a.jpg\n\ntrain/cat/gone.png\n", "{list}, line 3: {tmp}/train/cat/gone.png does not exist"),
    ],
    ids=["empty list", "missing file"],
)
def test_a_bad_list_is_one_line_naming_it(layout, tmp_path, content, expected):
    listing = tmp_path / "todo.txt"
    listing.write_text(content)
    with pytest.raises(DataUnavailableError, match="^" + re.escape(expected.format(list=listing, tmp=tmp_path))):
        list_images(listing, ("cat", "dog"))


def test_predict_refuses_what_holds_no_images(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "data.csv").write_text("1,2")
    for path, expected in [
        (tmp_path / "empty", "holds no images"),
        (tmp_path / "data.csv", "is neither an image"),
        (tmp_path / "gone", "does not exist"),
    ]:
        with pytest.raises(DataUnavailableError, match="^" + re.escape(f"{path} {expected}")):
            list_images(path, ("cat",))


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
        patched.setattr(folders, "_decode", _no_decoding)
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
    monkeypatch.setattr(folders, "_decode", _no_decoding)
    assert torch.equal(load_images(files, size=8, cache_dir=cache)[0], expected)


def test_skipped_files_are_reported_again_from_the_cache(with_bad_files, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    load_images(with_bad_files, size=8, cache_dir=cache, skip_unreadable=True)
    reported = capsys.readouterr().out
    with monkeypatch.context() as patched:
        patched.setattr(folders, "_decode", _no_decoding)
        _, kept = load_images(with_bad_files, size=8, cache_dir=cache, skip_unreadable=True)
    assert kept == (1,) and capsys.readouterr().out == reported
    with pytest.raises(UnreadableImageError):  # a cache written while skipping is not one that allows no bad files
        load_images(with_bad_files, size=8, cache_dir=cache)


def test_a_cache_folder_that_cannot_be_made_is_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / "taken").write_text("a file where the cache folder should be")
    cache = tmp_path / "taken" / "cache"
    monkeypatch.setattr(folders, "_decode", _no_decoding)  # refused before any decoding
    with pytest.raises(DataUnavailableError, match="^" + re.escape(f"cannot write the image cache in {cache} (")):
        load_images([solid(tmp_path / "a.png")], size=8, cache_dir=cache)


def test_channel_stats_match_a_direct_computation(monkeypatch):
    images = torch.randint(0, 256, (50, 3, 6, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(folders, "STATS_CHUNK_VALUES", 200)  # several chunks, the last one short
    mean, std = channel_stats(images)
    scaled = images.double() / 255
    torch.testing.assert_close(torch.tensor(mean, dtype=torch.double), scaled.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(torch.tensor(std, dtype=torch.double), scaled.std(dim=(0, 2, 3), correction=0))


@contextmanager
def hang_guard():
    """Fail, instead of hanging the tests, when the code inside has not returned after ``HANG_GUARD_S``."""

    def stop(signum, frame):
        pytest.fail(f"still running after {HANG_GUARD_S} s")  # not an OSError, which os.walk would swallow

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(HANG_GUARD_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _identities(files) -> list[tuple[int, int]]:
    return [(os.stat(file).st_dev, os.stat(file).st_ino) for file in files]


def test_links_never_lead_a_listing_around_a_loop_or_out_of_its_folder(layout, tmp_path, capsys):
    """Each image is listed once under its own path; links to folders and links out of the root are not followed."""
    elsewhere = solid(tmp_path / "elsewhere" / "x.png")
    (layout / "cat" / "loop").symlink_to(layout / "cat")  # a folder inside itself
    (layout / "dog" / "up").symlink_to(layout)  # the root inside a class
    (layout / "dog" / "self.png").symlink_to("self.png")  # a link to itself
    (layout / "cat" / "alias.png").symlink_to(layout / "cat" / "b.png")  # a second name
    (layout / "dog" / "stolen.png").symlink_to(layout / "cat" / "a.jpg")  # a second name in another class
    (layout / "cat" / "outside.png").symlink_to(elsewhere)
    (layout / "dog" / "away").symlink_to(tmp_path / "elsewhere")
    (layout / "bird").symlink_to(tmp_path / "elsewhere")  # a class folder out of the root

    with hang_guard():  # links that loop used to be followed until the path was too long: for ever, with two
        found = list_labelled_images(layout)
    assert find_classes(layout) == ("cat", "dog")
    own = ("cat/a.jpg", "cat/b.png", "cat/deeper/c.PNG", "dog/self.png", "dog/z.jpeg")
    assert found == ImageFiles(tuple(layout / name for name in own), (0, 0, 0, 1, 1), ("cat", "dog"))
    (line,) = capsys.readouterr().out.splitlines()  # one line says what was left out, and why
    assert line.startswith(f"listing {layout}: left out 3 link(s) leading out of it, not followed (")
    assert f"{layout / 'bird'} -> {tmp_path / 'elsewhere'}" in line
    assert "2 more name(s) (links) of images it lists, each image listed once" in line
    assert list_images(layout / "dog", ("cat", "dog")).files == (layout / "dog" / "self.png", layout / "dog" / "z.jpeg")


def test_an_image_reached_through_links_lands_in_one_split_only(tmp_path):
    """The validation images drawn from a training folder are other files than the training images."""
    for k in range(10):
        solid(tmp_path / "data" / ("cat" if k % 2 else "dog") / f"{k}.png")
    for name in ("again", "more"):  # each class folder linked into the other, twice
        (tmp_path / "data" / "cat" / name).symlink_to(tmp_path / "data" / "dog")
        (tmp_path / "data" / "dog" / name).symlink_to(tmp_path / "data")
    for k in range(10):
        (tmp_path / "data" / "cat" / f"link{k}.png").symlink_to(tmp_path / "data" / "dog" / f"{k - k % 2}.png")
    data = ImageFolderDataModule(root=str(tmp_path / "data"), val_fraction=0.2, cache_dir=None)
    with hang_guard():
        train, val = data._files("train"), data._files("val")
    assert len(train.files) + len(val.files) == 10
    assert not set(_identities(train.files)) & set(_identities(val.files))


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


@pytest.mark.parametrize("name", ["pipe.png", "pipe.txt"])
def test_a_fifo_to_predict_on_is_refused_by_name(tmp_path, make_fifo, name):
    """A FIFO given to predict on, as an image or as a list, is refused in one line without being opened."""
    fifo = make_fifo(tmp_path / name)
    with pytest.raises(DataUnavailableError, match="^" + re.escape(f"{fifo} is a FIFO (named pipe), not a file: ")):
        list_images(fifo, ("cat",))


def test_a_list_naming_a_fifo_or_a_folder_is_refused_at_that_line(layout, tmp_path, make_fifo):
    """Each line of a list must name a plain file; absolute paths and links are taken as written."""
    make_fifo(tmp_path / "pipe.png")
    (tmp_path / "link.png").symlink_to(layout / "dog" / "z.jpeg")
    listing = tmp_path / "todo.txt"
    for line, reason in [("pipe.png", "a FIFO (named pipe)"), ("train/cat", "a folder")]:
        listing.write_text(f"{layout / 'cat' / 'a.jpg'}\nlink.png\n{line}\n")
        expected = f"{listing}, line 3: {tmp_path / line} is {reason}, not an image"
        with pytest.raises(DataUnavailableError, match="^" + re.escape(expected)):
            list_images(listing, ("cat", "dog"))
    listing.write_text(f"{layout / 'cat' / 'a.jpg'}\nlink.png\n")
    assert list_images(listing, ("cat", "dog")).files == (layout / "cat" / "a.jpg", tmp_path / "link.png")


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
