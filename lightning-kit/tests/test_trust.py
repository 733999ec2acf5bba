"""What a run folder or a checkpoint names is data: code is imported only when the person named it, or trusts it."""

import functools
from pathlib import Path

import pytest
import torch
import yaml
from conftest import LAST, RUN, build_all, exit_message, main
from image_project.cli import ProjectCLI

from lightning_kit.export import main as export_main

# The image project's export command: python -m image_project.export.
export = functools.partial(export_main, cli_class=ProjectCLI)

# A module that leaves a mark when it is imported: proof that code ran.
MARKS_IMPORT = """
import lightning as L

open("imported", "w").close()


class Data(L.LightningDataModule):
    pass
"""


@pytest.fixture
def run_folder_with_code(run_copy) -> str:
    """The copied run, its config.yaml naming a data module in a module inside the run folder."""
    (RUN / "helper.py").write_text(MARKS_IMPORT)
    config = yaml.safe_load((RUN / "config.yaml").read_text())
    config["data"] = {"class_path": "runs.lightning_logs.version_0.helper.Data"}
    (RUN / "config.yaml").write_text(yaml.safe_dump(config))
    return "runs.lightning_logs.version_0.helper.Data"


@pytest.mark.parametrize(
    "command",
    [
        lambda cls: (main, "validate", "--ckpt_path", "last"),
        lambda cls: (main, "fit", "--ckpt_path", "last", "--max_epochs", "2"),
        lambda cls: (main, "test", "--ckpt_path", str(LAST), "--config", str(RUN / "config.yaml")),
        lambda cls: (main, "predict", "--ckpt_path", str(LAST), "--data", cls),
        lambda cls: (build_all, "--config", str(RUN / "config.yaml")),
        lambda cls: (export, "--ckpt_path", str(LAST), "--onnx", "no"),
    ],
    ids=["validate-last", "resume", "test-given-config", "predict-named", "audit", "export"],
)
def test_code_in_a_run_folder_is_never_imported(run_folder_with_code, command):
    """A run folder whose config.yaml names a module inside it is refused in one line, and the module never runs,
    even when the class is named on the command line."""
    run, *args = command(run_folder_with_code)
    message = exit_message(run, *args)
    assert message.startswith("error: ") and "refused, nothing was imported" in message, message
    assert "code in the run or data folder" in message and "\n" not in message
    assert not Path("imported").exists()


def test_a_checkpoint_naming_code_in_a_run_folder_is_refused(run_folder_with_code, fast_args):
    """A checkpoint whose hyperparameters name a module in a run folder is refused before anything is imported."""
    tampered = torch.load(LAST, weights_only=True)
    tampered["datamodule_hyper_parameters"] = {"_class_path": run_folder_with_code}
    torch.save(tampered, "tampered.ckpt")
    message = exit_message(main, "validate", *fast_args, "--ckpt_path", "tampered.ckpt")
    assert "tampered.ckpt names runs.lightning_logs.version_0.helper.Data" in message
    assert not Path("imported").exists()


OWN_DATA = """
from image_project.data.images import ImageDataModule


class MyData(ImageDataModule):
    \"\"\"A data module of the person's own, beside train.py, not in the project's package.\"\"\"
"""


@pytest.mark.slow
def test_your_own_data_module_can_be_evaluated_and_exported_when_named_or_trusted(
    in_tmp_path, fast_args, monkeypatch, capsys
):
    """Trained with --data mymodule.MyData, its checkpoint is evaluated and exported when the class is named again
    or its module is in the project's trusted_modules (ProjectCLI, cli.py); otherwise one line says how to allow it.
    The trust is the command line's: once it no longer names the module, the checkpoint is refused again."""
    Path("mymodule.py").write_text(OWN_DATA)
    monkeypatch.syspath_prepend(str(in_tmp_path))
    own = ["--data", "mymodule.MyData", "--data.dataset", "synthetic"]
    main([*fast_args, *own, "--max_epochs", "1"])
    message = exit_message(main, "test", *fast_args, "--ckpt_path", str(LAST))
    assert "names code outside this project (mymodule.MyData)" in message
    assert "--data mymodule.MyData" in message
    assert "add 'mymodule' to the trusted_modules of the project's KitCLI, or to packages in [tool" in message
    for subcommand in ("validate", "test", "predict"):
        main([subcommand, *fast_args, "--ckpt_path", str(LAST), "--data", "mymodule.MyData"])
    export(["--ckpt_path", str(LAST), "--onnx", "no", "--data", "mymodule.MyData"])
    assert (RUN / "model.pt2").is_file()
    with monkeypatch.context() as patch:
        patch.setattr(ProjectCLI, "trusted_modules", ("mymodule",))
        main(["test", *fast_args, "--ckpt_path", str(LAST)])
    out = capsys.readouterr().out
    assert out.count("test/acc") == 2 and "val/acc" in out and "predictions for " in out
    assert "names code outside this project (mymodule.MyData)" in exit_message(main, "test", "--ckpt_path", str(LAST))
