"""The accelerator asked for is checked against the machine before anything is built: one line, nothing written."""

import pytest
import torch
from image_project.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without a GPU")
def test_gpu_without_a_gpu_exits_with_a_short_message(in_tmp_path, fast_args):
    with pytest.raises(SystemExit) as exit_info:
        main([*fast_args, "--accelerator", "gpu"])
    message = str(exit_info.value.code)
    assert message.startswith("error:") and "no CUDA GPU" in message and "--accelerator cpu" in message
    assert not (in_tmp_path / "runs").exists()
