"""What arguments accept, held where they enter, through the baked projects' classes.

The library's part: the Trainer's and the run's tables (``lightning_kit.arguments``), the bounded types it defines
(``BatchSize``, ``Fraction``, ``Workers``, ``Seed``, ...) in the signatures of the projects' classes and of its own
ImageFolderDataModule, which jsonargparse checks as the command line is parsed, the rules over several arguments that
the classes check themselves, and what the data sets (``KitCLI.data_links``). Which ranges a project's own classes
(its data modules, Classifier, networks) accept is the project's tests' business.
"""

import inspect
import typing

import lightning as L
import pytest
from conftest import IMAGE_PROJECT, SEQUENCE_PROJECT, refused
from image_project.cli import ProjectCLI as ImageCLI
from image_project.cli import main as image_main
from sequence_project.cli import ProjectCLI as SequenceCLI
from sequence_project.cli import main as sequence_main

from lightning_kit import building as kit_cli
from lightning_kit.arguments import TRAINER
from lightning_kit.data.folders import ImageFolderDataModule

NET = "--model.net.init_args."
# Trainer arguments that are numbers or choices which Lightning checks itself, in one line, before a run starts.
LEFT_TO_LIGHTNING = {"precision", "max_time", "deterministic", "accelerator", "strategy", "profiler"}
# Each project's train.py main, command line and offline configuration.
PROJECTS = {
    "image": (image_main, ImageCLI, str(IMAGE_PROJECT / "configs" / "synthetic.yaml")),
    "sequence": (sequence_main, SequenceCLI, str(SEQUENCE_PROJECT / "configs" / "synthetic.yaml")),
}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--trainer.log_every_n_steps", "0"], "--trainer.log_every_n_steps must be"),
        (["--trainer.check_val_every_n_epoch", "0"], "--trainer.check_val_every_n_epoch must be"),
        (["--trainer.accumulate_grad_batches", "0"], "--trainer.accumulate_grad_batches must be"),
        (["--trainer.accumulate_grad_batches", "-2"], "--trainer.accumulate_grad_batches must be"),
        (["--trainer.val_check_interval", "0"], "--trainer.val_check_interval must be"),
        (["--trainer.val_check_interval", "1.5"], "--trainer.val_check_interval must be"),
        (["--trainer.val_check_interval", "-3"], "--trainer.val_check_interval must be"),
        (["--trainer.limit_train_batches", "-1"], "--trainer.limit_train_batches must be"),
        (["--trainer.limit_val_batches", "1.5"], "--trainer.limit_val_batches must be"),
        (["--trainer.limit_test_batches", "-0.5"], "--trainer.limit_test_batches must be"),
        (["--trainer.limit_predict_batches", "-2"], "--trainer.limit_predict_batches must be"),
        (["--trainer.overfit_batches", "-1"], "--trainer.overfit_batches must be"),
        (["--trainer.max_epochs", "-5"], "--max_epochs must be"),
        (["--max_epochs", "0"], "--max_epochs must be"),
        (["--trainer.min_epochs", "-3"], "--trainer.min_epochs must be"),
        (["--trainer.min_epochs", "5", "--max_epochs", "2"], "--trainer.min_epochs must be at most --max_epochs"),
        (["--trainer.max_steps", "-7"], "--trainer.max_steps must be"),
        (["--trainer.max_steps", "0"], "--trainer.max_steps must be"),
        (["--trainer.min_steps", "-2"], "--trainer.min_steps must be"),
        (["--trainer.min_steps", "9", "--trainer.max_steps", "3"], "--trainer.min_steps must be at most"),
        (["--trainer.num_sanity_val_steps", "-4"], "--trainer.num_sanity_val_steps must be"),
        (["--trainer.gradient_clip_val", "-1"], "--trainer.gradient_clip_val must be"),
        (["--trainer.gradient_clip_val", "inf"], "--trainer.gradient_clip_val"),
        (["--trainer.gradient_clip_algorithm", "clip"], "--trainer.gradient_clip_algorithm must be"),
        (["--trainer.reload_dataloaders_every_n_epochs", "-1"], "--trainer.reload_dataloaders_every_n_epochs must"),
        (["--trainer.fast_dev_run", "-2"], "--trainer.fast_dev_run must be"),
        (["--trainer.num_nodes", "0"], "--num_nodes must be"),
        (["--devices", "-3"], "--devices must be"),
        (["--devices", "0"], "--devices must be"),
        (["--devices", "[0, 0]"], "--devices must be"),
        (["--devices", "[-1]"], "--devices must be"),
        (["--trainer.accumulate_grad_batches", str(10**20)], "--trainer.accumulate_grad_batches 1000"),
        (["--seed_everything", str(2**40)], "--seed_everything must be"),
        (["--seed_everything", "-1"], "--seed_everything must be"),
    ],
)
def test_trainer_and_seed_arguments_out_of_range_are_one_line_naming_the_flag(
    in_tmp_path, synthetic_config, capsys, flags, named
):
    """A Trainer argument or seed that Lightning would divide by, count with or refuse deep in a run stops at once."""
    message = refused(["--config", synthetic_config, "--accelerator", "cpu", *flags], capsys)
    assert message.startswith(f"error: {named}"), message


