"""The per-step price of callbacks (``lightning_kit.callbacks.dispatch``): Lightning calls, at each step, only the
batch-level hooks a callback overrides; the ones it inherits unchanged from ``Callback`` are skipped.

Counted, not timed: a profiler records every callback hook Lightning calls."""

from collections import Counter

import lightning as L
from conftest import build_all
from image_project.cli import ProjectCLI
from lightning.pytorch.profilers import PassThroughProfiler

from lightning_kit import building as kit_cli
from lightning_kit.callbacks.dispatch import BATCH_HOOKS, skip_empty_batch_hooks


class CountingProfiler(PassThroughProfiler):
    """Counts the callback hooks Lightning calls (each through ``profile("[Callback]<key>.<hook>")``)."""

    def __init__(self) -> None:
        super().__init__()
        self.called: Counter[str] = Counter()

    def start(self, action_name: str) -> None:
        if action_name.startswith("[Callback]"):
            self.called[action_name.rsplit(".", 1)[1]] += 1


class CountsBatches(L.Callback):
    """A user's callback with one batch-level hook of its own."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1


def overrides(callback: L.Callback, hook: str) -> bool:
    return getattr(type(callback), hook) is not getattr(L.Callback, hook)


def test_a_callback_keeps_the_batch_hooks_it_overrides_and_loses_the_inherited_ones():
    counting, plain = CountsBatches(), L.Callback()
    skip_empty_batch_hooks([counting, plain])
    assert callable(counting.on_train_batch_end)
    assert all(getattr(plain, hook) is None for hook in BATCH_HOOKS)
    assert all(getattr(counting, hook) is None for hook in BATCH_HOOKS if hook != "on_train_batch_end")
    # Hooks of a run's start and end are called as before: only the per-batch ones are skipped.
    assert callable(plain.on_fit_start) and callable(plain.on_train_epoch_end)


def test_a_fit_calls_only_the_batch_hooks_that_do_something(in_tmp_path, fast_args):
    """Every callback of a project's Trainer (its own, Lightning's, one of the user's): at each step and validation
    batch, the only batch-level hooks called are ones a callback overrides, and the user's runs at every step."""
    user = CountsBatches()
    model, datamodule, trainer = build_all([*fast_args, "--max_epochs", "1"])
    trainer.callbacks.append(user)
    skip_empty_batch_hooks([user])  # as the project's command line does with callbacks it is given
    trainer.profiler = CountingProfiler()
    trainer.fit(model, datamodule=datamodule)

    assert user.batches == 3
    for hook in BATCH_HOOKS:
        owners = [callback for callback in trainer.callbacks if overrides(callback, hook)]
        # 3 training steps; 2 validation batches of the sanity check and 2 of the epoch; no test or predict.
        steps = 4 if hook.startswith("on_validation") else 0 if hook.startswith(("on_test", "on_predict")) else 3
        assert trainer.profiler.called[hook] == steps * len(owners), (hook, [type(c).__name__ for c in owners])
    # Of all the callbacks' hooks before backward and the optimizer's step, none is the base class's no-op.
    assert trainer.profiler.called["on_before_backward"] == 0


def test_callbacks_given_to_a_projects_fit_are_trimmed_too(in_tmp_path, fast_args):
    """Callbacks a sweep's trial adds (``lightning_kit.building.fit``) join the project's before the Trainer is made."""
    user = CountsBatches()
    run = kit_cli.fit(ProjectCLI, [*fast_args, "--max_epochs", "1"], callbacks=[user])
    assert user.batches == 3 and user.on_before_backward is None
    assert all(
        getattr(callback, hook) is None or overrides(callback, hook)
        for callback in run.trainer.callbacks
        for hook in BATCH_HOOKS
    )
