"""Cross-validation folds: the training and validation data in K stratified, disjoint folds chosen by the seed,
fold i validating, and the arguments checked where they enter."""

import csv
import pickle

import numpy as np
import pytest
import torch
from conftest import RUNS, SEQUENCE_PROJECT, checkpoint, epoch_metrics, refused, solid
from image_project.cli import main
from image_project.data.cifar10 import CIFAR10_BATCHES, CIFAR10_FOLDER
from image_project.data.images import ImageDataModule
from sequence_project.cli import main as sequence_main
from sequence_project.data.sequences import SequenceDataModule

from lightning_kit.data.folders import ImageFolderDataModule
from lightning_kit.data.folds import fold_split
from lightning_kit.errors import ConfigError

# Four classes of 13, 7, 4 and 9 samples, shuffled: the smallest has as many samples as there are folds.
LABELS = np.random.default_rng(0).permutation(np.repeat([0, 1, 2, 3], [13, 7, 4, 9]))
FOLDS = 4


def test_folds_are_disjoint_covering_and_stratified():
    """Each fold's validation set is the complement of its training set; the K validation sets cover every sample
    once; each class's count, and each fold's size, differs by at most one between folds."""
    validation = []
    for fold in range(FOLDS):
        train, val = fold_split(LABELS, FOLDS, fold, seed=5)
        assert sorted([*train, *val]) == list(range(len(LABELS)))
        validation.append(val)
    assert sorted(np.concatenate(validation)) == list(range(len(LABELS)))
    counts = np.array([np.bincount(LABELS[val], minlength=4) for val in validation])  # (fold, class)
    assert (counts.max(axis=0) - counts.min(axis=0)).max() <= 1, counts
    sizes = counts.sum(axis=1)
    assert sizes.max() - sizes.min() <= 1, sizes


def test_the_seed_chooses_the_folds():
    """The same seed gives the same folds, on any machine (NumPy's fixed RandomState stream); another seed, others."""
    assert np.array_equal(fold_split(LABELS, FOLDS, 1, seed=5)[1], fold_split(LABELS, FOLDS, 1, seed=5)[1])
    assert not np.array_equal(fold_split(LABELS, FOLDS, 1, seed=5)[1], fold_split(LABELS, FOLDS, 1, seed=6)[1])
    # Pinned: a change of the stream would move every saved fold run's validation set.
    assert fold_split(np.array([0, 1] * 5), 2, 0, seed=0)[1].tolist() == [0, 1, 6, 8, 9]


def test_more_folds_than_a_class_has_samples_is_refused_naming_the_class():
    """Each fold needs a sample of each class: five folds of a class of four are refused in one line naming it."""
    with pytest.raises(ConfigError, match=r"^--data\.folds 5 is more than the 4 .* of class 'c'.*at most 4") as caught:
        fold_split(LABELS, 5, 0, seed=5, class_names=["a", "b", "c", "d"])
    assert "\n" not in str(caught.value)


# The data modules of both projects, which take their folds from the library (``check_folds``, ``fold_split``).
DATA = {
    "image": lambda **folds: ImageDataModule(dataset="synthetic", synthetic_size=200, seed=3, **folds),
    "sequence": lambda **folds: SequenceDataModule(num_sequences=300, seed=3, **folds),
}


def _rows(split) -> list[bytes]:
    """The inputs of a split, one ``bytes`` per sample, sorted: a multiset to compare splits by."""
    return sorted(row.numpy().tobytes() for row in split.tensors[0])


@pytest.mark.parametrize("task", DATA)
def test_the_data_module_validates_on_fold_i_and_trains_on_the_others(task):
    """With --data.folds 3, fold i's run validates on fold i and trains on the rest of the data the run without folds
    trains and validates on; the three validation sets cover it once, stratified; the test split is unchanged."""
    plain, folded = DATA[task](), [DATA[task](folds=3, fold=fold) for fold in range(3)]
    for data in (plain, *folded):
        data.setup("fit")
    pool = sorted(_rows(plain.splits["train"]) + _rows(plain.splits["val"]))
    assert sorted(row for data in folded for row in _rows(data.splits["val"])) == pool
    for data in folded:
        assert sorted(_rows(data.splits["train"]) + _rows(data.splits["val"])) == pool
        assert torch.equal(data.splits["test"].tensors[0], plain.splits["test"].tensors[0])
    counts = torch.stack([torch.bincount(data.splits["val"].tensors[1], minlength=data.num_classes) for data in folded])
    assert (counts.max(dim=0).values - counts.min(dim=0).values).max() <= 1, counts


