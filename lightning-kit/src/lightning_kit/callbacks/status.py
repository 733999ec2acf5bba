"""The run's status record: ``run.json`` in its folder says whether it runs, and how it ended."""

import contextlib
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..run_record import DIVERGED, FAILED, FINISHED, INTERRUPTED, RUN_FILE, ended_record, started_record, write_record
from .divergence import DivergenceError


class RunStatus(L.Callback):
    """Write ``run.json`` (``run_record``) into the run's folder: ``running`` when ``fit`` starts, and how it ended
    when it ends. Only the first process of a DDP run writes it; a run without a logger has no folder, and no record.
    """

    def __init__(self) -> None:
        self._path: Path | None = None
        self._record: dict[str, Any] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # every process must ask: the answer is broadcast from rank 0
        self._path = None
        if not trainer.is_global_zero or trainer.logger is None or log_dir is None:
            return
        self._path = Path(log_dir) / RUN_FILE
        self._path.parent.mkdir(parents=True, exist_ok=True)
        resumed_from = trainer.ckpt_path
        self._record = started_record(str(resumed_from) if resumed_from else None)
        write_record(self._path, self._record)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, FINISHED)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException | KeyboardInterrupt):
            self._end(trainer, INTERRUPTED)
        else:
            status = DIVERGED if isinstance(exception, DivergenceError) else FAILED
            message = " ".join(str(exception).split())[:500] or type(exception).__name__
            self._end(trainer, status, error=f"{type(exception).__name__}: {message}")

    def _end(self, trainer: L.Trainer, status: str, **details: Any) -> None:
        if self._path is None:
            return  # not the first process, or fit had not started
        judge = trainer.checkpoint_callback
        if judge is not None and getattr(judge, "monitor", None):
            details.update(monitor=judge.monitor, mode=judge.mode, best_checkpoint=judge.best_model_path or None)
        else:
            details["monitor"] = None  # chose by no metric: the table of runs shows its last validated epoch
        with contextlib.suppress(OSError):  # the run's folder removed or replaced while it ran: what stopped it says so
            write_record(self._path, ended_record(self._record, status, **details))
        self._path = None
