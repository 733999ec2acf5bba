"""CIFAR-10: download the archive, check its digest and members, extract it whole, read its batches safely."""

import hashlib
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import zlib
from pathlib import Path, PurePosixPath
from typing import ClassVar

import torch
from lightning_kit.data import DataUnavailableError
from lightning_kit.files import NotAFileError, kind_of, open_regular

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
CIFAR10_BATCHES = (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def ensure_cifar10(data_dir: Path) -> None:
    """Make sure ``data_dir`` holds CIFAR-10's complete extracted folder.

    The archive (placed by hand, or downloaded when absent) is extracted only when its MD5
    is CIFAR-10's. A folder with batch files missing is extracted again from the archive.
    """
    folder, archive = data_dir / CIFAR10_FOLDER, data_dir / CIFAR10_ARCHIVE
    if archive.exists() and (kind := kind_of(archive.stat().st_mode)) is not None:
        raise DataUnavailableError(
            f"{archive} is {kind}, not the CIFAR-10 archive: remove it, or put the archive there"
        )
    missing = [name for name in CIFAR10_BATCHES if not (folder / name).is_file()]
    if folder.is_dir() and not missing:
        return
    if folder.is_dir() and not archive.is_file():
        raise DataUnavailableError(
            f"{folder / missing[0]} is missing: {folder} is an incomplete CIFAR-10 folder. "
            f"Remove it to have CIFAR-10 downloaded again, or place {CIFAR10_ARCHIVE} in {data_dir}/."
        )
    if not archive.is_file():
        download_cifar10(data_dir)
    extract_cifar10(archive, data_dir)


def download_cifar10(data_dir: Path) -> None:
    """Download CIFAR-10's archive into ``data_dir``, under its own name only once its MD5 is checked.

    A download that stops half-way leaves no file that a later run would take for the archive.
    """
    from torchvision.datasets.utils import download_url

    partial = data_dir / f"{CIFAR10_ARCHIVE}.part"
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        download_url(CIFAR10_URL, str(data_dir), filename=partial.name, md5=CIFAR10_MD5)
        partial.replace(data_dir / CIFAR10_ARCHIVE)
    except (urllib.error.URLError, OSError, RuntimeError) as err:
        raise DataUnavailableError(
            f"CIFAR-10 is not in {data_dir}/ and could not be downloaded ({err}). "
            f"Place {CIFAR10_ARCHIVE} from {CIFAR10_URL} in {data_dir}/, "
            "or train on offline data with --data.dataset synthetic."
        ) from err
    finally:
        partial.unlink(missing_ok=True)


def extract_cifar10(archive: Path, data_dir: Path) -> None:
    """Check ``archive``'s MD5, then extract its ``cifar-10-batches-py`` folder into ``data_dir``.

    Extraction goes into a temporary folder inside ``data_dir``, removed whatever happens, and
    the folder is renamed into place only when complete: a damaged archive or a stopped run
    never leaves a partial folder where the next run looks. An incomplete folder is replaced.
    """
    found = file_md5(archive)
    if found != CIFAR10_MD5:
        raise DataUnavailableError(
            f"{archive} is not the CIFAR-10 archive: its MD5 is {found}, not {CIFAR10_MD5}. "
            f"Download it again from {CIFAR10_URL}, or remove it to have it downloaded."
        )
    scratch = Path(tempfile.mkdtemp(prefix=f".{CIFAR10_FOLDER}-", dir=data_dir))
    try:
        try:
            _extract_members(archive, scratch)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
            raise DataUnavailableError(
                f"{archive} could not be extracted into {data_dir}/ ({err}), and nothing of it was kept. "
                "Check the space and permissions there, or remove the archive to have it downloaded again."
            ) from err
        extracted, target = scratch / CIFAR10_FOLDER, data_dir / CIFAR10_FOLDER
        missing = [name for name in CIFAR10_BATCHES if not (extracted / name).is_file()]
        if missing:
            raise DataUnavailableError(
                f"{archive} has no {CIFAR10_FOLDER}/{missing[0]}: it is not the CIFAR-10 archive. "
                f"Download it again from {CIFAR10_URL}, or remove it to have it downloaded."
            )
        if target.exists() or target.is_symlink():
            target.rename(scratch / "incomplete")  # removed with the temporary folder
        extracted.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _extract_members(archive: Path, into: Path) -> None:
    """Extract ``archive`` into ``into``, refusing any member but files and folders inside ``cifar-10-batches-py/``."""
    # PEP 706's "data" filter (Python 3.10.12, 3.11.4, 3.12 and later) also refuses links
    # out of `into` and drops special permissions; the check below covers older versions.
    options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with open_regular(archive) as file, tarfile.open(fileobj=file, mode="r:gz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name.replace("\\", "/")).parts
            if parts[:1] != (CIFAR10_FOLDER,) or ".." in parts or not (member.isfile() or member.isdir()):
                raise DataUnavailableError(
                    f"{archive} holds {member.name!r}, not a file or folder inside {CIFAR10_FOLDER}/: "
                    "it is not the CIFAR-10 archive, and nothing of it was kept. Remove it."
                )
            tar.extract(member, into, **options)


def file_md5(path: Path) -> str:
    """The MD5 digest of the file at ``path``, as hexadecimal."""
    digest = hashlib.md5(usedforsecurity=False)  # a checksum, not a security measure
    with open_regular(path) as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_cifar10_batches(folder: Path, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Read CIFAR-10's Python-format batch files into ``uint8`` images ``(N, 3, 32, 32)`` and labels ``(N,)``."""
    images, labels = [], []
    for name in names:
        path = folder / name
        if not path.exists():
            raise DataUnavailableError(f"{path} is missing: {folder} is not a complete CIFAR-10 folder.")
        try:
            with open_regular(path) as file:
                batch = _BatchUnpickler(file, encoding="latin1").load()
        except NotAFileError as err:
            raise DataUnavailableError(
                f"{err}: {folder} is not a CIFAR-10 folder. Remove it to have it extracted again."
            ) from err
        images.append(torch.as_tensor(batch["data"], dtype=torch.uint8).view(-1, 3, 32, 32))
        labels.append(torch.as_tensor(batch["labels"], dtype=torch.long))
    return torch.cat(images), torch.cat(labels)


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles CIFAR-10 batches (dicts of lists and NumPy arrays) and refuses anything else.

    CIFAR-10 ships as pickles; this loader never runs code a tampered file might name.
    """

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            # How Python 3 writes bytes at pickle protocol 2; it only encodes a string.
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR-10 batch file")
        return super().find_class(module, name)
