"""Serve an exported model over HTTP with LitServe, batching concurrent requests.

    python -m lightning_kit.serve runs/lightning_logs/version_3/model.pt2
    python -m my_project.serve --ckpt_path last --port 8080     # a project's: exported by its command line

``POST /predict`` takes what the model file says its model takes:

- a model of images: an image file (the body, or the one file of a multipart form); of token sequences: JSON
  ``{"tokens": [token ids]}``. Either answers ``{"predicted": name, "probabilities": {name: p, ...}}``.
- a model of tensors: JSON ``{"<input name>": one example, ...}``, each of forward's inputs as nested lists of its
  recorded shape (no batch dimension) and numbers of its dtype, e.g. ``{"history": [[0.1, 0.5], ...]}`` for a
  ``(24, 2)`` float32 input. It answers ``{"outputs": ...}``: forward's outputs for that example, nested lists for a
  tensor, a list for a tuple, an object for a dict (``null`` for a number that is not finite).

Each answer has its batch's size as the ``X-Batch-Size`` header; ``GET /health`` answers ``ok`` once the model is
loaded. A bad request answers 4xx with a JSON ``detail`` (400 for what the model cannot take, 413 for a body over
``--max_body_bytes``, 415 for a wrong Content-Type) and never reaches the model. SIGTERM: see ``stopping``. Needs the
``serve`` extra: ``pip install -e ".[serve]"``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from jsonargparse.typing import restricted_number_type

from ..accelerators import check_accelerator
from ..errors import ConfigError, OneLineParser, UserError, byte_size, command, first_few, invoked_as, signal_name
from ..installation import check_installation
from ..model_format import EXPORT_COMMAND, IMAGES, TENSORS
from ..passwords import scrubbed
from .model_file import ModelInfo, read_model
from .stopping import GRACE_S, Stopper, WorkerEndedError, catch_sigterm, say, sigterm_received

if TYPE_CHECKING:  # serving a model file imports no Lightning (4 CPU-s per process instead of 6.5)
    from ..cli import KitCLI

GENERIC_COMMAND = "python -m lightning_kit"  # GenericCLI.command, written down without importing it

# Measured with benchmarks/serve_load.py on 2 CPU cores: an idle request waits the whole timeout for its batch to
# fill; at concurrency 32, waiting 10 ms answered no more requests/s, and batches of up to 8 fewer than of 32.
MAX_BATCH_SIZE = 32
BATCH_TIMEOUT_S = 0.005
MAX_BODY_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 50_000_000  # a 50-megapixel photo; a larger image is refused from its header
HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # LitServe answers at these addresses only
MAX_SECONDS = 86_400  # the most --timeout and --batch_timeout may be: a day


def parser(
    prog: str | None = None, export_command: str = EXPORT_COMMAND, train_command: str = GENERIC_COMMAND
) -> argparse.ArgumentParser:
    """The command's options; ``export_command`` writes model files, ``train_command`` builds a checkpoint's model."""
    described = OneLineParser(
        prog=prog or invoked_as("python -m lightning_kit.serve"),
        description=__doc__.split("\n\n")[0],
        epilog=f"With --ckpt_path, other arguments (--config, --model, --data.*) go to {train_command}, as for the "
        "export.",
    )
    described.add_argument("model", nargs="?", help=f"the .pt2 file {export_command} wrote")
    described.add_argument("--ckpt_path", help="serve this checkpoint (`last`: the newest run's), exported first")
    described.add_argument("--host", choices=HOSTS, default="127.0.0.1", help="the address to answer at")
    described.add_argument("--port", type=_bounded(int, 1024, 65535), default=8000, help="1024 to 65535")
    described.add_argument("--accelerator", choices=("auto", "cpu", "gpu"), default="auto", help="where the model runs")
    for flag, bounded, default, text in (
        ("--workers_per_device", _bounded(int, 1), 1, "model processes per device (each loads it)"),
        ("--max_batch_size", _bounded(int, 1), MAX_BATCH_SIZE, "1: no batching"),
        (
            "--batch_timeout",
            _bounded(float, 0, MAX_SECONDS),
            BATCH_TIMEOUT_S,
            "seconds to wait for a batch to fill (less than --timeout)",
        ),
        ("--max_body_bytes", _bounded(int, 1), MAX_BODY_BYTES, "larger requests are refused (413)"),
        ("--max_pixels", _bounded(int, 1), MAX_PIXELS, "larger images are refused (413)"),
        ("--timeout", _bounded(float, 0, MAX_SECONDS, low_open=True), 30.0, "seconds a request may wait (504)"),
    ):
        described.add_argument(flag, type=bounded, default=default, help=text)
    return described


def _bounded(kind: type, low: float, high: float | None = None, low_open: bool = False):
    """An argparse type: jsonargparse's number of ``kind`` from ``low`` (excluded if ``low_open``) to ``high``."""
    restrictions = [(">" if low_open else ">=", kind(low))] + ([] if high is None else [("<=", kind(high))])
    restricted = restricted_number_type(None, kind, restrictions)
    bounds = " and ".join(f"{op} {bound:g}" for op, bound in restrictions)
    expected = f"expected a {'whole ' if kind is int else ''}number {bounds}"

    def convert(text: str):
        try:
            return kind(restricted(text))
        except ValueError:  # not a number of kind, or out of bounds (NaN is in none)
            raise argparse.ArgumentTypeError(f"{text}: {expected}") from None

    return convert


