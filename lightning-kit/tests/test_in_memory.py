"""The in-memory base of the data modules: what its loaders refuse before a batch reaches the loss."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_kit import audit
from lightning_kit.data import DataUnavailableError
from lightning_kit.data.memory import InMemoryDataModule, InMemoryDataset


class Labelled(InMemoryDataModule):
    def __init__(self, labels: list[int]) -> None:
        super().__init__(batch_size=2)
        self.labels, self.num_classes = torch.tensor(labels), 3

    def setup(self, stage: str) -> None:
        self.splits["train"] = InMemoryDataset(torch.zeros(len(self.labels), 4), self.labels)


@pytest.mark.parametrize(("labels", "found"), [([0, 4, 1, 3], "3, 4"), ([0, -1, 2], "-1")])
def test_a_class_label_outside_the_classes_is_one_line_naming_it(labels, found):
    """On a GPU the loss stops with a device-side assert, on the CPU with an IndexError: named before either."""
    data = Labelled(labels)
    data.setup("fit")
    with pytest.raises(DataUnavailableError) as caught:
        data.train_dataloader()
    assert str(caught.value) == (
        f"Labelled's train split has labels {found}: class labels must be 0 to 2, one for each of its 3 classes "
        "(num_classes, class_names)"
    )


def test_labels_of_the_classes_and_the_losss_ignore_index_are_served():
    data = Labelled([0, 2, -100, 1])
    data.setup("fit")
    assert sorted(label for batch in data.train_dataloader() for label in batch[1].tolist()) == [-100, 0, 1, 2]


class Classifies(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 3)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_audit_stops_at_data_it_refuses_rather_than_calling_it_not_audited():
    """Labels no device can train on are the data's mistake: the refusal itself, not a stage left unaudited."""
    with pytest.raises(DataUnavailableError, match="train split has labels 4"):
        audit(Classifies(), Labelled([0, 4]))