def test_every_numeric_trainer_argument_is_in_the_table():
    """Each Trainer argument that takes a number or a choice is checked here, or named as checked by Lightning."""
    numeric = set()
    for name, parameter in inspect.signature(L.Trainer).parameters.items():
        kinds = typing.get_args(parameter.annotation) or (parameter.annotation,)
        if any(kind in (int, float) or typing.get_origin(kind) is typing.Literal for kind in kinds):
            numeric.add(name)
    assert numeric - LEFT_TO_LIGHTNING - set(TRAINER) == set()


def unbounded(cls: type) -> set[str]:
    """The constructor arguments of ``cls`` that take a plain int or float (alone, in a union or in a tuple)."""
    hints = typing.get_type_hints(cls.__init__)

    def plain(kind) -> bool:
        return kind in (int, float) or any(plain(inner) for inner in typing.get_args(kind))

    return {name for name in inspect.signature(cls).parameters if plain(hints.get(name))}


def test_every_numeric_argument_of_a_shipped_class_has_its_bounds_in_its_type():
    """Each constructor argument that takes a number says in its type what it accepts, for the command line to check."""
    assert unbounded(ImageFolderDataModule) == set()


@pytest.mark.parametrize(
    ("task", "flags", "named"),
    [
        # The library's bounded types, in the signature of the image project's data module.
        ("image", ["--data.batch_size", "0"], "--data.batch_size must be"),
        ("image", ["--data.batch_size", str(10**12)], "--data.batch_size must be"),
        ("image", ["--data.val_fraction", "1.0"], "--data.val_fraction must be"),
        ("image", ["--data.val_fraction", "nan"], "--data.val_fraction"),
        ("image", ["--data.num_workers", "-1"], "--data.num_workers must be"),
        ("image", ["--data.num_workers", str(10**6)], "--data.num_workers must be"),
        ("image", ["--data.seed", "-1"], "--data.seed must be"),
        ("image", ["--data.seed", str(2**40)], "--data.seed must be"),
        # The networks' types, and what relates their arguments, which each checks as it is built.
        ("image", [f"{NET}std", "[0.2, 0.0, 0.2]"], f"{NET}std must be"),
        ("image", [f"{NET}std", "[0.2, -1, 0.2]"], f"{NET}std must be"),
        ("image", [f"{NET}mean", "[0.5, 0.5, 2.0]"], f"{NET}mean must be"),
        (
            "sequence",
            [f"{NET}num_heads", "3"],
            f"{NET}num_heads 3: AttentionClassifier refused it: ValueError: num_heads 3 must divide d_model 64",
        ),
        ("sequence", [f"{NET}num_heads", "0"], f"{NET}num_heads must be"),
        ("sequence", [f"{NET}num_heads", "-4"], f"{NET}num_heads must be"),
        ("sequence", [f"{NET}d_model", "0"], f"{NET}d_model must be"),
        (
            "sequence",
            [f"{NET}d_model", str(10**8)],
            f"{NET}d_model 100000000: AttentionClassifier refused it: ValueError: the network would need about",
        ),
        ("sequence", [f"{NET}num_layers", "-2"], f"{NET}num_layers must be"),
        ("sequence", [f"{NET}num_layers", "0"], f"{NET}num_layers must be"),
        (
            "sequence",
            [f"{NET}num_layers", str(10**9)],
            f"{NET}num_layers 1000000000: AttentionClassifier refused it: ValueError: the network would need about",
        ),
        ("sequence", [f"{NET}dropout", "1.5"], f"{NET}dropout must be"),
        ("sequence", [f"{NET}dropout", "1.0"], f"{NET}dropout must be"),
        ("sequence", [f"{NET}dropout", "-0.1"], f"{NET}dropout must be"),
    ],
)
def test_data_and_network_arguments_out_of_range_are_one_line_naming_the_flag(in_tmp_path, capsys, task, flags, named):
    """A data or network argument out of its range, or too large for memory, stops before anything is allocated."""
    main, _, config = PROJECTS[task]
    message = refused(["--config", config, "--accelerator", "cpu", *flags], capsys, run=main)
    assert message.startswith(f"error: {named}"), message


