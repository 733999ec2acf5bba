"""The model behind ``POST /predict``: a LitServe ``LitAPI`` that batches the inputs ``inputs`` has checked, one batch
per shape."""

import os
from collections import defaultdict
from typing import Annotated

import litserve as ls
import numpy as np
import torch
from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from torch.export.passes import move_to_device_pass

from ..model_format import TENSORS
from . import tensors
from .model_file import ModelInfo, read_model
from .stopping import ModelProcessGuard


async def read_input(request: Request) -> dict[str, np.ndarray]:
    """The checked input of ``request``, read in the HTTP server by its ``InputReader`` (``app.state.read_input``)."""
    return await request.app.state.read_input(request)


def cpu_threads(workers: int) -> int:
    """PyTorch's threads in each of ``workers`` model processes on the CPU: a core is left to the HTTP server."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, (cores - 1) // workers)


class Model(ls.LitAPI):
    """The model of a file, loaded in each model process (``command``'s docstring says what it answers)."""

    def __init__(
        self,
        model: ModelInfo,
        max_batch_size: int,
        batch_timeout: float,
        cpu_threads: int,
        guard: ModelProcessGuard,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.model_info = model
        self.cpu_threads = cpu_threads
        self.guard = guard

    def setup(self, device: str) -> None:
        self.guard.install()
        if device == "cpu":
            # PyTorch's default, a thread per core in each worker, leaves none to the HTTP server's decoding, and
            # threads that wait for a busy core: on 2 cores, a batch of 32 took 5x as long with 2 threads as with 1.
            torch.set_num_threads(self.cpu_threads)
        # LitServe hands each worker its device; torch.export's own pass moves the program's weights there.
        self.model = move_to_device_pass(read_model(self.model_info.path)[0], device).module()
        self.device = device

    def decode_request(self, request: Annotated[dict, Depends(read_input)]) -> dict[str, np.ndarray]:
        return request  # read, checked and decoded by read_input, one request at a time

    def batch(self, inputs: list) -> list:
        return inputs  # stacked in predict, one batch per shape

    @torch.inference_mode()
    def predict(self, inputs: list) -> list[tuple[object, int]]:
        """Each input's answer, and the size of its batch."""
        if not isinstance(inputs, list):  # max_batch_size 1: LitServe hands over one input, not a list
            return self.predict([inputs])[0]
        by_shape = defaultdict(list)
        for index, item in enumerate(inputs):
            by_shape[tuple(array.shape for array in item.values())].append(index)
        outputs: list[tuple[object, int]] = [(None, 0)] * len(inputs)
        for indices in by_shape.values():
            args, kwargs = tensors.arguments([inputs[index] for index in indices], self.model_info, self.device)
            answers = tensors.answers(self.model(*args, **kwargs), len(indices))
            for index, answer in zip(indices, answers, strict=True):
                outputs[index] = (answer, len(indices))
        return outputs

    def unbatch(self, outputs: list) -> list:
        return outputs

    def encode_response(self, output: tuple[object, int]) -> JSONResponse:
        answer, batch_size = output
        names = self.model_info.class_names
        if self.model_info.kind == TENSORS:
            content = {"outputs": answer}
        else:
            best = max(range(len(names)), key=answer.__getitem__)
            content = {"predicted": names[best], "probabilities": dict(zip(names, answer, strict=True))}
        return JSONResponse(content, headers={"X-Batch-Size": str(batch_size)})