def test_image_folders_divide_the_train_and_val_folders_into_the_folds(tmp_path):
    """With a val/ folder, the folds divide train/'s and val/'s images together, for fit and validate alike;
    test/ stays the test split."""
    root = tmp_path / "images"
    for number in range(10):  # each a colour of its own; 4 of each class in train/ and val/ together
        split = "test" if number >= 8 else "val" if number >= 6 else "train"
        solid(root / split / ("cat" if number % 2 else "dog") / f"{number}.png", colour=(20 * number, 0, 0))
    folders = {"root": str(root), "image_size": 8, "cache_dir": None}
    plain = ImageFolderDataModule(**folders)
    plain.setup("fit")
    pool = sorted(_rows(plain.splits["train"]) + _rows(plain.splits["val"]))
    validation = []
    for fold in range(2):
        fitted, validated = (ImageFolderDataModule(**folders, folds=2, fold=fold) for _ in range(2))
        fitted.setup("fit")
        validated.setup("validate")
        assert _rows(validated.splits["val"]) == _rows(fitted.splits["val"])
        assert sorted(_rows(fitted.splits["train"]) + _rows(fitted.splits["val"])) == pool
        assert sorted(fitted.splits["val"].tensors[1].tolist()) == [0, 0, 1, 1]
        validation += _rows(fitted.splits["val"])
        fitted.setup("test")
        assert len(fitted.splits["test"]) == 2
    assert sorted(validation) == pool


def test_cifar10_with_more_folds_than_a_class_has_images_is_refused_naming_it(tmp_path):
    """CIFAR-10's classes are counted once read: two folds of a single training airplane are refused in one line."""
    (tmp_path / CIFAR10_FOLDER).mkdir()
    for name in CIFAR10_BATCHES:  # two images each; only the first batch holds an airplane (label 0)
        batch = {"data": np.zeros((2, 3072), dtype=np.uint8), "labels": [0, 1] if name == "data_batch_1" else [1, 2]}
        (tmp_path / CIFAR10_FOLDER / name).write_bytes(pickle.dumps(batch, protocol=2))
    data = ImageDataModule(dataset="cifar10", data_dir=str(tmp_path), folds=2)
    with pytest.raises(ConfigError, match=r"^--data\.folds 2 is more than the 1 .* of class 'airplane'") as caught:
        data.setup("fit")
    assert "\n" not in str(caught.value)


FOLD_MISTAKES = [
    (["--data.folds", "1"], "--data.folds must be v>=2 or null, got 1"),
    (["--data.fold", "2"], "--data.fold picks the validation fold: give --data.folds too"),
    (["--data.folds", "3", "--data.fold", "3"], "--data.fold must be from 0 to 2, one of the --data.folds 3 folds"),
    (["--data.folds", "3", "--data.fold", "-1"], "--data.fold must be v>=0, got -1"),
    (["--data.folds", "3", "--data.val_fraction", "0.2"], "--data.val_fraction does not apply with --data.folds"),
]


@pytest.mark.parametrize(
    ("task", "flags", "message"),
    [
        *(("image", *mistake) for mistake in FOLD_MISTAKES),
        ("image", ["--data.folds", "9", "--data.synthetic_size", "60"], "--data.folds must be at most 3, the training"),
        *(("sequence", *mistake) for mistake in FOLD_MISTAKES),
    ],
)
def test_bad_fold_arguments_are_refused_in_one_line(
    in_tmp_path, fast_args, synthetic_config, capsys, task, flags, message
):
    """Each fold argument out of range, or not applying, stops train.py before anything is built, naming its flag."""
    if task == "sequence":  # the same flags on the sequence project's offline data
        config = str(SEQUENCE_PROJECT / "configs" / "synthetic.yaml")
        fast_args = [config if arg == synthetic_config else arg for arg in fast_args]
    assert message in refused([*fast_args, *flags], capsys, run=main if task == "image" else sequence_main)


def _validated(run: int) -> float:
    """The validation loss of a run's newest `validate` evaluation."""
    folders = sorted((RUNS / f"version_{run}" / "validate").iterdir(), key=lambda folder: int(folder.name[8:]))
    with (folders[-1] / "metrics.csv").open() as file:
        return float(next(csv.DictReader(file))["val/loss"])


@pytest.mark.slow
def test_validating_a_fold_run_from_its_checkpoint_uses_its_fold(in_tmp_path, fast_args):
    """`validate --ckpt_path` of fold 1's run scores fold 1, as its training did: the run's saved config.yaml holds
    the fold; the same checkpoint on fold 0 scores otherwise."""
    main([*fast_args, "--data.folds", "3", "--data.fold", "1", "--max_epochs", "1"])
    trained = float(epoch_metrics(0)[0]["val/loss"])
    evaluate = ["validate", "--ckpt_path", str(checkpoint(0)), "--trainer.limit_val_batches", "2"]
    main(evaluate)
    assert _validated(0) == pytest.approx(trained, abs=1e-5)
    main([*evaluate, "--data.fold", "0"])
    assert _validated(0) != pytest.approx(trained, abs=1e-5)