@pytest.mark.parametrize(
    ("task", "flags"),
    [
        ("image", [f"{NET}image_size", "64"]),
        ("image", ["--model.net.image_size", "16"]),
        ("image", [f"{NET}num_classes", "3"]),
        ("sequence", [f"{NET}max_len", "64"]),
        ("sequence", [f"{NET}vocab_size", "99"]),
        ("sequence", ["--model.net.num_classes", "5"]),
    ],
)
def test_a_network_argument_the_data_sets_given_otherwise_is_one_line(in_tmp_path, capsys, task, flags):
    """A value given for an argument the data sets, differing from the data's, stops the run instead of vanishing."""
    main, _, config = PROJECTS[task]
    flag = flags[0] if flags[0].startswith(NET) else flags[0].replace("--model.net.", NET)
    message = refused(["--config", config, "--accelerator", "cpu", *flags], capsys, run=main)
    assert message.startswith(f"error: {flag} {flags[1]} disagrees with the data's"), message


@pytest.mark.parametrize(
    ("task", "flags", "name", "value"),
    [
        ("image", [f"{NET}image_size", "32"], "image_size", 32),
        ("sequence", [f"{NET}max_len", "48", "--data.seq_len", "48"], "max_len", 48),
    ],
)
def test_a_network_argument_given_as_the_data_has_it_is_accepted(in_tmp_path, task, flags, name, value):
    """The same value as the data's is no contradiction: the run is built."""
    _, cli_class, config = PROJECTS[task]
    model, _ = kit_cli.build(cli_class, ["--config", config, *flags])
    assert getattr(model.net, name) == value


class DefaultData(L.LightningDataModule):
    num_classes, class_names, image_size = 2, ["a", "b"], 32

    def __init__(self, batch_size: int = 32, seed: int = 1) -> None:
        super().__init__()
        self.batch_size, self.seed = batch_size, seed


class ChosenData(DefaultData):
    def __init__(self, batch_size: int = 4, workers: int = 0) -> None:
        super().__init__(batch_size)


class DefaultClassCLI(ImageCLI):
    default_classes: typing.ClassVar = {**ImageCLI.default_classes, "data": DefaultData}


@pytest.mark.parametrize(
    ("flags", "batch_size"),
    [
        ([], 32),
        (["--data", f"{__name__}.ChosenData"], 4),  # its own default, not the default class's 32
        (["--data", f"{__name__}.ChosenData", "--data.batch_size", "5"], 5),
        (["--data.batch_size", "5", "--data", f"{__name__}.ChosenData"], 5),  # given, so kept as the class changes
    ],
)
def test_a_class_chosen_in_place_of_the_default_starts_from_its_own_defaults(in_tmp_path, flags, batch_size):
    """One parse: the default class is named by its path alone, so the class chosen takes its own defaults."""
    _, datamodule = kit_cli.build(DefaultClassCLI, ["--accelerator", "cpu", *flags])
    assert datamodule.batch_size == batch_size
