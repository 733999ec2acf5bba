"""The server under faults: hostile model files read with bounds, claims checked against the program (for images,
tokens and tensors), numeric flags refused in one line, a SIGTERM that answers every request the server had taken,
and a SIGTERM at any moment of the start-up that stops it.

The model files here are exported from a small network with the library's own ``export`` (no training): what
is tested is the reading of the file and the server, not what the network learned.
"""

import contextlib
import http.client
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import HANG_GUARD_S, wait_until_healthy
from conftest import _free_port as free_port
from PIL import Image
from torch import nn

from lightning_kit.errors import byte_size
from lightning_kit.export import export
from lightning_kit.serve import ModelFileError, read_model
from lightning_kit.serve.command import main as serve

pytest.importorskip("litserve", reason='serving needs LitServe: pip install -e ".[serve]"')

CLASSES = 10
SIDE = 32
# What a hostile entry inflates to, from a file of about 2 MB.
INFLATED = 2_000_000_000


class Images(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, CLASSES)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(inputs.float() / 255).mean((2, 3)))


class Tokens(nn.Module):
    def __init__(self, vocab_size: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(inputs).mean(1))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    """A model of 32x32 images and 10 classes, exported as the export command writes it."""
    path = tmp_path_factory.mktemp("faults") / "model.pt2"
    datamodule = SimpleNamespace(image_size=SIDE, class_names=[f"c{index}" for index in range(CLASSES)])
    export(Images(), datamodule, path, onnx="no")
    return path


@pytest.fixture(scope="module")
def tokens_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults-tokens") / "model.pt2"
    datamodule = SimpleNamespace(seq_len=12, vocab_size=16, class_names=["x", "y", "z"])
    export(Tokens(), datamodule, path, onnx="no")
    return path


class DeflatedZeros:
    """A deflate compressor for a stream of 1 MiB blocks of zeros that deflates each block only once.

    Each block ends in a full flush, which forgets what came before, so every block deflates to
    the same bytes: the stream is a real deflate stream of all the zeros (zlib inflates it back),
    made in milliseconds instead of the seconds of deflating 2 GB."""

    BLOCK = bytes(1 << 20)

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate, as a zip entry holds it
        self._block = self._deflate.compress(self.BLOCK) + self._deflate.flush(zlib.Z_FULL_FLUSH)

    def compress(self, data: bytes) -> bytes:
        assert data == self.BLOCK, "only whole blocks of zeros"
        return self._block

    def flush(self) -> bytes:
        return self._deflate.flush()


def rewritten(source: Path, target: Path, changed: dict | None = None, inflated: str | None = None) -> Path:
    """Copy ``source`` to ``target``: entries ending in a key of ``changed`` hold its bytes, and the entry ending in
    ``inflated`` is INFLATED zero bytes, deflated (about 2 MB in the file)."""
    changed = changed or {}
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as written:
        for item in archive.infolist():
            if inflated and item.filename.endswith(inflated):
                info = zipfile.ZipInfo(item.filename, item.date_time)
                info.compress_type = zipfile.ZIP_DEFLATED
                with written.open(info, "w") as stream:
                    # zipfile still counts the size and the CRC of every byte written; only deflating is skipped.
                    stream._compressor = DeflatedZeros()
                    for _ in range(INFLATED >> 20):
                        stream.write(DeflatedZeros.BLOCK)
                with written.open(info) as check:  # a real deflate stream: it inflates to zeros
                    assert check.read(1 << 20) == DeflatedZeros.BLOCK
                continue
            ending = next((end for end in changed if item.filename.endswith(end)), None)
            written.writestr(item, changed[ending] if ending else archive.read(item))
    return target


def lying(source: Path, target: Path, ending: str) -> Path:
    """A copy of the archive ``source`` whose directory says its entry ending in ``ending`` inflates to 100 bytes."""
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        position = archive.start_dir
    while data[position : position + 4] == b"PK\x01\x02":  # the directory's records, one per entry
        name_size, extra_size, comment_size = struct.unpack("<HHH", data[position + 28 : position + 34])
        name = data[position + 46 : position + 46 + name_size].decode()
        if name.endswith(ending):
            data[position + 24 : position + 28] = struct.pack("<I", 100)  # its uncompressed size
        position += 46 + name_size + extra_size + comment_size
    target.write_bytes(data)
    return target


