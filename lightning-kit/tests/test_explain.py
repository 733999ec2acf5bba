"""The explanation of what stopped an audit that is not a placement bug: the hook, the line of your code, and why."""

import os

import lightning as L
import pytest
import torch
from test_simulated_gpu import BATCH, Probe, line_of

from lightning_kit.gpu_audit import EXIT_INCOMPLETE, AuditIncompleteError, DevicePlacementError, audit, explain


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


class AsksTheGPUsUtilization(Probe):
    def on_train_epoch_end(self):
        torch.cuda.synchronize()  # answered: the simulated GPU's work is done at once
        self.log("gpu/utilization", float(torch.cuda.utilization()))  # no answer: what NVML would say


def test_a_cuda_call_the_simulated_gpu_cannot_answer_is_named_as_not_audited():
    with pytest.raises(AuditIncompleteError) as caught:
        audit(AsksTheGPUsUtilization(), BATCH)
    gap = caught.value.verdict.gaps[0].gap
    assert "torch.cuda.utilization" in gap and "AsksTheGPUsUtilization.on_train_epoch_end" in gap
    assert f"test_explain.py:{line_of('# no answer', __file__)}" in gap


INSTALLED_MODEL = """import torch
from test_simulated_gpu import Probe


class OffsetOnTheCPU(Probe):
    def forward(self, features):
        return self.net(features) + torch.zeros(3)  # created on the CPU
"""


def test_a_project_installed_among_the_libraries_is_still_your_code(tmp_path, monkeypatch):
    """A project installed with ``pip install .`` lives in site-packages, beside the libraries: its lines are still
    the ones named, since the audit counts the package of the model it audits as the user's code."""
    site_packages = tmp_path / "site-packages"
    model_file = site_packages / "installed_project" / "model.py"
    model_file.parent.mkdir(parents=True)
    (model_file.parent / "__init__.py").write_text("", encoding="utf-8")
    model_file.write_text(INSTALLED_MODEL, encoding="utf-8")
    monkeypatch.syspath_prepend(str(site_packages))
    # As the libraries' folders are found when the audit is imported: this one among them, and no project yet.
    monkeypatch.setattr(explain, "INSTALLED", (*explain.INSTALLED, f"{site_packages.resolve()}{os.sep}"))
    monkeypatch.setattr(explain, "_AUDITED", set())
    from installed_project.model import OffsetOnTheCPU

    assert not explain.is_user_code(str(model_file)), "a package among the libraries is not your code by itself"
    with pytest.raises(DevicePlacementError) as caught:
        audit(OffsetOnTheCPU(), BATCH)
    assert (caught.value.filename, caught.value.lineno) == (str(model_file), line_of("# created on", str(model_file)))
    assert explain.is_user_code(str(model_file))
    assert not explain.is_user_code(torch.__file__) and not explain.is_user_code(L.__file__)
