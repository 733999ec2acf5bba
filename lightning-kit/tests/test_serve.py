"""The served model over real HTTP: the predict command's answers, 4xx for bad requests, batching, a clean stop.

One server (``python -m lightning_kit.serve MODEL``) serves every kind of model: what a request
holds, an image file, JSON token ids or JSON tensors by name, is what the model file records. The
tests that differ by kind run on a model of each project: ``image_project``'s (images) and
``sequence_project``'s (tokens); and on a small network of two inputs by keyword, exported untrained
(tensors).
"""

import csv
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HANG_GUARD_S, png_header, wait_until_healthy
from conftest import _free_port as free_port
from image_project.cli import ProjectCLI as ImageCLI
from image_project.cli import main as train_image
from PIL import Image
from sequence_project.cli import ProjectCLI as SequenceCLI
from sequence_project.cli import main as train_sequence
from torch import nn

from lightning_kit.cli import GenericCLI
from lightning_kit.export import IMAGES, TENSORS, TOKENS
from lightning_kit.export import export as export_model
from lightning_kit.export import main as export
from lightning_kit.model_format import TensorInput
from lightning_kit.serve import ModelInfo, read_model, tensors
from lightning_kit.serve.command import GENERIC_COMMAND, model_file, parser
from lightning_kit.serve.command import main as serve

pytest.importorskip("litserve", reason='serving needs LitServe: pip install -e ".[serve]"')

# The test server's limits, small enough to reach with small requests.
MAX_BODY_BYTES = 100_000
MAX_PIXELS = 1_000_000


@dataclass(frozen=True)
class Project:
    """A baked project whose model is served: its command line and its train.py."""

    task: str
    cli_class: type
    train: object


PROJECTS = {
    "image": Project("image", ImageCLI, train_image),
    "sequence": Project("sequence", SequenceCLI, train_sequence),
}


@dataclass(frozen=True)
class Exported:
    """A folder with a copy of a project's short run and its exported model.pt2."""

    folder: Path
    project: Project


