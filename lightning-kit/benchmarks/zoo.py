"""Public architectures for the audit's benchmark, built from configurations with no weights (nothing is downloaded).

Each entry is a network of torchvision or transformers (installed for the benchmark), or of plain PyTorch with a custom
``autograd.Function`` or a TorchScript function inside, at a small width (so that a benchmark of all of them takes
minutes on a laptop's CPU) and its own depth and structure: the operations the audit sees per step are the
architecture's. ``ZooModule`` wraps any of them in a plain LightningModule, and ``ZooData`` gives it random
batches of the shape it takes. A smaller width makes each operation cheaper and the audit's cost per operation
weigh more: the ratios measured on these are an upper bound of those on the full-width models.
"""

import functools
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_kit.errors import UserError

BATCH_SIZE = 4
IMAGE = (3, 32, 32)
VOCABULARY, SEQUENCE, GENERATED = 256, 32, 8
CLASSES = 10


@dataclass(frozen=True)
class Entry:
    """One architecture: what kind it is, how to build it, what it takes and the package it needs."""

    kind: str  # what the benchmark's table says of it
    build: Callable[[], nn.Module]
    task: str  # images, tokens (classified), language (next token), seq2seq
    package: str | None = None  # the package it is built with, beside PyTorch


def _torchvision(name: str, **config) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision.models

        return getattr(torchvision.models, name)(weights=None, **config)

    return build


def _resnet() -> nn.Module:
    return _torchvision("resnet18", num_classes=CLASSES)()


def _mobilenet() -> nn.Module:
    return _torchvision("mobilenet_v3_small", num_classes=CLASSES)()


def _vit() -> nn.Module:
    from torchvision.models import VisionTransformer

    return VisionTransformer(
        image_size=32, patch_size=4, num_layers=6, num_heads=4, hidden_dim=192, mlp_dim=768, num_classes=CLASSES
    )  # ViT-Tiny's width and heads, 6 of its 12 blocks, on 32x32 images


def _swin() -> nn.Module:
    from torchvision.models import SwinTransformer

    return SwinTransformer(
        patch_size=[2, 2], embed_dim=48, depths=[2, 2, 2], num_heads=[3, 6, 12], window_size=[4, 4], num_classes=CLASSES
    )  # shifted windows and patch merging, three stages


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCABULARY, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
        max_position_embeddings=64, num_labels=CLASSES,
    )  # fmt: skip
    return BertForSequenceClassification(config)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCABULARY, n_positions=64, n_embd=128, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0,
        pad_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCABULARY, hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip  # rotary positions, grouped-query attention, RMSNorm
    return LlamaForCausalLM(config)


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCABULARY, d_model=128, d_kv=32, d_ff=512, num_layers=4, num_decoder_layers=4, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return T5ForConditionalGeneration(config)


class _ClampedGrad(torch.autograd.Function):
    """The identity forward; backward passes the gradient clamped to [-1, 1] (a straight-through estimator)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.clamp(-1.0, 1.0)


class FunctionNet(nn.Module):
    """A small CNN with a custom autograd.Function after each block."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2))
            for c_in, c_out in ((3, 32), (32, 64), (64, 128))
        )
        self.head = nn.Linear(128 * 4 * 4, CLASSES)

    def forward(self, x):
        for block in self.blocks:
            x = _ClampedGrad.apply(block(x))
        return self.head(x.flatten(1))


def _bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = x + bias
    return y * 0.5 * (1.0 + torch.erf(y * 0.7071067811865476))


@functools.cache
def _scripted_bias_gelu():
    """``_bias_gelu`` compiled by TorchScript (once, when a ScriptNet is first made: not when the zoo is imported)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated: models still use it
        return torch.jit.script(_bias_gelu)


class ScriptNet(nn.Module):
    """A token MLP-mixer whose feed-forward layers call a TorchScript function (bias and GELU together)."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, width)
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)
        self.bias_gelu = _scripted_bias_gelu()

    def forward(self, tokens):
        x = self.embedding(tokens)
        for layer, bias, norm in zip(self.layers, self.biases, self.norms, strict=True):
            x = x + self.bias_gelu(layer(norm(x)), bias)
        return self.head(x.mean(1))


