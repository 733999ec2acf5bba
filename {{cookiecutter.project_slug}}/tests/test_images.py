import csv
import hashlib
import io
import pickle
import re
import tarfile
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from {{ cookiecutter.project_slug }}.classifier import Classifier
from {{ cookiecutter.project_slug }}.cli import build, main
from {{ cookiecutter.project_slug }}.data import DataUnavailableError, images
from {{ cookiecutter.project_slug }}.data.folders import channel_stats
from {{ cookiecutter.project_slug }}.data.images import ImageDataModule, make_synthetic_images, random_crop_flip
from {{ cookiecutter.project_slug }}.errors import ConfigError
from {{ cookiecutter.project_slug }}.models.cnn import ReferenceCNN
from {{ cookiecutter.project_slug }}.placement import SIMULATED, run_on_simulated_gpu


def test_reference_cnn_is_the_seed_network_layer_for_layer():
    """The layers are exactly the seed's: three conv/pool pairs, flatten, two linear layers."""
    expected = [
        (nn.Conv2d, dict(in_channels=3, out_channels=32, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))),
        (nn.MaxPool2d, dict(kernel_size=2)),
        (nn.Conv2d, dict(in_channels=32, out_channels=32, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))),
        (nn.MaxPool2d, dict(kernel_size=2)),
        (nn.Conv2d, dict(in_channels=32, out_channels=64, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))),
        (nn.MaxPool2d, dict(kernel_size=2)),
        (nn.Flatten, {}),
        (nn.Linear, dict(in_features=1024, out_features=64)),
        (nn.Linear, dict(in_features=64, out_features=10)),
    ]
    layers = list(ReferenceCNN().layers)
    assert [type(layer) for layer in layers] == [cls for cls, _ in expected]
    for layer, (_, attributes) in zip(layers, expected, strict=True):
        for name, value in attributes.items():
            assert getattr(layer, name) == value, (layer, name)


def test_reference_cnn_maps_uint8_images_to_logits():
    """A (B, 3, 32, 32) uint8 batch gives (B, 10) finite logits; float input on the 0-255 scale gives the same."""
    model = ReferenceCNN()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    logits = model(images)
    assert logits.shape == (4, 10)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(model(images.float()), logits)


def test_normalisation_statistics_are_buffers_saved_in_the_checkpoint():
    """Mean and std move with the module, and a checkpoint restores the ones it was trained with."""
    trained = ReferenceCNN(mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6))
    assert {"mean", "std"} <= dict(trained.named_buffers()).keys()
    restored = ReferenceCNN()
    restored.load_state_dict(trained.state_dict())
    torch.testing.assert_close(restored.mean, trained.mean)
    torch.testing.assert_close(restored.std, trained.std)


def test_synthetic_images_are_deterministic_uint8():
    """The same seed gives the same images; another seed gives others."""
    images, labels = make_synthetic_images(64, seed=0)
    again, again_labels = make_synthetic_images(64, seed=0)
    other, _ = make_synthetic_images(64, seed=1)
    assert images.dtype == torch.uint8 and images.shape == (64, 3, 32, 32)
    assert labels.dtype == torch.long and labels.min() >= 0 and labels.max() < 10
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    assert not torch.equal(images, other)


def test_splits_are_disjoint_and_seeded():
    """Validation holds val_fraction of the training images; the split is the same for the same seed."""
    first = ImageDataModule(dataset="synthetic", synthetic_size=500, val_fraction=0.2, seed=3)
    second = ImageDataModule(dataset="synthetic", synthetic_size=500, val_fraction=0.2, seed=3)
    for dm in (first, second):
        dm.setup("fit")
    train, val = first.splits["train"].tensors[0], first.splits["val"].tensors[0]
    assert (len(train), len(val), len(first.splits["test"])) == (400, 100, 100)
    assert torch.equal(val, second.splits["val"].tensors[0])
    flat_train = {bytes(image.flatten().tolist()) for image in train}
    assert not any(bytes(image.flatten().tolist()) in flat_train for image in val)


def test_loaders_yield_full_batches_in_order():
    """Validation batches come in order, batch_size at a time, as uint8 images and int64 labels."""
    dm = ImageDataModule(dataset="synthetic", synthetic_size=300, batch_size=16)
    dm.setup("fit")
    batches = list(dm.val_dataloader())
    images, labels = batches[0]
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.uint8 and labels.dtype == torch.long
    assert torch.equal(torch.cat([b[0] for b in batches]), dm.splits["val"].tensors[0])


