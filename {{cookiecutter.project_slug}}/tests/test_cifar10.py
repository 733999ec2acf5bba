"""CIFAR-10: the archive checked (digest, members) and extracted whole, downloads renamed into place when complete,
and batch files read without running pickled code."""

import hashlib
import io
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning_kit.data import DataUnavailableError

from {{ cookiecutter.project_slug }}.data import cifar10
from {{ cookiecutter.project_slug }}.data.images import ImageDataModule


def _tar_member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    """A tar member named `name`, as `tarfile.addfile` takes it."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    return info, io.BytesIO(data) if kind == tarfile.REGTYPE else None


def _write_tiny_cifar10_archive(folder: Path, per_batch: int = 4, extra: tuple = ()) -> Path:
    """A cifar-10-python.tar.gz laid out and pickled as the real one is, with `per_batch` images per file.

    `extra` members (from `_tar_member`) are appended after CIFAR-10's own.
    """
    rng = np.random.default_rng(0)
    members = [_tar_member(cifar10.CIFAR10_FOLDER, kind=tarfile.DIRTYPE)]
    for name in (*cifar10.CIFAR10_TRAIN_BATCHES, cifar10.CIFAR10_TEST_BATCH):
        batch = {
            "batch_label": name,
            "labels": rng.integers(0, 10, per_batch).tolist(),
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "filenames": [f"{name}_{i}.png" for i in range(per_batch)],
        }
        members.append(_tar_member(f"{cifar10.CIFAR10_FOLDER}/{name}", pickle.dumps(batch, protocol=2)))
    archive = folder / cifar10.CIFAR10_ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for info, data in (*members, *extra):
            tar.addfile(info, data)
    return archive


def _accept_md5_of(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Take `archive`'s MD5 for CIFAR-10's, as the real archive's is taken."""
    monkeypatch.setattr(cifar10, "CIFAR10_MD5", hashlib.md5(archive.read_bytes()).hexdigest())


def test_cifar10_loads_from_an_archive_in_its_own_format(tmp_path, monkeypatch):
    """A placed archive is extracted in prepare_data and read in setup: 5 train batches, 1 test batch."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    _accept_md5_of(_write_tiny_cifar10_archive(data_dir, per_batch=4), monkeypatch)
    dm = ImageDataModule(dataset="cifar10", data_dir=str(data_dir), val_fraction=0.25)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (15, 5, 4)
    raw = pickle.loads((data_dir / cifar10.CIFAR10_FOLDER / "test_batch").read_bytes(), encoding="latin1")
    test_images, test_labels = dm.splits["test"].tensors
    assert torch.equal(test_images[1], torch.from_numpy(raw["data"][1]).view(3, 32, 32))
    assert test_labels.tolist() == raw["labels"]
    assert {path.name for path in data_dir.iterdir()} == {cifar10.CIFAR10_ARCHIVE, cifar10.CIFAR10_FOLDER}


def test_an_archive_with_another_md5_is_refused_before_extraction(tmp_path):
    """A file that is not CIFAR-10's archive gets one line with both digests and what to do; nothing is extracted."""
    archive = _write_tiny_cifar10_archive(tmp_path)
    found = hashlib.md5(archive.read_bytes()).hexdigest()
    expected = rf"its MD5 is {found}, not {cifar10.CIFAR10_MD5}\. Download it again .*, or remove it"
    with pytest.raises(DataUnavailableError, match=expected) as caught:
        cifar10.ensure_cifar10(tmp_path)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == [archive]


@pytest.mark.parametrize(
    "member",
    [
        _tar_member("../../escape", b"x"),
        _tar_member(f"{cifar10.CIFAR10_FOLDER}/../../../escape", b"x"),
        _tar_member("/absolute/escape", b"x"),
        _tar_member(f"{cifar10.CIFAR10_FOLDER}/link", kind=tarfile.SYMTYPE, link="../../escape"),
    ],
    ids=["parent", "parent-inside-folder", "absolute", "symlink"],
)
def test_an_archive_reaching_outside_its_folder_is_refused(tmp_path, monkeypatch, member):
    """A member that would land outside cifar-10-batches-py/ stops extraction; nothing is written or kept."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = _write_tiny_cifar10_archive(data_dir, extra=(member,))
    _accept_md5_of(archive, monkeypatch)
    with pytest.raises(DataUnavailableError, match=rf"holds '{member[0].name}', not a file or folder inside"):
        cifar10.ensure_cifar10(data_dir)
    assert sorted(tmp_path.rglob("*")) == [data_dir, archive]


def test_a_truncated_archive_leaves_no_partial_folder(tmp_path, monkeypatch):
    """A damaged archive stops with one line and leaves data/ as it was; a good archive then works."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = _write_tiny_cifar10_archive(data_dir, per_batch=64)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    _accept_md5_of(archive, monkeypatch)  # as if the truncated file's digest were CIFAR-10's
    with pytest.raises(DataUnavailableError, match="could not be extracted") as caught:
        cifar10.ensure_cifar10(data_dir)
    assert "\n" not in str(caught.value)
    assert list(data_dir.iterdir()) == [archive]
    _accept_md5_of(_write_tiny_cifar10_archive(data_dir), monkeypatch)
    cifar10.ensure_cifar10(data_dir)
    assert len(list((data_dir / cifar10.CIFAR10_FOLDER).iterdir())) == 6


