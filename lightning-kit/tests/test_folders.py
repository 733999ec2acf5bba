"""ImageFolderDataModule: your folders set the classes and the input size, the splits come from the layout, and a
model trained on them predicts on new files."""

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build, main

from lightning_kit.data.image_decoding import channel_stats
from lightning_kit.errors import ConfigError

# Colours far apart, one per class: a few epochs learn them.
CLASS_COLOURS = {"cat": (220, 40, 40), "dog": (40, 200, 60), "owl": (50, 60, 230)}
FOLDER_DATA = "lightning_kit.data.folders.ImageFolderDataModule"


def write_images(folder: Path, per_class: int, seed: int = 0, size: tuple[int, int] = (24, 18)) -> Path:
    """``folder/<class>/<n>.png|jpg``: each class's colour plus noise, PNG and JPEG alternating."""
    from PIL import Image

    generator = np.random.default_rng(seed)
    for name, colour in CLASS_COLOURS.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            pixels = np.clip(np.array(colour) + generator.normal(0, 25, (size[1], size[0], 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(folder / name / f"{n}.{'png' if n % 2 else 'jpg'}")
    return folder


def folder_args(root: Path, *more: str) -> list[str]:
    return [
        *("--data", FOLDER_DATA, "--data.root", str(root), "--data.image_size", "16", "--data.batch_size", "8"),
        *("--accelerator", "cpu", "--trainer.enable_progress_bar", "false", "--max_epochs", "2"),
        *more,
    ]


def test_an_image_folder_sets_the_classes_and_the_input_size_of_the_model(in_tmp_path):
    root = write_images(in_tmp_path / "pictures", per_class=5)
    model, datamodule = build(folder_args(root))
    assert model.class_names == datamodule.class_names == ["cat", "dog", "owl"]
    assert model.hparams.num_classes == model.net.num_classes == 3
    assert model.net.image_size == 16
    datamodule.setup("fit")
    images, labels = next(iter(datamodule.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16)
    assert model(images).shape == (len(labels), 3)
    # 15 images: 2 (val_fraction 0.1, rounded) held out for validation, chosen with the seed.
    assert len(datamodule.splits["train"]) + len(datamodule.splits["val"]) == 15
    assert len(datamodule.splits["val"]) == 2


def test_train_val_and_test_folders_are_the_splits(in_tmp_path):
    root = in_tmp_path / "pictures"
    for split, count in (("train", 4), ("val", 2), ("test", 1)):
        write_images(root / split, per_class=count, seed=len(split))
    _, datamodule = build(folder_args(root))
    for stage in ("fit", "test"):
        datamodule.setup(stage)
    assert {split: len(dataset) for split, dataset in datamodule.splits.items()} == {"train": 12, "val": 6, "test": 3}


def test_test_without_a_test_folder_says_where_to_put_one(in_tmp_path):
    root = write_images(in_tmp_path / "pictures", per_class=3)
    _, datamodule = build(folder_args(root))
    with pytest.raises(ConfigError, match=f"{root} has no test split: put its images in {root}/test/<class>/"):
        datamodule.setup("test")


def test_one_class_folder_is_refused(in_tmp_path):
    root = in_tmp_path / "pictures"
    write_images(root, per_class=2)
    for name in ("dog", "owl"):
        for path in (root / name).iterdir():
            path.unlink()
        (root / name).rmdir()
    with pytest.raises(SystemExit, match="a classifier needs at least 2"):
        main(folder_args(root))


def test_an_unreadable_image_stops_fit_with_its_name_before_training(in_tmp_path):
    root = write_images(in_tmp_path / "pictures", per_class=3)
    (root / "dog" / "broken.jpg").write_bytes(b"not a JPEG")
    with pytest.raises(SystemExit) as exit_info:
        main(folder_args(root))
    message = str(exit_info.value.code)
    assert message.startswith("error:") and str(root / "dog" / "broken.jpg") in message
    assert "--data.skip_unreadable true" in message and "\n" not in message
    assert not (in_tmp_path / "runs").exists() or not any((in_tmp_path / "runs").rglob("*.ckpt"))


@pytest.mark.slow
def test_fit_on_a_folder_keeps_its_statistics_then_predicts_on_new_files(in_tmp_path, capsys):
    """Trained on a folder, the checkpoint holds the training split's statistics; predict writes a row per file."""
    root = write_images(in_tmp_path / "pictures", per_class=8)
    main(folder_args(root, "--data.skip_unreadable", "true"))
    checkpoint = in_tmp_path / "runs/lightning_logs/version_0/checkpoints/last.ckpt"
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    _, datamodule = build(folder_args(root))
    datamodule.setup("fit")
    mean, std = channel_stats(datamodule.splits["train"].tensors[0])
    assert torch.allclose(state["net.mean"].flatten(), torch.tensor(mean) * 255)
    assert torch.allclose(state["net.std"].flatten(), torch.tensor(std) * 255)
    # New files: a flat folder (no labels), then a labelled one (its subfolders are class names).
    new = write_images(in_tmp_path / "new", per_class=4, seed=7)
    flat = in_tmp_path / "flat"
    flat.mkdir()
    for path in sorted(new.rglob("*.png")):
        path.rename(flat / f"{path.parent.name}-{path.name}")
    main(["predict", "--ckpt_path", "last", "--data.predict_path", str(flat), "--predictions.path", "flat.csv"])
    assert "predictions for 6 inputs written to flat.csv" in capsys.readouterr().out
    with open("flat.csv") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["file", "predicted", "p_cat", "p_dog", "p_owl"]
    assert [Path(row["file"]).name for row in rows] == [f"{c}-{n}.png" for c in CLASS_COLOURS for n in (1, 3)]
    main(["predict", "--ckpt_path", "last", "--data.predict_path", str(new), "--predictions.path", "labelled.csv"])
    with open("labelled.csv") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 6 and all(row["label"] == Path(row["file"]).parent.name for row in rows)
    assert sum(row["predicted"] == row["label"] for row in rows) >= 4  # colours this far apart are learnt
    assert abs(sum(float(rows[0][f"p_{name}"]) for name in CLASS_COLOURS) - 1) < 1e-4
    # A class folder renamed since training would name every prediction wrongly: refused.
    (root / "owl").rename(root / "bird")
    with pytest.raises(SystemExit, match=r"trained on the classes cat, dog, owl, but the data now has bird, cat, dog"):
        main(["validate", "--ckpt_path", "last"])
