"""Writing checkpoints safely, and finding and checking them before a run trusts them."""

import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .errors import UserError, byte_size, first_few
from .files import written_whole
from .trust import check_trusted

# What `--ckpt_path last` may resume from: the end of an epoch, or an interrupted step.
RESUMABLE = ("last.ckpt", "on_exception.ckpt")
# The entry of a checkpoint that names the classes of the run that saved it (``RunClasses``).
RUN_CLASSES = "lightning_kit_classes"
# A run folder Lightning numbered (version_3): the run's own record of its order, whatever the clock said.
_VERSION = re.compile(r"version_(\d+)")


class CheckpointError(UserError):
    """A checkpoint is missing, unreadable, or not one of this model."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Each checkpoint written beside its name and renamed (``written_whole``): a run killed while saving leaves the
    previous one whole. (Lightning's goes through ``$TMPDIR``, copied, not renamed, from another file system.)"""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        with written_whole(Path(path)) as temporary, temporary.open("xb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class RunClasses(L.Callback):
    """Name in every checkpoint the classes of the model and the data module that saved it (``check_architecture``)."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        data = trainer.datamodule
        checkpoint[RUN_CLASSES] = {
            "model": class_path(type(pl_module)),
            "data": class_path(type(data)) if data else None,
        }


def latest_checkpoint(runs_root: str | Path, report=print) -> Path:
    """The newest run's ``last.ckpt`` or ``on_exception.ckpt`` under ``runs_root`` that holds a training step; those
    passed over are told to ``report``."""
    candidates = {}
    for path in (path for name in RESUMABLE for path in Path(runs_root).glob(f"*/checkpoints/{name}")):
        try:
            candidates[path] = path.stat().st_mtime_ns
        except OSError:
            report(f"passing over {path}: it cannot be read (a broken link?)")
    if not candidates:
        raise CheckpointError(f"--ckpt_path last: no run under {runs_root}/ has a last.ckpt or on_exception.ckpt")

    # The newest run by the time of its newest checkpoint, but a run Lightning numbered later (version_3 after
    # version_2) is newer whatever the clock said: a clock set back (a laptop's, a cluster node's) must not make an
    # older run's checkpoint the newest. A run of a name of its own (--trainer.logger.init_args.version) has its time.
    def run_number(path: Path) -> int:
        found = _VERSION.fullmatch(path.parent.parent.name)
        return int(found[1]) if found else -1

    run_times: dict[Path, int] = {}
    for path, time in candidates.items():
        run_times[path.parent] = max(time, run_times.get(path.parent, time))
    latest = 0
    for path in sorted((path for path in candidates if run_number(path) >= 0), key=run_number):
        latest = run_times[path.parent] = max(latest, run_times[path.parent])
    newest_first = sorted(
        candidates, key=lambda path: (run_times[path.parent], run_number(path), candidates[path]), reverse=True
    )
    for path in newest_first:
        try:
            check_file(path)
            # Memory-mapped: only the few values read here are loaded, not the weights.
            steps = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step", 0)
        except CheckpointError as err:
            report(f"passing over {path}: {err}")
            continue
        except Exception:
            report(f"passing over {path}: it cannot be read (truncated?)")
            continue
        if steps > 0:
            return path
        report(f"passing over {path}: it was saved before any training step")
    raise CheckpointError(f"--ckpt_path last: no checkpoint under {runs_root}/ holds a trained model to resume")


# torch.save stores records uncompressed: an archive that would inflate to more than this many times its size was not
# written by it (a few megabytes of compressed zeros can inflate to gigabytes and exhaust the memory).
INFLATION_LIMIT = 10


def check_file(path: str | Path) -> None:
    """Raise ``CheckpointError`` unless ``path`` is a regular, non-empty file that reading cannot blow up, from its
    metadata and its zip directory alone: no FIFO or device is opened, no record inflated."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint {path} cannot be read: {err.strerror}") from err
    mode, size = info.st_mode, info.st_size
    if stat.S_ISDIR(mode):
        raise CheckpointError(f"--ckpt_path {path} is a folder: give a .ckpt file, e.g. {path}/last.ckpt")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise CheckpointError(f"checkpoint {path} is {kind}, not a file: refused unopened; give a .ckpt file")
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (its save was interrupted?)")
    if not zipfile.is_zipfile(path):
        return  # PyTorch's legacy format is read as stored: no more than the file's size
    try:
        with zipfile.ZipFile(path) as archive:
            inflated = sum(entry.file_size for entry in archive.infolist())
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"checkpoint {path} cannot be read (truncated?): {err}") from err
    if inflated > INFLATION_LIMIT * size:
        raise CheckpointError(
            f"checkpoint {path} would inflate from {byte_size(size)} on disk to {byte_size(inflated)}, more than "
            f"{INFLATION_LIMIT} times its size: refused unread (torch.save stores checkpoints uncompressed)"
        )