PEAK = """
import resource, sys
from lightning_kit.serve import ModelFileError, read_model
try:
    read_model(sys.argv[1])
    print("loaded")
except ModelFileError as err:
    print("refused:", err)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_kib(path: Path) -> tuple[str, int]:
    """What reading ``path`` in a fresh process said, and that process's peak resident memory (KiB)."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, timeout=HANG_GUARD_S, check=True
    )
    said, peak = done.stdout.strip().splitlines()
    return said, int(peak)


@pytest.fixture(scope="module")
def normal_peak(model_path) -> int:
    """The peak resident memory (KiB) of a process that read the normal model file."""
    said, peak = peak_kib(model_path)
    assert said == "loaded"
    return peak


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["data/weights/weight_0", "extra/input.json"])
def test_a_model_file_that_inflates_is_refused_within_twice_a_normal_files_memory(
    normal_peak, model_path, tmp_path, ending
):
    """An entry deflated from 2 GB in a 2 MB file, or one whose directory lies about its size: refused in one line,
    and the peak memory of the process stays within twice that of reading a normal file."""
    normal = normal_peak
    bomb = rewritten(model_path, tmp_path / "bomb.pt2", inflated=ending)
    for hostile in (bomb, lying(bomb, tmp_path / "lie.pt2", ending)):
        assert hostile.stat().st_size < 3_000_000
        said, peak = peak_kib(hostile)
        assert said.startswith(f"refused: {hostile}") and "\n" not in said, said
        assert peak < 2 * normal, (hostile.name, peak, normal)
        print(f"{hostile.name} {ending}: peak {peak / 1024:.0f} MiB, normal {normal / 1024:.0f} MiB")


def deflated(source: Path, target: Path) -> Path:
    """``source`` with every entry deflated (as a zip tool would re-pack it)."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as written:
        for item in archive.infolist():
            written.writestr(item.filename, archive.read(item))
    return target


def test_a_deflated_archive_is_read_within_bounds_and_a_damaged_stream_is_one_line(model_path, tmp_path):
    """A model file re-packed with deflate loads as the original (PyTorch reads a stored copy); one whose deflated
    entry is damaged is refused in one line naming the entry."""
    packed = deflated(model_path, tmp_path / "packed.pt2")
    original = read_model(model_path)[1]
    assert read_model(packed)[1] == type(original)(**{**original.__dict__, "path": packed})
    data = bytearray(packed.read_bytes())
    with zipfile.ZipFile(packed) as archive:
        entry = next(item for item in archive.infolist() if item.filename.endswith("models/model.json"))
    start = entry.header_offset + 30 + len(entry.filename.encode())
    data[start + 10 : start + 60] = b"\xff" * 50  # the middle of its deflate stream
    damaged = tmp_path / "damaged.pt2"
    damaged.write_bytes(data)
    with pytest.raises(ModelFileError) as refused:
        read_model(damaged)
    message = str(refused.value)
    assert message.startswith(f"{damaged} is damaged: ") and "models/model.json" in message and "\n" not in message


def extra(path: Path, name: str) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read(next(item for item in archive.namelist() if item.endswith(f"extra/{name}"))))


def test_claims_of_the_extra_files_are_checked_against_the_program(model_path, tokens_path, tmp_path):
    """input.json and class_names.json that disagree with the program's signature and output: one line each."""
    described = extra(model_path, "input.json")
    huge = {**described, "image_size": 20000, "shape": [2, 3, 20000, 20000]}
    tokens = extra(tokens_path, "input.json")
    cases = [
        (model_path, {"extra/input.json": json.dumps(huge)}, "says it takes image (uint8, 3x20000x20000)"),
        (model_path, {"extra/input.json": json.dumps({**described, "image_size": 64})}, "says 64x64 images"),
        (model_path, {"extra/class_names.json": b'["a", "b", "c"]'}, "names 3 classes, but its program answers 10"),
        (model_path, {"extra/class_names.json": json.dumps(["a"] * 10)}, "names the class 'a' twice"),
        (model_path, {"extra/class_names.json": b'{"a": 1}'}, "cannot be read"),
        (model_path, {"extra/input.json": json.dumps({**described, "dtype": "int64"})}, "takes int64 inputs"),
        (
            model_path,
            {"extra/input.json": json.dumps(tokens)},
            "its program takes inputs of uint8, shape (batch, 3, 32, 32)",
        ),
        (tokens_path, {"extra/input.json": json.dumps({**tokens, "vocab_size": 10**9})}, "program embeds 16 ids"),
        (tokens_path, {"extra/input.json": json.dumps({**tokens, "seq_len": 10**6})}, "up to 1000000 tokens"),
    ]
    for index, (source, changed, expected) in enumerate(cases):
        target = rewritten(source, tmp_path / f"claim{index}.pt2", changed)
        with pytest.raises(ModelFileError) as refused:
            read_model(target)
        message = str(refused.value)
        assert message.startswith(str(target)) and expected in message and "\n" not in message, message
    assert read_model(tokens_path)[1].lengths == (2, 12)