@command
def main(args: list[str] | None = None, cli_class: type[KitCLI] | None = None, prog: str | None = None) -> None:
    """Serve the model file ``args`` name, or the checkpoint of ``--ckpt_path`` exported by ``cli_class`` (the
    project's ``KitCLI``; by default ``GenericCLI``); ``prog`` names the command in messages."""
    check_installation(cli_class.__module__ if cli_class is not None else None)
    export_command, train_command = EXPORT_COMMAND, GENERIC_COMMAND
    if cli_class is not None:  # the project's own <package>.export, where it has one
        own, train_command = cli_class.own_package(), cli_class.command
        if own and importlib.util.find_spec(f"{own}.export") is not None:
            export_command = f"python -m {own}.export"
    options = parser(prog, export_command, train_command)
    known, rest = options.parse_known_args(args)
    if rest and known.ckpt_path is None:
        given = " ".join(rest)
        options.error(f"unrecognized arguments: {given} ({train_command}'s arguments go with --ckpt_path only)")
    if (known.model is None) == (known.ckpt_path is None):
        options.error("give the model file or --ckpt_path, one of the two")
    if known.batch_timeout >= known.timeout:
        options.error(
            f"argument --batch_timeout: {known.batch_timeout} is not less than --timeout {known.timeout}: "
            "no request would be answered before it times out"
        )
    try:  # the serve extra, before anything else is done (python_multipart reads the forms images come in)
        import litserve  # noqa: F401
        import python_multipart  # noqa: F401
    except ImportError as err:
        sys.exit(f'error: serving needs {err.name}, which is not installed: pip install -e ".[serve]"')
    if known.ckpt_path is None:
        handled = _one_line_errors()
    else:  # a checkpoint is exported first: its errors as train.py says them
        from ..messages import errors_as_messages

        handled = errors_as_messages()
    catch_sigterm()
    with handled:
        check_accelerator(SimpleNamespace(accelerator=known.accelerator))
        with model_file(known, rest, cli_class) as path:
            try:
                size = f" ({byte_size(path.stat().st_size)})"
            except OSError:  # reading it says why
                size = ""
            say(f"reading {path} and checking it{size}")
            _, model = read_model(path, export_command)
            say(f"checked {path}: {_described(model)}")
            check_limits(known, model)
            check_port_free(known.host, known.port)
            serve(known, model)


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """A mistake in the model file or the flags as one line, no password shown (without Lightning, which
    ``messages.errors_as_messages`` imports)."""
    try:
        yield
    except UserError as err:
        sys.exit(scrubbed(f"error: {err}"))


def _described(model: ModelInfo) -> str:
    if model.kind == TENSORS:
        way = "by keyword" if model.by_keyword else "by position"
        return f"a model of {', '.join(map(str, model.inputs))} per example ({way}), answering {model.answers}"
    if model.kind == IMAGES:
        takes = f"images, resized to {model.image_size}x{model.image_size}"
    else:
        takes = f"{model.lengths[0]} to {model.lengths[1]} token ids below {model.vocab_size}"
    return f"a model of {takes}, answering {len(model.class_names)} classes ({first_few(model.class_names, 5)})"


