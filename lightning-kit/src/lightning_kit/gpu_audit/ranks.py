"""Where the two processes of a DDP run part: the collectives each called, held against the other's.

NCCL matches the calls of the processes one by one: one that the other does not call, or of other shapes, leaves the
other waiting, silently, until NCCL's watchdog stops both (30 minutes by default).
"""

from ..guide import cite
from .explain import FIXES, file_line
from .simulated.collectives import Call
from .verdict import DevicePlacementError, Verdict


def compare(verdict: Verdict) -> None:
    """Mark, as a bug on the second process's stage, each stage of the DDP run whose processes part."""
    ran = {(outcome.stage, outcome.rank): outcome for outcome in verdict.outcomes if outcome.world_size > 1}
    for (stage, rank), second in ran.items():
        first = ran.get((stage, 0))
        if rank != 1 or first is None or first.error or first.gap or second.error or second.gap:
            continue
        parted = parting(first.collectives, second.collectives)
        if parted is not None:
            second.error = hang(parted, stage)


def parting(first: list[Call], second: list[Call]) -> tuple[Call | None, Call | None] | None:
    """Each rank's call (or None) at the first line of the user's code where rank 0's and rank 1's collectives part.

    Lightning's own calls are its to keep in step; how often a line calls is left alone, as the decisions Lightning
    reduces (which checkpoint is the best) are each rank's own here."""
    by_line: list[dict[tuple[str, int], list[Call]]] = [{}, {}]
    for calls, lines in zip((first, second), by_line, strict=True):
        for call in calls:
            if call.line is not None:
                lines.setdefault(call.line, []).append(call)
    for call in (*first, *second):
        if call.line is None:
            continue
        mine, theirs = by_line[0].get(call.line, []), by_line[1].get(call.line, [])
        if not mine or not theirs:
            return (mine[0] if mine else None), (theirs[0] if theirs else None)
        for a, b in zip(mine, theirs, strict=False):
            if a.signature != b.signature:
                return a, b
    return None


def hang(parted: tuple[Call | None, Call | None], stage: str) -> DevicePlacementError:
    """The bug of a DDP run whose processes part at ``parted``."""
    called = next(call for call in parted if call is not None)
    filename, lineno = called.line
    lines = [f"{stage} as DDP ranks 0 and 1 of 2: the processes part at {file_line(filename, lineno)}"]
    for rank, call in enumerate(parted):
        lines.append(f"    rank {rank}: {_said(call)}")
    lines.append(
        "On GPUs: no error. Each process waits for the other's matching call, and NCCL's watchdog stops both after "
        "its timeout (30 minutes by default), with nothing printed until then."
    )
    fix, rule = FIXES["collective mismatch"]
    lines.append(f"Fix: {fix}. See {rule} of the placement guide: {cite(rule)}.")
    return DevicePlacementError(
        "\n".join(lines),
        kind="collective mismatch",
        stage=stage,
        rank=1,
        hook="",
        operation=called.operation,
        filename=filename,
        lineno=lineno,
    )


def _said(call: Call | None) -> str:
    if call is None:
        return "calls nothing there"
    operation, tensors, line = call
    shown = ", ".join(f"{dtype} {tuple(shape) if shape else '()'}" for shape, dtype in tensors) or "no tensor"
    where = f"at {file_line(*line)}"
    if operation.startswith("self.log("):  # recorded where it was asked for; Lightning all-reduces it later
        return f"{operation}, an all_reduce of {shown}, {where}"
    return f"torch.distributed.{operation} of {shown}, {where}"
