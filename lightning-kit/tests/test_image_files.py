"""Image files: which files a folder, a list or a path names, with which labels; links never loop, leave the
folder or list a file twice; what a bad folder or list says."""

import os
import re
import signal
from contextlib import contextmanager

import pytest
from conftest import HANG_GUARD_S, solid

from lightning_kit.data import DataUnavailableError
from lightning_kit.data.folders import ImageFolderDataModule
from lightning_kit.data.image_files import ImageFiles, find_classes, list_images, list_labelled_images


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


def test_a_list_saved_with_a_byte_order_mark_is_read(layout, tmp_path):
    """Notepad saves UTF-8 with a byte order mark: it is no part of the first path."""
    listing = tmp_path / "todo.txt"
    listing.write_text("train/dog/z.jpeg\n", encoding="utf-8-sig")
    assert list_images(listing, ("cat", "dog")).files == (layout / "dog" / "z.jpeg",)


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


@pytest.mark.parametrize(
    ("folders", "said", "advice"),
    [
        (("train", "valid", "test"), "holds test/, train/, valid/: give it train/ and", "(rename valid/ to val/)"),
        (("train", "cat"), "holds cat/, train/: give it train/ and", "alone, each with one folder per class, or"),
        (("val", "test"), "holds test/, val/: give it train/ and", "or one folder per class alone"),
        (("training", "testing"), "holds testing/, training/:", "(rename testing/ to test/, training/ to train/)"),
    ],
    ids=["valid", "a class beside train", "no train", "training"],
)
def test_a_split_folder_beside_other_folders_is_refused_not_trained_as_a_class(tmp_path, folders, said, advice):
    """A data set as published (train/ valid/ test/) is not class folders: its splits would be trained as classes."""
    for folder in folders:
        solid(tmp_path / folder / "cat" / "a.png")
    with pytest.raises(DataUnavailableError) as caught:
        ImageFolderDataModule(root=tmp_path).setup("fit")
    message = str(caught.value)
    assert message.startswith(f"--data.root {tmp_path} {said}") and advice in message and "\n" not in message, message
