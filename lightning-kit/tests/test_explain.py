"""The explanation of what stopped an audit that is not a placement bug: the hook, the line of your code, and why."""

import pytest
import torch
from test_simulated_gpu import BATCH, Probe, line_of

from lightning_kit.placement import EXIT_INCOMPLETE, AuditIncompleteError, audit


class Unfinished(Probe):
    def validation_step(self, batch, batch_idx):
        raise NotImplementedError("validation comes later")  # not audited


def test_what_cannot_run_is_reported_as_not_audited():
    """An error that is not about devices gives a partial verdict naming the hook and line: never a pass."""
    with pytest.raises(AuditIncompleteError) as caught:
        audit(Unfinished(), BATCH)
    verdict = caught.value.verdict
    assert verdict.exit_code == EXIT_INCOMPLETE and not verdict.errors
    assert f"test_explain.py:{line_of('# not audited', __file__)}" in verdict.gaps[0].gap
    assert "Unfinished.validation_step" in verdict.gaps[0].gap and "NotImplementedError" in verdict.gaps[0].gap


class SynchronizesTheGPU(Probe):
    def on_train_epoch_end(self):
        torch.cuda.synchronize()  # needs a real GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what happens on machines without a GPU")
def test_a_call_that_needs_a_real_gpu_is_named_as_not_audited():
    with pytest.raises(AuditIncompleteError) as caught:
        audit(SynchronizesTheGPU(), BATCH)
    gap = caught.value.verdict.gaps[0].gap
    assert "torch.cuda.synchronize(), which needs a real GPU" in gap and "SynchronizesTheGPU.on_train_epoch_end" in gap
    assert f"test_explain.py:{line_of('# needs a real GPU', __file__)}" in gap