def test_random_crop_flip_gives_shifted_or_mirrored_crops():
    """Each augmented image is a 32x32 window of the zero-padded input, mirrored or not; the windows vary."""
    torch.manual_seed(0)
    batch = torch.randint(1, 256, (16, 3, 32, 32), dtype=torch.uint8)
    out = random_crop_flip(batch, padding=4)
    assert out.shape == batch.shape and out.dtype == batch.dtype
    padded = torch.nn.functional.pad(batch, (4, 4, 4, 4))
    found = set()
    for i in range(len(batch)):
        matches = [
            (top, left, flip)
            for top in range(9)
            for left in range(9)
            for flip in (False, True)
            if torch.equal(
                out[i], (lambda w: w.flip(-1) if flip else w)(padded[i, :, top : top + 32, left : left + 32])
            )
        ]
        assert matches, f"image {i} is not a crop of its padded input"
        found.add(matches[0])
    assert len(found) > 4, "crops should differ between images"


def test_augmentation_runs_where_the_batch_is():
    """On a (simulated) GPU, the crops and flips stay on the GPU: every index they build takes the batch's device."""
    out = run_on_simulated_gpu(random_crop_flip, torch.zeros(8, 3, 32, 32, dtype=torch.uint8), padding=4)
    assert out.device.type == SIMULATED and out.shape == (8, 3, 32, 32)


def _tar_member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    """A tar member named `name`, as `tarfile.addfile` takes it."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    return info, io.BytesIO(data) if kind == tarfile.REGTYPE else None


def _write_tiny_cifar10_archive(folder: Path, per_batch: int = 4, extra: tuple = ()) -> Path:
    """A cifar-10-python.tar.gz laid out and pickled as the real one is, with `per_batch` images per file.

    `extra` members (from `_tar_member`) are appended after CIFAR-10's own.
    """
    rng = np.random.default_rng(0)
    members = [_tar_member(images.CIFAR10_FOLDER, kind=tarfile.DIRTYPE)]
    for name in (*images.CIFAR10_TRAIN_BATCHES, images.CIFAR10_TEST_BATCH):
        batch = {
            "batch_label": name,
            "labels": rng.integers(0, 10, per_batch).tolist(),
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "filenames": [f"{name}_{i}.png" for i in range(per_batch)],
        }
        members.append(_tar_member(f"{images.CIFAR10_FOLDER}/{name}", pickle.dumps(batch, protocol=2)))
    archive = folder / images.CIFAR10_ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for info, data in (*members, *extra):
            tar.addfile(info, data)
    return archive


def _accept_md5_of(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Take `archive`'s MD5 for CIFAR-10's, as the real archive's is taken."""
    monkeypatch.setattr(images, "CIFAR10_MD5", hashlib.md5(archive.read_bytes()).hexdigest())


def test_cifar10_loads_from_an_archive_in_its_own_format(tmp_path, monkeypatch):
    """A placed archive is extracted in prepare_data and read in setup: 5 train batches, 1 test batch."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    _accept_md5_of(_write_tiny_cifar10_archive(data_dir, per_batch=4), monkeypatch)
    dm = ImageDataModule(dataset="cifar10", data_dir=str(data_dir), val_fraction=0.25)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (15, 5, 4)
    raw = pickle.loads((data_dir / images.CIFAR10_FOLDER / "test_batch").read_bytes(), encoding="latin1")
    test_images, test_labels = dm.splits["test"].tensors
    assert torch.equal(test_images[1], torch.from_numpy(raw["data"][1]).view(3, 32, 32))
    assert test_labels.tolist() == raw["labels"]
    assert {path.name for path in data_dir.iterdir()} == {images.CIFAR10_ARCHIVE, images.CIFAR10_FOLDER}


def test_an_archive_with_another_md5_is_refused_before_extraction(tmp_path):
    """A file that is not CIFAR-10's archive gets one line with both digests and what to do; nothing is extracted."""
    archive = _write_tiny_cifar10_archive(tmp_path)
    found = hashlib.md5(archive.read_bytes()).hexdigest()
    expected = rf"its MD5 is {found}, not {images.CIFAR10_MD5}\. Download it again .*, or remove it"
    with pytest.raises(DataUnavailableError, match=expected) as caught:
        images.ensure_cifar10(tmp_path)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == [archive]


