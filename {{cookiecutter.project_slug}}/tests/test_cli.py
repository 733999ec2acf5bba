"""The project's command line (cli.py): the classes train.py builds, what flows from the data, what it accepts."""

import pytest
from conftest import refused
from lightning_kit.building import build

from {{ cookiecutter.project_slug }}.classifier import Classifier
from {{ cookiecutter.project_slug }}.cli import ProjectCLI, main
{%- if cookiecutter.task == "image" %}
from {{ cookiecutter.project_slug }}.data.images import ImageDataModule
from {{ cookiecutter.project_slug }}.models.cnn import ReferenceCNN
{%- else %}
from {{ cookiecutter.project_slug }}.data.sequences import SequenceDataModule
from {{ cookiecutter.project_slug }}.models.attention import AttentionClassifier
{%- endif %}


def test_train_py_builds_the_classifier_around_this_projects_network_and_data():
    """Without a --model.net or --data, ProjectCLI's default classes, each with its own defaults."""
    model, datamodule = build(ProjectCLI, [])
{%- if cookiecutter.task == "image" %}
    assert (type(model), type(model.net), type(datamodule)) == (Classifier, ReferenceCNN, ImageDataModule)
    assert datamodule.hparams.dataset == "cifar10" and model.hparams.lr == 1e-3
{%- else %}
    assert (type(model), type(model.net), type(datamodule)) == (Classifier, AttentionClassifier, SequenceDataModule)
    assert datamodule.hparams.dataset == "synthetic" and model.hparams.lr == 1e-3
{%- endif %}
    assert model.class_names == datamodule.class_names
{%- if cookiecutter.task == "image" %}


USER_DATA = """
from lightning_kit.data import InMemoryDataModule


class SmallImages(InMemoryDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__(batch_size=batch_size)
        self.save_hyperparameters()
        self.num_classes, self.image_size = 3, 16
        self.class_names = ["red", "green", "blue"]

    def setup(self, stage: str) -> None:
        pass  # no splits: nothing is trained here
"""


def test_the_class_count_names_and_image_size_flow_from_any_data_module_to_the_network(tmp_path, monkeypatch):
    """data_links: a data module of 3 classes of 16x16 images gets a network and a Classifier made for them."""
    (tmp_path / "user_data.py").write_text(USER_DATA)
    monkeypatch.syspath_prepend(str(tmp_path))
    model, datamodule = build(ProjectCLI, ["--data", "user_data.SmallImages"])
    assert (model.net.image_size, model.net.num_classes, model.hparams.num_classes) == (16, 3, 3)
    assert model.net.layers[-1].out_features == 3 and model.class_names == ["red", "green", "blue"]
    assert datamodule.batch_size == datamodule.hparams.batch_size == 8  # its own default, not ImageDataModule's 64
{%- else %}


def test_the_vocabulary_length_and_classes_flow_from_the_data_to_the_network():
    """data_links: the network's vocab_size, max_len and num_classes are the data's vocab_size, seq_len, num_classes."""
    args = ["--data.dataset", "file", "--data.vocab_size", "20", "--data.seq_len", "12", "--data.num_classes", "3"]
    model, _ = build(ProjectCLI, args)
    assert model.net.token_embedding.num_embeddings == 20 and model.net.max_len == 12
    assert model.net.head.out_features == model.hparams.num_classes == 3
    assert model.class_names == ["0", "1", "2"]
{%- endif %}


def test_a_value_for_the_network_that_disagrees_with_the_data_is_refused():
    message = refused(["--model.net.init_args.num_classes", "5"])
    assert message.startswith("error: --model.net.init_args.num_classes 5 disagrees with the data's num_classes")


@pytest.mark.parametrize(
    ("flag", "value", "accepted"),
    [
{%- if cookiecutter.task == "image" %}
        ("mean", "[2, 0.5, 0.5]", "must be v>=0 and v<=1, got 2"),
        ("std", "[0.2, 0, 0.2]", "must be v>0 and v<=1, got 0"),
{%- else %}
        ("num_heads", "3", "3: AttentionClassifier refused it: ValueError: num_heads 3 must divide d_model 64"),
        ("d_model", "0", "must be v>0, got 0"),
        ("dropout", "1", "must be v>=0 and v<1, got 1"),
        ("num_layers", "0", "must be v>0, got 0"),
{%- endif %}
    ],
)
def test_a_bad_value_for_the_network_is_one_line_naming_its_flag(capsys, flag, value, accepted):
    """The network's types bound each argument, checked as the command line is parsed; what relates two of them, the
    network checks as it is built (a ValueError naming them, which the command line turns into their flags)."""
    assert refused([f"--model.net.init_args.{flag}", value], capsys).startswith(
        f"error: --model.net.init_args.{flag} {accepted}"
    )


@pytest.mark.parametrize(("flag", "value"), [("lr", "0"), ("weight_decay", "-1")])
def test_a_bad_value_for_the_classifier_is_one_line_naming_its_flag(capsys, flag, value):
    assert refused([f"--model.{flag}", value], capsys).startswith(f"error: --model.{flag} must be ")


def test_fit_help_lists_this_projects_networks_and_data_modules(capsys):
    """--model.net and --data list this package's classes, not every nn.Module installed."""
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--help"])
    assert stop.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
{%- if cookiecutter.task == "image" %}
    assert "{{ cookiecutter.project_slug }}.models.cnn.ReferenceCNN" in shown
    assert "{{ cookiecutter.project_slug }}.data.images.ImageDataModule" in shown
{%- else %}
    assert "{{ cookiecutter.project_slug }}.models.attention.AttentionClassifier" in shown
    assert "{{ cookiecutter.project_slug }}.data.sequences.SequenceDataModule" in shown
{%- endif %}
    assert "torch.nn.modules" not in shown and "torchvision.models" not in shown
