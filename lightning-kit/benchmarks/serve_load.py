"""A load test of a served model, for the library's maintainers: it is not installed with lightning-kit.

    python -m lightning_kit.serve model.pt2 --port 8000 &
    python benchmarks/serve_load.py model.pt2 --url http://127.0.0.1:8000
    python benchmarks/serve_load.py model.pt2 --url http://127.0.0.1:8000 --requests 200 --concurrency 1  # idle
    python -m lightning_kit.serve model.pt2 --port 8001 --max_batch_size 1 &
    python benchmarks/serve_load.py model.pt2 --url http://127.0.0.1:8001 --max_batch_size 1  # what batching gains

Sends ``--requests`` requests to the server at ``--url``, ``--concurrency`` at a time, from threads of
this process (``http.client``, one kept-alive connection each), and prints requests/s, the p50/p95/p99
latency and the batch sizes the model received (the ``X-Batch-Size`` header). It compares that with the
same model called directly in this process on the same inputs, decoded as the server decodes them, in
batches of ``--max_batch_size`` (give the server's) on as many threads as each of the server's model
processes uses. The inputs are sampled from what the model file records, so a model of any kind is
measured; a generic HTTP load tool (``oha``, ``hey``) can post one fixed body, but neither reads the
model file, nor compares with the model called directly. The client shares the machine's CPUs with a
server on 127.0.0.1: on a small machine its own work is part of what is measured.
"""

import argparse
import http.client
import io
import json
import statistics
import sys
import threading
import time
from urllib.parse import urlsplit

import numpy as np
import torch
from PIL import Image

from lightning_kit.data.image_decoding import decode_image
from lightning_kit.errors import UserError
from lightning_kit.model_format import IMAGES, TENSORS
from lightning_kit.serve import tensors
from lightning_kit.serve.api import cpu_threads
from lightning_kit.serve.command import MAX_BATCH_SIZE
from lightning_kit.serve.model_file import ModelInfo, read_model

# Different inputs sent in turn (the server does not cache, but identical bodies would flatter a compressing proxy).
DISTINCT_INPUTS = 64
# How long one request may wait for its answer: a bound on a hang, not on speed.
REQUEST_TIMEOUT_S = 300


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the .pt2 file the server serves")
    parser.add_argument("--url", required=True, help="the server's address, e.g. http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=2000, help="requests to send (default: 2000)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests at a time (default: 32)")
    parser.add_argument(
        "--max_batch_size", type=int, default=MAX_BATCH_SIZE, help="the server's, for the direct calls' batches"
    )
    parser.add_argument(
        "--workers_per_device", type=int, default=1, help="the server's, for the direct calls' CPU threads"
    )
    options = parser.parse_args(args)
    try:
        program, model = read_model(options.model)
        bodies = sample_bodies(model, DISTINCT_INPUTS)
        print(f"{model.path}: {options.requests} requests of {_described(model)}, {options.concurrency} at a time")
        threads = cpu_threads(options.workers_per_device)
        direct = direct_throughput(program.module(), model, bodies, options.requests, options.max_batch_size, threads)
        shown = f"batches of {options.max_batch_size}, {threads} CPU thread(s)"
        print(f"  direct, in this process, {shown}: {direct:8.1f} inputs/s", flush=True)
        measured = load(options.url, bodies, options.requests, options.concurrency)
    except (UserError, OSError) as err:
        sys.exit(f"error: {err}")
    print(
        f"  the server at {options.url}: {measured['rate']:8.1f} requests/s, latency p50 {measured['p50']:.1f} ms, "
        f"p95 {measured['p95']:.1f} ms, p99 {measured['p99']:.1f} ms; batches of {measured['batch']:.1f} on average; "
        f"{measured['rate'] / direct:.2f}x direct"
    )


def sample_bodies(model: ModelInfo, count: int) -> list[tuple[bytes, str]]:
    """``count`` request bodies with their Content-Type: random inputs of the largest size the model takes.

    For a model of tensors: one example of each input of its recorded shape, standard normal numbers for a
    floating dtype, random ``true``/``false`` for ``bool``, and zeros for an integer dtype (an index into a table
    of any size: the file does not record which integers an input takes).
    """
    generator = np.random.default_rng(0)
    bodies = []
    for _ in range(count):
        if model.kind == TENSORS:
            example = {spec.name: _sample(generator, spec).tolist() for spec in model.inputs}
            bodies.append((json.dumps(example).encode(), "application/json"))
        elif model.kind == IMAGES:
            pixels = generator.integers(0, 256, (model.image_size, model.image_size, 3), dtype=np.uint8)
            encoded = io.BytesIO()
            Image.fromarray(pixels).save(encoded, format="PNG")
            bodies.append((encoded.getvalue(), "image/png"))
        else:
            tokens = generator.integers(0, model.vocab_size, model.lengths[1]).tolist()
            bodies.append((json.dumps({"tokens": tokens}).encode(), "application/json"))
    return bodies


def direct_throughput(
    network: torch.nn.Module,
    model: ModelInfo,
    bodies: list[tuple[bytes, str]],
    count: int,
    batch_size: int,
    threads: int,
) -> float:
    """Inputs per second of ``network`` called in this process: each body decoded as the server does, then batched."""
    torch.set_num_threads(threads)  # as many as each of the server's model processes uses
    started = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, count, batch_size):
            chosen = [bodies[index % len(bodies)][0] for index in range(first, min(first + batch_size, count))]
            if model.kind == TENSORS:
                args, kwargs = tensors.arguments([tensors.decode(body, model) for body in chosen], model, "cpu")
                tensors.answers(network(*args, **kwargs), len(chosen))
            else:
                network(torch.from_numpy(np.stack([_decoded(model, body) for body in chosen])))
    return count / (time.perf_counter() - started)