def check_limits(known: argparse.Namespace, model: ModelInfo) -> None:
    """Refuse a model whose inputs are larger than the server's own limits let any request be."""
    if model.kind == IMAGES and model.image_size**2 > known.max_pixels:
        raise ConfigError(
            f"{model.path} takes {model.image_size}x{model.image_size} images, more pixels than --max_pixels "
            f"{known.max_pixels:,}: give a larger --max_pixels, or a model of smaller images"
        )
    numbers = sum(math.prod(spec.range_of(axis)[0] for axis in range(len(spec.shape))) for spec in model.inputs)
    if model.kind == TENSORS and 2 * numbers - 1 > known.max_body_bytes:
        raise ConfigError(
            f"{model.path} takes at least {numbers:,} numbers per example, {2 * numbers - 1:,} bytes of JSON, more "
            f"than --max_body_bytes {known.max_body_bytes:,}: give a larger --max_body_bytes"
        )


@contextmanager
def model_file(known: argparse.Namespace, rest: list[str], cli_class: type[KitCLI] | None = None) -> Iterator[Path]:
    """The model file given, or ``--ckpt_path`` exported by ``cli_class`` into a temporary folder."""
    if known.model is not None:
        yield Path(known.model)
        return
    from ..building import expand_shortcuts
    from ..checkpoints import latest_checkpoint
    from ..cli import GenericCLI
    from ..export import export, load_trained

    cli_class = cli_class or GenericCLI
    last = known.ckpt_path == "last"
    ckpt_path = latest_checkpoint(Path("runs/lightning_logs")) if last else Path(known.ckpt_path)
    say(f"exporting {ckpt_path} to serve it")
    trained, datamodule = load_trained(ckpt_path, expand_shortcuts(rest), cli_class)
    with tempfile.TemporaryDirectory(prefix="serve-") as folder:
        path = Path(folder) / "model.pt2"
        export(trained, datamodule, path, onnx="no")
        say(f"exported {ckpt_path} to serve it")
        yield path


def check_port_free(host: str, port: int) -> None:
    """Refuse a port in use, before the model's workers start."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ConfigError(f"--port {port} on {host} cannot be used ({err.strerror}): give another --port") from err


def serve(known: argparse.Namespace, model: ModelInfo) -> None:
    """Run the server until SIGTERM or Ctrl-C (``stopping``)."""
    if sigterm_received():  # while the checkpoint was exported or the file read
        say(f"stopped by SIGTERM before serving {model.path}")
        return
    from .api import Model, cpu_threads  # LitServe, the serve extra
    from .inputs import InputReader

    # Every request taken is answered before the HTTP servers stop: LitServe's own 504 comes first.
    graceful_s = known.timeout + GRACE_S
    stopper = Stopper(stop_s=graceful_s + GRACE_S)
    api = Model(
        model, known.max_batch_size, known.batch_timeout, cpu_threads(known.workers_per_device), stopper.model_processes
    )
    accelerator = {"gpu": "cuda"}.get(known.accelerator, known.accelerator)
    server = stopper.server_class()(
        api, accelerator=accelerator, workers_per_device=known.workers_per_device, timeout=known.timeout
    )
    server.uvicorn_graceful_timeout = graceful_s
    server.app.state.read_input = InputReader(model, known.max_body_bytes, known.max_pixels)
    logging.getLogger("litserve.server").addFilter(stopper.shutdown_noise)
    address = f"http://{'[::1]' if known.host == '::' else known.host}:{known.port}"
    server.app.state.ready_line = f"ready: serving {model.path} at {address}/predict"
    devices = server.devices  # LitServe's choice: ["cpu"], or a list of names ("cuda:0") per device
    workers = len(devices) * known.workers_per_device
    accelerator = devices[0] if devices == ["cpu"] else devices[0][0].partition(":")[0]
    say(
        f"starting {workers} model worker{'s' if workers > 1 else ''} on {accelerator} (each loads {model.path}); "
        f"{address}/predict answers once they are ready"
    )
    try:
        stopper.run(server, host=known.host, port=known.port, generate_client_file=False, log_level="warning")
    except WorkerEndedError as ended:
        code = ended.args[0]
        if code is None:
            how = "with its error above"
        else:
            how = f"exit status {code}" if code >= 0 else f"killed by {signal_name(-code)}"
        sys.exit(f"error: a model worker failed to load {model.path} ({how}); the server stopped before serving")
    say(f"stopped serving {model.path}")
