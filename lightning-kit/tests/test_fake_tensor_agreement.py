"""A second opinion from PyTorch: every rule's wrong and right code, audited and run on FakeTensor's CUDA device.

``torch._subclasses.fake_tensor.FakeTensorMode`` fakes CUDA tensors on a machine without a GPU and
propagates devices by PyTorch's own rules (``FakeTensor._find_common_device``), written apart from
the simulated GPU's. Each rule of tests/test_real_gpu.py (its wrong and right versions, and the
right versions the audit once refused) is run both ways (tests/fake_gpu.py): where FakeTensor can
express it, the two verdicts agree, or the disagreement is listed in ``DISAGREEMENTS`` with the
PyTorch source that decides it. FakeTensor cannot express code that reads values (``.item()``,
masks, ``nonzero``, data-dependent shapes, NumPy, metrics that count), what needs a real CUDA (cuDNN's
checks, CUDA generators, CTC), a collective (no process group), an uninitialised parameter moved
to it, and, on a machine without a CUDA driver, a backward pass: a rule whose bug is in the
backward pass is then judged by the audit alone, and a right version by its forward pass.
"""

import json

import pytest
from fake_check import CANNOT_EXPRESS, FORWARD_OK, OK, REFUSED
from fake_gpu import on_fake_gpu
from test_real_gpu import AGREEMENT, RIGHT
from test_simulated_gpu import BATCH

from lightning_kit.gpu_audit import DevicePlacementError, audit

# Where FakeTensor and the audit differ, and what decides it for CUDA (the audit follows it; the
# versions in tests/test_real_gpu.py run on a real GPU with the same verdicts as the audit's).
DISAGREEMENTS = {
    ("clamp by a CPU scalar", "wrong"): (
        "FakeTensor lets a 0-dim CPU tensor meet any device for every operation (torch/_subclasses/fake_tensor.py, "
        "FakeTensor._find_common_device: 'cpu - zero-dim tensors can be called in cuda kernels'); CUDA does so "
        "for TensorIterator's operations only. clamp.Tensor has no 'device_check: NoCheck' in native_functions.yaml "
        "(its out= variant has), so its generated CUDA wrapper checks every tensor with "
        "c10::impl::check_and_update_common_device (ATen/core/op_registration/adaption.h), which makes no "
        "exception for 0-dim tensors: 'Expected all tensors to be on the same device ... argument min in method "
        "wrapper_CUDA_clamp_Tensor'"
    ),
    ("randint_like's bound on the GPU", "wrong"): (
        "FakeTensor's fake kernel of randint_like.Tensor is that of the *_like constructors "
        "(torch/_subclasses/fake_impls.py, _like_tensor_constructors), which never reads `high`; CUDA's "
        "randint_like (aten/src/ATen/native/TensorFactories.cpp) reads it on the host: TORCH_CHECK(high.numel() == 1 "
        "&& high.ndimension() == 0 && high.device().is_cpu(), 'high must be a scalar tensor and on CPU')"
    ),
    ("CPU generator", "wrong"): (
        "FakeTensor's kernels of random operations do not look at the generator; CUDA's do, through "
        "at::check_generator<CUDAGeneratorImpl> (ATen/core/Generator.h): \"Expected a 'cuda' device type for "
        "generator but found 'cpu'\""
    ),
}

CASES = [
    *((rule, version) for rule in AGREEMENT for version in ("wrong", "right")),
    *((case, "right") for case in RIGHT),
]


def audit_verdict(make) -> tuple[str, str | None]:
    """("bug", the hook it stopped in) or ("ok", None)."""
    try:
        audit(make(), BATCH)
    except DevicePlacementError as err:
        return "bug", err.hook
    return "ok", None


def compared(audited: str, hook: str | None, fake) -> str:
    """``agree``, ``cannot express: why``, or ``disagree``."""
    if fake.outcome == CANNOT_EXPRESS:
        return f"cannot express: {fake.message}"
    if audited == "bug" and fake.outcome == REFUSED:
        return "agree"
    if audited == "bug" and fake.outcome == FORWARD_OK and hook is not None and hook.endswith("(backward)"):
        return "cannot express: the bug is in the backward pass, which FakeTensor's CUDA device cannot run here"
    if audited == "ok" and fake.outcome in (OK, FORWARD_OK):
        return "agree"
    return "disagree"


@pytest.mark.slow
@pytest.mark.parametrize(("rule", "version"), CASES)
def test_the_audit_and_faketensor_agree_where_faketensor_can_express_the_rule(rule, version, record_property):
    if rule in RIGHT:
        make, marks = RIGHT[rule], ()
    else:
        wrong, right, *marks = AGREEMENT[rule]
        make = wrong if version == "wrong" else right
    audited, hook = audit_verdict(make)
    fake = on_fake_gpu(make, *marks)
    verdict = compared(audited, hook, fake)
    row = {"rule": rule, "version": version, "audit": audited, "fake": str(fake), "verdict": verdict}
    record_property("fake_agreement", json.dumps(row))
    assert audited == ("bug" if version == "wrong" else "ok"), row
    if (rule, version) in DISAGREEMENTS:
        assert verdict == "disagree", f"listed as a disagreement, but it is not one any more: {row}"
    else:
        assert verdict != "disagree", f"an unexplained disagreement: {row}"


def test_each_listed_disagreement_is_a_rule_and_names_the_source_that_decides_it():
    for (rule, version), source in DISAGREEMENTS.items():
        assert (rule, version) in CASES, rule
        assert ".cpp" in source or ".h" in source or ".yaml" in source, rule
