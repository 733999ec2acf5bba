"""``train.py --accelerator simgpu``: the GPU command line, and Lightning's Trainer, run on the simulated GPU."""

import sys

import lightning as L
import pytest
import torch
from image_project.cli import main as train
from test_placement_main import PlainAttributeNet
from test_simulated_gpu import BATCH, Probe, line_of
from torch import nn
from torch.utils.data import DataLoader

from lightning_kit.gpu_audit import SIMULATED, simulated
from lightning_kit.gpu_audit.lightning import SimulatedGPUStrategy

# A network whose output offset is a plain attribute: a bug at the line marked "# CPU offset".
BUGGY_NET = f"{PlainAttributeNet.__module__}.PlainAttributeNet"
BUGGY_FILE = sys.modules[PlainAttributeNet.__module__].__file__
BUG_AT = f"{BUGGY_FILE}:{line_of('# CPU offset', BUGGY_FILE)}"


def test_a_simulated_run_computes_what_a_cpu_run_computes():
    """The simulated GPU carries real values: two steps of training give the CPU's weights, bit for bit."""
    weights = {}
    for accelerator in ("cpu", SIMULATED):
        torch.manual_seed(0)
        model = Probe(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)))
        arguments = {"strategy": SimulatedGPUStrategy()} if accelerator != "cpu" else {"accelerator": "cpu"}
        trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, **arguments)
        with simulated.simulating():
            trainer.fit(model, DataLoader([BATCH, BATCH], batch_size=None))
        weights[accelerator] = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert weights["cpu"].keys() == weights[SIMULATED].keys()
    for name, tensor in weights["cpu"].items():
        assert torch.equal(weights[SIMULATED][name], tensor), name


def test_train_runs_on_the_simulated_gpu_with_the_accelerator_swapped(in_tmp_path, fast_args, capsys):
    """`train.py --accelerator simgpu` is the GPU command line, run on the simulated GPU."""
    train([*fast_args, "--accelerator", SIMULATED, "--trainer.fast_dev_run", "2"])
    assert "fit finished" in capsys.readouterr().out
    buggy = ["--model.net", BUGGY_NET]
    with pytest.raises(SystemExit) as exit_info:
        train([*fast_args, "--accelerator", "simgpu", "--trainer.fast_dev_run", "2", *buggy])
    message = str(exit_info.value.code)
    assert message.startswith("error: this would fail on a GPU") and BUG_AT in message
    with pytest.raises(SystemExit) as exit_info:
        train([*fast_args, "--accelerator", "simgpu", "--devices", "2"])
    assert str(exit_info.value.code).startswith("error: --accelerator simgpu runs one process")


@pytest.mark.parametrize(
    ("optimizer", "multi_tensor"),
    [(torch.optim.Adam, "adam"), (torch.optim.AdamW, "adam"), (torch.optim.SGD, "sgd")],  # AdamW is Adam's
)
def test_optimizers_and_clipping_take_the_foreach_path_a_gpu_takes(monkeypatch, optimizer, multi_tensor):
    """On a GPU, PyTorch steps an optimizer and clips gradients with one foreach kernel over every parameter;
    on the simulated GPU too (its tensors are a subclass, which PyTorch's lists of foreach types leave out)."""
    calls = []

    def spy(module, name):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(name) or original(*args, **kwargs))

    spy(torch, "_foreach_norm")
    spy(sys.modules[f"torch.optim.{multi_tensor}"], f"_multi_tensor_{multi_tensor}")
    with simulated.simulating(0):
        net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to(simulated.device(0))
        net(torch.randn(4, 8, device=simulated.device(0))).sum().backward()
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer(net.parameters(), lr=0.1).step()
    assert calls == ["_foreach_norm", f"_multi_tensor_{multi_tensor}"]
    # Plain tensors' lists again once the block ends.
    modules = [sys.modules[name] for name in ("torch.optim.optimizer", "torch.utils._foreach_utils")]
    assert all(simulated.SimulatedTensor not in module._foreach_supported_types for module in modules)
