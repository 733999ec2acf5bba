"""Rule 15 of the placement guide: autocast (16-mixed, bf16-mixed, torch.autocast regions) on the simulated GPU.

Autocast on the simulated GPU casts by CUDA's policy, read from the op lists PyTorch ships
(``gpu_audit/simulated/autocast.py``): a manual ``torch.autocast(x.device.type, ...)`` region is
audited, the Trainer's mixed precision runs as mixed precision, and what CUDA's autocast refuses
(a dtype mix, ``binary_cross_entropy``) stops at its line.
"""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from image_project.cli import ProjectCLI
from test_simulated_gpu import BATCH, Probe, assert_rule

from lightning_kit.gpu_audit import audit, simulated
from lightning_kit.gpu_audit.simulated.autocast import cuda_policies
from lightning_kit.placement import main as audit_main


def _registered(key: str) -> set[str]:
    """The aten operations with a kernel for dispatch key ``key``."""
    names = set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                names.add(name)
        except RuntimeError:
            continue  # a schema without an operator (a TorchScript builtin)
    return names


def test_the_simulated_gpu_autocasts_exactly_the_operations_cuda_autocasts():
    """Every operation with a CUDA autocast kernel has a simulated one, read from PyTorch's lists, and no other."""
    assert _registered("AutocastPrivateUse1") == _registered("AutocastCUDA")
    assert {"linear", "conv2d", "softmax.int", "norm.Scalar", "addcmul", "binary_cross_entropy"} <= set(cuda_policies())


def _cast(policy_case: str) -> torch.dtype:
    d = simulated.device(0)
    half = torch.randn(4, 4, device=d, dtype=torch.float16)
    single = torch.randn(4, 4, device=d)
    with torch.autocast(d.type, dtype=torch.float16):
        return {
            "lower precision": lambda: F.linear(single, single),
            "float32": lambda: half.exp(),
            "float32 by its dtype argument": lambda: half.softmax(-1),
            "float32 appended": lambda: half.norm(),
            "promoted to the widest": lambda: torch.addcmul(half, half, single),
            "promoted, all lower": lambda: torch.addcmul(half, half, half),
        }[policy_case]().dtype


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        ("lower precision", torch.float16),
        ("float32", torch.float32),
        ("float32 by its dtype argument", torch.float32),
        ("float32 appended", torch.float32),
        ("promoted to the widest", torch.float32),
        ("promoted, all lower", torch.float16),
    ],
)
def test_each_of_cudas_autocast_policies_casts_as_on_cuda(case, dtype):
    """One operation of each policy of CUDA's autocast returns the dtype it returns on a CUDA GPU."""
    with simulated.simulating(0):
        assert _cast(case) == dtype


class AutocastRegion(Probe):
    """A manual region, as a model written for GPUs has it: the device type taken from the input."""

    def forward(self, features):
        with torch.autocast(device_type=features.device.type, dtype=torch.float16):
            logits = self.net(features)
            assert logits.dtype == torch.float16, logits.dtype  # linear runs in float16 ...
            assert logits.softmax(-1).dtype == torch.float32  # ... softmax in float32, as on CUDA
        return logits.float()


def test_a_manual_autocast_region_is_audited_with_cudas_casting():
    """A ``torch.autocast(x.device.type, ...)`` region runs on the simulated GPU with CUDA's dtypes, backward too."""
    verdict = audit(AutocastRegion(), BATCH)
    assert {(outcome.stage, outcome.rank) for outcome in verdict.outcomes} >= {("fit", 0), ("fit", 1)}


class FillsFloat32Zeros(Probe):
    def forward(self, features):
        with torch.autocast(device_type=features.device.type, dtype=torch.float16):
            logits = self.net(features)
            kept = torch.zeros(features.shape[0], 3, device=features.device)
            kept[features[:, 0] > 0] = logits[features[:, 0] > 0]  # float16 values into float32 zeros
        return kept.float()


class FillsZerosOfItsDtype(Probe):
    def forward(self, features):
        with torch.autocast(device_type=features.device.type, dtype=torch.float16):
            logits = self.net(features)
            kept = logits.new_zeros(features.shape[0], 3)
            kept[features[:, 0] > 0] = logits[features[:, 0] > 0]
        return kept.float()


def test_a_dtype_mix_that_cuda_refuses_under_autocast_is_caught_at_its_line():
    """float16 values indexed into a float32 tensor stop where CUDA stops them; zeros of the values' dtype pass."""
    error = assert_rule(FillsFloat32Zeros(), FillsZerosOfItsDtype(), "# float16 values into float32 zeros", __file__)
    assert error.kind == "dtype"
    assert "dtypes match" in str(error)


class SigmoidThenBCE(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        targets = F.one_hot(labels, 3).float()
        return F.binary_cross_entropy(torch.sigmoid(self(features)), targets)  # unsafe to autocast


class BCEWithLogits(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.binary_cross_entropy_with_logits(self(features), F.one_hot(labels, 3).float())


def test_binary_cross_entropy_under_mixed_precision_is_refused_as_cuda_refuses_it():
    """CUDA's autocast refuses ``binary_cross_entropy`` (the CPU's does not): the audit stops there; logits pass."""
    trainer = L.Trainer(precision="bf16-mixed", logger=False)
    error = assert_rule(SigmoidThenBCE(), BCEWithLogits(), "# unsafe to autocast", __file__, trainer=trainer)
    assert error.kind == "autocast"
    assert "binary_cross_entropy_with_logits" in str(error)


class ExpectsDtype(Probe):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype_expected = dtype

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        assert logits.dtype == self.dtype_expected, logits.dtype
        return F.cross_entropy(logits, labels)


def test_the_trainers_mixed_precision_runs_as_mixed_precision_and_is_named():
    """``precision="bf16-mixed"`` trains in bfloat16 on the simulated GPU, and the report names that precision."""
    verdict = audit(ExpectsDtype(torch.bfloat16), BATCH, trainer=L.Trainer(precision="bf16-mixed", logger=False))
    assert "note: precision bf16-mixed ran as on a CUDA GPU: autocast to bfloat16" in verdict.report()
    audit(ExpectsDtype(torch.float32), BATCH, trainer=L.Trainer(precision="32-true", logger=False))


@pytest.mark.slow
def test_the_audit_command_runs_16_mixed_as_given(in_tmp_path, synthetic_config, capsys):
    """``--precision 16-mixed`` is audited as float16 with a gradient scaler, and named so (not bf16-mixed)."""
    with pytest.raises(SystemExit) as stop:
        audit_main(["--config", synthetic_config, "--precision", "16-mixed"], cli_class=ProjectCLI)
    out = capsys.readouterr().out
    assert stop.value.code == 0, out
    assert "note: precision 16-mixed ran as on a CUDA GPU: autocast to float16, gradients scaled" in out
    assert "bf16" not in out