def export_project(task: str, trained: Path, tmp_path_factory) -> Exported:
    """A copy of the short run of ``task``'s project in ``trained``, exported to model.pt2."""
    project = PROJECTS[task]
    folder = tmp_path_factory.mktemp(f"serve-{task}")
    shutil.copytree(trained / "runs", folder / "runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        export(["--ckpt_path", "last", "--output", "model.pt2", "--onnx", "no"], cli_class=project.cli_class)
    return Exported(folder, project)


# One export and one server per project for the module, both alive at once: tests of either project come in
# any order (xdist hands them out one by one), and a single parametrized fixture would be torn down and set
# up again (an export and a server's start, about 12 s) at every change of project.
@pytest.fixture(scope="module")
def exported_image(trained_once, tmp_path_factory) -> Exported:
    return export_project("image", trained_once, tmp_path_factory)


@pytest.fixture(scope="module")
def exported_sequence(trained_sequence_once, tmp_path_factory) -> Exported:
    return export_project("sequence", trained_sequence_once, tmp_path_factory)


@pytest.fixture(params=sorted(PROJECTS))
def exported(request) -> Exported:
    """For each project (or the one a test names): a copy of its short run, exported to model.pt2."""
    return request.getfixturevalue(f"exported_{request.param}")


def start_server(folder: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """``python -m lightning_kit.serve model.pt2`` in ``folder`` on a free port, once its /health answers; and its
    address. The library's own command: it needs no project to serve a model file."""
    port = free_port()
    command = [sys.executable, "-m", "lightning_kit.serve", "model.pt2", "--port", str(port), *flags]
    log = (folder / f"server-{port}.log").open("w+b")
    server = subprocess.Popen(command, cwd=folder, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server, log)
    except BaseException:
        server.kill()
        server.wait()
        raise
    return server, url


def stop(server: subprocess.Popen) -> int:
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(HANG_GUARD_S)
    finally:
        if server.poll() is None:
            server.kill()


def serve_exported(exported: Exported) -> Iterator[str]:
    """A server of the exported model, with small limits and batches of up to 4 gathered for up to 0.1 s."""
    flags = ["--max_batch_size", "4", "--batch_timeout", "0.1", "--max_body_bytes", str(MAX_BODY_BYTES)]
    flags += ["--max_pixels", str(MAX_PIXELS)]
    process, url = start_server(exported.folder, *flags)
    yield url
    stop(process)


@pytest.fixture(scope="module")
def server_image(exported_image) -> Iterator[str]:
    yield from serve_exported(exported_image)


@pytest.fixture(scope="module")
def server_sequence(exported_sequence) -> Iterator[str]:
    yield from serve_exported(exported_sequence)


@pytest.fixture
def server(request, exported) -> str:
    """The address of the server of ``exported``'s model."""
    return request.getfixturevalue(f"server_{exported.project.task}")


def request(url: str, body=b"", content_type: str | None = None, method: str = "POST", path: str = "/predict", **kw):
    """Send one request; its status, headers and JSON answer."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=HANG_GUARD_S)
    headers = {"Content-Type": content_type} if content_type else {}
    try:
        connection.request(method, path, body=body, headers=headers, **kw)
        response = connection.getresponse()
        return response.status, response.headers, json.loads(response.read())
    finally:
        connection.close()


def predicted(answer: dict) -> tuple[str, list[float]]:
    return answer["predicted"], list(answer["probabilities"].values())


def read_csv(path: Path) -> list[dict]:
    with path.open() as file:
        return list(csv.DictReader(file))


def encoded(pixels: torch.Tensor, format: str = "PNG", mode: str = "RGB") -> bytes:
    """Image file bytes of ``pixels`` (``uint8`` ``(H, W, 3)``)."""
    written = BytesIO()
    Image.fromarray(pixels.numpy()).convert(mode).save(written, format=format)
    return written.getvalue()


def sample_files() -> dict[str, bytes]:
    """Image files of several formats and sizes, none of them the model's size."""
    generator = torch.Generator().manual_seed(0)
    pixels = [
        torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
        for height, width in ((40, 50), (64, 64), (20, 31), (33, 33))
    ]
    return {
        "a.png": encoded(pixels[0]),
        "b.jpg": encoded(pixels[1], "JPEG"),
        "c.png": encoded(pixels[2], mode="L"),
        "d.bmp": encoded(pixels[3], "BMP"),
    }


IMAGE = (encoded(torch.zeros(32, 32, 3, dtype=torch.uint8)), "image/png")


def form(*files: tuple[str, bytes], boundary: str = "b0undary") -> tuple[bytes, str]:
    """A multipart form body holding ``files`` (named ``file``), and its Content-Type."""
    head = '--{}\r\nContent-Disposition: form-data; name="file"; filename="{}"\r\nContent-Type: image/png\r\n\r\n'
    parts = [head.format(boundary, name).encode() + data + b"\r\n" for name, data in files]
    body = b"".join(parts) + f'--{boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\nhi\r\n'.encode()
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_image_answers_equal_the_predict_command(exported, server):
    """Each image file, as the body or as a form's file, is answered as `predict` answers it in its CSV."""
    files = sample_files()
    folder = exported.folder / "inputs"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(exported.folder)
        train_image(
            ["predict", "--ckpt_path", "last", "--data.predict_path", "inputs", "--predictions.path", "out.csv"]
        )
    rows = {Path(row["file"]).name: row for row in read_csv(exported.folder / "out.csv")}
    assert sorted(rows) == sorted(files)
    for name, data in files.items():
        expected = [float(value) for key, value in rows[name].items() if key.startswith("p_")]
        for body, content_type in [(data, "image/whatever"), form((name, data))]:
            status, _, answer = request(server, body, content_type)
            assert status == 200, answer
            assert answer["predicted"] == rows[name]["predicted"]
            assert list(answer["probabilities"]) == [key.removeprefix("p_") for key in rows[name] if key[:2] == "p_"]
            assert predicted(answer)[1] == pytest.approx(expected, abs=2e-6)


def bad_image_requests() -> list[tuple[str, bytes, str | None, int]]:
    """(what, body, Content-Type, the status expected) of requests the server must refuse."""
    good = encoded(torch.zeros(40, 40, 3, dtype=torch.uint8))
    return [
        ("not an image", b"hello, this is text", "image/png", 400),
        ("a truncated image", good[: len(good) // 2], "image/png", 400),
        ("an empty body", b"", "image/png", 400),
        ("an empty body without a type", b"", None, 400),
        ("a decompression bomb", png_header(100_000, 100_000), "image/png", 413),
        ("more pixels than --max_pixels", encoded(torch.zeros(1001, 1000, 3, dtype=torch.uint8)), "image/png", 413),
        ("a wrong content type", good, "text/plain", 415),
        ("a form without a file", form()[0], form()[1], 400),
        ("a form with two files", *form(("a.png", good), ("b.png", good)), 400),
        ("a body over --max_body_bytes", b"\0" * (MAX_BODY_BYTES + 1), "image/png", 413),
    ]


TOKENS_GOOD = (json.dumps({"tokens": [0, 1, 2, 3]}).encode(), "application/json")


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["sequence"], indirect=True)
def test_token_answers_equal_the_predict_command(exported, server):
    """Token sequences are answered as `predict` answers them in its CSV, whatever their length."""
    generator = np.random.default_rng(0)
    for length in (20, 32):
        tokens = generator.integers(0, 16, (3, length))
        np.savez(exported.folder / f"tokens{length}.npz", tokens=tokens)
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(exported.folder)
            path = ["--data.predict_path", f"tokens{length}.npz", "--predictions.path", f"out{length}.csv"]
            train_sequence(["predict", "--ckpt_path", "last", *path])
        rows = read_csv(exported.folder / f"out{length}.csv")
        assert len(rows) == len(tokens)
        for row, sequence in zip(rows, tokens.tolist(), strict=True):
            status, _, answer = request(server, json.dumps({"tokens": sequence}).encode(), "application/json")
            assert status == 200, answer
            assert answer["predicted"] == row["predicted"]
            assert list(answer["probabilities"]) == [key.removeprefix("p_") for key in row if key[:2] == "p_"]
            expected = [float(value) for key, value in row.items() if key.startswith("p_")]
            assert predicted(answer)[1] == pytest.approx(expected, abs=2e-6)


def bad_token_requests() -> list[tuple[str, bytes, str | None, int]]:
    """(what, body, Content-Type, the status expected) of requests the server must refuse."""
    return [
        ("a token id out of the vocabulary", b'{"tokens": [0, 1, 16]}', "application/json", 400),
        ("a negative token id", b'{"tokens": [0, -1]}', "application/json", 400),
        ("a sequence too long", json.dumps({"tokens": [0] * 33}).encode(), "application/json", 400),
        ("a sequence too short", b'{"tokens": [0]}', "application/json", 400),
        ("an empty sequence", b'{"tokens": []}', "application/json", 400),
        ("ids that are not whole numbers", b'{"tokens": [0, 1.5, true]}', "application/json", 400),
        ("a bare list", b"[0, 1, 2]", "application/json", 400),
        ("malformed JSON", b'{"tokens": [0, 1', "application/json", 400),
        ("not UTF-8", b'{"tokens": "\xff"}', "application/json", 400),
        ("an empty body", b"", "application/json", 400),
        ("a wrong content type", b'{"tokens": [0, 1]}', "text/plain", 415),
        ("a body over --max_body_bytes", b" " * (MAX_BODY_BYTES + 1), "application/json", 413),
    ]


# A good request to each project's model.
GOOD = {"image": IMAGE, "sequence": TOKENS_GOOD}
BAD_REQUESTS = [("image", *case) for case in bad_image_requests()] + [
    ("sequence", *case) for case in bad_token_requests()
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("exported", "what", "body", "content_type", "status"),
    BAD_REQUESTS,
    indirect=["exported"],
    ids=[f"{task}-{what}" for task, what, *_ in BAD_REQUESTS],
)
def test_a_bad_request_answers_its_4xx_and_the_server_keeps_serving(exported, server, what, body, content_type, status):
    """Each bad request answers its 4xx with a JSON detail, never a 500; a good request is answered after it."""
    answered, _, answer = request(server, body, content_type)
    assert (answered, type(answer.get("detail"))) == (status, str), answer
    if what in ("a decompression bomb", "more pixels than --max_pixels"):  # the server's limit, not Pillow's
        assert answer["detail"].endswith(f", more than {MAX_PIXELS:,}: send a smaller image"), answer
    assert request(server, *GOOD[exported.project.task])[0] == 200


@pytest.mark.slow
def test_an_oversized_body_without_a_length_is_refused_as_it_comes(exported, server):
    """A body sent in chunks, with no Content-Length, is refused with 413 once it passes --max_body_bytes."""
    good = GOOD[exported.project.task]
    chunks = (b"\0" * 10_000 for _ in range(MAX_BODY_BYTES // 10_000 + 5))
    status, _, answer = request(server, chunks, good[1], encode_chunked=True)
    assert (status, type(answer.get("detail"))) == (413, str)
    assert request(server, *good)[0] == 200


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/predict", 405), ("POST", "/nowhere", 404)])
def test_a_wrong_method_or_path_answers_as_the_framework_does(exported, server, method, path, status):
    """GET /predict is 405 and an unknown path 404, each with a JSON detail; /health says ok."""
    answered, _, answer = request(server, *GOOD[exported.project.task], method=method, path=path)
    assert (answered, type(answer.get("detail"))) == (status, str)
    host, port = server.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=HANG_GUARD_S)
    connection.request("GET", "/health")
    assert connection.getresponse().read() == b"ok"


def concurrently(url: str, requests: list[tuple[bytes, str]]) -> list[tuple[int, dict, dict]]:
    """Send ``requests`` at once, each from its own thread; each one's status, headers and answer, in order."""
    answers: list = [None] * len(requests)
    ready = threading.Barrier(len(requests))

    def send(index: int) -> None:
        ready.wait()
        status, headers, answer = request(url, *requests[index])
        answers[index] = (status, headers, answer)

    threads = [threading.Thread(target=send, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD_S)
    return answers


@pytest.mark.slow
def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(exported, server):
    """Requests sent at once reach the model in batches (X-Batch-Size), each answered as when sent alone; bad
    requests among them answer their 4xx without failing their batch-mates."""
    if exported.project.task == "image":
        generator = torch.Generator().manual_seed(1)
        goods = [
            (encoded(torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=generator)), "image/png")
            for _ in range(8)
        ]
        bad = (b"not an image", "image/png")
    else:
        tokens = [[index % 16, 1, 2, 3, 4, 5] for index in range(8)]
        goods = [(json.dumps({"tokens": sequence}).encode(), "application/json") for sequence in tokens]
        bad = (b'{"tokens": [99, 1]}', "application/json")
    alone = [request(server, *good)[2] for good in goods]
    answers = concurrently(server, [item for good in goods for item in (good, bad)])
    assert [status for status, _, _ in answers] == [200, 400] * len(goods)
    for (_, _, answer), expected in zip(answers[::2], alone, strict=True):  # batched, the sums round differently
        assert answer["predicted"] == expected["predicted"]
        assert predicted(answer)[1] == pytest.approx(predicted(expected)[1], abs=1e-6)
    sizes = [int(headers["X-Batch-Size"]) for _, headers, _ in answers[::2]]
    assert max(sizes) > 1 and all(1 <= size <= 4 for size in sizes), sizes


def answered(connection: http.client.HTTPConnection) -> int:
    """The status of the answer to the request sent on ``connection``, once it is read whole."""
    response = connection.getresponse()
    response.read()
    return response.status


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_sigterm_answers_the_requests_in_flight_then_exits_0(exported):
    """SIGTERM while requests wait for their batch: each is answered, and the server exits with status 0."""
    body, content_type = IMAGE
    process, url = start_server(exported.folder, "--max_batch_size", "64", "--batch_timeout", "2")
    host, port = url.removeprefix("http://").split(":")
    connections = [http.client.HTTPConnection(host, int(port), timeout=HANG_GUARD_S) for _ in range(4)]
    try:
        for connection in connections:  # accepted: a request in flight is one the server has read
            connection.request("POST", "/predict", body=body, headers={"Content-Type": content_type})
        answers = []
        for connection in connections:
            answers.append(answered(connection))
            connection.request("POST", "/predict", body=body, headers={"Content-Type": content_type})
        # The four wait up to 2 s for a batch of 64 to fill; SIGTERM comes meanwhile, once the last was sent.
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        answers += [answered(connection) for connection in connections]
        assert answers == [200] * 8
        assert process.wait(HANG_GUARD_S) == 0
    finally:
        for connection in connections:
            connection.close()
        if process.poll() is None:
            process.kill()
            process.wait()


def model_of_inputs(path: Path, inputs: torch.Tensor, description: dict) -> None:
    """Write a .pt2 file as the export writes it, of a model that takes ``inputs``, described by ``description``."""
    program = torch.export.export(torch.nn.Flatten(), (inputs,))
    extra = {"class_names.json": '["a", "b"]', "input.json": json.dumps(description)}
    torch.export.save(program, path, extra_files=extra)


def rewritten(source: Path, target: Path, changed: dict[str, bytes], added: dict[str, bytes]) -> None:
    """Copy the .pt2 archive ``source`` to ``target``: the entries ending in a key of ``changed`` hold its bytes,
    and the entries ``added`` (named inside the archive's folder) are added."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as written:
        folder = archive.namelist()[0].split("/")[0]
        for item in archive.infolist():
            ending = next((end for end in changed if item.filename.endswith(end)), None)
            written.writestr(item, changed[ending] if ending else archive.read(item))
        for name, data in added.items():
            written.writestr(f"{folder}/{name}", data)


def bad_model_files(folder: Path) -> list[tuple[str, str]]:
    """(file, what its error line must say) for model files the server must refuse at start."""
    model = folder / "model.pt2"
    (folder / "folder.pt2").mkdir()
    (folder / "truncated.pt2").write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    (folder / "random.pt2").write_bytes(bytes(range(256)) * 64)
    (folder / "model.ckpt").write_bytes(model.read_bytes())
    floats = torch.zeros(2, 10)
    model_of_inputs(folder / "undecodable.pt2", floats, {"kind": "floats", "dtype": "float32", "shape": [2, 10]})
    ids = torch.zeros(2, 8, dtype=torch.long)
    model_of_inputs(folder / "mislabelled.pt2", ids, {"kind": IMAGES, "dtype": "int64", "shape": [2, 8]})
    rewritten(model, folder / "compiled.pt2", {}, {"data/aotinductor/model/model.so": b"\x7fELF"})
    opaque = {"config": {"net.thing": {"path_name": "opaque_obj_0", "use_pickle": False}}}
    constants = {"model_constants_config.json": json.dumps(opaque).encode()}
    rewritten(model, folder / "opaque.pt2", constants, {"data/constants/opaque_obj_0": b"cos\nsystem\n"})
    with zipfile.ZipFile(model) as archive:
        weights_file = next(name for name in archive.namelist() if name.endswith("model_weights_config.json"))
        weights = json.loads(archive.read(weights_file))
    for entry in weights["config"].values():
        entry["use_pickle"] = True
    rewritten(model, folder / "pickled.pt2", {"model_weights_config.json": json.dumps(weights).encode()}, {})
    refused = "only unpickling can load: refused, nothing was loaded"
    return [
        ("missing.pt2", "missing.pt2 does not exist"),
        ("folder.pt2", "folder.pt2 is a folder, not a file"),
        ("truncated.pt2", "truncated.pt2 is not an exported model"),
        ("random.pt2", "random.pt2 is not an exported model"),
        ("model.ckpt", "model.ckpt is not a .pt2 file"),
        ("undecodable.pt2", "neither images (uint8, (batch, 3, size, size)) nor token ids (int64, (batch, length))"),
        ("mislabelled.pt2", "takes int64 inputs of shape (2, 8) (its input.json says 'images'), neither images"),
        ("compiled.pt2", "model.so, which a plain exported program does not: refused, nothing was loaded"),
        ("opaque.pt2", refused),
        ("pickled.pt2", refused),
    ]


def test_a_bad_model_file_stops_the_server_with_one_line_before_the_port_is_taken(exported, tmp_path, monkeypatch):
    """A missing, folder, truncated, random, misnamed, undecodable or pickle-bearing model file: one line each."""
    shutil.copy(exported.folder / "model.pt2", tmp_path / "model.pt2")
    monkeypatch.chdir(tmp_path)
    port = free_port()
    for name, expected in bad_model_files(tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            serve([name, "--port", str(port)])
        message = str(exit_info.value.code)
        assert message.startswith(f"error: {name}") and expected in message and "\n" not in message, message
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # nothing took the port


@pytest.mark.slow
def test_a_checkpoint_is_served_through_a_temporary_export(exported, monkeypatch):
    """--ckpt_path last serves the newest run's checkpoint, exported by the project's command line into a
    temporary folder that goes afterwards."""
    monkeypatch.chdir(exported.folder)
    with model_file(parser().parse_args(["--ckpt_path", "last"]), [], exported.project.cli_class) as path:
        assert path.parent.parent.resolve() != exported.folder.resolve()
        assert read_model(path)[1] == replace(read_model(Path("model.pt2"))[1], path=path)
    assert not path.exists()


@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_a_port_in_use_is_one_line(exported, monkeypatch):
    """A port another program answers at stops the server at start with one line naming --port."""
    monkeypatch.chdir(exported.folder)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit, match=rf"^error: --port {port} on 127\.0\.0\.1 cannot be used"):
            serve(["model.pt2", "--port", str(port)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_a_gpu_asked_for_on_a_machine_without_one_is_one_line(exported, monkeypatch):
    """--accelerator gpu without a GPU stops at start with one line naming the flag."""
    monkeypatch.chdir(exported.folder)
    with pytest.raises(SystemExit, match=r"^error: --accelerator gpu was requested but no CUDA GPU was found"):
        serve(["model.pt2", "--accelerator", "gpu"])


def test_without_litserve_the_command_says_how_to_install_it(monkeypatch):
    """Without the serve extra, one line says how to install it."""
    monkeypatch.setitem(sys.modules, "litserve", None)
    with pytest.raises(SystemExit, match=r'^error: serving needs litserve, .*: pip install -e "\.\[serve\]"$'):
        serve(["model.pt2"])


EXPECTED_INFO = {
    "image": {"kind": IMAGES, "image_size": 32},
    "sequence": {"kind": TOKENS, "vocab_size": 16, "lengths": (2, 32)},
}


def test_the_model_file_says_what_a_request_holds(exported, tmp_path):
    """The server reads the kind of input from the file: a model of images, or of token ids and their lengths. A
    file exported before the kind was recorded is read by its inputs' type and shape."""
    info = read_model(exported.folder / "model.pt2")[1]
    expected = EXPECTED_INFO[exported.project.task]
    assert {key: getattr(info, key) for key in expected} == expected
    with zipfile.ZipFile(exported.folder / "model.pt2") as archive:
        name = next(name for name in archive.namelist() if name.endswith("extra/input.json"))
        described = json.loads(archive.read(name))
    del described["kind"], described["varies"]
    unrecorded = tmp_path / "unrecorded.pt2"
    rewritten(exported.folder / "model.pt2", unrecorded, {"extra/input.json": json.dumps(described).encode()}, {})
    assert read_model(unrecorded)[1] == replace(info, path=unrecorded)


@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_a_projects_server_names_its_own_export_command(exported, monkeypatch):
    """Run with the project's command line, a model file that is not there names the project's export command."""
    monkeypatch.chdir(exported.folder)
    with pytest.raises(SystemExit) as exit_info:
        serve(["missing.pt2"], cli_class=ImageCLI)
    assert (
        str(exit_info.value.code)
        == "error: missing.pt2 does not exist: export a checkpoint with python -m image_project.export"
    )
    with pytest.raises(SystemExit) as exit_info:
        serve(["missing.pt2"])
    assert str(exit_info.value.code).endswith("export a checkpoint with python -m lightning_kit.export")


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_the_projects_serve_command_exports_its_checkpoint_in_a_fresh_process(exported):
    """``python -m image_project.serve --ckpt_path last``: the project's thin command exports the newest run's
    checkpoint with its own command line, then stops at a port in use with one line naming --port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "image_project.serve", "--ckpt_path", "last", "--port", str(port)],
            cwd=exported.folder,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    assert "to serve it" in done.stdout, done.stderr[-3000:]
    assert done.returncode == 1 and done.stderr.strip().startswith(f"error: --port {port} on 127.0.0.1"), done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_a_sigterm_while_the_checkpoint_is_exported_stops_with_0_and_leaves_no_export(exported, tmp_path):
    """SIGTERM while ``--ckpt_path`` is being exported: the server does not start, exits 0, and the temporary
    export is removed (the signal used to end the process there, leaving the folder in the temporary files)."""
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "image_project.serve", "--ckpt_path", "last", "--port", str(free_port())],
            cwd=exported.folder,
            env={**os.environ, "TMPDIR": str(temporary)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while "exporting" not in log_path.read_text() and server.poll() is None:
            assert time.monotonic() < deadline, "the command never said it was exporting"
            time.sleep(0.01)
        server.send_signal(signal.SIGTERM)
        status = server.wait(HANG_GUARD_S)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    lines = log_path.read_text().splitlines()
    assert status == 0 and "Traceback" not in lines, lines
    assert lines[0] == "exporting runs/lightning_logs/version_0/checkpoints/last.ckpt to serve it", lines
    assert lines[-1].startswith("stopped by SIGTERM before serving "), lines
    assert not any(line.startswith(("starting", "ready")) for line in lines), lines
    assert not list(temporary.iterdir()), "the temporary export was left behind"


# What a server's processes import: the command (``python -m lightning_kit.serve``, which each model process
# spawned imports again), the API a model process unpickles, and what the HTTP servers read requests with.
SERVER_IMPORTS = """
import sys
from lightning_kit.serve.command import main
from lightning_kit.serve.api import Model
from lightning_kit.serve.inputs import InputReader
from lightning_kit.serve import read_model
read_model(sys.argv[1])
heavy = ("lightning.pytorch", "lightning.fabric", "torchmetrics", "torchvision")
print(sorted(name for name in heavy if name in sys.modules))
"""


@pytest.mark.parametrize("exported", ["image"], indirect=True)
def test_serving_a_model_file_imports_no_lightning(exported):
    """A model file is served with PyTorch and LitServe alone: no Lightning, torchmetrics or torchvision is imported
    (each process of the server imports in about 4 CPU-s instead of 6.5); ``--ckpt_path`` brings them in."""
    done = subprocess.run(
        [sys.executable, "-c", SERVER_IMPORTS, str(exported.folder / "model.pt2")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
    assert GenericCLI.command == GENERIC_COMMAND  # what --help names, written down without importing the command line


class Stations(nn.Module):
    """A model of tensors: ``values`` (B, 2, 3) float32 and ``station`` (B,) int64, an id of 4 stations, by keyword
    (its example_input_array is a dict), answering a dict of ``mean`` (B, 2) and ``spread`` (B,)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(4, 3)
        self.head = nn.Linear(3, 1)
        self.example_input_array = {"values": torch.randn(2, 2, 3), "station": torch.tensor([0, 3])}

    def forward(self, values: torch.Tensor, station: torch.Tensor) -> dict[str, torch.Tensor]:
        features = values + self.embedding(station)[:, None]  # (batch, 2, 3)
        return {"mean": self.head(features).squeeze(-1), "spread": features.std(dim=(1, 2))}


@pytest.fixture(scope="module")
def exported_tensors(tmp_path_factory) -> tuple[Path, nn.Module]:
    """A folder with the model.pt2 of an untrained ``Stations``, and the model."""
    folder = tmp_path_factory.mktemp("serve-tensors")
    torch.manual_seed(0)
    model = Stations().eval()
    export_model(model, None, folder / "model.pt2", onnx="no")
    return folder, model


@pytest.fixture(scope="module")
def server_tensors(exported_tensors) -> Iterator[str]:
    yield from serve_exported(Exported(exported_tensors[0], None))


def tensor_body(values, station) -> tuple[bytes, str]:
    return json.dumps({"values": values, "station": station}).encode(), "application/json"


def test_the_model_file_says_which_tensors_a_request_holds(exported_tensors, monkeypatch):
    """A model of tensors: its inputs by name, dtype and shape per example, by keyword, and what it answers; a
    --max_body_bytes that no example's JSON could fit in is refused at start, in one line."""
    folder, _ = exported_tensors
    info = read_model(folder / "model.pt2")[1]
    assert (info.kind, info.class_names, info.by_keyword) == (TENSORS, (), True)
    # The number of rows of values is free (the model takes any), from 2 as torch.export makes every such size.
    assert [str(spec) for spec in info.inputs] == ["values (float32, (2 or more)x3)", "station (int64, one number)"]
    assert (info.answers, info.index_rows) == ("a dict of mean (any,), spread ()", (None, 4))
    monkeypatch.chdir(folder)
    with pytest.raises(SystemExit) as stopped:
        serve(["model.pt2", "--max_body_bytes", "10", "--port", str(free_port())])
    assert str(stopped.value.code) == (
        "error: model.pt2 takes at least 7 numbers per example, 13 bytes of JSON, more than --max_body_bytes 10: "
        "give a larger --max_body_bytes"
    )


@pytest.mark.slow
def test_tensor_answers_equal_the_models_and_are_batched(exported_tensors, server_tensors):
    """One example's JSON is answered with the model's outputs for it, a dict by name; examples sent at once reach
    the model in batches (X-Batch-Size), each answered with its own outputs."""
    _, model = exported_tensors
    generator = torch.Generator().manual_seed(1)
    values, station = torch.randn(6, 2, 3, generator=generator), torch.tensor([0, 1, 2, 3, 1, 0])
    with torch.no_grad():
        expected = model(values=values, station=station)
    bodies = [tensor_body(values[index].tolist(), int(station[index])) for index in range(6)]
    status, _, answer = request(server_tensors, *bodies[0])
    assert status == 200 and list(answer) == ["outputs"], answer
    assert answer["outputs"]["mean"] == pytest.approx(expected["mean"][0].tolist(), abs=1e-6)
    assert answer["outputs"]["spread"] == pytest.approx(expected["spread"][0].item(), abs=1e-6)
    answers = concurrently(server_tensors, bodies)
    for index, (status, _, answer) in enumerate(answers):
        assert status == 200, answer
        assert answer["outputs"]["mean"] == pytest.approx(expected["mean"][index].tolist(), abs=1e-5)
        assert answer["outputs"]["spread"] == pytest.approx(expected["spread"][index].item(), abs=1e-5)
    sizes = [int(headers["X-Batch-Size"]) for _, headers, _ in answers]
    assert max(sizes) > 1 and all(1 <= size <= 4 for size in sizes), sizes
    # Examples of another number of rows, which the model takes too, sent with these: each answered as forward does.
    longer = torch.randn(3, 5, 3, generator=generator)
    with torch.no_grad():
        expected_longer = model(values=longer, station=station[:3])
    bodies = [tensor_body(longer[index].tolist(), int(station[index])) for index in range(3)] + bodies[:3]
    answers = concurrently(server_tensors, bodies)
    for index, (status, _, answer) in enumerate(answers[:3]):
        assert status == 200, answer
        assert answer["outputs"]["mean"] == pytest.approx(expected_longer["mean"][index].tolist(), abs=1e-5)
    assert all(status == 200 for status, _, _ in answers[3:])


ROWS = [[0.5, 1.0, -2.0], [3.0, 0.0, 1.0]]  # one example of values, (2, 3)


def bad_tensor_requests() -> list[tuple[str, bytes, str | None, int]]:
    """(what, body, Content-Type, the status expected) of requests a model of tensors must refuse."""
    json_type = "application/json"
    return [
        ("an unknown input", json.dumps({"values": ROWS, "station": 1, "extra": 0}).encode(), json_type, 400),
        ("a missing input", json.dumps({"values": ROWS}).encode(), json_type, 400),
        ("a ragged list", tensor_body([[0.5, 1.0, -2.0], [3.0, 0.0]], 1)[0], json_type, 400),
        ("too few rows", tensor_body(ROWS[:1], 1)[0], json_type, 400),
        ("a batch, not one example", tensor_body([ROWS, ROWS], 1)[0], json_type, 400),
        ("nesting deeper than the shape", tensor_body([[[0.5], [1.0], [2.0]], ROWS[1]], 1)[0], json_type, 400),
        ("a string", tensor_body([["0.5", 1.0, -2.0], ROWS[1]], 1)[0], json_type, 400),
        ("a boolean for a float", tensor_body([[True, 1.0, -2.0], ROWS[1]], 1)[0], json_type, 400),
        ("NaN", b'{"values": [[NaN, 1, 2], [3, 4, 5]], "station": 1}', json_type, 400),
        ("Infinity", b'{"values": [[Infinity, 1, 2], [3, 4, 5]], "station": 1}', json_type, 400),
        ("a float that overflows", b'{"values": [[1e999, 1, 2], [3, 4, 5]], "station": 1}', json_type, 400),
        ("a float past float32", tensor_body([[1e39, 1.0, -2.0], ROWS[1]], 1)[0], json_type, 400),
        ("a float for an integer", tensor_body(ROWS, 1.5)[0], json_type, 400),
        ("a whole float for an integer", tensor_body(ROWS, 1.0)[0], json_type, 400),
        ("a boolean for an integer", tensor_body(ROWS, True)[0], json_type, 400),
        ("an integer past int64", tensor_body(ROWS, 2**70)[0], json_type, 400),
        ("an id past the embedding", tensor_body(ROWS, 4)[0], json_type, 400),
        ("a negative id", tensor_body(ROWS, -1)[0], json_type, 400),
        ("a list for a number", tensor_body(ROWS, [1])[0], json_type, 400),
        ("null", tensor_body(ROWS, None)[0], json_type, 400),
        ("nesting past the parser", b"[" * 50_000, json_type, 400),
        ("a bare list", b"[1, 2]", json_type, 400),
        ("malformed JSON", b'{"values": [[0.5, 1', json_type, 400),
        ("not UTF-8", b'{"values": "\xff"}', json_type, 400),
        ("an empty body", b"", json_type, 400),
        ("a wrong content type", tensor_body(ROWS, 1)[0], "text/plain", 415),
        ("a body over --max_body_bytes", b" " * (MAX_BODY_BYTES + 1), json_type, 413),
    ]


@pytest.mark.slow
def test_a_bad_tensor_request_answers_its_4xx_and_the_server_keeps_serving(server_tensors):
    """Each body a model of tensors cannot take answers its 4xx with a JSON detail, never a 500, before it reaches
    the model; a good request is answered after them. (One test for them all: each good request waits for its
    batch, and these are many.)"""
    wrong = {}
    for what, body, content_type, status in bad_tensor_requests():
        answered, _, answer = request(server_tensors, body, content_type)
        if (answered, type(answer.get("detail"))) != (status, str):
            wrong[what] = (answered, answer)
    assert not wrong, wrong
    assert request(server_tensors, *tensor_body(ROWS, 1))[0] == 200


@pytest.mark.slow
def test_the_load_test_runs_against_a_server_of_tensors(exported_tensors, server_tensors):
    """The maintainers' load test (``benchmarks/serve_load.py``, not installed): bodies sampled from the recorded
    inputs, each answered 200, against the model called directly on the same inputs."""
    script = Path(__file__).resolve().parents[1] / "benchmarks/serve_load.py"
    command = [sys.executable, script, "model.pt2", "--url", server_tensors, "--requests", "40", "--concurrency", "4"]
    run = subprocess.run(
        command, cwd=exported_tensors[0], capture_output=True, text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    said = "40 requests of JSON examples of values (float32, (2 or more)x3), station (int64, one number), 4 at a time"
    assert said in run.stdout
    assert f"the server at {server_tensors}: " in run.stdout and "requests/s" in run.stdout, run.stdout


@pytest.mark.parametrize(
    ("dtype", "good", "bad", "said"),
    [
        ("bool", [True, False], [True, 1], "takes true or false: it holds 1 (a number)"),
        ("uint8", [0, 255], [0, 256], "holds 256: outside the range of uint8 (0 to 255)"),
        ("int32", [-(2**31), 7], [0, 2**31], "holds 2147483648: outside the range of int32"),
        ("float16", [65504, -0.5], [1.0, 70000.0], "holds 70000.0: float16 takes finite numbers from -6.55e+04"),
        ("bfloat16", [1, 2.5], [1, 10**400], "holds a number of 401 digits: bfloat16 takes finite numbers"),
        ("float64", [1e300, 2], [1, "2"], 'takes numbers (float64): it holds "2" (a string)'),
    ],
)
def test_each_dtype_takes_its_own_numbers(tmp_path, dtype, good, bad, said):
    """A request's numbers are checked against the dtype the file records, in the HTTP server, before the model: an
    example of them is stacked into the batch the program takes, of that dtype."""
    info = ModelInfo(tmp_path, (), TENSORS, inputs=(TensorInput("x", dtype, (2,)),))
    decoded = tensors.decode(json.dumps({"x": good}).encode(), info)
    (batch,), _ = tensors.arguments([decoded, decoded], info, "cpu")
    assert batch.dtype == getattr(torch, dtype) and batch.shape == (2, 2)
    assert batch[0].tolist() == pytest.approx(good)
    with pytest.raises(tensors.RequestError) as refused:
        tensors.decode(json.dumps({"x": bad}).encode(), info)
    assert refused.value.status == 400 and str(refused.value).startswith(f"x {said}"), refused.value


class Flattened(nn.Module):
    """A network that folds its time steps into the batch (``view(B * T, C)``): its program multiplies sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)
        self.example_input_array = torch.randn(2, 5, 3)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        batch, steps, channels = values.shape
        return self.layer(values.reshape(batch * steps, channels)).view(batch, steps * 2)


def test_a_program_that_does_arithmetic_on_its_sizes_is_served(tmp_path):
    """torch.export writes ``operator.mul`` of two sizes that vary into the program: its own arithmetic, read like
    an ATen operation, and the server answers what forward does, batched or alone."""
    model = Flattened().eval()
    export_model(model, None, tmp_path / "model.pt2", onnx="no")
    program, info = read_model(tmp_path / "model.pt2")
    values = torch.randn(3, 4, 3)
    examples = [tensors.decode(json.dumps({"values": row.tolist()}).encode(), info) for row in values]
    (batch,), _ = tensors.arguments(examples, info, "cpu")
    with torch.no_grad():
        answered = tensors.answers(program.module()(batch), 3)
        torch.testing.assert_close(torch.tensor(answered), model(values))


def test_a_program_that_answers_no_row_per_example_fails_its_batch_not_an_answer():
    """A program that drops the batch dimension of a batch of one answers no example a row of another's."""
    assert tensors.answers(torch.ones(1, 3), 1) == [[1.0, 1.0, 1.0]]
    with pytest.raises(ValueError, match=r"the model answered a tensor of shape \(3,\) for 1 examples, not one row"):
        tensors.answers(torch.ones(3), 1)


class Either(nn.Module):
    """A network that takes one of two branches by its weights, with torch.cond: a program with graphs of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)
        self.example_input_array = torch.randn(2, 3)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return torch.cond(self.layer.bias.sum() > 0, lambda x: self.layer(x), lambda x: -self.layer(x), (values,))


def test_a_program_of_torch_cond_is_served_its_branches_checked(tmp_path):
    """torch.cond's branches are graphs beside the program's: read as it is, each calling ATen operations alone."""
    model = Either().eval()
    export_model(model, None, tmp_path / "model.pt2", onnx="no")
    program, info = read_model(tmp_path / "model.pt2")
    values = torch.randn(3, 3)
    examples = [tensors.decode(json.dumps({"values": row.tolist()}).encode(), info) for row in values]
    (batch,), _ = tensors.arguments(examples, info, "cpu")
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(tensors.answers(program.module()(batch), 3)), model(values))
