"""Interruption and resume: stop cleanly on a signal with a checkpoint, and resume exactly as if never stopped."""

import random
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..errors import ConfigError
from ..metric_logs import parse_name
from ..upstream.lightning import ask_to_stop, put_back_signal_handlers
from .divergence import DivergenceError


class InterruptCheckpoint(L.Callback):
    """Stop ``fit`` cleanly on Ctrl-C or SIGTERM, and save ``on_exception.ckpt`` to resume from.

    SIGTERM is what SLURM and most schedulers send before they kill a job. Either
    signal, received by any process of a DDP run, asks every process to stop: after
    the training step under way, or, during validation, once the validation has
    finished. A run resumed with ``--ckpt_path last`` then continues exactly as one
    that never stopped. A second Ctrl-C stops at once, without a checkpoint. Nothing
    is saved by a run that stopped before it trained a step, or that failed.

    (Lightning's own ``OnExceptionCheckpoint`` is not used: with it installed, every
    new ``fit`` silently resumes from the last checkpoint it can find.)
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


class RandomState(L.Callback):
    """Keep the random generators' state in every checkpoint, and restore it on resume.

    So dropout and any other random draw continue, after an interruption, exactly as
    they would have in a run that never stopped.
    """

    def state_dict(self) -> dict[str, Any]:
        # Tensors and plain Python values only: checkpoints are read with weights_only=True.
        kind, keys, position, has_gauss, gauss = np.random.get_state()
        state = {
            "torch": torch.get_rng_state(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind, keys, position, has_gauss, gauss = state["numpy"]
        torch.set_rng_state(state["torch"])
        np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, which goes on judging across a resume.

    A resumed run writes into a new run folder, and for a new folder Lightning's own forgets
    the scores so far: the first epoch after the resume became the best, however it scored.
    This one keeps the best checkpoints' scores and paths (in the earlier run's folder) and
    saves a new best only when it beats them. Lightning never deletes a checkpoint outside
    the callback's own folder, so the earlier run's stay as they are.
    """

    def __init__(self, *args: Any, monitor_named_in: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.monitor_named_in = monitor_named_in  # where the monitored metric's name was given, for a mistake in it

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A monitored metric that validation does not log (a typo) is one line naming where it was given, once the
        sanity check has validated: not after a whole epoch, in Lightning's words."""
        if self.monitor is None or parse_name(self.monitor).stage != "val":
            return  # a training metric's (or a stage's it does not say) is logged later, if at all: Lightning judges it
        logged = sorted(name for name in trainer.callback_metrics if parse_name(name).stage == "val")
        if logged and self.monitor not in trainer.callback_metrics:
            where = f" ({self.monitor_named_in})" if self.monitor_named_in else ""
            raise ConfigError(
                f"the monitored metric {self.monitor!r}{where} is not one validation logs: it logs "
                f"{', '.join(logged[:8])}{' and more' if len(logged) > 8 else ''}"
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict({**state_dict, "dirpath": self.dirpath})
