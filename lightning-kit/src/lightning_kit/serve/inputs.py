"""A request's input, read and checked in the HTTP server before it is queued for the model.

Each request is checked on its own, before batching: LitServe fails a whole batch when
``decode_request`` raises for one of its requests, so a bad request here answers its own
4xx (with a JSON ``detail``) and never reaches the model or its batch-mates. Decoding here
also runs beside the model, in threads, instead of before it in the model's process.
"""
{%- if cookiecutter.task == "image" %}

import os
from functools import partial
{%- else %}

import json
{%- endif %}

{% if cookiecutter.task == "image" -%}
import anyio
{% endif -%}
import numpy as np
from fastapi import HTTPException, Request
{%- if cookiecutter.task == "image" %}
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
{%- endif %}
from starlette.requests import ClientDisconnect

{% if cookiecutter.task == "image" -%}
from ..data.image_decoding import ImageTooLargeError, UnreadableImageError, decode_image
{% endif -%}
from .model_file import ModelInfo
{%- if cookiecutter.task == "image" %}

# What POST /predict takes: an image file as the body, or a multipart form holding one.
ACCEPTED = "an image file as the body (Content-Type image/... or application/octet-stream), or a form with one file"
{%- else %}

# What POST /predict takes: a JSON object with the token ids.
ACCEPTED = 'JSON {"tokens": [token ids]} (Content-Type application/json)'
{%- endif %}


class InputReader:
    """Reads the input of one request: the body, within ``max_body_bytes``, checked and made the model's input.

    Args:
        model: What the model takes.
        max_body_bytes: The largest body accepted; a larger one is refused (413) when its
            ``Content-Length`` says so, before it is read, and otherwise once that much has come.
{%- if cookiecutter.task == "image" %}
        max_pixels: The most pixels an image may have; a larger one is refused from its header (413).
{%- endif %}
    """

    def __init__(self, model: ModelInfo, max_body_bytes: int{% if cookiecutter.task == "image" %}, max_pixels: int{% endif %}) -> None:
        self.model = model
        self.max_body_bytes = max_body_bytes
{%- if cookiecutter.task == "image" %}
        self.max_pixels = max_pixels
        self._decoders: anyio.CapacityLimiter | None = None  # made in the event loop, on the first request
{%- endif %}

    async def __call__(self, request: Request) -> np.ndarray:
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        body = await self._body(request)
{%- if cookiecutter.task == "image" %}
        if media_type == "multipart/form-data":
            body = await self._form_file(request, body)
        elif media_type and media_type != "application/octet-stream" and not media_type.startswith("image/"):
            raise HTTPException(415, f"Content-Type {media_type} is not accepted: send {ACCEPTED}")
        if not body:
            raise HTTPException(400, f"the image is empty: send {ACCEPTED}")
        if self._decoders is None:
            self._decoders = anyio.CapacityLimiter(os.cpu_count() or 1)  # a few large images at a time, not 40
        decode = partial(decode_image, body, self.model.image_size, self.max_pixels)
        try:
            pixels = await anyio.to_thread.run_sync(decode, limiter=self._decoders)
        except ImageTooLargeError as err:
            raise HTTPException(413, f"{err}: send a smaller image") from err
        except UnreadableImageError as err:
            raise HTTPException(400, f"the body is not an image that can be read ({err}): send {ACCEPTED}") from err
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))  # (3, size, size), as the model takes it
{%- else %}
        if media_type and media_type != "application/json":
            raise HTTPException(415, f"Content-Type {media_type} is not accepted: send {ACCEPTED}")
        if not body:
            raise HTTPException(400, f"the body is empty: send {ACCEPTED}")
        return self._tokens(body)
{%- endif %}

    async def _body(self, request: Request) -> bytes:
        """The body, refused (413) once it is longer than ``max_body_bytes``: by its Content-Length, or as it comes."""
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
{%- if cookiecutter.task == "image" %}

    @staticmethod
    async def _form_file(request: Request, body: bytes) -> bytes:
        """The one file of a multipart form (its other fields are ignored)."""

        async def stream():
            yield body

        try:
            form = await MultiPartParser(request.headers, stream(), max_files=1, max_fields=100).parse()
        except MultiPartException as err:
            raise HTTPException(400, f"the form cannot be read ({err.message}): send {ACCEPTED}") from err
        files = [value for value in form.values() if isinstance(value, UploadFile)]
        if not files:
            raise HTTPException(400, f"the form holds no file: send {ACCEPTED}")
        try:
            return await files[0].read()
        finally:
            await form.close()
{%- else %}

    def _tokens(self, body: bytes) -> np.ndarray:
        """The token ids of a JSON body, checked against the model's vocabulary and lengths."""
        try:
            given = json.loads(body)
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            raise HTTPException(400, f"the body is not JSON ({err}): send {ACCEPTED}") from err
        tokens = given.get("tokens") if isinstance(given, dict) else None
        if not isinstance(tokens, list) or not all(type(token) is int for token in tokens):
            raise HTTPException(400, f"expected {ACCEPTED}, with whole numbers as the ids")
        fewest, most = self.model.lengths
        if not fewest <= len(tokens) <= most:
            raise HTTPException(400, f"{len(tokens)} tokens: the model takes from {fewest} to {most} tokens")
        vocab_size = self.model.vocab_size
        outside = [token for token in tokens if not 0 <= token < vocab_size]
        if outside:
            raise HTTPException(400, f"token id {outside[0]} is outside the vocabulary: ids lie in [0, {vocab_size})")
        return np.array(tokens, dtype=np.int64)
{%- endif %}