@pytest.mark.parametrize(
    "member",
    [
        _tar_member("../../escape", b"x"),
        _tar_member(f"{images.CIFAR10_FOLDER}/../../../escape", b"x"),
        _tar_member("/absolute/escape", b"x"),
        _tar_member(f"{images.CIFAR10_FOLDER}/link", kind=tarfile.SYMTYPE, link="../../escape"),
    ],
    ids=["parent", "parent-inside-folder", "absolute", "symlink"],
)
def test_an_archive_reaching_outside_its_folder_is_refused(tmp_path, monkeypatch, member):
    """A member that would land outside cifar-10-batches-py/ stops extraction; nothing is written or kept."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = _write_tiny_cifar10_archive(data_dir, extra=(member,))
    _accept_md5_of(archive, monkeypatch)
    with pytest.raises(DataUnavailableError, match=rf"holds '{member[0].name}', not a file or folder inside"):
        images.ensure_cifar10(data_dir)
    assert sorted(tmp_path.rglob("*")) == [data_dir, archive]


def test_a_truncated_archive_leaves_no_partial_folder(tmp_path, monkeypatch):
    """A damaged archive stops with one line and leaves data/ as it was; a good archive then works."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = _write_tiny_cifar10_archive(data_dir, per_batch=64)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    _accept_md5_of(archive, monkeypatch)  # as if the truncated file's digest were CIFAR-10's
    with pytest.raises(DataUnavailableError, match="could not be extracted") as caught:
        images.ensure_cifar10(data_dir)
    assert "\n" not in str(caught.value)
    assert list(data_dir.iterdir()) == [archive]
    _accept_md5_of(_write_tiny_cifar10_archive(data_dir), monkeypatch)
    images.ensure_cifar10(data_dir)
    assert len(list((data_dir / images.CIFAR10_FOLDER).iterdir())) == 6


def test_an_incomplete_folder_is_extracted_again_from_the_archive(tmp_path, monkeypatch):
    """A cifar-10-batches-py folder with batch files missing is replaced by the archive's complete one."""
    folder = tmp_path / images.CIFAR10_FOLDER
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"half written")
    _accept_md5_of(_write_tiny_cifar10_archive(tmp_path), monkeypatch)
    dm = ImageDataModule(dataset="cifar10", data_dir=str(tmp_path), val_fraction=0.25)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (15, 5, 4)
    assert {path.name for path in tmp_path.iterdir()} == {images.CIFAR10_ARCHIVE, images.CIFAR10_FOLDER}


def test_an_incomplete_folder_without_archive_names_the_missing_file(tmp_path):
    """With no archive to extract again, one line names the first missing batch file and the two ways out."""
    folder = tmp_path / images.CIFAR10_FOLDER
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"")
    with pytest.raises(DataUnavailableError, match=r"data_batch_2 is missing.*Remove it.*place cifar-10") as caught:
        images.ensure_cifar10(tmp_path)
    assert "\n" not in str(caught.value)


def test_a_download_lands_under_the_archive_name_only_when_complete(tmp_path, monkeypatch):
    """A download that fails half-way leaves nothing behind; a complete one is checked and extracted."""
    from torchvision.datasets import utils

    good = _write_tiny_cifar10_archive(tmp_path).read_bytes()
    data_dir = tmp_path / "data"

    def failing_download(url, root, filename, md5):
        Path(root, filename).write_bytes(good[:100])
        raise OSError("connection reset")

    def download(url, root, filename, md5):
        assert md5 == images.CIFAR10_MD5 and filename != images.CIFAR10_ARCHIVE
        Path(root, filename).write_bytes(good)

    monkeypatch.setattr(images, "CIFAR10_MD5", hashlib.md5(good).hexdigest())
    monkeypatch.setattr(utils, "download_url", failing_download)
    with pytest.raises(DataUnavailableError, match="connection reset"):
        images.ensure_cifar10(data_dir)
    assert list(data_dir.iterdir()) == []
    monkeypatch.setattr(utils, "download_url", download)
    images.ensure_cifar10(data_dir)
    assert {path.name for path in data_dir.iterdir()} == {images.CIFAR10_ARCHIVE, images.CIFAR10_FOLDER}