class Readings(nn.Module):
    """A model of tensors: ``values`` (B, 4) float32 and ``station`` (B,) int64 by keyword, answering (B, 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(5, 4)
        self.fc = nn.Linear(4, 2)
        self.example_input_array = {"values": torch.zeros(2, 4), "station": torch.zeros(2, dtype=torch.long)}

    def forward(self, values: torch.Tensor, station: torch.Tensor) -> torch.Tensor:
        return self.fc(values + self.embedding(station))


@pytest.fixture(scope="module")
def readings_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults-tensors") / "model.pt2"
    export(Readings(), None, path, onnx="no")
    return path


def saved(path: Path, program, described: dict, class_names: list | None = None) -> Path:
    """``program`` written to ``path`` as the export writes it, its input.json ``described``."""
    extra = {"class_names.json": json.dumps(class_names or []), "input.json": json.dumps(described)}
    torch.export.save(program, path, extra_files=extra)
    return path


def test_claims_of_a_model_of_tensors_are_checked_against_the_program(readings_path, tmp_path):
    """An input.json of tensors that disagrees with its program (a dtype, a shape, a name, how they are passed, an
    input too few), class names for it, or a program of one batch size or of no row per example: one line each."""
    described = extra(readings_path, "input.json")
    assert read_model(readings_path)[1].index_rows == (None, 5)
    values, station = described["inputs"]
    takes = "its input.json says it takes"
    cases = [
        (
            {**described, "inputs": [{**values, "dtype": "float64"}, station]},
            "takes values of float32, shape (batch, 4)",
        ),
        ({**described, "inputs": [{**values, "shape": [5]}, station]}, f"{takes} values (float32, 5), station"),
        ({**described, "passed": "positional"}, "by position, but its program takes values, station by keyword"),
        ({**described, "inputs": [{**values, "name": "value"}, station]}, "but its program takes values, station by"),
        ({**described, "inputs": [values]}, f"{takes} values (float32, 4) by keyword, but its program takes values"),
        ({**described, "inputs": [{**values, "dtype": "complex64"}, station]}, "says values is 'complex64', not one"),
        ({**described, "inputs": "values"}, "is damaged: its input.json names no inputs"),
        ({key: value for key, value in described.items() if key != "passed"}, "is damaged: its input.json names no"),
    ]
    changes = [{"extra/input.json": json.dumps(claimed)} for claimed, _ in cases]
    cases.append((None, "names 1 classes, but a model of tensors answers its outputs as they are: refused"))
    changes.append({"extra/class_names.json": b'["a"]'})
    for index, ((_, expected), changed) in enumerate(zip(cases, changes, strict=True)):
        target = rewritten(readings_path, tmp_path / f"claim{index}.pt2", changed)
        with pytest.raises(ModelFileError) as refused:
            read_model(target)
        message = str(refused.value)
        assert message.startswith(str(target)) and expected in message and "\n" not in message, message
    inputs = Readings().example_input_array
    static = saved(tmp_path / "static.pt2", torch.export.export(Readings(), (), inputs), described)
    with pytest.raises(ModelFileError, match=r"takes batches of 2 examples only .*: refused$"):
        read_model(static)
    batch = torch.export.Dim("batch")
    summed = torch.export.export(Summed(), (), inputs, dynamic_shapes={"values": {0: batch}, "station": {0: batch}})
    with pytest.raises(ModelFileError, match=r"answers a float32 tensor of shape \(\), which no request could be"):
        read_model(saved(tmp_path / "summed.pt2", summed, described))


class Summed(Readings):
    """One number for the whole batch: no answer per request."""

    def forward(self, values: torch.Tensor, station: torch.Tensor) -> torch.Tensor:
        return super().forward(values, station).sum()


def test_a_program_of_one_batch_size_is_refused(model_path, tmp_path):
    """A program exported with a fixed batch would fail every batch of another size: refused at start."""
    program = torch.export.export(Images(), (torch.zeros(2, 3, SIDE, SIDE, dtype=torch.uint8),))
    names = json.dumps([f"c{index}" for index in range(CLASSES)])
    static = tmp_path / "static.pt2"
    torch.export.save(
        program,
        static,
        extra_files={"class_names.json": names, "input.json": json.dumps(extra(model_path, "input.json"))},
    )
    with pytest.raises(ModelFileError, match=r"takes batches of 2 examples only .*: refused$"):
        read_model(static)


def test_a_model_of_more_pixels_than_max_pixels_is_refused_before_the_port(model_path, monkeypatch):
    monkeypatch.chdir(model_path.parent)
    with pytest.raises(SystemExit) as stopped:
        serve(["model.pt2", "--max_pixels", "100", "--port", str(free_port())])
    assert str(stopped.value.code).startswith("error: model.pt2 takes 32x32 images, more pixels than --max_pixels 100")


NUMBERS = [
    ("--batch_timeout", "nan"),
    ("--batch_timeout", "inf"),
    ("--batch_timeout", "-1"),
    ("--batch_timeout", "1e300"),
    ("--timeout", "nan"),
    ("--timeout", "-inf"),
    ("--timeout", "0"),
    ("--port", "80"),
    ("--port", "1e4"),
    ("--workers_per_device", "0"),
    ("--max_batch_size", "nan"),
    ("--max_body_bytes", "-5"),
    ("--max_pixels", "x"),
]


@pytest.mark.parametrize(("flag", "value"), NUMBERS)
def test_every_numeric_flag_refuses_what_is_not_a_number_in_its_range_in_one_line(flag, value, capsys):
    with pytest.raises(SystemExit) as stopped:
        serve(["model.pt2", f"{flag}={value}"])
    assert stopped.value.code == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"error: argument {flag}: {value}: expected") and "\n" not in said, said


def test_a_batch_timeout_not_below_the_timeout_is_refused(capsys):
    with pytest.raises(SystemExit):
        serve(["model.pt2", "--batch_timeout", "5", "--timeout", "5"])
    said = capsys.readouterr().err.strip()
    assert said.startswith("error: argument --batch_timeout: 5.0 is not less than --timeout 5.0") and "\n" not in said


def png(side: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    written = io.BytesIO()
    Image.fromarray(pixels).save(written, format="PNG")
    return written.getvalue()


def start(folder: Path, *flags: str, session: bool = False) -> tuple[subprocess.Popen, int, Path]:
    """A server of ``folder/model.pt2``, ready; ``session``: in a session of its own, whose processes are its."""
    port = free_port()
    log_path = folder / f"server-{port}.log"
    log = log_path.open("w+b")
    command = [sys.executable, "-m", "lightning_kit.serve", "model.pt2", "--port", str(port), *flags]
    server = subprocess.Popen(
        command, cwd=folder, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=session
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", server, log)
    except BaseException:
        server.kill()
        server.wait()
        raise
    return server, port, log_path


def stopped_under_load(folder: Path, body: bytes, clients: int, stagger: float, delay: float, group: bool = False):
    """Start a server, start ``clients`` clients ``stagger`` seconds apart, each sending ``body`` on a connection of
    its own, SIGTERM the server (``group``: every process of its session, as SLURM and systemd stop a job) ``delay``
    seconds after the first: what each client got, the exit status, the log."""
    server, port, log_path = start(folder, session=group)
    outcomes: Counter = Counter()
    lock = threading.Lock()
    go = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        go.wait()
        time.sleep(stagger * index)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_GUARD_S)
        try:
            connection.request("POST", "/predict", body=body, headers={"Content-Type": "image/png"})
            response = connection.getresponse()
            response.read()
            outcome = response.status
        except OSError as err:
            outcome = type(err).__name__
        except http.client.HTTPException as err:
            outcome = type(err).__name__
        finally:
            connection.close()
        with lock:
            outcomes[outcome] += 1

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    try:
        for thread in threads:
            thread.start()
        go.wait()
        time.sleep(delay)
        if group:
            os.killpg(server.pid, signal.SIGTERM)
        else:
            server.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(HANG_GUARD_S)
        status = server.wait(HANG_GUARD_S)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return outcomes, status, log_path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("side", "clients", "stagger", "delay", "group"),
    [
        (SIDE, 40, 0.0, 0.05, False),
        (SIDE, 40, 0.02, 0.3, False),
        (2000, 12, 0.02, 0.1, False),
        (SIDE, 40, 0.02, 0.3, True),
    ],
    ids=["40-at-once", "40-through-the-stop", "12-large-images", "40-through-a-stop-of-its-whole-group"],
)
def test_sigterm_answers_every_request_it_took_and_refuses_the_rest(model_path, side, clients, stagger, delay, group):
    """SIGTERM while clients send: every connection the server took is answered (200, or 503/504 where it cannot
    be), the others are refused, never reset; the server exits 0, and its log has no traceback. SIGTERM to every
    process of the server at once too: its model process and LitServe's manager wait for the HTTP servers."""
    outcomes, status, log = stopped_under_load(model_path.parent, png(side), clients, stagger, delay, group)
    print(f"{clients} clients of {side}x{side} images: {dict(outcomes)}, exit {status}")
    answered = {key: count for key, count in outcomes.items() if key in (200, 503, 504)}
    refused = outcomes.get("ConnectionRefusedError", 0)
    assert sum(answered.values()) + refused == clients, outcomes
    assert answered.get(200, 0) > 0, outcomes
    assert status == 0, log[-2000:]
    assert "Traceback" not in log and "BrokenPipeError" not in log and "ConnectionResetError" not in log, log[-3000:]
    lines = log.splitlines()
    assert any(line.startswith("ready: serving model.pt2 at http://127.0.0.1:") for line in lines), lines
    assert lines.index(next(line for line in lines if line.startswith("ready"))) > 1  # after what it was doing


