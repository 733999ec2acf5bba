"""Whether each stage the audit ran fits a GPU of a given size, and the largest batch that would (guide, rule 21).

Each stage's peak is counted as ``torch.cuda.max_memory_allocated`` counts it (``simulated/memory.py``), in the
allocator's segments, plus ``CONTEXT`` (an estimate). The largest batch is a linear estimate: what a batch adds beyond
what is held, scaled to the room left. GPU-only kernels (cuDNN workspaces, flash attention) count as the CPU's do.
"""

import re

from ..errors import byte_size
from ..guide import cite
from .simulated import memory
from .verdict import Outcome, Verdict

GIB = 1 << 30
MIB = 1 << 20
# What CUDA's context, cuBLAS's and cuDNN's workspaces take before the first tensor: an estimate.
CONTEXT = 600 * MIB
# Usable memory of common GPUs, in GiB, by name as people write them (matched without case, spaces or dashes).
GPUS = {
    "T4": 15,
    "V100": 16,
    "V100-32GB": 32,
    "A10": 24,
    "A10G": 24,
    "L4": 22,
    "RTX3090": 24,
    "RTX4090": 24,
    "RTX5090": 32,
    "A6000": 48,
    "L40S": 45,
    "A100": 40,
    "A100-80GB": 80,
    "H100": 80,
    "H200": 141,
    "B200": 180,
}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(g|gb|gib|m|mb|mib)$", re.IGNORECASE)


def parse_capacity(text: str) -> int:
    """The bytes a GPU named or sized by ``text`` holds: ``24GB``, ``24GiB``, ``16000MB`` or a name (``A10G``)."""
    names = {_plain(name): size for name, size in GPUS.items()} | {"a10040gb": 40, "v10016gb": 16}
    if _plain(text) in names:
        return names[_plain(text)] * GIB
    found = _SIZE.match(text.strip())
    if found is None or float(found[1]) <= 0:
        raise ValueError(
            f"--gpu_memory {text!r} is neither a size (24GB, 24GiB, 16000MB) nor a GPU this knows ({', '.join(GPUS)})"
        )
    return int(float(found[1]) * (GIB if found[2].lower().startswith("g") else MIB))


def _plain(name: str) -> str:
    return re.sub(r"[\s_-]", "", name).lower()


def largest_batch(outcome: Outcome, capacity: int) -> int | None:
    """The largest batch the stage would fit in ``capacity``, by a linear estimate; None where it cannot say."""
    per_batch = outcome.peak - outcome.held
    if outcome.batch_size is None or per_batch <= 0:
        return None
    room = capacity - CONTEXT - memory.reserved(outcome.held)
    return max(int(outcome.batch_size * room / per_batch), 0)


def judged(verdict: Verdict, capacity: int) -> tuple[list[str], bool]:
    """The lines that say whether each stage run fits a GPU of ``capacity`` bytes; and whether every one does."""
    lines = [
        f"On a GPU of {byte_size(capacity)}: each stage's tensors at their peak, in CUDA's segments, and about "
        f"{byte_size(CONTEXT)} for CUDA's context and workspaces (an estimate)"
    ]
    largest: list[tuple[str, int | None]] = []  # of each stage that does not fit: its stage, its largest batch
    for outcome in verdict.outcomes:
        if outcome.peak == 0:
            continue  # not run (a stage that stopped before its first tensor)
        need, batch = memory.reserved(outcome.peak) + CONTEXT, largest_batch(outcome, capacity)
        at = f" at batch size {outcome.batch_size}" if outcome.batch_size is not None else ""
        would = f" (a batch of about {batch} would)" if batch else ""
        fits = need <= capacity
        lines.append(f"  {outcome.where:<44} {byte_size(need)}{at}: {'fits' if fits else 'DOES NOT FIT'}{would}")
        if not fits:
            largest.append((outcome.stage, batch))
    if largest:
        batches = [batch for _, batch in largest if batch]
        fix = f"a batch of at most about {min(batches)}" if batches else "a smaller model, or its parameters in 16 bits"
        if batches and any(stage == "fit" for stage, _ in largest):
            fix += " (--trainer.accumulate_grad_batches keeps the batch the optimizer sees)"
        lines.append(
            f"CUDA would stop with 'CUDA out of memory'. Fix: {fix}, or --trainer.precision bf16-mixed for smaller "
            f"activations; rule 21 of the placement guide: {cite('rule 21')}"
        )
    return lines, not largest
