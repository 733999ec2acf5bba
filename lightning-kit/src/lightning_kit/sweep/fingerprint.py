"""What a study trains on and with, recorded when it is created: a re-run on other data or arguments is refused.

The data's fingerprint digests an in-memory data set's tensors, the sizes and modification times of the files a data
set names (``samples``, ``imgs`` or ``files``, as torchvision's folders do), else its length and a sample of items.
"""

import hashlib
import os
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from lightning.pytorch.cli import SaveConfigCallback
from torch.utils.data import ConcatDataset, DataLoader, Subset

FULL_BYTES = 256 * 1024 * 1024  # a tensor up to this size is digested whole; a larger one, by SAMPLES slices
SAMPLES = 4096
ITEMS = 64  # items read of a data set that is neither tensors nor a file listing


def data_fingerprint(datamodule: L.LightningDataModule) -> dict[str, Any]:
    """The digest of ``datamodule``'s training and validation data, set up as ``fit`` does, with their sizes."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    digest = hashlib.blake2b(digest_size=16)
    sizes = {}
    for split in ("train", "val"):
        try:
            loader = getattr(datamodule, f"{split}_dataloader")()
        except Exception:  # no such split (a data module without validation data)
            loader = None
        dataset = loader.dataset if isinstance(loader, DataLoader) else loader
        digest.update(split.encode())
        _digest(digest, dataset)
        sizes[split] = _size(dataset)
    classes = getattr(datamodule, "class_names", None)
    if classes is not None:
        digest.update(repr(list(classes)).encode())
    return {"digest": digest.hexdigest(), **sizes}


def configuration(trainer: L.Trainer) -> dict[str, Any]:
    """What train.py resolved its arguments to (a run's config.yaml), as plain data; {} if it is not known."""
    saver = next((c for c in trainer.callbacks if isinstance(c, SaveConfigCallback)), None)
    if saver is None:
        return {}
    try:
        resolved = yaml.safe_load(saver.parser.dump(saver.config))
    except Exception:  # a value its own parser cannot write: the arguments alone define the study
        return {}
    # ``config`` names the files the arguments came from, not what they say.
    return {key: value for key, value in (resolved or {}).items() if key != "config"}


def differences(then: Any, now: Any, prefix: str = "") -> list[str]:
    """The dotted keys at which two configurations differ, each with both values: ``model.lr: then 0.01, now 0.02``."""
    if isinstance(then, dict) and isinstance(now, dict):
        found = []
        for key in [*then, *(k for k in now if k not in then)]:
            found += differences(then.get(key), now.get(key), f"{prefix}{key}.")
        return found
    if then == now:
        return []
    then, now = ("absent" if value is None else str(value) for value in (then, now))
    then, now = (text if len(text) <= 80 else f"{text[:77]}..." for text in (then, now))
    return [f"{prefix.rstrip('.') + ': ' if prefix else ''}then {then}, now {now}"]


def _size(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:
        return None


def _digest(digest: "hashlib._Hash", dataset: Any, depth: int = 0) -> None:
    """Feed ``digest`` what defines ``dataset``: its tensors, the files it names, or a sample of its items."""
    digest.update(type(dataset).__qualname__.encode())
    if dataset is None or depth > 8:
        return
    if isinstance(dataset, Subset):
        digest.update(np.asarray(dataset.indices, dtype=np.int64).tobytes())
        _digest(digest, dataset.dataset, depth + 1)
        return
    if isinstance(dataset, ConcatDataset):
        for part in dataset.datasets:
            _digest(digest, part, depth + 1)
        return
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple | list) and all(isinstance(t, torch.Tensor) for t in tensors):
        _item(digest, tensors)  # each tensor
        return
    for name in ("samples", "imgs", "files"):
        listing = getattr(dataset, name, None)
        if isinstance(listing, list | tuple) and listing:
            _files(digest, listing)
            return
    size = _size(dataset)
    digest.update(repr(size).encode())
    if not size:
        return
    for index in sorted({round(k * (size - 1) / max(ITEMS - 1, 1)) for k in range(min(ITEMS, size))}):
        try:
            _item(digest, dataset[index])
        except Exception as err:  # an item it cannot give: that, too, is what it is
            digest.update(type(err).__name__.encode())


def _tensor(digest: "hashlib._Hash", tensor: torch.Tensor) -> None:
    if tensor.device.type != "cpu":  # data a module keeps on a device (rare: Lightning moves the batches)
        tensor = torch.tensor(tensor.detach().tolist(), dtype=tensor.dtype)
    tensor = tensor.detach().contiguous()
    digest.update(f"{tuple(tensor.shape)} {tensor.dtype}".encode())
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    if raw.numel() <= FULL_BYTES:
        digest.update(raw.numpy().tobytes())
        return
    piece = max(FULL_BYTES // SAMPLES, 1)
    for k in range(SAMPLES):
        start = k * (raw.numel() - piece) // (SAMPLES - 1)
        digest.update(raw[start : start + piece].numpy().tobytes())


def _files(digest: "hashlib._Hash", listing: list | tuple) -> None:
    """The files a data set names (a path, or a tuple starting with one), each with its size and modification time."""
    for entry in listing:
        path = entry[0] if isinstance(entry, tuple | list) and entry else entry
        digest.update(repr(entry if not isinstance(entry, tuple | list) else tuple(map(str, entry))).encode())
        try:
            found = os.stat(path)
            digest.update(f"{found.st_size} {found.st_mtime_ns}".encode())
        except (OSError, TypeError, ValueError):
            digest.update(b"-")


def _item(digest: "hashlib._Hash", item: Any, depth: int = 0) -> None:
    if depth > 4:
        return
    if isinstance(item, torch.Tensor):
        _tensor(digest, item)
    elif isinstance(item, np.ndarray):
        _tensor(digest, torch.from_numpy(np.ascontiguousarray(item)))
    elif isinstance(item, bytes | str | int | float | bool) or item is None:
        digest.update(repr(item).encode())
    elif isinstance(item, tuple | list):
        for part in item:
            _item(digest, part, depth + 1)
    elif isinstance(item, dict):
        for key in sorted(item, key=str):
            digest.update(str(key).encode())
            _item(digest, item[key], depth + 1)
    elif hasattr(item, "tobytes"):  # an image (PIL)
        digest.update(f"{getattr(item, 'size', '')} {getattr(item, 'mode', '')}".encode())
        digest.update(item.tobytes())
    else:
        digest.update(type(item).__qualname__.encode())