@pytest.mark.skipif(sys.platform != "linux", reason="the filter is Linux's socket filter")
def test_a_port_stopping_completes_the_handshakes_it_answered_and_refuses_the_rest():
    """What the server does to its port on SIGTERM: connections whose handshake completed stay queued to be taken;
    a new one's SYN is not answered, and once the port is shut that client is refused (on its SYN sent again), never
    reset, whatever moment of the shutdown it came in."""
    from lightning_kit.serve.stopping import drop_new_handshakes

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        taken = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
        drop_new_handshakes(listener)
        outcomes = []

        def connect() -> None:
            late = socket.socket()
            late.settimeout(HANG_GUARD_S)
            try:
                late.connect(("127.0.0.1", port))
                outcomes.append("connected")
            except OSError as err:
                outcomes.append(type(err).__name__)
            finally:
                late.close()

        client = threading.Thread(target=connect)
        client.start()
        time.sleep(0.2)  # its SYN has come and gone unanswered: not queued
        listener.setblocking(False)
        connection, _ = listener.accept()
        with pytest.raises(BlockingIOError):
            listener.accept()
        connection.close()
        taken.close()
        listener.shutdown(socket.SHUT_RDWR)
    client.join(HANG_GUARD_S)
    assert outcomes == ["ConnectionRefusedError"]


