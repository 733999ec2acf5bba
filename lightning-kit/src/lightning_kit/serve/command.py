"""Serve an exported model over HTTP with LitServe, batching concurrent requests.

    python -m lightning_kit.serve runs/lightning_logs/version_3/model.pt2
    python -m my_project.serve --ckpt_path last --port 8080     # a project's: exported by its command line
    python -m my_project.serve --bench --ckpt_path last

``POST /predict`` takes what the model file says its model takes (the export records it): for a
model of images, an image file (the body, or the one file of a multipart form); for a model of
token sequences, JSON ``{"tokens": [token ids]}``. It answers JSON ``{"predicted": name,
"probabilities": {name: p, ...}}``, with the batch it was run in as the ``X-Batch-Size`` header;
``GET /health`` answers ``ok`` once the model is loaded. A bad request answers 4xx with a JSON
``detail``. SIGTERM stops the server once the requests in flight are answered. Needs the
``serve`` extra: ``pip install -e ".[serve]"``.
"""

import argparse
import importlib.util
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from ..accelerators import check_accelerator
from ..checkpoints import latest_checkpoint
from ..cli import GenericCLI, KitCLI, expand_shortcuts, invoked_as
from ..errors import ConfigError
from ..export import export, load_trained
from ..messages import errors_as_messages
from .model_file import EXPORT_COMMAND, ModelInfo, read_model

# Measured with --bench on 2 CPU cores (README, "Serving the model"): an idle request waits the whole timeout
# for its batch to fill (p50 10 ms at 2 or 5 ms, 16 ms at 10 ms); at concurrency 32, waiting 10 ms made batches
# larger but answered no more requests/s, and batches of up to 8 fewer than of up to 32.
MAX_BATCH_SIZE = 32
BATCH_TIMEOUT_S = 0.005
MAX_BODY_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 50_000_000  # a 50-megapixel photo; a larger image is refused from its header
# LitServe answers at these addresses only; ports below 1024 need root.
HOSTS = ("127.0.0.1", "0.0.0.0", "::")
# How long the HTTP servers may take to answer the requests in flight after SIGTERM.
GRACE_S = 30
# The process that runs the server: SIGTERM there stops it (see _answer_then_stop).
_SERVER_PID = None


