"""The placement check (``python -m lightning_kit.lint_placement``, a project's pre-commit hook no-manual-placement)
finds every way of naming a device in code, names its file and line, and leaves device-agnostic code alone.

That a project's own code places nothing by hand is the project's test (the template's tests);
these test the check, on planted files and on the library's own sources.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

from lightning_kit import guide, lint_placement

# The library's folder: src/lightning_kit holds its sources, and no train.py.
LIBRARY = Path(__file__).resolve().parents[1]
PACKAGE = LIBRARY / "src" / "lightning_kit"
# The library's modules that play Lightning's part, so place by hand, and are exempt.
EXEMPT = [
    PACKAGE / "gpu_audit" / "simulated",
    PACKAGE / "gpu_audit" / "lightning.py",
    PACKAGE / "gpu_audit" / "batches.py",
    PACKAGE / "bench.py",
]
HOOK = "def transfer_batch_to_device(self, batch, device, dataloader_idx):\n    return "


@pytest.mark.parametrize(
    "source",
    [
        # Moving a tensor or a module.
        "model.cuda()",
        "x = batch.cpu()",
        "x = x.xpu()",
        "x = x.cuda(non_blocking=True)",
        "model.apply(lambda m: m.cuda())",
        "xs = list(map(torch.Tensor.cuda, xs))",
        "x = getattr(x, 'cuda')()",
        # .to() with a device: written in, an index, or a variable or attribute holding one.
        "x = x.to(device)",
        "x = x.to(self.device)",
        "x = x.to(x.device)",
        "x = x.to('cpu')",
        "x = x.to('mps')",
        "x = x.to(0)",
        "x = x.to(local_rank)",
        "x = x.to(f'cuda:{rank}')",
        "x = x.to(device='cuda:0')",
        "x = x.to(torch.device('cuda'), torch.float16)",
        "x = x.to(device, non_blocking=True)",
        f"{HOOK}batch.to('cuda')",  # a device written in, even in the hook that hands one over
        # torch.device of an accelerator or an index.
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
        "device = torch.device(0)",
        "device = torch.device('cuda', 0)",
        "device = torch.device(type='cuda')",
        "device = torch.device(f'cuda:{rank}')",
        "with torch.device('cuda'):\n    x = torch.zeros(3)",
        # A device written into a call.
        "x = torch.zeros(3, device='cuda')",
        "x = torch.zeros(3, device='cuda:1')",
        "x = torch.zeros(3, device='cpu')",
        "x = torch.arange(8, device=0)",
        "x = torch.zeros(3, device=local_rank)",
        "generator = torch.Generator(device='cuda')",
        "net = nn.DataParallel(net, device_ids=[0, 1], output_device=0)",
        "net = DistributedDataParallel(net, device_ids=[self.local_rank])",
        "with torch.autocast('cuda'):\n    y = net(x)",
        "with torch.autocast(device_type='cuda'):\n    y = net(x)",
        # Loading onto an accelerator.
        "state = torch.load(path, map_location='cuda')",
        "state = torch.load(path, map_location=0)",
        "state = torch.load(path, map_location=torch.device('cuda', 0))",
        "state = torch.load(path, map_location={'cpu': 'cuda:0'})",
        # Transfers by hand.
        "target.copy_(source, non_blocking=True)",
        # The global default device, and the current GPU.
        "torch.set_default_device('cuda')",
        "torch.set_default_device(device)",
        "torch.set_default_tensor_type(torch.cuda.FloatTensor)",
        "torch.set_default_tensor_type('torch.cuda.FloatTensor')",
        "torch.cuda.set_device(1)",
        "with torch.cuda.device(1):\n    x = torch.zeros(3)",
        "index = torch.cuda.current_device()",
        # The legacy CUDA tensor types.
        "x = x.type(torch.cuda.FloatTensor)",
        "x = x.type('torch.cuda.HalfTensor')",
        "x = torch.cuda.LongTensor(3)",
    ],
)
def test_the_placement_check_finds_every_way_of_naming_a_device(tmp_path, source):
    """Each form is found once, at its file and line, with the fix and the rule of the placement guide that explains
    it, which the command it names prints."""
    planted = tmp_path / "planted.py"
    planted.write_text(f"import torch\n\n{source}\n", encoding="utf-8")
    line = 4 if source.startswith(HOOK) else 3
    found = lint_placement.check([planted])
    assert len(found) == 1, found
    assert found[0].startswith(f"{planted}:{line}: `"), found
    cited = re.search(r"\((rules? [\d to]+): python -m lightning_kit\.guide (\d+)(?:-(\d+))?\)$", found[0])
    assert cited is not None, found
    assert guide.rules(int(cited[2]), int(cited[3] or cited[2])).startswith(f"## {cited[2]}. "), cited


@pytest.mark.parametrize(
    "source",
    [
        # The device taken from the data or the module.
        "x = torch.arange(n, device=x.device)",
        "x = torch.zeros(3, device=self.device)",
        "ema = torch.zeros(3, device=pl_module.device)",
        "generator = torch.Generator(device=images.device)",
        "device = torch.device(x.device)",
        "def positions(n, device):\n    return torch.arange(n, device=device)",
        "x = x.new_zeros(3)",
        "y = x.type_as(z)",
        "self.register_buffer('positions', torch.arange(8))",
        "with torch.autocast(device_type=x.device.type):\n    y = net(x)",
        # Conversions of the dtype or the layout, not the device.
        "x = x.to(torch.float16)",
        "x = x.to(x.dtype)",
        "x = x.to(dtype)",
        "x = x.to(memory_format=torch.channels_last)",
        "x = x.type(torch.float16)",
        "x = x.float()",
        # In the hook where Lightning hands over the device (rule 1).
        f"{HOOK}MyBatch(batch.x.to(device), batch.y.to(device, non_blocking=True))",
        # Loading onto the CPU: Lightning moves the model afterwards.
        "state = torch.load(path, map_location='cpu')",
        "state = torch.load(path, map_location=torch.device('cpu'))",
        "state = torch.load(path, map_location={'cuda:0': 'cpu'})",
        # Pinned memory stays host memory: only Lightning's copy to the GPU gets faster.
        "loader = DataLoader(dataset, batch_size=32, pin_memory=True)",
        "x = x.pin_memory()",
        # Asking about devices, and modules named cuda or cpu.
        "ok = torch.cuda.is_available()",
        "state = torch.cuda.get_rng_state_all()",
        "torch.backends.cuda.matmul.allow_tf32 = True",
        "capability = torch.backends.cpu.get_cpu_capability()",
        "trainer = L.Trainer(accelerator='gpu', devices=2)",
        "workers = os.cpu_count()",
        # Words in strings and comments.
        "help = 'never .cuda() or .to(device)'  # x.cuda()",
    ],
)
def test_the_placement_check_leaves_device_agnostic_code_alone(tmp_path, source):
    planted = tmp_path / "planted.py"
    planted.write_text(f"import torch\n\n{source}\n", encoding="utf-8")
    assert lint_placement.check([planted]) == []


MODEL = "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
FORWARD = "class Net(nn.Module):\n    def forward(self, x, lengths):\n"


@pytest.mark.parametrize(
    "source",
    [
        # Made from nothing where the model runs: forward, the steps, a batch or epoch hook, a function inside one.
        f"{FORWARD}        window = torch.hann_window(400)  # found\n        return torch.stft(x, 400, window=window)",
        f"{FORWARD}        return x + torch.arange(x.shape[1])  # found",
        f"{FORWARD}        return x + torch.randn(x.shape)  # found",
        f"{FORWARD}        return x * torch.tensor([0.5, 2.0])  # found",
        f"{FORWARD}        return x + torch.from_numpy(np.ones(3))  # found",
        f"{FORWARD}        return x[torch.LongTensor([0, 2])]  # found",
        "class Net(L.LightningModule):\n    def training_step(self, batch, i):\n"
        "        return self(batch).sum() + torch.zeros(3, dtype=torch.float16).sum()  # found",
        "class Net(L.LightningModule):\n    def _shared_step(self, batch):\n"
        "        mask = torch.ones(batch.shape[0], dtype=torch.bool)  # found\n        return batch[mask]",
        "class Net(L.LightningModule):\n    def on_validation_epoch_end(self):\n"
        "        total = torch.zeros(())  # found\n        self.log('n', total)",
        f"{FORWARD}        def positions(n):\n            return torch.arange(n)  # found\n        return positions(3)",
        # Kept as a plain attribute of a module: it stays on the CPU when the module moves.
        f"{MODEL}        self.mean = torch.tensor([0.5, 0.5, 0.5])  # found",
        "class Net(L.LightningModule):\n    def __init__(self):\n        self.weights = torch.ones(10)  # found",
        # A .cpu() whose value goes back into the device's computation, or into a collective (rule 12).
        f"{FORWARD}        mask = lengths.cpu()  # found\n        return x * mask",
        "class Net(L.LightningModule):\n    def training_step(self, batch, i):\n"
        "        self.log('loss', batch.sum().cpu(), sync_dist=True)  # found",
        f"{FORWARD}        lengths = lengths.to('cpu')  # found\n        return x / lengths",
    ],
)
def test_tensors_made_on_the_cpu_where_the_model_runs_on_its_device_are_found(tmp_path, source):
    """What a reader of forward and the steps sees at a glance: a tensor made there without the data's device, a
    tensor kept as a module's plain attribute, a .cpu() copy that meets the device's tensors again."""
    planted = tmp_path / "planted.py"
    planted.write_text(f"import torch\n{source}\n", encoding="utf-8")
    line = 1 + next(number for number, text in enumerate(source.splitlines(), 1) if text.endswith("# found"))
    found = lint_placement.check([planted])
    assert [entry.split(": ")[0] for entry in found] == [f"{planted}:{line}"], found
    assert re.search(r"python -m lightning_kit\.guide (2-3|3|6)\)$", found[0]), found


@pytest.mark.parametrize(
    "source",
    [
        # Given the data's device, or made outside the model's run (a dataset, a buffer, a parameter, __init__).
        f"{FORWARD}        return x + torch.arange(x.shape[1], device=x.device)",
        f"{FORWARD}        return x + torch.zeros(3, **self.factory)",
        f"{MODEL}        self.register_buffer('mean', torch.tensor([0.5, 0.5]))",
        f"{MODEL}        self.scale = nn.Parameter(torch.ones(3))",
        f"{MODEL}        mean = torch.tensor([0.5, 0.5])\n        self.register_buffer('mean', mean)",
        "class Data(L.LightningDataModule):\n    def __init__(self):\n        self.images = torch.rand(8, 3, 4, 4)",
        "class Points(Dataset):\n    def __getitem__(self, i):\n        return torch.randn(3)",
        "def make_batch(n):\n    return torch.randn(n, 3)",
        # A .cpu() copy that leaves the device's computation: detached, to host data, collected for the epoch's end.
        "class Net(L.LightningModule):\n    def validation_step(self, batch, i):\n"
        "        self.outputs.append(self(batch).argmax(1).cpu())",
        "class Net(L.LightningModule):\n    def validation_step(self, batch, i):\n"
        "        self.outputs.append(self(batch).detach().cpu())",
        "class Net(L.LightningModule):\n    def on_validation_epoch_end(self):\n"
        "        scores = torch.cat(self.outputs).cpu().numpy()",
        "class Net(L.LightningModule):\n    def on_validation_epoch_end(self):\n"
        "        score = f1_score(np.asarray(torch.cat(self.outputs).cpu()), self.labels)",
        # An argument PyTorch reads on the host (rule 13), as it is or through the name it is given.
        f"{FORWARD}        return pack_padded_sequence(x, lengths.cpu(), batch_first=True)",
        f"{FORWARD}        return nn.utils.rnn.pack_padded_sequence(x, lengths=lengths.cpu(), batch_first=True)",
        f"{FORWARD}        lengths = lengths.cpu()\n        return rnn.pack_padded_sequence(x, lengths, True)",
        f"{FORWARD}        return x.tensor_split(lengths.cpu())",
        f"{FORWARD}        return torch.tensor_split(x, lengths.to('cpu'))",
    ],
)
def test_tensors_made_where_the_cpu_is_right_are_left_alone(tmp_path, source):
    planted = tmp_path / "planted.py"
    planted.write_text(f"import torch\n{source}\n", encoding="utf-8")
    assert lint_placement.check([planted]) == []


def test_the_library_places_by_hand_only_where_it_plays_lightnings_part():
    """Lightning places everything; see the placement guide.

    Three parts of the library stand in for Lightning and are exempt: the simulated GPU and its
    Lightning side, which play Lightning's part on a GPU, and the benchmark's hand-written loop.
    Every other module is checked, and places nothing.
    """
    files = lint_placement.project_files(LIBRARY)
    assert PACKAGE / "cli.py" in files and PACKAGE / "gpu_audit" / "audit.py" in files
    assert not [path for path in files if any(path == part or part in path.parents for part in EXEMPT)]
    offenders = lint_placement.check(files)
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("part", EXEMPT, ids=lambda path: path.relative_to(PACKAGE).as_posix())
def test_each_exempt_part_of_the_library_places_by_hand_and_is_skipped(part):
    """The exemptions are not stale: each exempt part does place by hand, and the check skips it."""
    files = sorted(part.rglob("*.py")) if part.is_dir() else [part]
    assert any(lint_placement.manual_placements(path.read_text(encoding="utf-8")) for path in files), part
    assert all(lint_placement.is_exempt(path) for path in files)
    assert lint_placement.check(files) == []


@pytest.mark.parametrize("inside", ["bench.py", "gpu_audit/lightning.py", "gpu_audit/simulated/devices.py"])
def test_a_file_named_as_an_exempt_part_elsewhere_is_checked(tmp_path, inside):
    """Only the library's own files are exempt: a project's file of the same name and folder is checked."""
    planted = tmp_path / "src" / "lightning_kit" / inside
    planted.parent.mkdir(parents=True)
    planted.write_text("import torch\n\nx = torch.zeros(3).cuda()\n", encoding="utf-8")
    assert not lint_placement.is_exempt(planted)
    [found] = lint_placement.check([planted])
    assert found.startswith(f"{planted}:3: `.cuda()`"), found


def test_the_placement_check_names_file_line_and_fix(tmp_path, capsys):
    planted = tmp_path / "planted.py"
    planted.write_text("import torch\n\nx = torch.zeros(3).cuda()\n", encoding="utf-8")
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\n\nx = torch.zeros(3, device=y.device)\n", encoding="utf-8")
    assert lint_placement.main([str(planted), str(clean)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{planted}:3: `.cuda()` — delete it") and "python -m lightning_kit.guide 1-2" in out
    assert len(out.splitlines()) == 1
    assert lint_placement.main([str(clean)]) == 0


def _project_with_placements(root: Path) -> None:
    """A project's layout: a placement in src/, one in train.py, and one in tests/, which is not checked."""
    for path, source in [
        ("src/their_project/model.py", "import torch\n\nnet = torch.nn.Linear(1, 1).cuda()\n"),
        ("src/their_project/clean.py", "import torch\n\nx = torch.zeros(3)\n"),
        ("train.py", "import torch\n\nx = torch.zeros(3)\nx = x.to('cuda')\n"),
        ("tests/test_model.py", "import torch\n\nx = torch.zeros(3).cuda()\n"),
    ]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(source, encoding="utf-8")