@pytest.mark.slow
def test_the_server_says_what_it_does_until_it_is_ready(model_path):
    """Before `ready`, lines say it reads and checks the file and starts its workers; each comes at once. Once it
    says `ready`, its port takes connections (it was said a moment before the socket listened)."""
    with server_in_a_session(model_path.parent, "ready") as (server, log_path):
        try:
            waited_for(lambda: "\nready:" in log_path.read_text() or server.poll() is not None, "no 'ready'")
            port = int(log_path.read_text().split("\nready: ")[1].split(":")[2].split("/")[0])
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_GUARD_S)
            connection.request("GET", "/health")  # refused, were the port not listening yet
            assert connection.getresponse().status == 200
            connection.close()
            lines = log_path.read_text().splitlines()
        finally:
            server.send_signal(signal.SIGTERM)
            assert server.wait(HANG_GUARD_S) == 0
    assert lines[0] == f"reading model.pt2 and checking it ({byte_size(model_path.stat().st_size)})"
    assert lines[1].startswith("checked model.pt2: a model of images, resized to 32x32, answering 10 classes")
    assert lines[2].startswith("starting 1 model worker on cpu")
    assert lines[3] == f"ready: serving model.pt2 at http://127.0.0.1:{port}/predict"


def sessions_live_processes(session: int) -> dict[int, str]:
    """The processes of ``session`` (a session leader's pid) that have not exited: their command lines by pid."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it exited meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if fields[0] != "Z" and int(fields[3]) == session:
            found[int(stat.parent.name)] = command
    return found


@contextlib.contextmanager
def server_in_a_session(folder: Path, name: str) -> Iterator[tuple[subprocess.Popen, Path]]:
    """``python -m lightning_kit.serve model.pt2`` in ``folder``, in a session of its own, its output in a log.

    The body ends with the server. Then every process it started must end too, by itself; should the test
    fail first, every process of the session is killed.
    """
    port = free_port()
    log_path = folder / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "lightning_kit.serve", "model.pt2", "--port", str(port)],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its processes are found by the session
        )
    try:
        yield server, log_path
        deadline = time.monotonic() + HANG_GUARD_S
        while left := sessions_live_processes(server.pid):
            assert time.monotonic() < deadline, f"processes the server started still run after it: {left}"
            time.sleep(0.05)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for pid in sessions_live_processes(server.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def waited_for(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {HANG_GUARD_S} s"
        time.sleep(0.001)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the processes of a session from /proc")
def test_a_sigterm_at_any_moment_of_the_start_up_stops_the_server_and_every_process_it_started(model_path):
    """SIGTERM from the moment the server says it starts its workers until it is ready: it stops with 0, says so,
    never goes on to serve, and leaves no process running.

    The handler once raised KeyboardInterrupt in the main thread wherever it was: inside a finalizer, it was
    dropped (the server went on to serve and ignored SIGTERM); inside LitServe's start-up, the process died of it.
    """
    for delay in (0.0, 0.003, 0.008, 0.02, 0.2):
        with server_in_a_session(model_path.parent, "early") as (server, log_path):
            waited_for(lambda: "starting" in log_path.read_text() or server.poll() is not None, "no 'starting'")
            time.sleep(delay)
            server.send_signal(signal.SIGTERM)
            status = server.wait(HANG_GUARD_S)
        lines = log_path.read_text(errors="replace").splitlines()
        assert status == 0, (delay, lines)
        assert "Traceback" not in lines and not any("Exception ignored" in line for line in lines), (delay, lines)
        stopping = lines.index("stopping: answering the requests taken, refusing new connections")
        assert not any(line.startswith("ready") for line in lines[stopping:]), (delay, lines)
        assert lines[-1] == "stopped serving model.pt2", (delay, lines)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the processes of a session from /proc")
def test_a_model_worker_killed_while_it_loads_stops_the_server_with_one_line(model_path):
    """LitServe waits for a model worker to say it is ready or failed: one killed before (the OOM killer, say) left
    the server waiting for ever. Now it stops with one line saying how the worker ended, and every process ends."""
    with server_in_a_session(model_path.parent, "killed") as (server, log_path):

        def workers() -> list[int]:
            assert server.poll() is None, log_path.read_text()
            return [pid for pid, command in sessions_live_processes(server.pid).items() if WORKER in command]

        waited_for(workers, "no model worker")
        os.kill(workers()[0], signal.SIGKILL)
        status = server.wait(HANG_GUARD_S)
    lines = log_path.read_text(errors="replace").splitlines()
    assert status == 1, lines
    assert lines[-1] == (
        "error: a model worker failed to load model.pt2 (killed by SIGKILL); the server stopped before serving"
    ), lines
    assert not any(line.startswith("ready") for line in lines), lines


# How a model worker's command line ends: a process spawned by multiprocessing (and not its resource tracker).
WORKER = "multiprocessing.spawn import spawn_main"
