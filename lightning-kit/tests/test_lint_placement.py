"""The placement check (lint_placement.py, the pre-commit hook no-manual-placement) finds every way of naming
a device in code, names its file and line, and leaves device-agnostic code alone."""

from pathlib import Path

import pytest

from lightning_kit import lint_placement

PROJECT = Path(__file__).resolve().parents[1]
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
    """Each form is found once, at its file and line, with the fix and the rule of docs/device-placement.md."""
    planted = tmp_path / "planted.py"
    planted.write_text(f"import torch\n\n{source}\n", encoding="utf-8")
    line = 4 if source.startswith(HOOK) else 3
    found = lint_placement.check([planted])
    assert len(found) == 1, found
    assert found[0].startswith(f"{planted}:{line}: `") and "(docs/device-placement.md, rule" in found[0], found


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


def test_project_code_places_no_tensors_by_hand():
    """Lightning places everything; see docs/device-placement.md.

    Three parts stand in for Lightning and are exempt: the simulated GPU and its Lightning
    side, which play Lightning's part on a GPU, and the benchmark's hand-written loop.
    """
    files = lint_placement.project_files(PROJECT)
    assert PROJECT / "train.py" in files and PROJECT / "src" / "lightning_kit" / "cli.py" in files
    offenders = lint_placement.check(files)
    assert not offenders, "\n".join(offenders)


def test_the_placement_check_names_file_line_and_fix(tmp_path, capsys):
    planted = tmp_path / "planted.py"
    planted.write_text("import torch\n\nx = torch.zeros(3).cuda()\n", encoding="utf-8")
    assert lint_placement.main([str(planted), str(PROJECT / "train.py")]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{planted}:3: `.cuda()` — delete it") and "docs/device-placement.md" in out
    assert len(out.splitlines()) == 1
    assert lint_placement.main([str(PROJECT / "train.py")]) == 0


def test_invalid_python_is_one_line_naming_its_line(tmp_path, capsys):
    planted = tmp_path / "planted.py"
    planted.write_text("import torch\n\nx = (\n", encoding="utf-8")
    assert lint_placement.main([str(planted)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{planted}:3: not valid Python")