def _found_in(root: Path) -> list[str]:
    """Where the placements of ``_project_with_placements`` are reported: src/'s and train.py's, not tests/'."""
    return [f"{root / 'src' / 'their_project' / 'model.py'}:3", f"{root / 'train.py'}:4"]


def test_without_files_it_checks_src_and_train_py_of_the_current_folder(in_tmp_path, capsys):
    _project_with_placements(in_tmp_path)
    assert lint_placement.main([]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines] == _found_in(in_tmp_path), lines


def test_it_runs_as_python_m_lightning_kit_lint_placement(in_tmp_path):
    """``python -m lightning_kit.lint_placement``: a project's pre-commit hook."""
    _project_with_placements(in_tmp_path)
    command = ["-m", "lightning_kit.lint_placement"]
    checked = subprocess.run(
        [sys.executable, *command],
        cwd=in_tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert [line.split(": ")[0] for line in checked.stdout.splitlines()] == _found_in(in_tmp_path), checked.stdout
    (in_tmp_path / "src" / "their_project" / "model.py").unlink()
    (in_tmp_path / "train.py").unlink()
    clean = subprocess.run(
        [sys.executable, *command], cwd=in_tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert (clean.returncode, clean.stdout, clean.stderr) == (0, "", "")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_exits_0(flag, capsys):
    assert lint_placement.main([flag]) == 0
    out, err = capsys.readouterr()
    assert "python -m lightning_kit.lint_placement FILES..." in out and err == "", (out, err)


def test_nothing_to_check_is_one_line_and_exit_2(in_tmp_path, capsys):
    """No FILES, and neither src/ nor train.py here: said, so as not to read as a pass."""
    assert lint_placement.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: nothing to check: ") and len(err.splitlines()) == 1, err
    assert "src/" in err and "train.py" in err, err


def test_invalid_python_is_one_line_naming_its_line(tmp_path, capsys):
    planted = tmp_path / "planted.py"
    planted.write_text("import torch\n\nx = (\n", encoding="utf-8")
    assert lint_placement.main([str(planted)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{planted}:3: not valid Python")


def _special(kind: str, at: Path) -> Path:
    """A path the check must not read as source: what ``kind`` names, planted under ``at``."""
    path = at / f"{kind}.py"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-fifo":
        os.mkfifo(at / "real-fifo")
        path.symlink_to(at / "real-fifo")
    elif kind == "dangling-link":
        path.symlink_to(at / "nowhere")
    elif kind == "device":
        return Path("/dev/zero")
    elif kind == "socket":
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 8)
    elif kind == "latin-1":
        path.write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    elif kind == "bad-coding":
        path.write_bytes(b"# -*- coding: no-such-codec -*-\nx = 1\n")
    elif kind == "huge":
        path.write_text("x = 1\n" * (lint_placement.MAX_SOURCE_BYTES // 6 + 10))
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize(
    "kind",
    ["missing", "fifo", "link-to-fifo", "dangling-link", "device", "socket", "binary", "latin-1", "bad-coding", "huge"],
)
def test_what_is_not_python_source_is_one_line_and_never_read_without_bound(kind, tmp_path, capsys):
    """A FIFO or device is not opened for reading (it would block or never end), a large file is not read
    whole, text in another encoding is refused as Python refuses it; the other files are still checked."""
    path = _special(kind, tmp_path)
    planted = tmp_path / "planted.py"
    planted.write_text("import torch\n\nx = torch.zeros(3).cuda()\n", encoding="utf-8")
    assert lint_placement.main([str(path), str(planted)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith(f"{planted}:3:") and len(out.splitlines()) == 1, out
    assert err.startswith(f"error: {path} ") and len(err.splitlines()) == 1, err
    with pytest.raises(lint_placement.UnreadableError):
        lint_placement.check([path])


def test_a_coding_declaration_is_read_as_python_reads_it(tmp_path):
    latin = tmp_path / "latin.py"
    latin.write_bytes("# -*- coding: latin-1 -*-\nname = 'caf\xe9'\nx = x.cuda()\n".encode("latin-1"))
    [found] = lint_placement.check([latin])
    assert found.startswith(f"{latin}:3:")


def test_a_folder_stands_for_its_python_files_and_links_in_it_are_not_followed(tmp_path, capsys):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "m.py").write_text("x = x.cuda()\n")
    (tmp_path / "pkg" / "notes.txt").write_text("x.cuda()\n")
    (tmp_path / "pkg" / "loop").symlink_to(tmp_path / "pkg")
    assert lint_placement.main([str(tmp_path / "pkg")]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{tmp_path / 'pkg' / 'sub' / 'm.py'}:1:")
