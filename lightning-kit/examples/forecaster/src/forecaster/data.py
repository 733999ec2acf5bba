"""Noisy seasonal series, made from a seed: windows of the past and the values that follow them, as dicts."""

import math

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class Windows(Dataset):
    """Each item: ``{"history": (length, 2), "target": (horizon,)}`` from one row of ``series``."""

    def __init__(self, series: torch.Tensor, phase: torch.Tensor, length: int, horizon: int) -> None:
        self.series, self.phase, self.length, self.horizon = series, phase, length, horizon

    def __len__(self) -> int:
        return len(self.series)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        history = torch.stack([self.series[index, : self.length], self.phase[index, : self.length]], dim=-1)
        return {"history": history, "target": self.series[index, self.length : self.length + self.horizon]}


class SineWaves(L.LightningDataModule):
    """``size`` series of a season of 12 steps at random phases and amplitudes, with noise; 70/15/15 split."""

    def __init__(
        self,
        size: int = 512,
        length: int = 24,
        horizon: int = 4,
        noise: float = 0.05,
        batch_size: int = 32,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        size, length, horizon = self.hparams.size, self.hparams.length, self.hparams.horizon
        generator = torch.Generator().manual_seed(self.hparams.seed)
        steps = torch.arange(length + horizon)
        start = torch.randint(0, 12, (size, 1), generator=generator)
        phase = torch.sin(2 * math.pi * (steps + start) / 12)
        amplitude = 0.5 + torch.rand(size, 1, generator=generator)
        series = amplitude * phase + self.hparams.noise * torch.randn(size, length + horizon, generator=generator)
        splits = torch.tensor([0.7, 0.15, 0.15]).mul(size).long()
        splits[0] += size - splits.sum()
        rows, phases = series.split(splits.tolist()), phase.split(splits.tolist())
        parts = [Windows(s, p, length, horizon) for s, p in zip(rows, phases, strict=True)]
        self.train_set, self.val_set, self.test_set = parts

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)
