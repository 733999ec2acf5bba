"""The server under load: ``python -m lightning_kit.serve --bench MODEL``.

Sends ``--requests`` requests, ``--concurrency`` at a time, from threads of this process
(``http.client``, one kept-alive connection each) to a server on 127.0.0.1, and prints
requests/s, the p50/p95/p99 latency and the batch sizes the model received. Without
``--url`` it starts the server itself twice, batching as asked and with
``--max_batch_size 1``, so the gain of batching is measured in one run; then one request at
a time against the idle batching server. It compares each with the same model called
directly in this process on the same inputs, decoded the same way, in batches of
``--max_batch_size``. The client shares the machine's CPUs with the server: on a small
machine its own work is part of what is measured.
"""

import argparse
import http.client
import io
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

import numpy as np
import torch
from PIL import Image

from ..data.image_decoding import decode_image
from ..errors import UserError
from ..model_format import IMAGES, TENSORS
from . import tensors
from .api import cpu_threads
from .model_file import ModelInfo, load_program

# Different inputs sent in turn (the server does not cache, but identical bodies would flatter a compressing proxy).
DISTINCT_INPUTS = 64
# How long a server started here may take to load its model, and then to stop.
START_S = 300
STOP_S = 60


def bench(known: argparse.Namespace, model: ModelInfo) -> None:
    """Measure and print; the settings are the server's flags, with --requests, --concurrency and --url."""
    signal.signal(signal.SIGTERM, _stopped)  # so that the servers started here are stopped too (see _with_server)
    bodies = sample_bodies(model, DISTINCT_INPUTS)
    print(
        f"{model.path}: {known.requests} requests of {_described(model)}, {known.concurrency} at a time",
        flush=True,
    )
    threads = cpu_threads(known.workers_per_device)
    direct = direct_throughput(model, bodies, known.requests, known.max_batch_size, threads)
    shown = f"batches of {known.max_batch_size}, {threads} CPU thread(s)"
    print(f"  direct, in this process, {shown}: {direct:8.1f} inputs/s", flush=True)
    if known.url is not None:
        measured = load(known.url, bodies, known.requests, known.concurrency)
        print(f"  the server at {known.url}: {_summary(measured)}; {measured['rate'] / direct:.2f}x direct")
        return
    unbatched = _with_server(known, model, 1, lambda url: load(url, bodies, known.requests, known.concurrency))
    print(f"  server, --max_batch_size 1: {_summary(unbatched)}", flush=True)

    def batched_then_idle(url: str) -> tuple[dict, dict]:
        return load(url, bodies, known.requests, known.concurrency), load(url, bodies, 200, 1)

    batched, idle = _with_server(known, model, known.max_batch_size, batched_then_idle)
    print(
        f"  server, --max_batch_size {known.max_batch_size} --batch_timeout {known.batch_timeout}: {_summary(batched)}"
    )
    print(
        f"  batching: {batched['rate'] / unbatched['rate']:.2f}x the requests/s of --max_batch_size 1, "
        f"{batched['rate'] / direct:.2f}x the direct throughput"
    )
    print(f"  idle server, one request at a time: p50 {idle['p50']:.1f} ms, p99 {idle['p99']:.1f} ms")


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
    model: ModelInfo, bodies: list[tuple[bytes, str]], count: int, batch_size: int, threads: int
) -> float:
    """Inputs per second of the model called in this process: each body decoded as the server does, then batched."""
    network = load_program(model.path).module()
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
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=START_S)
        try:
            while True:
                with lock:
                    index = next(taken, None)
                if index is None:
                    return
                body, content_type = bodies[index % len(bodies)]
                sent = time.perf_counter()
                connection.request("POST", "/predict", body=body, headers={"Content-Type": content_type})
                response = connection.getresponse()
                answer = response.read()
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
        raise UserError(f"{len(failures)} of {count} requests to {url} failed, the first: {failures[0]}")
    cuts = statistics.quantiles([seconds * 1000 for seconds in latencies], n=100, method="inclusive")
    return {
        "rate": count / elapsed,
        "p50": cuts[49],
        "p95": cuts[94],
        "p99": cuts[98],
        "batch": statistics.fmean(batch_sizes),
    }


def _with_server(known: argparse.Namespace, model: ModelInfo, max_batch_size: int, work):
    """``work(url)`` against a server of ``model`` started here, batching up to ``max_batch_size``; its result."""
    port = free_port()
    command = [
        *(sys.executable, "-m", __package__, str(model.path), "--port", str(port), "--accelerator", known.accelerator),
        *("--max_batch_size", str(max_batch_size), "--batch_timeout", str(known.batch_timeout)),
        *("--workers_per_device", str(known.workers_per_device)),
    ]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_healthy(url, server, log)
            return work(url)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(STOP_S)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def free_port() -> int:
    """A port of 127.0.0.1 that nothing answers at now (LitServe takes ports from 1024 only: this one is above)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(url: str, server: subprocess.Popen, log) -> None:
    """Return once ``url``/health answers ok; stop with the server's last lines if it ends or takes too long."""
    address = urlsplit(url)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and server.poll() is None:
        try:
            connection = http.client.HTTPConnection(address.hostname, address.port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().read() == b"ok":
                return
        except OSError:
            pass
        time.sleep(0.1)
    log.seek(0)
    said = log.read().decode(errors="replace").strip().splitlines()[-5:]
    raise UserError(f"the server for the load test did not start: {' / '.join(said) or 'it said nothing'}")


def _stopped(signum, frame) -> None:
    raise SystemExit("the load test was stopped by SIGTERM")


def _described(model: ModelInfo) -> str:
    if model.kind == TENSORS:
        return f"JSON examples of {', '.join(map(str, model.inputs))}"
    if model.kind == IMAGES:
        return f"{model.image_size}x{model.image_size} PNG images"
    return f"{model.lengths[1]} token ids"


def _summary(measured: dict) -> str:
    return (
        f"{measured['rate']:8.1f} requests/s, latency p50 {measured['p50']:.1f} ms, p95 {measured['p95']:.1f} ms, "
        f"p99 {measured['p99']:.1f} ms; batches of {measured['batch']:.1f} on average"
    )
