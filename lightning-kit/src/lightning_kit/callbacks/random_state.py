"""The random generators' state in every checkpoint, restored on resume."""

import random
from typing import Any

import lightning as L
import numpy as np
import torch


class RandomState(L.Callback):
    """Keep the random generators' state in every checkpoint, and restore it on resume.

    So dropout and any other random draw continue, after an interruption, exactly as
    they would have in a run that never stopped.
    """

    def state_dict(self) -> dict[str, Any]:
        # Tensors and plain Python values only: checkpoints are read with weights_only=True.
        kind, keys, position, has_gauss, gauss = np.random.get_state()
        state = {
            "torch": torch.get_rng_state(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kind, keys, position, has_gauss, gauss = state["numpy"]
        torch.set_rng_state(state["torch"])
        np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