def _sample(generator: np.random.Generator, spec) -> np.ndarray:
    """One random example of a model of tensors' input ``spec`` (see ``sample_bodies``)."""
    shape = [spec.range_of(axis)[0] or 1 for axis in range(len(spec.shape))]  # the fewest where a size varies
    if spec.dtype == "bool":
        return generator.integers(0, 2, shape).astype(bool)
    if getattr(torch, spec.dtype).is_floating_point:
        return generator.standard_normal(shape).astype(np.float32)
    return np.zeros(shape, dtype=np.int64)


def _decoded(model: ModelInfo, body: bytes) -> np.ndarray:
    if model.kind == IMAGES:
        return decode_image(body, model.image_size, max_pixels=model.image_size**2 * 4).transpose(2, 0, 1)
    return np.array(json.loads(body)["tokens"], dtype=np.int64)


def load(url: str, bodies: list[tuple[bytes, str]], count: int, concurrency: int) -> dict:
    """Send ``count`` requests to ``url``'s /predict, ``concurrency`` at a time; their rate, latencies and batches."""
    address = urlsplit(url)
    latencies: list[float] = []
    batch_sizes: list[int] = []
    failures: list[str] = []
    taken = iter(range(count))
    lock = threading.Lock()

    def client() -> None:
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=REQUEST_TIMEOUT_S)
        try:
            while True:
                with lock:
                    index = next(taken, None)
                if index is None:
                    return
                body, content_type = bodies[index % len(bodies)]
                sent = time.perf_counter()
                try:
                    connection.request("POST", "/predict", body=body, headers={"Content-Type": content_type})
                    response = connection.getresponse()
                    answer = response.read()
                except OSError as err:  # refused, reset, timed out: said once, below, rather than in a thread
                    with lock:
                        failures.append(str(err))
                    return
                with lock:
                    latencies.append(time.perf_counter() - sent)
                    if response.status != 200:
                        failures.append(f"{response.status} {answer[:200]!r}")
                    batch_sizes.append(int(response.headers.get("X-Batch-Size", 0)))
        finally:
            connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise UserError(f"{len(failures)} requests to {url} failed, the first: {failures[0]}")
    cuts = statistics.quantiles([seconds * 1000 for seconds in latencies], n=100, method="inclusive")
    return {
        "rate": count / elapsed,
        "p50": cuts[49],
        "p95": cuts[94],
        "p99": cuts[98],
        "batch": statistics.fmean(batch_sizes),
    }


def _described(model: ModelInfo) -> str:
    if model.kind == TENSORS:
        return f"JSON examples of {', '.join(map(str, model.inputs))}"
    if model.kind == IMAGES:
        return f"{model.image_size}x{model.image_size} PNG images"
    return f"{model.lengths[1]} token ids"


if __name__ == "__main__":
    main()