# The lines of PyTorch's refusal of an unsafe file (``weights_only=True``) that say nothing about the file: the first
# advises loading it with ``weights_only=False``, which would run the code a tampered file holds.
_PYTORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation of torch.load")


def load_refusal(err: BaseException) -> str:
    """The line of ``torch.load``'s refusal that names what the file holds ("unsupported GLOBAL posix.system")."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(_PYTORCH_BOILERPLATE)]
    if said:
        return said[0]
    if lines and lines[0].startswith(_PYTORCH_BOILERPLATE[0]):
        return "it holds something other than tensors and plain data"
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


@dataclass(frozen=True)
class Trained:
    """A checkpoint's weights' shapes by name, its class names, and its model's class where it says (``RunClasses``)."""

    shapes: dict[str, torch.Size]
    class_names: list[str] | None
    model_class: str | None = None


def read_checkpoint(path: str | Path) -> Trained:
    """What the Lightning checkpoint ``path`` holds, read as data (``weights_only``: a tampered one cannot run code),
    the classes its hyperparameters name held to ``check_trusted`` before anything is imported."""
    path = Path(path)
    check_file(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be read (truncated, or not a safe PyTorch file): {load_refusal(err)}"
        ) from err
    if not isinstance(checkpoint, dict) or not {"state_dict", "pytorch-lightning_version"} <= checkpoint.keys():
        raise CheckpointError(f"{path} is not a Lightning checkpoint")
    sections = ("hyper_parameters", "datamodule_hyper_parameters")
    check_trusted({section: checkpoint.get(section) for section in sections}, path, [path.parent.parent])
    shapes = {name: tensor.shape for name, tensor in checkpoint["state_dict"].items()}
    class_names = (checkpoint.get("hyper_parameters") or {}).get("class_names")
    classes = checkpoint.get(RUN_CLASSES) if isinstance(checkpoint.get(RUN_CLASSES), dict) else {}
    model_class = classes.get("model") if isinstance(classes.get("model"), str) else None
    return Trained(shapes, list(class_names) if isinstance(class_names, list | tuple) else None, model_class)


def check_architecture(path: str | Path, trained: Trained, model: L.LightningModule) -> None:
    """Raise ``CheckpointError`` unless ``trained`` (read from ``path``) fits ``model``: its class, its weights' shapes,
    and its class names, which in another order would fit the weights and name every prediction wrongly."""
    if trained.model_class is not None and trained.model_class != class_path(type(model)):
        raise CheckpointError(
            f"{path} holds the weights of a {trained.model_class}, but the model built is a {class_path(type(model))} "
            f"(a run's config.yaml edited since, or --model naming another class): build the {trained.model_class} "
            "it was trained as"
        )
    shapes = trained.shapes
    expected = {name: tensor.shape for name, tensor in model.state_dict().items()}
    if expected != shapes:
        missing = sorted(expected.keys() - shapes.keys())
        unexpected = sorted(shapes.keys() - expected.keys())
        resized = sorted(name for name in expected.keys() & shapes.keys() if expected[name] != shapes[name])
        raise CheckpointError(
            f"{path} holds another model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"different shapes {resized[:3]} (of {len(missing)}, {len(unexpected)} and {len(resized)})"
        )
    now = list(getattr(model, "class_names", None) or [])
    if trained.class_names is not None and now and now != trained.class_names:
        raise CheckpointError(
            f"{path} was trained on the classes {first_few(trained.class_names, 6)}, but the data now has "
            f"{first_few(now, 6)}: its predictions would be named wrongly. Use the data it was trained on."
        )
