"""A ``.pt2`` archive read within bounds: what ``torch.export.save`` writes for a plain program, and nothing more.

The archive's directory is read first: an entry that a plain program does not have, an entry
twice, encryption, an unknown compression, or sizes past their bounds are refused before
anything is inflated. Each entry is then read as a stream that stops at its bound, whatever its
header says, into a copy of the archive with every entry stored, so PyTorch inflates nothing.
Weights and constants that only unpickling could load are refused (``model_file`` says what
else a file must be to be served).
"""

import io
import json
import re
import zipfile
import zlib
from collections import Counter
from pathlib import Path
from typing import BinaryIO

from ..errors import UserError

# What `torch.export.save` writes for one plain program, below the archive's own folder.
_SAVED_ENTRIES = re.compile(
    r"[^/]+/(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|models/[^/]+\.json"
    r"|data/weights/[^/]+|data/constants/[^/]+|data/sample_inputs/[^/]+\.pt|extra/[^/]+)"
)
_PAYLOAD_CONFIGS = re.compile(r"[^/]+/data/(weights|constants)/[^/]+_config\.json")
_TENSOR_CONSTANT = "tensor_"  # torch.export's TENSOR_CONSTANT_FILENAME_PREFIX: a tensor stored raw, not pickled
# Bounds on what an archive's entries inflate to, checked in its directory before anything is read. Together: a few
# times the file's size (torch.export.save stores them uncompressed, 1x), or MIN_TOTAL_BYTES for a small file.
INFLATION = 4
MIN_TOTAL_BYTES = 64 * 1024 * 1024
# Each extra file (the class names, what the inputs are) and each other record but the weights and constants.
MAX_EXTRA_BYTES = 4 * 1024 * 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 100_000
_PAYLOAD = re.compile(r"[^/]+/data/(weights|constants)/[^/]+")
_EXTRA = re.compile(r"[^/]+/extra/[^/]+")
_CHUNK = 1024 * 1024


class ModelFileError(UserError):
    """A model file that is missing, not an exported model, unsafe to load, or of inputs no server decodes."""


def stored_copy(path: Path, file: BinaryIO, size: int) -> io.BytesIO:
    """Refuse, unread, an archive that holds anything but a plain program, or whose entries inflate past their
    bounds; else a copy of it with every entry stored, each read as a stream that stops at its bound."""
    with zipfile.ZipFile(file) as archive:
        entries = archive.infolist()
        if len(entries) > MAX_ENTRIES:
            raise ModelFileError(f"{path} holds {len(entries):,} entries, more than any exported program: refused")
        for entry in entries:
            if not _SAVED_ENTRIES.fullmatch(entry.filename):
                refused = "which a plain exported program does not: refused, nothing was loaded"
                raise ModelFileError(f"{path} holds {entry.filename}, {refused}")
        repeated = [name for name, count in Counter(entry.filename for entry in entries).items() if count > 1]
        if repeated:
            raise ModelFileError(f"{path} holds {repeated[0]} twice, as no exported program does: refused")
        _check_sizes(path, entries, size)
        copy = io.BytesIO()
        configs = {}
        with zipfile.ZipFile(copy, "w", zipfile.ZIP_STORED) as stored:
            for entry in entries:
                data = _bounded_read(path, archive, entry, _total_bound(size))
                if _PAYLOAD_CONFIGS.fullmatch(entry.filename):
                    configs[entry.filename] = data
                stored.writestr(zipfile.ZipInfo(entry.filename, entry.date_time), data)
                del data
    _check_payloads(path, configs)
    copy.seek(0)
    return copy


def _bound(entry: zipfile.ZipInfo, total: int) -> int:
    """The most bytes ``entry`` may inflate to, by what it is, in an archive whose entries may hold ``total``."""
    if _PAYLOAD.fullmatch(entry.filename) and not _PAYLOAD_CONFIGS.fullmatch(entry.filename):
        return total  # weights and constants: as large as the model is
    return min(total, MAX_EXTRA_BYTES if _EXTRA.fullmatch(entry.filename) else MAX_RECORD_BYTES)


def _total_bound(size: int) -> int:
    """The most bytes the entries of an archive of ``size`` bytes may inflate to, together."""
    return max(INFLATION * size, MIN_TOTAL_BYTES)


def _check_sizes(path: Path, entries: list[zipfile.ZipInfo], size: int) -> None:
    """Refuse an archive whose directory says its entries inflate past their bounds: nothing is read."""
    total = _total_bound(size)
    for entry in entries:
        if entry.flag_bits & 0x1:
            raise ModelFileError(f"{path} holds {entry.filename} encrypted, as no exported program is: refused")
        if entry.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ModelFileError(
                f"{path} holds {entry.filename} compressed as no exported program is (method {entry.compress_type}): "
                "refused"
            )
        bound = _bound(entry, total)
        if entry.file_size > bound:
            raise ModelFileError(
                f"{path} holds {entry.filename}, which inflates to {entry.file_size:,} bytes, more than the "
                f"{bound:,} such an entry may hold: refused, nothing was loaded"
            )
    inflated = sum(entry.file_size for entry in entries)
    if inflated > total:
        raise ModelFileError(
            f"{path} inflates to {inflated:,} bytes, more than {total:,} for a file of {size:,} bytes "
            f"(an exported program is stored uncompressed): refused, nothing was loaded"
        )


def _bounded_read(path: Path, archive: zipfile.ZipFile, entry: zipfile.ZipInfo, total: int) -> bytes:
    """``entry``'s bytes, read as a stream that stops once it holds more than its directory says (or its bound)."""
    limit = min(entry.file_size, _bound(entry, total))
    chunks, read = [], 0
    try:
        with archive.open(entry) as stream:
            while read <= limit:
                chunk = stream.read(min(_CHUNK, limit + 1 - read))
                if not chunk:
                    break
                chunks.append(chunk)
                read += len(chunk)
    except (
        zipfile.BadZipFile,
        EOFError,
        zlib.error,
    ) as err:  # a checksum or a stream that disagrees with the directory
        raise ModelFileError(f"{path} is damaged: {entry.filename} cannot be read ({err}): refused") from err
    if read != entry.file_size:
        raise ModelFileError(
            f"{path} is damaged: {entry.filename} holds {'more' if read > limit else 'fewer'} bytes than its "
            f"directory says ({entry.file_size:,}): refused"
        )
    return b"".join(chunks)


def _check_payloads(path: Path, configs: dict[str, bytes]) -> None:
    """Refuse weights and constants that only unpickling could load: nothing in the file is unpickled."""
    for name, text in configs.items():
        try:
            entries = json.loads(text)["config"].values()
            pickled = [entry for entry in entries if entry["use_pickle"] or not _raw(name, entry)]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ModelFileError(f"{path} is damaged: {name} cannot be read ({err})") from err
        if pickled:
            raise ModelFileError(f"{path} stores objects that only unpickling can load: refused, nothing was loaded")


def _raw(config_name: str, entry: dict) -> bool:
    """Whether a weight or constant is stored as raw tensor bytes (custom and opaque objects are pickles)."""
    return "/data/weights/" in config_name or str(entry["path_name"]).startswith(_TENSOR_CONSTANT)
