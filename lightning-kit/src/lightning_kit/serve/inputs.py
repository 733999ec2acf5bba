"""A request's input, read and checked in the HTTP server before it is queued for the model.

LitServe fails a whole batch when ``decode_request`` raises for one of its requests, so each request is checked here
on its own, and decoded beside the model, in threads, not in the model's process.
"""

import os
from functools import partial

import anyio
import numpy as np
from fastapi import HTTPException, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from ..data.image_decoding import ImageTooLargeError, UnreadableImageError, decode_image
from ..model_format import IMAGES
from . import tensors
from .model_file import ModelInfo

IMAGE_FILE = "an image file as the body (Content-Type image/... or application/octet-stream), or a form with one file"
DECODED_IN_THREAD = 64 * 1024  # a larger JSON body is decoded in a thread, not in the event loop


class InputReader:
    """Reads the input of one request for ``model``: the body, checked and made the model's input."""

    def __init__(self, model: ModelInfo, max_body_bytes: int, max_pixels: int) -> None:
        self.model = model
        self.max_body_bytes = max_body_bytes
        self.max_pixels = max_pixels
        self._decoders: anyio.CapacityLimiter | None = None  # made in the event loop, on the first image
        self._accepted = IMAGE_FILE if model.kind == IMAGES else tensors.accepted(model)

    async def __call__(self, request: Request) -> dict[str, np.ndarray]:
        """The model's inputs by name."""
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        body = await self._body(request)
        if self.model.kind == IMAGES:
            return {self.model.inputs[0].name: await self._image(request, media_type, body)}
        if media_type and media_type != "application/json":
            raise HTTPException(415, f"Content-Type {media_type} is not accepted: send {self._accepted}")
        if not body:
            raise HTTPException(400, f"the body is empty: send {self._accepted}")
        decode = partial(tensors.decode, body, self.model)
        try:  # a large body in a thread, so that the others' requests are read meanwhile
            return await anyio.to_thread.run_sync(decode) if len(body) > DECODED_IN_THREAD else decode()
        except tensors.RequestError as err:
            raise HTTPException(err.status, str(err)) from err

    async def _body(self, request: Request) -> bytes:
        """The body, refused (413) past ``max_body_bytes``: by its Content-Length, or as it comes."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length")
        too_long = HTTPException(413, f"the body is larger than {limit:,} bytes (the server's --max_body_bytes)")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_long
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_long
                chunks.append(chunk)
        except ClientDisconnect as err:  # nobody is left to answer; not the server's error
            raise HTTPException(400, "the client closed the connection before the body was sent") from err
        return b"".join(chunks)

    async def _image(self, request: Request, media_type: str, body: bytes) -> np.ndarray:
        """The pixels of an image file (the body, or a form's one file), ``(3, size, size)``."""
        if media_type == "multipart/form-data":
            body = await self._form_file(request, body)
        elif media_type and media_type != "application/octet-stream" and not media_type.startswith("image/"):
            raise HTTPException(415, f"Content-Type {media_type} is not accepted: send {self._accepted}")
        if not body:
            raise HTTPException(400, f"the image is empty: send {self._accepted}")
        if self._decoders is None:
            self._decoders = anyio.CapacityLimiter(os.cpu_count() or 1)  # a few large images at a time, not 40
        decode = partial(decode_image, body, self.model.image_size, self.max_pixels)
        try:
            pixels = await anyio.to_thread.run_sync(decode, limiter=self._decoders)
        except ImageTooLargeError as err:
            raise HTTPException(413, f"{err}: send a smaller image") from err
        except UnreadableImageError as err:
            raise HTTPException(
                400, f"the body is not an image that can be read ({err}): send {self._accepted}"
            ) from err
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))

    async def _form_file(self, request: Request, body: bytes) -> bytes:
        """The one file of a multipart form (its other fields are ignored)."""

        async def stream():
            yield body

        try:
            form = await MultiPartParser(request.headers, stream(), max_files=1, max_fields=100).parse()
        except MultiPartException as err:
            raise HTTPException(400, f"the form cannot be read ({err.message}): send {self._accepted}") from err
        files = [value for value in form.values() if isinstance(value, UploadFile)]
        if not files:
            raise HTTPException(400, f"the form holds no file: send {self._accepted}")
        try:
            return await files[0].read()
        finally:
            await form.close()
