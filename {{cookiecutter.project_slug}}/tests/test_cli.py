import os
import re
import subprocess
import sys

import pytest
import yaml
from conftest import HANG_GUARD_S, PROJECT
from lightning.pytorch.callbacks import TQDMProgressBar

from {{ cookiecutter.project_slug }}.cli import build, build_all, expand_shortcuts, main


def test_shortcuts_expand_to_trainer_flags():
    assert expand_shortcuts(["--accelerator", "gpu"]) == ["--trainer.accelerator", "gpu"]
    assert expand_shortcuts(["test", "--devices=2", "--model.lr", "1"]) == [
        "test",
        "--trainer.devices=2",
        "--model.lr",
        "1",
    ]
    assert expand_shortcuts(["--max_epochsx", "3"]) == ["--max_epochsx", "3"]


def test_without_a_subcommand_fit_runs(in_tmp_path, fast_args, capsys):
    """`train.py --accelerator cpu ...` trains, as `train.py fit ...` does."""
    main([*fast_args, "--max_epochs", "1"])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("fit", "validate", "test", "predict"))


@pytest.mark.slow
def test_fit_then_each_subcommand_from_its_checkpoint(in_tmp_path, fast_args, capsys):
    """fit writes a best and a last checkpoint; validate, test and predict run from it."""
    main([*fast_args, "--max_epochs", "1"])
    assert "fit finished" in capsys.readouterr().out
    checkpoints = sorted(path.name for path in in_tmp_path.glob("runs/lightning_logs/version_0/checkpoints/*.ckpt"))
    assert "last.ckpt" in checkpoints and len(checkpoints) == 2
    last = str(in_tmp_path / "runs/lightning_logs/version_0/checkpoints/last.ckpt")
    for subcommand in ("validate", "test", "predict"):
        main([subcommand, *fast_args, "--ckpt_path", last])
    out = capsys.readouterr().out
    assert "val/acc" in out and "test/acc" in out


def test_the_progress_bar_redraws_every_20_steps(in_tmp_path, synthetic_config):
    """A bar redrawn every step costs time on every step; when shown, it is redrawn every 20."""
    _, _, trainer = build_all(["--config", synthetic_config, "--trainer.enable_progress_bar", "true"])
    assert isinstance(trainer.progress_bar_callback, TQDMProgressBar)
    assert trainer.progress_bar_callback.refresh_rate == 20
    _, _, quiet = build_all(["--config", synthetic_config, "--trainer.enable_progress_bar", "false"])
    assert quiet.progress_bar_callback is None


USER_DATA = """
from {{ cookiecutter.project_slug }}.data import InMemoryDataModule


class TinyData(InMemoryDataModule):
    def __init__(self, batch_size: int = 8, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.num_classes = 3
        self.class_names = ["red", "green", "blue"]

    def setup(self, stage: str) -> None:
        pass
"""


@pytest.fixture
def user_data(tmp_path, monkeypatch) -> str:
    """The class path of a data module written outside the project, as a user's own module."""
    (tmp_path / "user_data.py").write_text(USER_DATA)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_data.TinyData"


def test_any_data_module_from_the_command_line_starts_from_its_own_defaults(user_data):
    """--data takes any LightningDataModule; the default's batch size (64) is not carried over to it."""
    model, datamodule = build(["--data", user_data])
    assert type(datamodule).__name__ == "TinyData"
    assert datamodule.hparams.batch_size == 8
    # The class count and names flow from the data to the network and the Classifier.
    assert model.hparams.num_classes == model.net.num_classes == 3
    assert model.class_names == ["red", "green", "blue"]
    _, chosen = build(["--data", user_data, "--data.batch_size", "5"])
    assert chosen.hparams.batch_size == 5


def test_print_config_shows_the_chosen_classs_own_defaults(user_data, capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--data", user_data, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"] == {"class_path": user_data, "init_args": {"batch_size": 8, "seed": 0, "num_workers": 0}}


def test_a_data_module_from_a_config_file(user_data, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(f"data:\n  class_path: {user_data}\n  init_args:\n    batch_size: 4\n")
    model, datamodule = build(["--config", str(config)])
    assert type(datamodule).__name__ == "TinyData" and datamodule.hparams.batch_size == 4
    assert model.net.num_classes == 3


def test_another_network_starts_from_its_own_defaults(tmp_path, monkeypatch):
    """--model.net switches the network; arguments it shares with the default one keep its own defaults."""
    (tmp_path / "user_net.py").write_text(
        "from torch import nn\n\n\n"
        "class Wide(nn.Module):\n"
        "    def __init__(self, num_classes: int = 2, mean: float = 0.5) -> None:\n"
        "        super().__init__()\n"
        "        self.mean, self.head = mean, nn.LazyLinear(num_classes)\n\n"
        "    def forward(self, x):\n"
        "        return self.head(x.flatten(1).float())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model, datamodule = build(["--model.net", "user_net.Wide"])
    assert model.net.mean == 0.5  # not the default network's statistics
    assert model.net.head.out_features == datamodule.num_classes


def test_a_mistake_in_a_chosen_data_module_is_one_line(user_data, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build(["--data", user_data, "--data.batch_size", "many"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: --data.batch_size: Expected a <class 'int'>. Got value: many")


def test_fit_help_lists_this_projects_classes_only(capsys):
    """--model.net and --data list this project's classes, not every nn.Module installed."""
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "torchvision.models" not in out and "torch.nn.modules" not in out
    assert "{{ cookiecutter.project_slug }}.models." in out and "{{ cookiecutter.project_slug }}.data." in out
    assert len(out.splitlines()) < 700, len(out.splitlines())  # 1,240 when every nn.Module was listed


WARNS_LIKE_OLD_CODE = """
import warnings

from {{ cookiecutter.project_slug }}.cli import Net


class OldNet(Net):
    def forward(self, inputs):
        warnings.warn("old_api() is deprecated: use new_api()", FutureWarning, stacklevel=1)
        return super().forward(inputs)
"""
# Lines of Lightning's model summary (rich's table, or the plain one) and its totals.
TOTALS = r"(Trainable|Non-trainable|Total|Modules in) "
MODEL_SUMMARY = re.compile(r"^\s*[┏┃┡│└|]|^---|^\s*\d+\s+\||^" + TOTALS + r"|^[\d.]+( [KMGT])?\s+" + TOTALS)


@pytest.mark.slow
def test_a_short_fit_prints_only_lines_a_user_can_act_on(in_tmp_path, fast_args):
    """The project's own lines, the model summary, why fit stopped and the metrics; a user's warning still shows."""
    (in_tmp_path / "old_code.py").write_text(WARNS_LIKE_OLD_CODE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT / "src"), str(in_tmp_path)])}
    command = [sys.executable, str(PROJECT / "train.py"), *fast_args, "--model.net", "old_code.OldNet"]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    own = ("fit finished: best epoch 0: ", "best checkpoint: ", "run folder: ", "`Trainer.fit` stopped: ")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    warned = [line for line in lines if "FutureWarning: old_api() is deprecated: use new_api()" in line]
    rest = [line for line in lines if not (MODEL_SUMMARY.match(line) or line.startswith(own)) and line not in warned]
    source = '  warnings.warn("old_api() is deprecated: use new_api()", FutureWarning, stacklevel=1)'
    assert warned and rest == [source], lines  # Python prints the warning's source line after it
