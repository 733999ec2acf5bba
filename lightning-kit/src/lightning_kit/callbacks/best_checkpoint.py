"""The best checkpoint, judged across a resume."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from ..errors import ConfigError
from ..metric_logs import parse_name


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, which goes on judging across a resume.

    A resumed run writes into a new run folder, for which Lightning's own forgets the scores so far (the first epoch
    after the resume became the best). This one keeps the earlier best checkpoints' scores and paths; Lightning never
    deletes a checkpoint outside the callback's own folder.
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
