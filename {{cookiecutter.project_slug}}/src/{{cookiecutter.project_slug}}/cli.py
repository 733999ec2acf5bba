"""This project's command line: which classes ``train.py`` builds, their defaults, and what flows from the data.

Everything else (the Trainer shortcuts, checked checkpoints, one-line errors, the simulated
GPU) is lightning_kit's ``KitCLI``, which ``ProjectCLI`` subclasses.
"""

from lightning_kit.cli import KitCLI
from lightning_kit.cli import main as run_cli

from .classifier import LOSS_ON_PROGRESS_BAR_EVERY, Classifier
{%- if cookiecutter.task == "image" %}
from .data.images import ImageDataModule
from .models.cnn import ReferenceCNN
{%- else %}
from .data.sequences import SequenceDataModule
from .models.attention import AttentionClassifier
{%- endif %}


class ProjectCLI(KitCLI):
    """``train.py``: the Classifier around {% if cookiecutter.task == "image" %}the reference CNN, on ImageDataModule{% else %}the attention classifier, on SequenceDataModule{% endif %} unless told otherwise."""

    model_class = Classifier
{%- if cookiecutter.task == "image" %}
    default_classes = {"model.net": ReferenceCNN, "data": ImageDataModule}
{%- else %}
    default_classes = {"model.net": AttentionClassifier, "data": SequenceDataModule}
{%- endif %}
    # What the network and the Classifier take from the data: argument -> the data module's attribute.
    # Each link applies when the data module has the attribute and the network takes the argument:
    # a network without one is left as is.
    data_links = {
        "model.num_classes": "num_classes",
        "model.class_names": "class_names",
        "model.net.init_args.num_classes": "num_classes",
{%- if cookiecutter.task == "image" %}
        "model.net.init_args.image_size": "image_size",
{%- else %}
        "model.net.init_args.vocab_size": "vocab_size",
        "model.net.init_args.max_len": "seq_len",
{%- endif %}
    }
    # Modules whose classes a run's config.yaml or a checkpoint may name besides this package and the
    # libraries it is built on, e.g. ("our_team.datasets",). For one command, naming the class is enough.
    trusted_modules = ()
    monitor = ("val/acc", "max")
    refresh_every = LOSS_ON_PROGRESS_BAR_EVERY


def main(args: list[str] | None = None) -> None:
    """``train.py``: run the command line on ``args`` (default: ``sys.argv[1:]``); without a subcommand, ``fit``."""
    run_cli(ProjectCLI, args)
