"""Values a training step logs are recorded whatever the length of an epoch."""

import math
import warnings

import lightning as L
from lightning.fabric.utilities.warnings import PossibleUserWarning

# What Lightning warns of an epoch shorter than its logging interval, which this callback then lowers.
SHORT_EPOCH_WARNING = r"The number of training batches \(\d+\) is smaller than the logging interval"


class StepLogging(L.Callback):
    """Lower Lightning's logging interval (``log_every_n_steps``) to an epoch's batches where an epoch has fewer, so
    that short epochs still record what a step logs, and silence Lightning's warning of them. Added only where the
    interval was not given.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning warns as it sets the data up, before on_train_start: the data is not set up early for it, which
        # would draw a resumed run's shuffle before its random state is restored.
        warnings.filterwarnings("ignore", message=SHORT_EPOCH_WARNING, category=PossibleUserWarning)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        batches = trainer.num_training_batches
        if isinstance(batches, int | float) and not math.isinf(batches) and 0 < batches < trainer.log_every_n_steps:
            trainer.log_every_n_steps = int(batches)
