"""The forecaster learns, and the library's audit proves on the CPU that it would run on a GPU."""

import lightning as L
from forecaster import Forecaster, SineWaves

from lightning_kit import audit


def test_the_forecaster_learns_the_season_on_the_cpu():
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(Forecaster(), SineWaves(size=256))
    assert trainer.callback_metrics["val/r2"] > 0.5


def test_every_stage_runs_on_a_simulated_gpu():
    verdict = audit(Forecaster(), SineWaves(size=128))
    assert {outcome.stage for outcome in verdict.outcomes} == {"fit", "validate", "test", "predict"}