def test_an_incomplete_folder_is_extracted_again_from_the_archive(tmp_path, monkeypatch):
    """A cifar-10-batches-py folder with batch files missing is replaced by the archive's complete one."""
    folder = tmp_path / cifar10.CIFAR10_FOLDER
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"half written")
    _accept_md5_of(_write_tiny_cifar10_archive(tmp_path), monkeypatch)
    dm = ImageDataModule(dataset="cifar10", data_dir=str(tmp_path), val_fraction=0.25)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (15, 5, 4)
    assert {path.name for path in tmp_path.iterdir()} == {cifar10.CIFAR10_ARCHIVE, cifar10.CIFAR10_FOLDER}


def test_an_incomplete_folder_without_archive_names_the_missing_file(tmp_path):
    """With no archive to extract again, one line names the first missing batch file and the two ways out."""
    folder = tmp_path / cifar10.CIFAR10_FOLDER
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"")
    with pytest.raises(DataUnavailableError, match=r"data_batch_2 is missing.*Remove it.*place cifar-10") as caught:
        cifar10.ensure_cifar10(tmp_path)
    assert "\n" not in str(caught.value)


def test_a_download_lands_under_the_archive_name_only_when_complete(tmp_path, monkeypatch):
    """A download that fails half-way leaves nothing behind; a complete one is checked and extracted."""
    from torchvision.datasets import utils

    good = _write_tiny_cifar10_archive(tmp_path).read_bytes()
    data_dir = tmp_path / "data"

    def failing_download(url, root, filename, md5):
        Path(root, filename).write_bytes(good[:100])
        raise OSError("connection reset")

    def download(url, root, filename, md5):
        assert md5 == cifar10.CIFAR10_MD5 and filename != cifar10.CIFAR10_ARCHIVE
        Path(root, filename).write_bytes(good)

    monkeypatch.setattr(cifar10, "CIFAR10_MD5", hashlib.md5(good).hexdigest())
    monkeypatch.setattr(utils, "download_url", failing_download)
    with pytest.raises(DataUnavailableError, match="connection reset"):
        cifar10.ensure_cifar10(data_dir)
    assert list(data_dir.iterdir()) == []
    monkeypatch.setattr(utils, "download_url", download)
    cifar10.ensure_cifar10(data_dir)
    assert {path.name for path in data_dir.iterdir()} == {cifar10.CIFAR10_ARCHIVE, cifar10.CIFAR10_FOLDER}


def test_missing_cifar10_without_network_says_what_to_do(tmp_path, monkeypatch):
    """With no archive and no route to the download server, one error names the archive and the synthetic option."""
    monkeypatch.setattr(cifar10, "CIFAR10_URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    dm = ImageDataModule(dataset="cifar10", data_dir=str(tmp_path / "data"))
    with pytest.raises(DataUnavailableError, match=r"cifar-10-python\.tar\.gz.*--data\.dataset synthetic"):
        dm.prepare_data()


def test_cifar10_reader_refuses_pickled_code(tmp_path):
    """A batch file that would call a function when unpickled is rejected, and the function never runs."""
    folder = tmp_path / cifar10.CIFAR10_FOLDER
    folder.mkdir()

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    (folder / "test_batch").write_bytes(pickle.dumps({"data": Exploit(), "labels": []}))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        cifar10.read_cifar10_batches(folder, ("test_batch",))
    assert not (tmp_path / "pwned").exists()


def test_a_fifo_in_place_of_the_cifar10_archive_or_a_batch_is_refused_by_name(tmp_path, monkeypatch, make_fifo):
    """Neither the archive nor a batch file is opened unless it is a plain file: a FIFO would never end."""
    monkeypatch.setattr(cifar10, "CIFAR10_URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")  # nothing downloaded
    archive = make_fifo(tmp_path / "data" / cifar10.CIFAR10_ARCHIVE)
    with pytest.raises(DataUnavailableError, match="^" + re.escape(f"{archive} is a FIFO (named pipe), not the CIFAR")):
        ImageDataModule(dataset="cifar10", data_dir=str(tmp_path / "data")).prepare_data()
    batch = make_fifo(tmp_path / cifar10.CIFAR10_FOLDER / "test_batch")
    with pytest.raises(DataUnavailableError, match="^" + re.escape(f"{batch} is a FIFO (named pipe), not a file: ")):
        cifar10.read_cifar10_batches(batch.parent, ("test_batch",))
