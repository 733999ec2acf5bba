"""Stop cleanly on a signal, with a checkpoint to resume from."""

import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..upstream.lightning import ask_to_stop, put_back_signal_handlers
from .divergence import DivergenceError


class InterruptCheckpoint(L.Callback):
    """Stop ``fit`` cleanly on Ctrl-C or SIGTERM (what SLURM sends before it kills a job), and save
    ``on_exception.ckpt`` to resume from with ``--ckpt_path last``, exactly as a run that never stopped.

    A signal to any process of a DDP run stops every process, after the training step under way or once the
    validation under way has finished. A second Ctrl-C stops at once, without a checkpoint; a run that failed, or
    trained no step, saves nothing. (Lightning's ``OnExceptionCheckpoint`` is not used: with it, every new ``fit``
    silently resumes from the last checkpoint it can find.)
    """

    FILENAME = "on_exception.ckpt"
    # The checkpoint the last stop saved (None: nothing was trained yet), for the command line's message.
    saved: Path | None = None

    def __init__(self) -> None:
        InterruptCheckpoint.saved = None
        self._asked = False  # a signal arrived in this process
        self._held = False  # a stop waits for the validation under way to finish
        self._previous_handlers: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Installed after Lightning's own SIGTERM handler, which would stop in the middle of
        # a validation, and under DDP broadcast from whichever process received the signal.
        self._asked = self._held = False
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            handler = signal.getsignal(signum)
            if signum == signal.SIGINT and handler in (signal.SIG_IGN, None):
                continue  # started as a background job: Ctrl-C belongs to the shell's foreground
            self._previous_handlers[signum] = handler
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._asked and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._asked = True

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self._stop_asked(trainer):
            ask_to_stop(trainer, True)  # it stops at its next safe point

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            # Lightning would stop after any validation batch; a run resumed there is not exact.
            self._held = ask_to_stop(trainer, False)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.sanity_checking:
            self._held = self._stop_asked(trainer) or self._held

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._held:
            ask_to_stop(trainer, True)

    def _stop_asked(self, trainer: L.Trainer) -> bool:
        # Every process takes part, so a signal to any one of them stops all of them.
        return trainer.strategy.reduce_boolean_decision(self._asked, all=False)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        checkpoint_dir = trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback is not None else None
        # SIGTERMException is Lightning's stop at a safe point; any other exception may strike mid-step.
        graceful = isinstance(exception, SIGTERMException)
        if graceful and trainer.state.fn == TrainerFn.FITTING and trainer.global_step > 0 and checkpoint_dir:
            try:
                trainer.save_checkpoint(Path(checkpoint_dir) / self.FILENAME)
            except DivergenceError:
                # StopOnDivergence refused the save: a stop it did not see coming (Lightning's own SIGTERM
                # handler, in a thread). The run ends with that line instead, its signal handlers put back.
                self.teardown(trainer, pl_module, "fit")
                put_back_signal_handlers(trainer)
                raise
            InterruptCheckpoint.saved = Path(checkpoint_dir) / self.FILENAME