def parser(
    prog: str | None = None, export_command: str = EXPORT_COMMAND, train_command: str = GenericCLI.command
) -> argparse.ArgumentParser:
    """The command's options; ``prog`` names it, ``export_command`` the command that writes its model files and
    ``train_command`` the command line that builds the model of a checkpoint (``--ckpt_path``)."""
    described = argparse.ArgumentParser(
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
    described.add_argument(
        "--workers_per_device", type=_bounded(int, 1), default=1, help="model processes per device (each loads it)"
    )
    described.add_argument("--max_batch_size", type=_bounded(int, 1), default=MAX_BATCH_SIZE, help="1: no batching")
    described.add_argument(
        "--batch_timeout", type=_bounded(float, 0), default=BATCH_TIMEOUT_S, help="seconds to wait for a batch to fill"
    )
    described.add_argument(
        "--max_body_bytes", type=_bounded(int, 1), default=MAX_BODY_BYTES, help="larger requests are refused (413)"
    )
    described.add_argument(
        "--max_pixels", type=_bounded(int, 1), default=MAX_PIXELS, help="larger images are refused (413)"
    )
    described.add_argument(
        "--timeout", type=_bounded(float, 0, low_open=True), default=30.0, help="seconds a request may wait (504)"
    )
    described.add_argument("--bench", action="store_true", help="measure a server under load instead (see --requests)")
    described.add_argument("--requests", type=_bounded(int, 1), default=2000, help="--bench: requests to send")
    described.add_argument("--concurrency", type=_bounded(int, 1), default=32, help="--bench: requests at a time")
    described.add_argument("--url", help="--bench: a running server's address (default: start one, and one unbatched)")
    return described


def _bounded(kind, low, high=None, low_open=False):
    """An argparse type: a number of ``kind`` from ``low`` (excluded when ``low_open``) to ``high``."""

    def convert(text: str):
        value = kind(text)
        if value < low or (low_open and value == low) or (high is not None and value > high):
            above = f"more than {low}" if low_open else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{text}: expected {above}" + (f" and at most {high}" if high else ""))
        return value

    convert.__name__ = kind.__name__
    return convert


def main(args: list[str] | None = None, cli_class: type[KitCLI] = GenericCLI, prog: str | None = None) -> None:
    """Serve the model file ``args`` name, or the checkpoint of ``--ckpt_path`` exported by ``cli_class`` (the
    project's ``KitCLI``; by default ``GenericCLI``, which takes ``--model`` and ``--data``); ``prog`` names the
    command in messages."""
    export_command = export_command_of(cli_class)
    options = parser(prog, export_command, cli_class.command)
    known, rest = options.parse_known_args(args)
    if rest and known.ckpt_path is None:
        given = " ".join(rest)
        options.error(f"unrecognized arguments: {given} ({cli_class.command}'s arguments go with --ckpt_path only)")
    if (known.model is None) == (known.ckpt_path is None):
        options.error("give the model file or --ckpt_path, one of the two")
    try:  # the serve extra: checked before anything else is done
        import litserve  # noqa: F401
        import python_multipart  # noqa: F401  (reads the forms that images come in)
    except ImportError as err:
        sys.exit(f'error: serving needs {err.name}, which is not installed: pip install -e ".[serve]"')
    with errors_as_messages():
        check_accelerator(SimpleNamespace(accelerator=known.accelerator))
        with model_file(known, rest, cli_class) as path:
            _, model = read_model(path, export_command)
            if known.bench:
                from .bench import bench  # the load test's client: only for --bench

                bench(known, model)
                return
            check_port_free(known.host, known.port)
            serve(known, model)


def export_command_of(cli_class: type[KitCLI]) -> str:
    """The command that exports ``cli_class``'s checkpoints: the project's ``<package>.export``, where it has one."""
    own = cli_class.own_package()
    if own and importlib.util.find_spec(f"{own}.export") is not None:
        return f"python -m {own}.export"
    return EXPORT_COMMAND


@contextmanager
def model_file(known: argparse.Namespace, rest: list[str], cli_class: type[KitCLI] = GenericCLI) -> Iterator[Path]:
    """The model file to serve: the one given, or ``--ckpt_path`` exported (its model built by ``cli_class``) into
    a temporary folder."""
    if known.model is not None:
        yield Path(known.model)
        return
    last = known.ckpt_path == "last"
    ckpt_path = latest_checkpoint(Path("runs/lightning_logs")) if last else Path(known.ckpt_path)
    trained, datamodule = load_trained(ckpt_path, expand_shortcuts(rest), cli_class)
    with tempfile.TemporaryDirectory(prefix="serve-") as folder:
        path = Path(folder) / "model.pt2"
        export(trained, datamodule, path, onnx="no")
        print(f"exported {ckpt_path} to serve it")
        yield path


def check_port_free(host: str, port: int) -> None:
    """Refuse, in one line, a port another program is answering at (before the model's workers start)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ConfigError(f"--port {port} on {host} cannot be used ({err.strerror}): give another --port") from err


def serve(known: argparse.Namespace, model: ModelInfo) -> None:
    """Run the server until SIGTERM or Ctrl-C."""
    import litserve as ls  # the serve extra: only this command needs it

    from .api import Classifier, cpu_threads
    from .inputs import InputReader

    api = Classifier(model, known.max_batch_size, known.batch_timeout, cpu_threads(known.workers_per_device))
    accelerator = {"gpu": "cuda"}.get(known.accelerator, known.accelerator)
    server = ls.LitServer(
        api,
        accelerator=accelerator,
        workers_per_device=known.workers_per_device,
        timeout=known.timeout,
    )
    server.app.state.read_input = InputReader(model, known.max_body_bytes, known.max_pixels)
    address = f"http://{'[::1]' if known.host == '::' else known.host}:{known.port}"
    print(f"serving {model.path} at {address}/predict (ready when {address}/health answers ok)", flush=True)
    global _SERVER_PID
    _SERVER_PID = os.getpid()
    signal.signal(signal.SIGTERM, _answer_then_stop)
    try:
        server.run(host=known.host, port=known.port, generate_client_file=False, log_level="warning")
    except KeyboardInterrupt:  # before the HTTP servers started: LitServe leaves its model processes to us
        for child in multiprocessing.active_children():
            child.terminate()
            child.join(GRACE_S)


def _answer_then_stop(signum, frame) -> None:
    """SIGTERM: the HTTP servers stop taking requests and answer those in flight; then LitServe stops the rest.

    LitServe (0.2.19) runs no handler of its own for SIGTERM, and on its normal shutdown
    closes the model's queues before the HTTP servers, so requests in flight would go
    unanswered. Uvicorn answers them when told to stop (SIGTERM, in each of LitServe's
    ``LitServer-<n>`` processes); once they have, LitServe's Ctrl-C path stops the model's.
    """
    if os.getpid() != _SERVER_PID:  # a process LitServe forked, which inherited this handler: as if it had none
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    http_servers = [child for child in multiprocessing.active_children() if child.name.startswith("LitServer-")]
    for child in http_servers:
        os.kill(child.pid, signal.SIGTERM)
    for child in http_servers:
        child.join(GRACE_S)
    raise KeyboardInterrupt
