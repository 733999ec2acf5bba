"""The per-step price of callbacks: Lightning calls every batch-level hook of every callback at every step, the
base class's empty ones too, each through a profiler context (a few microseconds apiece; for a small network a tenth
of the step or more). Lightning skips a hook attribute that is not callable, so each one a callback inherits
unchanged is set to ``None`` on it.
"""

from collections.abc import Iterable

import lightning as L

# The hooks Lightning calls once per batch or per optimizer step.
BATCH_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


def skip_empty_batch_hooks(callbacks: Iterable[L.Callback]) -> None:
    """Stop Lightning calling the batch-level hooks that ``callbacks`` inherit unchanged from ``Callback``."""
    for callback in callbacks:
        for name in BATCH_HOOKS:
            if getattr(type(callback), name, None) is getattr(L.Callback, name):
                setattr(callback, name, None)
