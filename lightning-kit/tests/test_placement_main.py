"""``python -m <package>.placement``: the audit of what ``train.py`` builds from the same arguments; its exit status."""

from pathlib import Path

import pytest
import torch
from test_simulated_gpu import line_of
from torch import nn

from lightning_kit.placement.__main__ import main
from lightning_kit.placement.verdict import EXIT_FAILED, EXIT_PASSED, EXIT_USAGE

PROJECT = Path(__file__).resolve().parents[1]


def test_the_command_line_audit_reports_every_stage(in_tmp_path, synthetic_config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", synthetic_config])
    out = capsys.readouterr().out
    assert exit_info.value.code == EXIT_PASSED, out
    for stage in ("fit", "validate", "test", "predict"):
        assert f"{stage} on simgpu:0 " in out and f"{stage} on simgpu:1 (DDP rank 1 of 2)" in out
    assert "the model will run on a GPU" in out
    assert not list(in_tmp_path.iterdir()), "the audit writes nothing where it runs"


{%- if cookiecutter.task == "image" %}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["flat", "train-val"])
def test_the_command_line_audit_passes_an_image_folder_without_a_test_split(in_tmp_path, layout, capsys):
    """configs/image_folder.yaml on the documented layouts without test/: fit and validate pass, exit 0,
    and the report says test and predict were skipped; with a test/ folder they are audited too."""
    from test_folders import write_images

    root = in_tmp_path / "images"
    for split in ("train", "val") if layout == "train-val" else ("",):
        write_images(root / split, per_class=6)
    args = ["--config", str(PROJECT / "configs" / "image_folder.yaml"), "--data.root", str(root)]
    args += ["--data.image_size", "16", "--data.batch_size", "4"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr().out
    assert exit_info.value.code == EXIT_PASSED, out
    assert "note: test skipped: ImageFolderDataModule has no data for it" in out
    assert "note: predict skipped: ImageFolderDataModule has no data for it" in out
    assert "validate on simgpu:1 (DDP rank 1 of 2)" in out and "test on simgpu" not in out
    assert "Every stage the data defines ran on the simulated GPUs" in out

    if layout == "train-val":
        write_images(root / "test", per_class=2)
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        out = capsys.readouterr().out
        assert exit_info.value.code == EXIT_PASSED and "skipped" not in out, out
        assert "test on simgpu:1 (DDP rank 1 of 2)" in out and "predict on simgpu:0" in out
{%- endif %}


class PlainAttributeNet(nn.Module):
    """A network for either task's data whose output offset is a plain attribute, not a buffer."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.head = nn.Linear(1, num_classes)
        self.offset = torch.zeros(1)

    def forward(self, inputs):
        return self.head(inputs.float().flatten(1).mean(dim=1, keepdim=True)) + self.offset  # CPU offset


def test_the_command_line_audit_exits_1_at_a_bug(in_tmp_path, synthetic_config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", synthetic_config, "--model.net", f"{__name__}.PlainAttributeNet"])
    out = capsys.readouterr().out
    assert exit_info.value.code == EXIT_FAILED
    assert f"{__file__}:{line_of('# CPU offset', __file__)}" in out and "`net.offset`, a plain tensor attribute" in out


def test_a_wrong_argument_is_one_line_with_exit_2(in_tmp_path, synthetic_config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", synthetic_config, "--model.lr", "fast"])
    assert exit_info.value.code == EXIT_USAGE
