"""The simulated GPU's memory, counted as CUDA's caching allocator counts it.

Every tensor on the simulated GPU keeps its values in a CPU storage (a view shares its base's), counted from the
moment it is made to the moment it is freed (PyTorch keeps one Python object for a storage while it lives, so a
weak reference to it is told), rounded up to 512 bytes as ``torch.cuda.memory_allocated`` counts CUDA's blocks.
``stage_peak`` is the audit's own count, which the code's resets do not touch: the most a stage's own storages
held at once since ``start_stage`` (storages made before it and freed in it, garbage of earlier work, do not lower
it). What CUDA reserves beyond its blocks is an estimate: the peak rounded up to whole 2 MiB segments.
"""

import weakref

import torch

BLOCK = 512  # CUDA's caching allocator rounds every block up to this
SEGMENT = 2 * 1024 * 1024  # the smallest segment it reserves from the driver


class _Count:
    current = 0
    peak = 0
    stage = 0  # the stage counted, a number a stage: a storage made in it is the stage's
    stage_current = 0
    stage_peak = 0
    allocations = 0
    frees = 0


_count = _Count()


class _Held(weakref.ref):
    """A weak reference to a storage of the simulated GPU, with the bytes it takes."""

    __slots__ = ("key", "size", "stage")


_live: dict[int, _Held] = {}  # by the storage's id, while it lives


def _freed(held: _Held) -> None:
    if _live.pop(held.key, None) is not None:
        _count.current -= held.size
        _count.frees += 1
        if held.stage == _count.stage:
            _count.stage_current -= held.size


def track(elem: torch.Tensor) -> None:
    """Count the storage of ``elem``, the values of a tensor on the simulated GPU, until it is freed."""
    try:
        storage = elem.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return  # the compressed sparse layouts: no one storage (rare on a GPU; left out of the count)
    key = id(storage)
    size = (storage.nbytes() + BLOCK - 1) & -BLOCK
    if key in _live or size == 0:
        return  # a view of a tensor counted already, or the same tensor wrapped again; empty: CUDA allocates nothing
    held = _Held(storage, _freed)
    held.key, held.size, held.stage = key, size, _count.stage
    _live[key] = held
    _count.current += size
    _count.stage_current += size
    _count.allocations += 1
    _count.peak = max(_count.peak, _count.current)
    _count.stage_peak = max(_count.stage_peak, _count.stage_current)


def allocated() -> int:
    """As ``torch.cuda.memory_allocated()``."""
    return _count.current


def peak() -> int:
    """As ``torch.cuda.max_memory_allocated()``."""
    return _count.peak


def reset_peak() -> None:
    """As ``torch.cuda.reset_peak_memory_stats()``."""
    _count.peak = _count.current


def start_stage() -> None:
    """Start the audit's count of a stage: what is held now is not the stage's."""
    _count.stage += 1
    _count.stage_current = _count.stage_peak = 0


def stage_peak() -> int:
    return _count.stage_peak


def stage_allocated() -> int:
    return _count.stage_current


def reserved(held: int | None = None) -> int:
    """An estimate of what CUDA's allocator would have reserved to hand out ``held`` bytes (the peak if None)."""
    held = _count.peak if held is None else held
    return -(-held // SEGMENT) * SEGMENT


def stats() -> dict[str, int]:
    """The counts of ``torch.cuda.memory_stats()`` that the simulated GPU keeps."""
    return {
        "allocated_bytes.all.current": _count.current,
        "allocated_bytes.all.peak": _count.peak,
        "allocation.all.allocated": _count.allocations,
        "allocation.all.current": len(_live),
        "allocation.all.freed": _count.frees,
        "active_bytes.all.current": _count.current,
        "active_bytes.all.peak": _count.peak,
        "reserved_bytes.all.current": reserved(),
        "reserved_bytes.all.peak": reserved(),
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }
