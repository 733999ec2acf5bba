"""Models whose verdict the audit must earn, each audited in a process of its own (``test_gpu_branches.py``).

Classes of model that used to get a verdict the audit had not earned:

- code that asks whether it runs on CUDA (``torch.cuda.is_available()``, ``x.is_cuda``, ``x.device.type``,
  ``self.device``, capability, name, memory, ``torch.autocast("cuda")``, ...): the GPU branch is the one
  audited, and an index of another process's GPU is that error;
- what the user built on the model itself (hooks of every kind, parametrizations, pruning, attributes
  of parameters): the model Lightning trains is the one audited, never a copy;
- convolutions and other composite operations given a CPU operand: the device error CUDA raises;
- the line that made the CPU tensor, one or more calls and files away from where it met the GPU;
- and, beyond placement, deterministic mode: a kernel CUDA has no deterministic implementation of stops the
  run, under the Trainer's flag or the code's own call; what PyTorch makes deterministic on CUDA passes;
- DDP: a trainable parameter no loss reaches, the processes' collectives parting (a hang on GPUs), and what
  DistributedDataParallel refuses as it wraps the model (lazy modules, a sparse buffer).

Each class says what the audit must find (``expected``); a correct twin of each wrong one passes.
``python gpu_branch_cases.py`` audits every case in a forked child of its own (``run_audit(...,
isolate=True)``) and prints one JSON line per case.
"""

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from gpu_branch_helpers import Normalised
from torch import nn
from torch.nn.utils import parametrize, prune
from torchmetrics.classification import MulticlassAccuracy

BATCH = (torch.randn(8, 8), torch.randint(0, 3, (8,)))


@dataclass(frozen=True)
class Expected:
    """What the audit must say: its exit status, and for a bug its kind, line, rank and the line that made it."""

    status: int = 0  # 0 passed, 1 a bug, 3 not audited
    kind: str | None = None
    at: str | None = None  # a comment on the line the bug is found at
    made: str | None = None  # a comment on the line that made the CPU tensor
    rank: int = 0
    stage: str | None = None
    said: str | None = None  # words the report holds
    note: str | None = None  # words one of the verdict's notes holds


PASSES = Expected()


def bug(at: str | None, kind: str = "mixed devices", **more) -> Expected:
    return Expected(status=1, kind=kind, at=at, **more)


class Probe(L.LightningModule):
    """(B, 8) features to (B, 3) logits; trained with cross entropy."""

    expected = PASSES

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 3)

    def forward(self, features):
        return self.net(features)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self(features), labels)

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.log("val/loss", F.cross_entropy(self(features), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


# CUDA guards: the branch written for the GPU is the one that runs.


class GuardedByIsAvailable(Probe):
    expected = bug("# cpu in the is_available branch", made="# cpu in the is_available branch")

    def forward(self, features):
        if torch.cuda.is_available():
            return self.net(features) + torch.ones(3)  # cpu in the is_available branch
        return self.net(features)


class GuardedByIsAvailableRight(Probe):
    def forward(self, features):
        if torch.cuda.is_available():
            return self.net(features) + torch.ones(3, device=features.device)
        return self.net(features)


class GuardedByIsCuda(Probe):
    expected = bug("# cpu in the is_cuda branch")

    def forward(self, features):
        logits = self.net(features)
        if features.is_cuda:
            logits = logits + torch.zeros(3)  # cpu in the is_cuda branch
        return logits


class GuardedByDeviceType(Probe):
    expected = bug("# cpu in the device.type branch")

    def forward(self, features):
        logits = self.net(features)
        if features.device.type == "cuda":
            logits = logits * torch.ones(8, 3).mean(0)  # cpu in the device.type branch
        return logits


class GuardedByModuleDevice(Probe):
    expected = bug("# cpu in the self.device branch")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        if self.device.type == "cuda" and str(self.device).startswith("cuda:"):
            logits = logits + torch.zeros(3)  # cpu in the self.device branch
        return F.cross_entropy(logits, labels)


class GuardedByStrategyDevice(Probe):
    expected = bug("# cpu in the root_device branch")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        if self.trainer.strategy.root_device.type == "cuda":
            logits = logits + torch.zeros(3)  # cpu in the root_device branch
        return F.cross_entropy(logits, labels)


class LastGPUByCount(Probe):
    expected = bug("# the last GPU of the machine", kind="another GPU", rank=0)

    def forward(self, features):
        extra = torch.zeros(3, device=f"cuda:{torch.cuda.device_count() - 1}")  # the last GPU of the machine
        return self.net(features) + extra


class GPUZeroWhenAvailable(Probe):
    expected = bug("# cuda:0 where there is a GPU", kind="another GPU", rank=1)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
        return F.cross_entropy(self(features) + torch.zeros(3, device=device), labels)  # cuda:0 where there is a GPU


class SetsDeviceZero(Probe):
    expected = bug("# set_device(0)", kind="another GPU", rank=1)

    def on_fit_start(self):
        torch.cuda.set_device(0)  # set_device(0)


class CapabilityBranch(Probe):
    expected = bug("# cpu in the capability branch")

    def forward(self, features):
        logits = self.net(features)
        if torch.cuda.get_device_capability() >= (8, 0):
            logits = logits + torch.zeros(3)  # cpu in the capability branch
        return logits


class BFloat16Branch(Probe):
    expected = bug("# cpu in the bf16 branch")

    def forward(self, features):
        logits = self.net(features)
        if torch.cuda.is_bf16_supported():
            logits = logits + torch.zeros(3)  # cpu in the bf16 branch
        return logits


class DeviceNameBranch(Probe):
    expected = bug("# cpu in the device-name branch")

    def forward(self, features):
        logits = self.net(features)
        if "NVIDIA" in torch.cuda.get_device_name(0) and torch.cuda.get_device_properties(0).total_memory > 2**30:
            logits = logits + torch.zeros(3)  # cpu in the device-name branch
        return logits


class MemoryBranch(Probe):
    expected = bug("# cpu in the memory branch")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        free, total = torch.cuda.mem_get_info()
        if torch.cuda.memory_allocated() > 0 and torch.cuda.max_memory_allocated() > 0 and free < total:
            logits = logits + torch.zeros(3)  # cpu in the memory branch
        return F.cross_entropy(logits, labels)


class TypeNameBranch(Probe):
    expected = bug("# cpu in the type() branch")

    def forward(self, features):
        logits = self.net(features)
        if features.type() == "torch.cuda.FloatTensor":
            logits = logits + torch.zeros(3)  # cpu in the type() branch
        return logits


class BuiltWithCudaBranch(Probe):
    expected = bug("# cpu in the is_built branch")

    def forward(self, features):
        logits = self.net(features)
        if torch.backends.cuda.is_built() and torch.cuda.is_initialized():
            logits = logits + torch.zeros(3)  # cpu in the is_built branch
        return logits


class AcceleratorBranch(Probe):
    expected = bug("# cpu in the torch.accelerator branch")

    def forward(self, features):
        logits = self.net(features)
        if torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "cuda":
            logits = logits + torch.zeros(3)  # cpu in the torch.accelerator branch
        return logits


class AutocastOnCuda(Probe):
    expected = bug("# unsafe under CUDA's autocast", kind="autocast")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        with torch.autocast("cuda", dtype=torch.float16):
            probabilities = torch.sigmoid(self(features))
            targets = F.one_hot(labels, 3).to(probabilities.dtype)
            return F.binary_cross_entropy(probabilities, targets)  # unsafe under CUDA's autocast


class AutocastOnCudaRight(Probe):
    def training_step(self, batch, batch_idx):
        features, labels = batch
        with torch.autocast("cuda", dtype=torch.float16):
            logits = self(features)
            assert logits.dtype == torch.float16 and torch.is_autocast_enabled("cuda"), "CUDA's autocast is on"
            return F.binary_cross_entropy_with_logits(logits, F.one_hot(labels, 3).to(logits.dtype))


class AutocastIntoAFloatAccumulator(Probe):
    """index_add_ of a float16 result into a float32 tensor: its dtypes must match (on the CPU all is float32)."""

    expected = bug("# float16 into float32", kind="dtype")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        with torch.autocast("cuda", dtype=torch.float16):
            logits = self(features)
            per_class = torch.zeros(3, 3, device=logits.device)
            per_class.index_add_(0, labels, logits)  # float16 into float32
            return F.cross_entropy(logits.float(), labels) + 0 * per_class.sum()


class AutocastMaskedWithAHugeConstant(Probe):
    """Attention scores under float16 autocast, masked with -1e9: float16 cannot hold it."""

    expected = bug("# -1e9 in float16", kind="dtype")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        with torch.autocast("cuda", dtype=torch.float16):
            scores = features @ features.T
            mask = torch.eye(len(features), dtype=torch.bool, device=scores.device)
            scores = scores.masked_fill(mask, -1e9)  # -1e9 in float16
            return F.cross_entropy(self(scores.softmax(-1).float() @ features), labels)


class AutocastMaskedWithTheSmallestValue(AutocastMaskedWithAHugeConstant):
    expected = PASSES

    def training_step(self, batch, batch_idx):
        features, labels = batch
        with torch.autocast("cuda", dtype=torch.float16):
            scores = features @ features.T
            mask = torch.eye(len(features), dtype=torch.bool, device=scores.device)
            scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
            return F.cross_entropy(self(scores.softmax(-1).float() @ features), labels)


class NamesTheGPU(Probe):
    expected = Expected(note="names the GPU itself (device='cuda')")

    def forward(self, features):
        return self.net(features) + torch.zeros(3, device="cuda")  # the GPU named


class TakesTheCurrentGPU(Probe):
    def forward(self, features):
        with torch.cuda.device(features.device), torch.cuda.device_of(features):
            offset = torch.zeros(3, device=torch.device("cuda", torch.cuda.current_device()))
        return self.net(features) + offset


class TimesItsSteps(Probe):
    def training_step(self, batch, batch_idx):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = super().training_step(batch, batch_idx)
        end.record()
        torch.cuda.synchronize()
        self.log("step_ms", start.elapsed_time(end))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return loss


class AsksUtilization(Probe):
    expected = Expected(status=3, said="torch.cuda.utilization")

    def on_train_epoch_end(self):
        self.log("gpu/utilization", float(torch.cuda.utilization()))  # what NVML would say


class PinsItsInputs(Probe):
    expected = bug("# pins a GPU tensor", kind="pin memory")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self(features.pin_memory()), labels)  # pins a GPU tensor


class PinsItsCPUCopies(Probe):
    def validation_step(self, batch, batch_idx):
        features, _ = batch
        self.kept = self(features).detach().cpu().pin_memory()


# Hooks and attributes: the model Lightning trains is the one audited.


class ParameterHookWithCPUMask(Probe):
    expected = bug("# a CPU mask in a parameter's hook", said="It is `mask`, a plain tensor attribute")

    def __init__(self) -> None:
        super().__init__()
        self.mask = torch.ones(3, 8)
        self.net.weight.register_hook(lambda grad: grad * self.mask)  # a CPU mask in a parameter's hook


class ParameterHookWithBufferMask(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.ones(3, 8), persistent=False)
        self.net.weight.register_hook(lambda grad: grad * self.mask)


class AfterAccumulationHook(Probe):
    expected = bug("# a CPU tensor after accumulation")

    def __init__(self) -> None:
        super().__init__()
        self.decay = torch.full((3,), 0.9)
        self.net.bias.register_post_accumulate_grad_hook(self.decayed)

    def decayed(self, parameter):
        parameter.grad.mul_(self.decay)  # a CPU tensor after accumulation


class ForwardHook(Probe):
    expected = bug("# a CPU offset in a forward hook")

    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.zeros(3)
        self.net.register_forward_hook(self.offset_by)

    def offset_by(self, module, args, output):
        return output + self.offset  # a CPU offset in a forward hook


class ForwardPreHook(Probe):
    expected = bug("# a CPU scale in a pre-hook")

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.ones(8)
        self.net.register_forward_pre_hook(lambda module, args: (args[0] * self.scale,))  # a CPU scale in a pre-hook


class FullBackwardHook(Probe):
    expected = bug("# a CPU scale in a backward hook")

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.ones(8)
        self.body = nn.Linear(8, 8)
        self.body.register_full_backward_hook(self.scaled)

    def forward(self, features):
        return self.net(self.body(features.requires_grad_()))

    def scaled(self, module, grad_input, grad_output):
        return (grad_input[0] * self.scale,)  # a CPU scale in a backward hook


class BackwardPreHook(Probe):
    expected = bug("# a CPU scale in a backward pre-hook")

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.ones(3)
        self.net.register_full_backward_pre_hook(self.scaled)

    def scaled(self, module, grad_output):
        return (grad_output[0] * self.scale,)  # a CPU scale in a backward pre-hook


class StateDictHook(Probe):
    expected = bug("# a CPU tensor in a state-dict hook")

    def __init__(self) -> None:
        super().__init__()
        self.shrink = torch.full((3, 8), 0.5)
        self.register_state_dict_post_hook(_shrunk)


def _shrunk(module, state_dict, prefix, local_metadata):
    weight = state_dict[prefix + "net.weight"]
    state_dict[prefix + "net.weight"] = weight * module.shrink  # a CPU tensor in a state-dict hook


class ParametersKeepTheirAttributes(Probe):
    """Weight decay chosen by an attribute set on each parameter: the same objects, with it, on the GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.net.bias.no_decay = True

    def configure_optimizers(self):
        decayed = [p for p in self.parameters() if not getattr(p, "no_decay", False)]
        kept = [p for p in self.parameters() if getattr(p, "no_decay", False)]
        if not decayed or not kept or kept[0] is not self.net.bias or not self.net.bias.is_cuda:
            raise ValueError("a parameter lost its attribute, or is not the object it was")
        return torch.optim.AdamW([{"params": decayed}, {"params": kept, "weight_decay": 0.0}], lr=0.01)


class RemovesItsHook(Probe):
    """A hook removed by its handle in a later hook: gone on the GPU too (the same dict of hooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.stale = torch.ones(3, 8)
        self.handle = self.net.weight.register_hook(lambda grad: grad * self.stale)

    def on_fit_start(self):
        self.handle.remove()


# Parametrizations and pruning: built on the model itself, which the audit trains as it is.


class HalvedOnTheCPU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.factor = torch.full((3, 8), 0.5)

    def forward(self, weight):
        return weight * self.factor  # a parametrization's CPU tensor


class HalvedOnTheDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("factor", torch.full((3, 8), 0.5))

    def forward(self, weight):
        return weight * self.factor


class ParametrizedWithACPUTensor(Probe):
    expected = bug("# a parametrization's CPU tensor", said="parametrizations.weight.0.factor")

    def __init__(self) -> None:
        super().__init__()
        parametrize.register_parametrization(self.net, "weight", HalvedOnTheCPU())


class ParametrizedWithABuffer(Probe):
    def __init__(self) -> None:
        super().__init__()
        parametrize.register_parametrization(self.net, "weight", HalvedOnTheDevice())


class WeightNormParametrization(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.utils.parametrizations.weight_norm(nn.Linear(8, 3))


class SpectralNormParametrization(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.utils.parametrizations.spectral_norm(nn.Linear(8, 3))


class OldWeightNorm(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.utils.weight_norm(nn.Linear(8, 3))


class OldSpectralNorm(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.utils.spectral_norm(nn.Linear(8, 3))


class PrunedByMagnitude(Probe):
    def __init__(self) -> None:
        super().__init__()
        prune.l1_unstructured(self.net, "weight", amount=0.5)


class PrunedByMaskAndStructure(Probe):
    def __init__(self) -> None:
        super().__init__()
        prune.custom_from_mask(self.net, "weight", torch.rand(3, 8) > 0.3)
        prune.random_structured(self.net, "weight", amount=0.3, dim=0)


class MasksItsWeightsInAHook(Probe):
    expected = bug("# a CPU mask on the GPU's weights")

    def __init__(self) -> None:
        super().__init__()
        self.keep = (torch.rand(3, 8) > 0.5).float()
        self.net.register_forward_pre_hook(self.masked)

    def masked(self, module, args):
        with torch.no_grad():
            module.weight.mul_(self.keep)  # a CPU mask on the GPU's weights


# Convolutions and other composite operations given a CPU operand.


class ConvolvesWithACPUKernel(Probe):
    expected = bug("# a CPU kernel", said="weight type (torch.FloatTensor)")

    def __init__(self) -> None:
        super().__init__()
        self.kernel = torch.full((1, 1, 3), 1 / 3)  # a pre-emphasis filter, a plain attribute

    def forward(self, features):
        smoothed = F.conv1d(features.unsqueeze(1), self.kernel, padding=1)  # a CPU kernel
        return self.net(smoothed.squeeze(1))


class ConvolvesWithABufferKernel(Probe):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kernel", torch.full((1, 1, 3), 1 / 3), persistent=False)

    def forward(self, features):
        return self.net(F.conv1d(features.unsqueeze(1), self.kernel, padding=1).squeeze(1))


class GroupedConvolutionWithACPUWeight(Probe):
    expected = bug("# a grouped CPU weight", said="weight type (torch.FloatTensor)")

    def __init__(self) -> None:
        super().__init__()
        self.window = torch.ones(2, 1, 1, 1)

    def forward(self, features):
        images = features.view(-1, 2, 2, 2)
        return self.net(F.conv2d(images, self.window, groups=2).flatten(1))  # a grouped CPU weight


class ConvolutionWithACPUBias(Probe):
    expected = bug("# a device weight, a CPU bias", said="bias type (torch.FloatTensor)")

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 1, 3, padding=1, bias=False)
        self.shift = torch.zeros(1)

    def forward(self, features):
        signal = features.unsqueeze(1)
        shifted = F.conv1d(signal, self.conv.weight, self.shift, padding=1)  # a device weight, a CPU bias
        return self.net(shifted.squeeze(1))


class TransposedConvolutionWithACPUWeight(Probe):
    expected = bug("# a transposed CPU weight", said="weight type (torch.FloatTensor)")

    def __init__(self) -> None:
        super().__init__()
        self.upsample = torch.ones(1, 1, 1)

    def forward(self, features):
        return self.net(F.conv_transpose1d(features.unsqueeze(1), self.upsample).squeeze(1))  # a transposed CPU weight


class SpectrogramWithACPUWindow(Probe):
    expected = bug("# the window meets the GPU", made="# the window, made on the CPU")

    def forward(self, features):
        window = torch.hann_window(4)  # the window, made on the CPU
        spectrum = torch.stft(features, n_fft=4, window=window, return_complex=True).abs()  # the window meets the GPU
        return self.net(spectrum.mean(-1).repeat(1, 2)[:, :8])


class LayerNormWithACPUWeight(Probe):
    expected = bug("# a CPU layer-norm weight")

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.ones(8)

    def forward(self, features):
        return self.net(F.layer_norm(features, (8,), self.gain))  # a CPU layer-norm weight


class GroupNormWithACPUWeight(Probe):
    expected = bug("# a CPU group-norm weight")

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.ones(8)

    def forward(self, features):
        return self.net(F.group_norm(features.unsqueeze(-1), 2, self.gain).squeeze(-1))  # a CPU group-norm weight


class EinsumWithACPUOperand(Probe):
    expected = bug("# einsum with a CPU projection")

    def __init__(self) -> None:
        super().__init__()
        self.projection = torch.eye(8)

    def forward(self, features):
        return self.net(torch.einsum("bi,ij->bj", features, self.projection))  # einsum with a CPU projection


class DistancesToCPUCentres(Probe):
    expected = bug("# distances to CPU centres")

    def __init__(self) -> None:
        super().__init__()
        self.centres = torch.randn(3, 8)

    def forward(self, features):
        return self.net(features) - torch.cdist(features, self.centres)  # distances to CPU centres


class SamplesACPUGrid(Probe):
    expected = bug("# a CPU sampling grid")

    def __init__(self) -> None:
        super().__init__()
        self.grid = torch.zeros(1, 2, 4, 2)

    def forward(self, features):
        images = features.view(-1, 1, 2, 4)
        grid = self.grid.expand(images.shape[0], -1, -1, -1)
        return self.net(F.grid_sample(images, grid, align_corners=False).flatten(1))  # a CPU sampling grid


class LinearWithACPUWeight(Probe):
    expected = bug("# a CPU weight in F.linear")

    def __init__(self) -> None:
        super().__init__()
        self.readout = torch.randn(3, 8)

    def forward(self, features):
        return F.linear(features, self.readout) + self.net(features)  # a CPU weight in F.linear


class ScalesByACPUNumber(Probe):
    """A 0-dim CPU tensor is a number to element-wise operations, on CUDA too."""

    def forward(self, features):
        return self.net(features * torch.tensor(2.0))


# The line that made the CPU tensor, one or more calls, or a file, away from where it met the GPU.


class LengthsMadeInPredictStep(Probe):
    expected = bug("# where the lengths meet the GPU's features", made="# lengths made on the CPU", stage="predict")

    def __init__(self) -> None:
        super().__init__()
        self.net = Normalised()

    def forward(self, features, lengths=None):
        return self.net(features, features.new_full((features.shape[0],), 8.0) if lengths is None else lengths)

    def predict_step(self, batch, batch_idx):
        features, _ = batch
        lengths = torch.full((features.shape[0],), 8.0)  # lengths made on the CPU
        return self(features, lengths)


class ComputedFromARange(Probe):
    expected = bug("# the scale meets the GPU", made="# a scale computed from arange")

    def forward(self, features):
        scale = torch.arange(8) / 8  # a scale computed from arange
        return self.net(features * scale)  # the scale meets the GPU


class CopiedToTheCPU(Probe):
    expected = bug("# a CPU copy meets the GPU", made="# copied to the CPU")

    def forward(self, features):
        logits = self.net(features)
        on_host = logits.detach().cpu()  # copied to the CPU
        return logits + on_host.mean(0)  # a CPU copy meets the GPU


def _zeros() -> torch.Tensor:
    return torch.zeros(3)  # made two calls away


def _offsets() -> torch.Tensor:
    return _zeros()


class MadeTwoCallsAway(Probe):
    expected = bug("# offsets from two calls away", made="# made two calls away")

    def forward(self, features):
        return self.net(features) + _offsets()  # offsets from two calls away


class PositionsOfTheSeed(Probe):
    """The seed's example: position indices made inside forward, without the input's device."""

    expected = bug("# positions meet the GPU", made="# positions made on the CPU")

    def __init__(self) -> None:
        super().__init__()
        self.position = nn.Embedding(8, 8)

    def forward(self, features):
        B, T = features.shape
        positions = torch.arange(T).expand(B, T)  # positions made on the CPU
        return self.net(features + self.position(positions).mean(1))  # positions meet the GPU


class KeepsMasksInAList(Probe):
    expected = bug("# a mask from a plain list", said="kept in a plain list")

    def __init__(self) -> None:
        super().__init__()
        self.masks = [torch.ones(3)]

    def forward(self, features):
        return self.net(features) * self.masks[0]  # a mask from a plain list


class SamplesNoiseFromADistribution(Probe):
    """A VAE's reparameterisation with ``Normal(0, 1)``: its parameters are Python numbers, so its samples are CPU's."""

    expected = bug("# noise meets the GPU", made="# sampled on the CPU")

    def forward(self, features):
        noise = torch.distributions.Normal(0.0, 1.0).sample(features.shape)  # sampled on the CPU
        return self.net(features + noise)  # noise meets the GPU


class SamplesNoiseFromADistributionRight(Probe):
    def forward(self, features):
        noise = torch.distributions.Normal(torch.zeros_like(features), torch.ones_like(features)).sample()
        return self.net(features + noise)


class LegacyTensorConstructor(Probe):
    expected = bug("# a legacy constructor's bias", made="# torch.Tensor is the CPU's")

    def forward(self, features):
        bias = torch.Tensor(3).fill_(0.1)  # torch.Tensor is the CPU's
        return self.net(features) + bias  # a legacy constructor's bias


class NoiseAfterTheTransfer(Probe):
    """Augmentation in ``on_after_batch_transfer``: the batch is on the GPU there, and the noise must be too."""

    expected = bug("# noise added to the moved batch")

    def on_after_batch_transfer(self, batch, dataloader_idx):
        features, labels = batch
        return features + 0.1 * torch.randn(features.shape), labels  # noise added to the moved batch


# Deterministic mode as CUDA has it: a kernel CUDA has no deterministic implementation of stops the run, under the
# Trainer's flag or the code's own call as it stands at that operation; what PyTorch makes deterministic runs.


class Images(Probe):
    """The features as (B, 2, 2, 2) images, a 1x1 convolution to 3 channels, a layer of each case's, a mean."""

    deterministic: bool | str | None = True  # Trainer(deterministic=...) of the case

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Identity()  # every parameter reaches the loss, as DDP needs
        self.conv = nn.Conv2d(2, 3, 1)

    def layer(self, images):
        return images

    def forward(self, features):
        return self.layer(self.conv(features.view(-1, 2, 2, 2))).flatten(2).mean(2)


class SegmentationLoss(Images):
    """A segmentation model's cross entropy over (B, C, H, W): nll_loss2d, which averages with atomics on CUDA."""

    expected = bug("# a per-pixel loss that averages", kind="deterministic", said="nll_loss2d_forward_out_cuda")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        maps = self.conv(features.view(-1, 2, 2, 2))
        masks = labels[:, None, None].expand(-1, 2, 2)
        return F.cross_entropy(maps, masks)  # a per-pixel loss that averages


class SegmentationLossAveragedByHand(SegmentationLoss):
    expected = PASSES

    def training_step(self, batch, batch_idx):
        features, labels = batch
        maps = self.conv(features.view(-1, 2, 2, 2))
        masks = labels[:, None, None].expand(-1, 2, 2)
        return F.cross_entropy(maps, masks, reduction="none").mean()


class SegmentationLossNotDeterministic(SegmentationLoss):
    expected = PASSES
    deterministic = None


class SegmentationLossWarned(SegmentationLoss):
    expected = Expected(note="nll_loss2d_forward_out_cuda_template has no deterministic CUDA implementation")
    deterministic = "warn"


class AdaptivePoolTo2x2(Images):
    """Its backward adds with atomics on CUDA: found in the backward pass, named at the forward's line."""

    expected = bug("# pooled to 2x2", kind="deterministic", said="in its backward pass (AdaptiveAvgPool2DBackward0)")

    def layer(self, images):
        return F.adaptive_avg_pool2d(F.interpolate(images, scale_factor=2, mode="nearest"), 2)  # pooled to 2x2


class AdaptivePoolTo1x1(Images):
    def layer(self, images):
        return F.adaptive_avg_pool2d(images, 1)  # a mean, on CUDA too


class AdaptiveMaxPool(Images):
    expected = bug("# max-pooled", kind="deterministic", said="adaptive_max_pool2d_backward_cuda")

    def layer(self, images):
        return F.adaptive_max_pool2d(images, 1)  # max-pooled


class BicubicUpsampling(Images):
    expected = bug("# bicubic", kind="deterministic", said="upsample_bicubic2d_backward_out_cuda")

    def layer(self, images):
        return F.interpolate(images, scale_factor=2, mode="bicubic", align_corners=False)  # bicubic


class BilinearUpsampling(Images):
    """PyTorch routes bilinear interpolation on CUDA to a decomposition whose backward is deterministic."""

    def layer(self, images):
        return F.interpolate(images, scale_factor=2, mode="bilinear", align_corners=False)


class ReflectionPadding(Images):
    expected = bug("# padded by reflection", kind="deterministic", said="reflection_pad1d_backward_out_cuda")

    def layer(self, images):
        return F.pad(images.flatten(2), (1, 1), mode="reflect")  # padded by reflection


class ReplicatePadding(Images):
    """Routed to a decomposition on CUDA in deterministic mode, as bilinear interpolation is."""

    def layer(self, images):
        return F.pad(images, (1, 1, 1, 1), mode="replicate")


class MaxEmbeddingBag(Probe):
    """Bags of token ids, embedded by their largest value: the backward of max mode adds with atomics on CUDA."""

    expected = bug("# max of each bag", kind="deterministic", said="embedding_bag_backward_cuda_max")
    deterministic = True
    mode = "max"

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(16, 8, mode=self.mode)

    def forward(self, features):
        return self.net(self.bag(features.abs().mul(4).long().clamp(max=15)))  # max of each bag


class MeanEmbeddingBag(MaxEmbeddingBag):
    expected = PASSES
    mode = "mean"


class MaxPooling3d(Images):
    """3-d max pooling: its backward adds with atomics on CUDA."""

    expected = bug("# pooled in 3-d", kind="deterministic", said="max_pool3d_with_indices_backward_cuda")

    def layer(self, images):
        return F.max_pool3d(images[:, None], kernel_size=(1, 2, 2))[:, 0]  # pooled in 3-d


class MaxPooling3dWithIndices(Images):
    """...which PyTorch routes to a deterministic decomposition on CUDA where the indices are asked for."""

    def layer(self, images):
        pooled, _ = F.max_pool3d(images[:, None], kernel_size=(1, 2, 2), return_indices=True)
        return pooled[:, 0]


class GridSampleNotAligned(Images):
    expected = bug("# sampled, corners not aligned", kind="deterministic", said="grid_sampler_2d_backward_cuda")

    def layer(self, images):
        grid = images.new_zeros(images.shape[0], 2, 2, 2)
        return F.grid_sample(images, grid, align_corners=False)  # sampled, corners not aligned


class GridSampleAlignedTakesCudnn(GridSampleNotAligned):
    """Bilinear, zero padding, aligned corners: CUDA takes cuDNN's sampler, which has no alert."""

    expected = PASSES

    def layer(self, images):
        grid = images.new_zeros(images.shape[0], 2, 2, 2)
        return F.grid_sample(images, grid, align_corners=True)


class HistogramOfFloats(Probe):
    expected = bug("# a histogram of the logits", kind="deterministic", said="_histc_cuda with floating point input")
    deterministic = True

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.log("train/spread", torch.histc(logits.detach(), bins=4).max())  # a histogram of the logits
        return F.cross_entropy(logits, labels)


class CountsWithWeights(HistogramOfFloats):
    expected = bug("# counts weighted by confidence", kind="deterministic", said="_bincount_cuda")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        confidence = logits.detach().softmax(1).amax(1)
        weighted = torch.bincount(labels, weights=confidence, minlength=3)  # counts weighted by confidence
        self.log("train/weighted", weighted.max())
        return F.cross_entropy(logits, labels)


class CountsWithoutWeights(HistogramOfFloats):
    expected = PASSES

    def training_step(self, batch, batch_idx):
        features, labels = batch
        self.log("train/most", torch.bincount(labels, minlength=3).max().float())
        return F.cross_entropy(self(features), labels)


class MedianWithIndices(HistogramOfFloats):
    expected = bug("# the median and where it is", kind="deterministic", said="median CUDA with indices output")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        middle, _ = logits.median(dim=1)  # the median and where it is
        return F.cross_entropy(logits, labels) + 0 * middle.sum()


class MedianOfAll(HistogramOfFloats):
    expected = PASSES

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        return F.cross_entropy(logits, labels) + 0 * logits.median()


class ProductScatter(HistogramOfFloats):
    expected = bug("# a product per class", kind="deterministic", said="scatter_reduce_cuda_prod_")

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        products = logits.new_ones(3).scatter_reduce(0, labels, logits[:, 0], reduce="prod")  # a product per class
        return F.cross_entropy(logits, labels) + 0 * products.sum()


class DeterministicByPyTorch(HistogramOfFloats):
    """What PyTorch makes deterministic on CUDA: embedding's backward, index_add, scatter_add_, cumsum, sums."""

    expected = PASSES

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(3, 3)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features) + self.embedding(labels)
        totals = logits.new_zeros(3, 3).index_add(0, labels, logits)
        counts = logits.new_zeros(3).scatter_add_(0, labels, torch.ones_like(labels, dtype=logits.dtype))
        sums = logits.new_zeros(3).scatter_reduce(0, labels, logits[:, 0], reduce="sum")
        extra = totals.sum() + counts.sum() + sums.sum() + logits.cumsum(0).sum()
        return F.cross_entropy(logits, labels) + 0 * extra


class TurnsDeterminismOnItself(Images):
    """The code's own call, as it stands at each operation: on for the steps after on_fit_start."""

    expected = bug("# max-pooled after on_fit_start", kind="deterministic", said="adaptive_max_pool2d_backward_cuda")
    deterministic = None

    def on_fit_start(self):
        torch.use_deterministic_algorithms(True)

    def layer(self, images):
        return F.adaptive_max_pool2d(images, 1)  # max-pooled after on_fit_start


class TurnsDeterminismOffAroundIt(TurnsDeterminismOnItself):
    """...and off again around the one operation that has no deterministic kernel, where its backward runs."""

    expected = PASSES

    def training_step(self, batch, batch_idx):
        torch.use_deterministic_algorithms(False)
        try:
            features, labels = batch
            loss = F.cross_entropy(self(features), labels)
            self.manual_backward(loss)
        finally:
            torch.use_deterministic_algorithms(True)

    automatic_optimization = False


# DDP's reducer, as PyTorch's DistributedDataParallel runs it on the simulated process group: a trainable parameter
# that no loss reaches stops the second step of a multi-GPU run (Lightning's "ddp" has find_unused_parameters=False).


class AuxiliaryHeadAtValidationOnly(Probe):
    """A head used only to validate: the training loss never reaches it."""

    expected = bug(None, kind="unused parameters", said="Parameters which did not receive grad: aux.bias, aux.weight")

    def __init__(self) -> None:
        super().__init__()
        self.aux = nn.Linear(8, 3)

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.log("val/loss", F.cross_entropy(self(features) + self.aux(features), labels))


class AuxiliaryHeadFrozen(AuxiliaryHeadAtValidationOnly):
    """...frozen: DDP leaves out what needs no gradient."""

    expected = PASSES

    def __init__(self) -> None:
        super().__init__()
        self.aux.requires_grad_(False)


class AuxiliaryHeadInTheLoss(AuxiliaryHeadAtValidationOnly):
    expected = PASSES

    def training_step(self, batch, batch_idx):
        features, labels = batch
        return F.cross_entropy(self(features) + 0.1 * self.aux(features), labels)


class AuxiliaryHeadWithUnusedParametersFound(AuxiliaryHeadAtValidationOnly):
    """...with the strategy that lets DDP find unused parameters each step."""

    expected = PASSES
    strategy = "ddp_find_unused_parameters_true"


class BranchTakenSomeSteps(Probe):
    """A layer used on odd steps only: the second step finds it unused."""

    expected = bug(None, kind="unused parameters", said="Parameters which did not receive grad: extra.bias")

    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(3, 3)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        if self.global_step % 2 == 1:
            logits = self.extra(logits)
        return F.cross_entropy(logits, labels)


# The two processes of a DDP run call the same collectives, line by line of the code, with tensors of the same shapes:
# where they part, NCCL waits for ever on GPUs.


class LogsOnRankZeroOnly(Probe):
    expected = bug("# synced on rank 0 alone", kind="collective mismatch", rank=1, said="rank 1: calls nothing there")

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.trainer.is_global_zero:
            self.log("train/loss", loss, sync_dist=True)  # synced on rank 0 alone
        return loss


class LogsOnEveryRank(Probe):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train/loss", loss, sync_dist=True)
        if self.trainer.is_global_zero:
            self.last_loss = float(loss)  # rank 0 alone may read values, write files, print
        return loss


class MetricComputedOnRankZeroOnly(Probe):
    expected = bug("# computed on rank 0 alone", kind="collective mismatch", rank=1)

    def __init__(self) -> None:
        super().__init__()
        self.accuracy = MulticlassAccuracy(3)

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self.accuracy.update(self(features), labels)

    def on_validation_epoch_end(self):
        if self.trainer.is_global_zero:
            self.log("val/acc", self.accuracy.compute())  # computed on rank 0 alone
        self.accuracy.reset()


class MetricComputedOnEveryRank(MetricComputedOnRankZeroOnly):
    expected = PASSES

    def on_validation_epoch_end(self):
        self.log("val/acc", self.accuracy.compute())
        self.accuracy.reset()


class GathersOnRankZeroOnly(Probe):
    expected = bug("# gathered on rank 0 alone", kind="collective mismatch", rank=1)

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        if self.global_rank == 0:
            self.all_gather(logits)  # gathered on rank 0 alone
        self.log("val/loss", F.cross_entropy(logits, labels))


class GathersWhatTheDataSizes(Probe):
    """A gather of the examples of one class: how many there are depends on the process's share of the data."""

    expected = bug("# sized by the data", kind="collective mismatch", rank=1, said="float32 (")
    batch = (torch.randn(8, 8), torch.tensor([0, 1, 1, 1, 2, 0, 1, 1]))  # five of class 1, one of class 2

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.all_gather(logits[labels == self.global_rank + 1])  # sized by the data
        self.log("val/loss", F.cross_entropy(logits, labels))


class GathersOfEqualShapes(Probe):
    def validation_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        self.all_gather(logits)
        self.log("val/loss", F.cross_entropy(logits, labels))


class BarrierOnRankZeroOnly(Probe):
    expected = bug("# a barrier rank 1 never reaches", kind="collective mismatch", rank=1)

    def on_train_epoch_end(self):
        if self.trainer.is_global_zero:
            torch.distributed.barrier()  # a barrier rank 1 never reaches


# What DistributedDataParallel checks as it wraps the model, before the first batch: on GPUs as in the audit.


class LazyHeadMaterialisedByTheFirstBatch(Probe):
    """Right on one GPU; under DDP the head is still uninitialised when DDP wraps the model."""

    expected = bug(None, kind="lazy modules", said="uninitialized: net.weight, net.bias")

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.LazyLinear(3)


class LazyHeadMaterialisedInSetup(LazyHeadMaterialisedByTheFirstBatch):
    expected = PASSES

    def setup(self, stage):
        self.net(torch.zeros(2, 8))  # on the CPU, before Lightning moves the model and DDP wraps it


class SparseAdjacencyBuffer(Probe):
    """DDP broadcasts rank 0's buffers as it wraps the model, and cannot broadcast a sparse one."""

    expected = bug(None, kind="DDP", said="No support for sparse tensors")

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("adjacency", torch.eye(3).to_sparse())

    def forward(self, features):
        return (self.adjacency @ self.net(features).t()).t()


class FrozenBackbone(Probe):
    """A frozen layer is no parameter of DDP's: it needs no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(8, 8).requires_grad_(False)

    def forward(self, features):
        return self.net(self.backbone(features))


class GradientCheckpointed(Probe):
    """Activations recomputed in the backward pass (non-reentrant), which DDP's reducer supports."""

    def forward(self, features):
        return torch.utils.checkpoint.checkpoint(self.net, features, use_reentrant=False)


class ManualOptimizationUnderDDP(Probe):
    """manual_backward under DDP, a value logged with sync_dist on every rank."""

    automatic_optimization = False

    def training_step(self, batch, batch_idx):
        features, labels = batch
        optimizer = self.optimizers()
        loss = F.cross_entropy(self(features), labels)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        self.log("train/loss", loss, sync_dist=True)


class ReentrantCheckpointOfABlockRunTwice(Probe):
    """A block run twice a step through reentrant activation checkpointing: DDP reduces its gradients twice."""

    expected = bug(None, kind="reentrant", said="mark a variable ready only once")
    reentrant = True

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, features):
        features = self.embed(features)  # what the checkpointed block takes requires grad
        for _ in range(2):
            features = torch.utils.checkpoint.checkpoint(self.block, features, use_reentrant=self.reentrant)
        return self.net(features)


class NonReentrantCheckpointOfABlockRunTwice(ReentrantCheckpointOfABlockRunTwice):
    expected = PASSES
    reentrant = False


class RecurrentCriticInEvalMode(Probe):
    """A frozen recurrent critic in eval mode that the loss flows through: cuDNN's eval forward has no backward."""

    expected = bug("# the critic runs in eval mode", kind="cudnn RNN")
    cudnn = True

    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.LSTM(3, 4, batch_first=True)
        self.critic.requires_grad_(False)

    def on_train_epoch_start(self):
        self.critic.eval()

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self(features)
        with torch.backends.cudnn.flags(enabled=self.cudnn):
            judged, _ = self.critic(logits.unsqueeze(1))  # the critic runs in eval mode
        return F.cross_entropy(logits, labels) + judged.mean()


class RecurrentCriticInEvalModeWithoutCudnn(RecurrentCriticInEvalMode):
    expected = PASSES
    cudnn = False


CASES = {
    name: case
    for name, case in dict(globals()).items()
    if isinstance(case, type) and issubclass(case, Probe) and case is not Probe
}


def main(names: list[str]) -> None:
    """Audit each case named (every case if none) in a forked child, and print its verdict as a JSON line."""
    from lightning_kit.gpu_audit import run_audit
    from lightning_kit.gpu_audit.isolation import can_fork

    for name in names or CASES:
        forked = can_fork()  # the audit then runs in a process of its own
        # The Trainer's settings of the case (its deterministic flag, which it sets for the process when made: off
        # again after the case; its strategy, whose DDP options the DDP pass takes).
        given = {key: getattr(CASES[name], key, None) for key in ("deterministic", "strategy")}
        given = {key: value for key, value in given.items() if value is not None}
        trainer = (
            L.Trainer(**given, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
            if given
            else None
        )
        try:
            batch = getattr(CASES[name], "batch", BATCH)
            verdict = run_audit(CASES[name](), batch, trainer=trainer, isolate=True, stop_at_bug=True)
        finally:
            torch.use_deterministic_algorithms(False)
        error = verdict.errors[0] if verdict.errors else None
        print(
            json.dumps(
                {
                    "case": name,
                    "forked": forked,
                    "status": verdict.exit_code,
                    "kind": error.kind if error else None,
                    "stage": error.stage if error else None,
                    "rank": error.rank if error else None,
                    "at": [Path(error.filename).name, error.lineno] if error else None,
                    "made": [Path(error.made_filename).name, error.made_lineno]
                    if error and error.made_lineno
                    else None,
                    "report": "\n".join(verdict.report()),
                    "notes": verdict.notes,
                    "expected": asdict(CASES[name].expected),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
