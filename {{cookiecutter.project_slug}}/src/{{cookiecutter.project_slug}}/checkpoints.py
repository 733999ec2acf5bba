"""Finding and checking checkpoints before a run trusts them."""

from pathlib import Path

import lightning as L
import torch

from .errors import UserError

# What `--ckpt_path last` may resume from: the end of an epoch, or an interrupted step.
RESUMABLE = ("last.ckpt", "on_exception.ckpt")


class CheckpointError(UserError):
    """A checkpoint is missing, unreadable, or not one of this model."""


def latest_checkpoint(runs_root: str | Path) -> Path:
    """The newest ``last.ckpt`` or ``on_exception.ckpt`` of any run under ``runs_root``."""
    candidates = [path for name in RESUMABLE for path in Path(runs_root).glob(f"*/checkpoints/{name}")]
    if not candidates:
        raise CheckpointError(f"--ckpt_path last: no run under {runs_root}/ has a last.ckpt or on_exception.ckpt")
    return max(candidates, key=lambda path: path.stat().st_mtime_ns)


def read_checkpoint(path: str | Path) -> dict[str, torch.Size]:
    """Check that ``path`` is a readable Lightning checkpoint; return the shapes of its weights by name.

    The file is read with ``weights_only=True``: tensors and plain data only, so a
    tampered checkpoint cannot run code.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
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
    return {name: tensor.shape for name, tensor in checkpoint["state_dict"].items()}


def check_architecture(path: str | Path, shapes: dict[str, torch.Size], model: L.LightningModule) -> None:
    """Raise ``CheckpointError`` unless the weights ``shapes`` read from ``path`` fit ``model``."""
    expected = {name: tensor.shape for name, tensor in model.state_dict().items()}
    if expected != shapes:
        missing = sorted(expected.keys() - shapes.keys())
        unexpected = sorted(shapes.keys() - expected.keys())
        resized = sorted(name for name in expected.keys() & shapes.keys() if expected[name] != shapes[name])
        raise CheckpointError(
            f"{path} holds another model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"different shapes {resized[:3]} (of {len(missing)}, {len(unexpected)} and {len(resized)})"
        )