ZOO: dict[str, Entry] = {
    "resnet18": Entry("convolutional (torchvision)", _resnet, "images", "torchvision"),
    "mobilenet_v3": Entry("convolutional, depthwise (torchvision)", _mobilenet, "images", "torchvision"),
    "vit": Entry("vision transformer (torchvision)", _vit, "images", "torchvision"),
    "swin": Entry("hierarchical attention (torchvision)", _swin, "images", "torchvision"),
    "bert": Entry("encoder (transformers)", _bert, "tokens", "transformers"),
    "gpt2": Entry("decoder, generate in predict (transformers)", _gpt2, "language", "transformers"),
    "llama": Entry("decoder, GQA, generate in predict (transformers)", _llama, "language", "transformers"),
    "t5": Entry("seq2seq, generate in predict (transformers)", _t5, "seq2seq", "transformers"),
    "function": Entry("CNN with a custom autograd.Function", FunctionNet, "images"),
    "script": Entry("MLP with a TorchScript function", ScriptNet, "tokens"),
}


def missing_package(name: str) -> str | None:
    """The package ``ZOO[name]`` needs that is not installed, or None."""
    package = ZOO[name].package
    return package if package is not None and importlib.util.find_spec(package) is None else None


def build(name: str) -> tuple["ZooModule", "ZooData"]:
    """The LightningModule and data module of ``ZOO[name]``, seeded: the same weights in every process."""
    if name not in ZOO:
        raise UserError(f"no model {name!r} in the zoo; it has {', '.join(ZOO)}")
    package = missing_package(name)
    if package is not None:
        raise UserError(f"{name} needs {package}, which is not installed: pip install {package}")
    torch.manual_seed(0)
    entry = ZOO[name]
    return ZooModule(entry.build(), entry.task), ZooData(entry.task)


class ZooModule(L.LightningModule):
    """Any network of the zoo as a plain LightningModule: its loss for its task, AdamW, and a prediction."""

    def __init__(self, net: nn.Module, task: str) -> None:
        super().__init__()
        self.net, self.task = net, task

    def _loss(self, batch):
        inputs, targets = batch
        if self.task == "images":
            return F.cross_entropy(self.net(inputs), targets)
        if self.task == "tokens":
            logits = self.net(inputs)
            return F.cross_entropy(getattr(logits, "logits", logits), targets)
        # transformers' models compute their own loss from labels: the next tokens, or the target sequence
        return self.net(input_ids=inputs, labels=targets).loss

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self._loss(batch))

    def test_step(self, batch, batch_idx):
        self.log("test/loss", self._loss(batch))

    def predict_step(self, batch, batch_idx):
        inputs = batch[0]
        if self.task in ("language", "seq2seq"):
            return self.net.generate(inputs, max_new_tokens=GENERATED, do_sample=False)
        logits = self.net(inputs)
        return getattr(logits, "logits", logits).argmax(-1)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class ZooData(L.LightningDataModule):
    """Random batches for a task: every split has the same two batches of ``BATCH_SIZE``."""

    def __init__(self, task: str) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        count = 2 * BATCH_SIZE
        if task == "images":
            inputs = torch.randn(count, *IMAGE, generator=generator)
            targets = torch.randint(0, CLASSES, (count,), generator=generator)
        else:
            inputs = torch.randint(2, VOCABULARY, (count, SEQUENCE), generator=generator)
            if task == "tokens":
                targets = torch.randint(0, CLASSES, (count,), generator=generator)
            elif task == "language":
                targets = inputs.clone()
            else:
                targets = torch.randint(2, VOCABULARY, (count, SEQUENCE // 2), generator=generator)
        self.dataset = TensorDataset(inputs, targets)

    def _loader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=BATCH_SIZE)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()

    def predict_dataloader(self) -> DataLoader:
        return self._loader()
