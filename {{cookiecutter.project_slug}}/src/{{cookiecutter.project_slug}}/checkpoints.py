"""Writing checkpoints safely, and finding and checking them before a run trusts them."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .errors import UserError

# What `--ckpt_path last` may resume from: the end of an epoch, or an interrupted step.
RESUMABLE = ("last.ckpt", "on_exception.ckpt")


class CheckpointError(UserError):
    """A checkpoint is missing, unreadable, or not one of this model."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file beside it, then rename it into place.

    A run killed while saving leaves the previous checkpoint whole, never a truncated
    one; its temporary file is removed when the next save in that folder finds it.
    (Lightning's own writer goes through a temporary file in ``$TMPDIR``, which is
    copied, not renamed, when it is on another file system.)
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        with written_whole(Path(path)) as temporary, temporary.open("wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to: renamed to ``path`` when the block ends, removed if it fails.

    A process killed while writing leaves ``path`` as it was; its temporary file is removed
    by the next write in that folder.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_files(path.parent)
    temporary = path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}.{path.name}")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


TEMPORARY_PREFIX = ".saving."


def _remove_abandoned_files(folder: Path) -> None:
    """Remove temporary files of saves that were killed: those of processes that no longer exist."""
    for path in folder.glob(f"{TEMPORARY_PREFIX}*"):
        pid = path.name[len(TEMPORARY_PREFIX) :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


def latest_checkpoint(runs_root: str | Path, report=print) -> Path:
    """The newest ``last.ckpt`` or ``on_exception.ckpt`` under ``runs_root`` of a run that trained.

    Checkpoints that cannot be read, or that hold no training step, are passed over,
    and ``report`` is told about each.
    """
    candidates = [path for name in RESUMABLE for path in Path(runs_root).glob(f"*/checkpoints/{name}")]
    if not candidates:
        raise CheckpointError(f"--ckpt_path last: no run under {runs_root}/ has a last.ckpt or on_exception.ckpt")
    for path in sorted(candidates, key=lambda path: path.stat().st_mtime_ns, reverse=True):
        try:
            # Memory-mapped: only the few values read here are loaded, not the weights.
            steps = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step", 0)
        except Exception:
            report(f"passing over {path}: it cannot be read (truncated?)")
            continue
        if steps > 0:
            return path
        report(f"passing over {path}: it was saved before any training step")
    raise CheckpointError(f"--ckpt_path last: no checkpoint under {runs_root}/ holds a trained model to resume")


@dataclass(frozen=True)
class Trained:
    """What a checkpoint says about the model it holds: its weights' shapes by name, and its class names."""

    shapes: dict[str, torch.Size]
    class_names: list[str] | None


def read_checkpoint(path: str | Path) -> Trained:
    """Check that ``path`` is a readable Lightning checkpoint of this project; return what it holds.

    The file is read with ``weights_only=True``: tensors and plain data only, so a
    tampered checkpoint cannot run code. Its hyperparameters may name classes that the
    command line would import to rebuild the model: only this project's are accepted,
    checked before anything is imported.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"--ckpt_path {path} is a folder: give a .ckpt file, e.g. {path}/last.ckpt")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (its save was interrupted?)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        reason = str(err).strip().splitlines()[0]
        raise CheckpointError(
            f"checkpoint {path} cannot be read (truncated, or not a safe PyTorch file): {reason}"
        ) from err
    if (
        not isinstance(checkpoint, dict)
        or "state_dict" not in checkpoint
        or "pytorch-lightning_version" not in checkpoint
    ):
        raise CheckpointError(f"{path} is not a Lightning checkpoint")
    for section in ("hyper_parameters", "datamodule_hyper_parameters"):
        foreign = [name for name in _class_paths(checkpoint.get(section)) if not name.startswith(_OWN_CLASSES)]
        if foreign:
            raise CheckpointError(
                f"{path} names code outside this project in its {section} ({', '.join(foreign[:3])}): "
                "refused, nothing was imported"
            )
    shapes = {name: tensor.shape for name, tensor in checkpoint["state_dict"].items()}
    class_names = (checkpoint.get("hyper_parameters") or {}).get("class_names")
    return Trained(shapes, list(class_names) if isinstance(class_names, list | tuple) else None)


# What a checkpoint's hyperparameters may name: this project's classes, and Lightning's instantiator.
_OWN_CLASSES = (f"{__package__}.", "lightning.pytorch.cli.instantiate_module")
_CLASS_KEYS = ("class_path", "_class_path", "_instantiator")


def _class_paths(value: Any) -> list[str]:
    """Every class path named in ``value``, a checkpoint's hyperparameters, however nested."""
    if isinstance(value, dict):
        found = [value[key] for key in _CLASS_KEYS if isinstance(value.get(key), str)]
        return found + [name for item in value.values() for name in _class_paths(item)]
    if isinstance(value, list | tuple):
        return [name for item in value for name in _class_paths(item)]
    return []


def check_architecture(path: str | Path, trained: Trained, model: L.LightningModule) -> None:
    """Raise ``CheckpointError`` unless the weights and classes ``trained`` read from ``path`` fit ``model``.

    Classes in another order, or renamed, would fit the weights and silently name every
    prediction wrongly: the data's class names must be the checkpoint's.
    """
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
            f"{path} was trained on the classes {_listed(trained.class_names)}, but the data now has "
            f"{_listed(now)}: its predictions would be named wrongly. Use the data it was trained on."
        )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