def test_missing_cifar10_without_network_says_what_to_do(tmp_path, monkeypatch):
    """With no archive and no route to the download server, one error names the archive and the synthetic option."""
    monkeypatch.setattr(images, "CIFAR10_URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    dm = ImageDataModule(dataset="cifar10", data_dir=str(tmp_path / "data"))
    with pytest.raises(DataUnavailableError, match=r"cifar-10-python\.tar\.gz.*--data\.dataset synthetic"):
        dm.prepare_data()


def test_cifar10_reader_refuses_pickled_code(tmp_path):
    """A batch file that would call a function when unpickled is rejected, and the function never runs."""
    folder = tmp_path / images.CIFAR10_FOLDER
    folder.mkdir()

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    (folder / "test_batch").write_bytes(pickle.dumps({"data": Exploit(), "labels": []}))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        images.read_cifar10_batches(folder, ("test_batch",))
    assert not (tmp_path / "pwned").exists()


def test_a_fifo_in_place_of_the_cifar10_archive_or_a_batch_is_refused_by_name(tmp_path, monkeypatch, make_fifo):
    """Neither the archive nor a batch file is opened unless it is a plain file: a FIFO would never end."""
    monkeypatch.setattr(images, "CIFAR10_URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")  # nothing downloaded
    archive = make_fifo(tmp_path / "data" / images.CIFAR10_ARCHIVE)
    with pytest.raises(DataUnavailableError, match="^" + re.escape(f"{archive} is a FIFO (named pipe), not the CIFAR")):
        ImageDataModule(dataset="cifar10", data_dir=str(tmp_path / "data")).prepare_data()
    batch = make_fifo(tmp_path / images.CIFAR10_FOLDER / "test_batch")
    with pytest.raises(DataUnavailableError, match="^" + re.escape(f"{batch} is a FIFO (named pipe), not a file: ")):
        images.read_cifar10_batches(batch.parent, ("test_batch",))


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        ({"dataset": "imagenet"}, "dataset"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"dataset": "synthetic", "synthetic_size": 0}, "synthetic_size"),
        ({"dataset": "synthetic", "synthetic_size": 5}, "synthetic_size"),
        ({"dataset": "synthetic", "synthetic_size": 100, "val_fraction": 0.001}, "synthetic_size"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(arguments, flag):
    """Each value out of range stops construction with one line that starts with its --data flag."""
    with pytest.raises(ConfigError, match=rf"^--data\.{flag} must be ") as caught:
        ImageDataModule(**arguments)
    assert "\n" not in str(caught.value)


def test_the_smallest_synthetic_size_named_is_the_smallest_that_works():
    """At val_fraction 0.1, 5 images are refused with "at least 6", and 6 give one validation and one test image."""
    with pytest.raises(ConfigError, match=r"at least 6 at --data\.val_fraction 0\.1,"):
        ImageDataModule(dataset="synthetic", synthetic_size=5)
    dm = ImageDataModule(dataset="synthetic", synthetic_size=6)
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (5, 1, 1)


def test_a_bad_size_on_the_command_line_is_one_line_naming_the_flag(in_tmp_path, synthetic_config):
    """`--data.synthetic_size 0` ends in "error: --data.synthetic_size ...", not a traceback blaming val_fraction."""
    with pytest.raises(SystemExit) as exit_info:
        build(["--config", synthetic_config, "--data.synthetic_size", "0"])
    assert str(exit_info.value.code).startswith("error: --data.synthetic_size must be an integer of at least 6")


@pytest.mark.slow
def test_reference_cnn_learns_the_synthetic_images():
    """One CPU epoch on the synthetic images reaches at least 90% validation accuracy."""
    L.seed_everything(0)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    datamodule = ImageDataModule(dataset="synthetic")
    trainer.fit(Classifier(ReferenceCNN(), num_classes=10), datamodule=datamodule)
    assert trainer.callback_metrics["val/acc"] >= 0.9


# Colours far apart, one per class: a few epochs learn them.
CLASS_COLOURS = {"cat": (220, 40, 40), "dog": (40, 200, 60), "owl": (50, 60, 230)}
FOLDER_DATA = "{{ cookiecutter.project_slug }}.data.images.ImageFolderDataModule"


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
