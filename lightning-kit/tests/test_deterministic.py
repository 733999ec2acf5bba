"""The simulated GPU's table of CUDA's deterministic-mode alerts, held against the installed PyTorch.

``gpu_audit/simulated/deterministic.py`` holds CUDA's kernels that refuse to run under
``torch.use_deterministic_algorithms(True)``, read from PyTorch's CUDA sources. The installed
PyTorch's own documentation of that function lists them too: every entry it says "will throw" is
in the table (or here, with why it is not), so that a PyTorch that adds one fails this test, and
none it says acts deterministically is. What each alert does to a model, and the routes PyTorch
takes around them, is in ``gpu_branch_cases.py`` (deterministic mode).
"""

import re

import pytest
import torch

from lightning_kit.gpu_audit.simulated.deterministic import ALERTS

# The documentation's names of what throws, and the operations of the table that are theirs.
DOCUMENTED = {
    "torch.nn.AvgPool3d": {"avg_pool3d_backward"},
    "torch.nn.AdaptiveAvgPool2d": {"_adaptive_avg_pool2d_backward"},
    "torch.nn.AdaptiveAvgPool3d": {"_adaptive_avg_pool3d_backward", "adaptive_avg_pool3d_backward"},
    "torch.nn.AdaptiveMaxPool2d": {"adaptive_max_pool2d_backward"},
    "torch.nn.FractionalMaxPool2d": {"fractional_max_pool2d_backward"},
    "torch.nn.FractionalMaxPool3d": {"fractional_max_pool3d_backward"},
    "torch.nn.MaxUnpool1d": {"max_unpool2d"},
    "torch.nn.MaxUnpool2d": {"max_unpool2d"},
    "torch.nn.MaxUnpool3d": {"max_unpool3d"},
    "torch.nn.functional.interpolate": {
        "upsample_linear1d_backward",
        "upsample_bilinear2d_backward",
        "upsample_bicubic2d_backward",
        "upsample_trilinear3d_backward",
    },
    "torch.nn.ReflectionPad1d": {"reflection_pad1d_backward"},
    "torch.nn.ReflectionPad3d": {"reflection_pad3d_backward"},
    "torch.nn.NLLLoss": {"nll_loss2d_forward"},
    "torch.nn.CTCLoss": {"_ctc_loss_backward"},
    "torch.nn.EmbeddingBag": {"_embedding_bag_backward", "_embedding_bag_dense_backward"},
    "torch.Tensor.put_": {"put_"},
    "torch.histc": {"histc"},
    "torch.bincount": {"bincount"},
    "torch.median": {"median.dim", "median.dim_values"},
    "torch.nn.functional.grid_sample": {"grid_sampler_2d_backward", "grid_sampler_3d_backward"},
    "torch.Tensor.scatter_reduce": {"scatter_reduce.two"},
}
# Documented as throwing, and not in the table: why.
NOT_CUDA_ALERTS = {
    # ReflectionPad.cu's reflection_pad2d_backward has had no alert since it was made deterministic; the list kept it.
    "torch.nn.ReflectionPad2d": "no alert in CUDA's kernel",
    "torch.Tensor.resize_": "quantized tensors only, not CUDA's",
}
# Documented as deterministic on CUDA: none of their operations may be in the table.
DETERMINISTIC = {
    "torch.cumsum": "cumsum",
    "torch.Tensor.index_put": "index_put",
    "torch.Tensor.scatter_add_": "scatter_add",
    "torch.gather": "gather",
    "torch.index_add": "index_add",
    "torch.index_select": "index_select",
    "torch.repeat_interleave": "repeat_interleave",
    "torch.Tensor.index_copy": "index_copy",
    "torch.nn.Embedding": "embedding_dense_backward",
    "torch.bmm": "bmm",
}


def _documented(start: str, end: str) -> set[str]:
    """The names listed between ``start`` and ``end`` in ``torch.use_deterministic_algorithms``'s documentation."""
    text = " ".join(torch.use_deterministic_algorithms.__doc__.split())
    listed = text[text.index(start) : text.index(end, text.index(start))]
    return set(re.findall(r"\* :(?:class|func):`([\w.]+)`", listed))


THROWS = ("normally-nondeterministic operations will throw", "In addition")
ACTS_DETERMINISTICALLY = ("will act deterministically", "normally-nondeterministic operations will throw")


def test_every_operation_the_documentation_says_throws_is_in_the_table_or_said_why_not():
    throws = _documented(*THROWS)
    assert len(throws) >= 20, throws  # the section was found
    unknown = throws - DOCUMENTED.keys() - NOT_CUDA_ALERTS.keys()
    assert not unknown, f"this PyTorch documents alerts the table does not know: {sorted(unknown)}"
    for name in throws & DOCUMENTED.keys():
        for operation in DOCUMENTED[name]:
            assert operation in ALERTS, (name, operation)


def test_what_the_documentation_says_is_deterministic_is_no_alert():
    deterministic = _documented(*ACTS_DETERMINISTICALLY)
    assert set(DETERMINISTIC) <= deterministic, set(DETERMINISTIC) - deterministic
    for operation in DETERMINISTIC.values():
        assert not any(key.partition(".")[0] == operation for key in ALERTS), operation


@pytest.mark.parametrize("key", sorted(ALERTS))
def test_each_alert_names_an_operation_of_this_pytorch(key):
    """The table's operations (and overloads) exist in the installed PyTorch: a renamed one would never alert."""
    name, _, overload = key.partition(".")
    packet = getattr(torch.ops.aten, name, None)
    assert packet is not None, key
    assert not overload or overload in packet.overloads(), (key, packet.overloads())
