"""train.py end to end on the synthetic data, the audit of what it trains, and the configs it ships with."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, HANG_GUARD_S, PROJECT, RUNS
from lightning_kit import audit
from lightning_kit.building import build, build_all

from {{ cookiecutter.project_slug }}.cli import ProjectCLI, main


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m module args`` in the current folder, as a person would run it beside train.py."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=HANG_GUARD_S,
    )


@pytest.mark.slow
def test_fit_then_validate_test_predict_and_export_the_checkpoint(in_tmp_path, fast_args, capsys):
    """The whole life of a run: a short fit, its checkpoint evaluated three ways, then exported to one file."""
    main([*fast_args, "--max_epochs", "1"])
    assert "fit finished: best epoch 0: val/loss=" in capsys.readouterr().out
    run = RUNS / "version_0"
    assert {"last.ckpt"} < {path.name for path in (run / "checkpoints").iterdir()}
    for subcommand in ("validate", "test", "predict"):
        main([subcommand, *fast_args, "--ckpt_path", "last"])
    out = capsys.readouterr().out
    assert "val/acc" in out and "test/acc" in out
    class_names = build(ProjectCLI, fast_args)[1].class_names
    header = (run / "predictions.csv").read_text().splitlines()[0]
    assert header == ",".join(["index", "predicted", "label", *(f"p_{name}" for name in class_names)])

    exported = run_module("{{ cookiecutter.project_slug }}.export", "--ckpt_path", "last", "--onnx", "no")
    assert exported.returncode == 0, exported.stdout + exported.stderr
    names = {"class_names.json": ""}
    program = torch.export.load(run / "model.pt2", extra_files=names).module()
{%- if cookiecutter.task == "image" %}
    inputs = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)  # raw images: it normalises them itself
{%- else %}
    inputs = torch.randint(0, 16, (5, 32))  # token ids
{%- endif %}
    probabilities = program(inputs)
    assert probabilities.shape == (5, len(class_names))
    torch.testing.assert_close(probabilities.sum(dim=1), torch.ones(5))
    assert json.loads(names["class_names.json"]) == class_names


@pytest.mark.slow
def test_the_example_sweep_trains_a_trial_through_the_projects_sweep_command(in_tmp_path, fast_args):
    space = ("--space", str(CONFIGS / "sweeps" / "example.yaml"), "--trials", "1")
    done = run_module("{{ cookiecutter.project_slug }}.sweep", *space, *fast_args, "--max_epochs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 trials complete, 0 pruned" in done.stdout
    assert (in_tmp_path / "runs/sweeps/example/trial_0000/checkpoints/last.ckpt").is_file()


def test_the_shipped_model_and_data_would_run_on_a_gpu(in_tmp_path, synthetic_config):
    """The audit trains what train.py builds on a simulated GPU: every stage, on one GPU and as each DDP rank."""
    model, datamodule, trainer = build_all(ProjectCLI, ["--config", synthetic_config, "--accelerator", "cpu"])
    verdict = audit(model, datamodule, trainer=trainer)
    ran = [(outcome.stage, outcome.rank, outcome.world_size) for outcome in verdict.outcomes]
    passes = ((0, 1), (0, 2), (1, 2))  # one GPU, then each process of a two-GPU DDP run
    assert ran == [(stage, *each) for each in passes for stage in ("fit", "validate", "test", "predict")]
{%- if cookiecutter.task == "image" %}


def small_image_folder(root) -> str:
    """Two classes of four small PNG images each, as configs/image_folder.yaml expects them."""
    from PIL import Image

    for name, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
        (root / name).mkdir(parents=True)
        for index in range(4):
            Image.new("RGB", (12, 10), colour).save(root / name / f"{index}.png")
    return str(root)
{%- endif %}


@pytest.mark.parametrize("config", sorted(path.name for path in CONFIGS.glob("*.yaml")))
def test_each_shipped_config_builds(in_tmp_path, config):
    """Every file of configs/ names classes and values train.py accepts (nothing is trained or read)."""
    args = ["--config", str(CONFIGS / config)]
    if config in ("mlflow.yaml", "wandb.yaml"):
        pytest.importorskip(config.removesuffix(".yaml"), reason=f"its logger comes with the {config[:-5]} extra")
        args = ["--config", str(CONFIGS / "synthetic.yaml"), *args]
{%- if cookiecutter.task == "image" %}
    if config == "image_folder.yaml":
        args += ["--data.root", small_image_folder(in_tmp_path / "images"), "--data.cache_dir", "null"]
{%- endif %}
    model, datamodule = build(ProjectCLI, args)
    assert model.net.num_classes == datamodule.num_classes == len(model.class_names)
