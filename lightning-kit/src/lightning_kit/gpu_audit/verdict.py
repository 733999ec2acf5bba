"""What the device audit found: a bug (``DevicePlacementError``), a part it could not audit, or a pass.

Exit statuses of ``python -m <package>.placement``: 0 passed, 1 a bug, 2 a wrong command line, 3 incomplete.
"""

from dataclasses import dataclass, field

from ..errors import byte_size
from . import simulated

STAGES = ("fit", "validate", "test", "predict")
STEP_OF_STAGE = {"fit": "training_step", "validate": "validation_step", "test": "test_step", "predict": "predict_step"}
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3


@dataclass(eq=False, repr=False)
class DevicePlacementError(RuntimeError):
    """An operation that would fail on a GPU.

    ``kind`` is a key of ``explain.FIXES`` or ``"unmoved batch"`` (``batches.py``); ``hook`` where it ran (e.g.
    ``"callback EMA.on_train_batch_end"``); ``filename:lineno`` the line of your code where it happened, and
    ``made_filename:made_lineno`` the one that made the tensor on the wrong device, where known (else ``""``, 0).
    Every field has a default, so that it pickles as exceptions do (from a forked audit): by its message.
    """

    message: str
    kind: str = ""
    stage: str = ""
    rank: int = 0
    hook: str = ""
    operation: str = ""
    filename: str = ""
    lineno: int = 0
    made_filename: str = ""
    made_lineno: int = 0

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def step(self) -> str:
        """The method's own name, e.g. ``"training_step"``."""
        return self.hook.rpartition(".")[2]


class AuditIncompleteError(RuntimeError):
    """No bug was found, but part of the run could not be audited; ``verdict`` says which part and why."""

    def __init__(self, verdict: "Verdict") -> None:
        super().__init__("\n".join(verdict.report()))
        self.verdict = verdict


@dataclass
class Outcome:
    """One stage of one pass: passed, failed with a placement bug, or not (wholly) audited."""

    stage: str
    rank: int
    world_size: int
    seconds: float = 0.0
    error: DevicePlacementError | None = None
    gap: str | None = None  # why (the rest of) the stage was not audited
    peak: int = 0  # the most bytes its tensors held on the GPU at once, as torch.cuda.max_memory_allocated counts
    held: int = 0  # what they held besides a batch's own: the model (in training its gradients, the optimizer's state)
    batch_size: int | None = None  # of its batches (fit: training's), where Lightning can size one
    collectives: list = field(default_factory=list)  # what it called of torch.distributed's, in order (collectives)

    @property
    def where(self) -> str:
        ddp = f" (DDP rank {self.rank} of {self.world_size})" if self.world_size > 1 else ""
        return f"{self.stage} on {simulated.device(self.rank)}{ddp}"


@dataclass(repr=False)
class Verdict:
    """What the audit ran and found; ``exit_code`` is the audit command's status, and ``report()`` its lines."""

    outcomes: list[Outcome] = field(default_factory=list)
    hooks: set[str] = field(default_factory=set)  # the hooks and loop steps that ran
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # a stage the data has nothing for: why

    @property
    def errors(self) -> list[DevicePlacementError]:
        """Each bug once, by its line, in the order found."""
        unique: dict[tuple[str, int, str], DevicePlacementError] = {}
        for error in (outcome.error for outcome in self.outcomes if outcome.error is not None):
            unique.setdefault((error.filename, error.lineno, error.kind), error)
        return list(unique.values())

    @property
    def gaps(self) -> list[Outcome]:
        return [outcome for outcome in self.outcomes if outcome.gap is not None]

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.errors else EXIT_INCOMPLETE if self.gaps else EXIT_PASSED

    def __repr__(self) -> str:
        found = {
            EXIT_PASSED: "passed",
            EXIT_FAILED: f"{len(self.errors)} bug{'s' if len(self.errors) > 1 else ''}",
            EXIT_INCOMPLETE: f"{len(self.gaps)} stage{'s' if len(self.gaps) > 1 else ''} not audited",
        }[self.exit_code]
        return (
            f"<Verdict {found}: {len(self.outcomes)} stages run, {len(self.hooks)} hooks, exit status {self.exit_code}>"
        )

    def report(self) -> list[str]:
        """The audit's report, as its command prints it: each stage of each pass, each bug, each gap, the notes."""
        lines = []
        for outcome in self.outcomes:
            status = "FAILED" if outcome.error else "NOT AUDITED" if outcome.gap else "ok"
            peak = f", GPU memory {byte_size(outcome.peak)} at most" if outcome.peak and status == "ok" else ""
            lines.append(f"  {outcome.where:<44} {status}  ({outcome.seconds:.2f} s{peak})")
        for error in self.errors:
            lines += ["", f"FAILED {error}"]
        for outcome in self.gaps:
            lines += ["", f"NOT AUDITED {outcome.where}: {outcome.gap}"]
        lines += [f"note: {stage} skipped: {why}" for stage, why in self.skipped.items()]
        lines += [f"note: {note}" for note in self.notes]
        return lines
