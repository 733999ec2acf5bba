"""A ``.pt2`` archive read within bounds: what ``torch.export.save`` writes for a plain program, and nothing more.

The directory is checked before anything is inflated; each entry is then read up to the size the directory says into
a copy with every entry stored, so PyTorch inflates nothing.
"""

import io
import json
import re
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from ..errors import UserError

# What `torch.export.save` writes for one plain program, below the archive's own folder, by kind: its records (the
# weights' and constants' configs among them), its extra files, and the weights and constants themselves.
_SAVED_ENTRIES = re.compile(
    r"[^/]+/(?:(?P<record>archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/[^/]+\.json|data/sample_inputs/[^/]+\.pt)|(?P<config>data/(?:weights|constants)/[^/]+_config\.json)"
    r"|(?P<extra>extra/[^/]+)|(?P<payload>data/(?:weights|constants)/[^/]+))"
)
_TENSOR_CONSTANT = "tensor_"  # torch.export's TENSOR_CONSTANT_FILENAME_PREFIX: a tensor stored raw, not pickled
# Together the entries may inflate to a few times the file's size (torch.export.save stores them uncompressed), or
# MIN_TOTAL_BYTES for a small file; each extra file, and each record but the weights and constants, less.
INFLATION = 4
MIN_TOTAL_BYTES = 64 * 1024 * 1024
MAX_EXTRA_BYTES = 4 * 1024 * 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_BYTES = {"record": MAX_RECORD_BYTES, "config": MAX_RECORD_BYTES, "extra": MAX_EXTRA_BYTES}  # by kind, but payload
MAX_ENTRIES = 100_000


class ModelFileError(UserError):
    """A model file that is missing, not an exported model, unsafe to load, or of inputs no server decodes."""


def stored_copy(path: Path, file: BinaryIO, size: int) -> io.BytesIO:
    """The archive in ``file`` (``size`` bytes), checked, as a copy with every entry stored."""
    with zipfile.ZipFile(file) as archive:
        entries = archive.infolist()
        if len(entries) > MAX_ENTRIES:
            raise ModelFileError(f"{path} holds {len(entries):,} entries, more than any exported program: refused")
        kinds = _check_directory(path, archive, size)
        copy = io.BytesIO()
        with zipfile.ZipFile(copy, "w", zipfile.ZIP_STORED) as stored:
            for entry in entries:
                data = _read(path, archive, entry)
                if kinds[entry.filename] == "config":
                    _check_payloads(path, entry.filename, data)
                stored.writestr(zipfile.ZipInfo(entry.filename, entry.date_time), data)
                del data
    copy.seek(0)
    return copy


def _check_directory(path: Path, archive: zipfile.ZipFile, size: int) -> dict[str, str]:
    """Each entry's kind (a group of ``_SAVED_ENTRIES``); refused where the directory names an entry that
    ``torch.export.save`` does not write, or says the entries inflate past their bounds."""
    total, kinds = max(INFLATION * size, MIN_TOTAL_BYTES), {}
    for entry in archive.infolist():
        saved = _SAVED_ENTRIES.fullmatch(entry.filename)
        if saved is None:
            refused = "which a plain exported program does not: refused, nothing was loaded"
            raise ModelFileError(f"{path} holds {entry.filename}, {refused}")
        if archive.getinfo(entry.filename) is not entry:  # zipfile's name for it is its last entry of that name
            raise ModelFileError(f"{path} holds {entry.filename} twice, as no exported program does: refused")
        kinds[entry.filename] = saved.lastgroup
        if entry.flag_bits & 0x1:
            raise ModelFileError(f"{path} holds {entry.filename} encrypted, as no exported program is: refused")
        if entry.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ModelFileError(
                f"{path} holds {entry.filename} compressed as no exported program is (method {entry.compress_type}): "
                "refused"
            )
        bound = min(total, MAX_BYTES.get(saved.lastgroup, total))  # weights and constants: as large as the model is
        if entry.file_size > bound:
            raise ModelFileError(
                f"{path} holds {entry.filename}, which inflates to {entry.file_size:,} bytes, more than the "
                f"{bound:,} such an entry may hold: refused, nothing was loaded"
            )
    inflated = sum(entry.file_size for entry in archive.infolist())
    if inflated > total:
        raise ModelFileError(
            f"{path} inflates to {inflated:,} bytes, more than {total:,} for a file of {size:,} bytes "
            f"(an exported program is stored uncompressed): refused, nothing was loaded"
        )
    return kinds


def _read(path: Path, archive: zipfile.ZipFile, entry: zipfile.ZipInfo) -> bytes:
    """``entry``'s bytes, inflated up to the directory's size (``read()`` alone would inflate a lying entry whole)."""
    try:
        with archive.open(entry) as stream:
            data = stream.read(entry.file_size)
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:  # a CRC or a stream that disagrees with the directory
        raise ModelFileError(f"{path} is damaged: {entry.filename} cannot be read ({err}): refused") from err
    if len(data) != entry.file_size:
        raise ModelFileError(f"{path} is damaged: {entry.filename} is shorter than its directory says: refused")
    return data


def _check_payloads(path: Path, name: str, config: bytes) -> None:
    """Refuse weights and constants that only unpickling could load (custom and opaque objects are pickles)."""
    try:
        pickled = any(
            entry["use_pickle"]
            or ("/data/weights/" not in name and not str(entry["path_name"]).startswith(_TENSOR_CONSTANT))
            for entry in json.loads(config)["config"].values()
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ModelFileError(f"{path} is damaged: {name} cannot be read ({err})") from err
    if pickled:
        raise ModelFileError(f"{path} stores objects that only unpickling can load: refused, nothing was loaded")
