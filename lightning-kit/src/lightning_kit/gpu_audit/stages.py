"""What the audit is given, checked, and what each of its stages ran: the bookkeeping beside ``audit._run``.

``check_arguments`` refuses the wrong kind of object in one line saying what ``audit()`` takes; ``steps``
counts the batches a stage's loop started (Lightning's own count), so that a stage that ran none is not
audited (``no_step``, why); ``not_run`` marks every stage of a pass not audited.
"""

from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from .verdict import STEP_OF_STAGE, Outcome, Verdict

LOADER_OF_STAGE = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}


def check_arguments(model: Any, data: Any, trainer: Any) -> None:
    """Raise ``TypeError``, in one line saying what the audit takes, for arguments of the wrong kind."""
    takes = "audit(model, data=None, trainer=None) takes a LightningModule instance"
    if isinstance(model, L.LightningDataModule) and isinstance(data, L.LightningModule):
        raise TypeError(f"{takes} first and the data second: the two are swapped (audit(model, data))")
    if isinstance(model, type):
        raise TypeError(f"{takes}, not the class {model.__name__}: construct it first, {model.__name__}(...)")
    if isinstance(model, torch.nn.Module) and not isinstance(model, L.LightningModule):
        raise TypeError(
            f"{takes}, not a plain {type(model).__name__} (torch.nn.Module): wrap it in a LightningModule "
            "with training_step and configure_optimizers, as Lightning trains it"
        )
    if not isinstance(model, L.LightningModule):
        raise TypeError(f"{takes}, not {kind(model)}")
    if isinstance(data, type):
        raise TypeError(f"audit()'s data is a LightningDataModule instance or one batch, not the class {data.__name__}")
    if isinstance(data, L.LightningModule):
        raise TypeError("audit()'s data is a LightningDataModule or one batch, not a second LightningModule")
    if trainer is not None and not isinstance(trainer, L.Trainer):
        raise TypeError(f"audit()'s trainer is a lightning.Trainer or None, not {kind(trainer)}")


def kind(value: Any) -> str:
    """``value``'s kind, in words: ``None``, ``a str``, ``the class X``, ``a Y``."""
    if value is None:
        return "None"
    if isinstance(value, type):
        return f"the class {value.__name__}"
    return f"a {type(value).__name__}"


def not_run(
    verdict: Verdict, stages: list[str], rank: int, world_size: int, why: str, report: Callable[[Outcome], None]
) -> Verdict:
    """``verdict`` with every stage of this pass not audited, for ``why``."""
    for stage in stages:
        outcome = Outcome(stage, rank, world_size, gap=why)
        verdict.outcomes.append(outcome)
        report(outcome)
    return verdict


def steps(runner: L.Trainer, stage: str) -> int:
    """How many batches ``runner`` has started in ``stage``'s loop (training batches, for fit), all calls together."""
    loop = {
        "fit": runner.fit_loop.epoch_loop,
        "validate": runner.validate_loop,
        "test": runner.test_loop,
        "predict": runner.predict_loop,
    }[stage]
    return loop.batch_progress.total.ready


def no_step(stage: str, model: L.LightningModule, data: Any) -> str:
    """Why a stage that ran no step is not audited."""
    loader = "train_dataloader" if stage == "fit" else LOADER_OF_STAGE[stage]
    owner = type(data if isinstance(data, L.LightningDataModule) else model).__name__
    return (
        f"{stage} ran no {STEP_OF_STAGE[stage]}: {owner}.{loader}() yielded no batch (an empty split?), "
        "so nothing of it ran on the simulated GPU"
    )
