"""The generated README's "Adding a dataset" steps, followed literally on a data set the test makes.

Each "Save as `PATH`:" block is written to PATH, and every command of the section's bash
blocks is run in order, as a new team member would, with `python` and `pytest` from this
environment (standing in for the project's `pip install -e .`).
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_GUARD_S
from PIL import Image

SAVE_AS = re.compile(r"^Save as `([^`]+)`:$")


def dataset_steps(readme: str) -> list[tuple[str, str, str]]:
    """``("save", path, text)`` and ``("run", command, "")`` in the order of the README's "Adding a dataset"."""
    section = readme.split("\n## Adding a dataset\n", 1)[1].split("\n## ", 1)[0]
    lines, steps, save_as, index = section.splitlines(), [], None, 0
    while index < len(lines):
        line = lines[index].strip()
        if match := SAVE_AS.match(line):
            save_as = match.group(1)
        elif line.startswith("```") and len(line) > 3:
            indent = len(lines[index]) - len(lines[index].lstrip())
            end = next(n for n in range(index + 1, len(lines)) if lines[n].strip() == "```")
            block = [text[indent:] for text in lines[index + 1 : end]]
            if save_as is not None:
                steps.append(("save", save_as, "\n".join(block) + "\n"))
                save_as = None
            elif line == "```bash":
                commands = [text.split("  #")[0].strip() for text in block]
                steps += [("run", command, "") for command in commands if command and not command.startswith("#")]
            index = end
        index += 1
    return steps


def follow(root: Path, steps: list[tuple[str, str, str]]) -> list[str]:
    """Write the files and run the commands of ``steps`` in ``root``; return each command's output."""
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "PYTHONUNBUFFERED": "1"}
    outputs = []
    for kind, target, text in steps:
        if kind == "save":
            path = root / target
            assert not path.exists(), f"the README's step would overwrite {target}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            continue
        command = shlex.split(target)
        assert command[0] in ("python", "pytest"), target
        command = [sys.executable, *([] if command[0] == "python" else ["-m", "pytest"]), *command[1:]]
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL
        )
        assert done.returncode == 0, f"$ {target}\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
        outputs.append(done.stdout)
    return outputs


def make_flowers(folder: Path, per_class: int = 12) -> None:
    """``folder/<class>/`` of PNG and JPEG images, each class a colour plus noise, of differing sizes."""
    generator = np.random.default_rng(0)
    for name, colour in {"daisy": (230, 230, 60), "rose": (210, 30, 60), "tulip": (150, 60, 200)}.items():
        (folder / name).mkdir(parents=True)
        for n in range(per_class):
            height, width = generator.integers(20, 60, size=2)
            pixels = np.clip(np.array(colour) + generator.normal(0, 30, (height, width, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(folder / name / f"{n:04d}.{'png' if n % 2 else 'jpg'}")


def make_arrays(path: Path) -> None:
    """What ``ArrayImages`` reads: 24x24 images of three colours, labels and class names."""
    generator = np.random.default_rng(1)
    labels = np.arange(90) % 3
    colours = np.array([(200, 40, 40), (40, 200, 40), (40, 40, 200)])
    images = np.clip(colours[labels][:, None, None, :] + generator.normal(0, 30, (90, 24, 24, 3)), 0, 255)
    np.savez(path, images=images.astype(np.uint8), labels=labels, class_names=np.array(["red", "green", "blue"]))


def make_sequences(path: Path) -> None:
    """``tokens`` and ``labels`` for configs/from_file.yaml: label 1 when token 0 comes before token 1."""
    generator = np.random.default_rng(2)
    tokens = generator.integers(2, 16, size=(300, 32))
    order = generator.permuted(np.tile(np.arange(32), (300, 1)), axis=1)[:, :2]
    tokens[np.arange(300), order[:, 0]], tokens[np.arange(300), order[:, 1]] = 0, 1
    np.savez(path, tokens=tokens, labels=(order[:, 0] < order[:, 1]).astype(np.int64))


def make_lines(path: Path) -> None:
    """What ``TextLines`` reads: ``label<TAB>text`` lines, the label told by the text's letters."""
    generator = np.random.default_rng(3)
    lines = []
    for n in range(200):
        label = "spam" if n % 2 else "ham"
        letters = "xyz" if label == "spam" else "abc"
        lines.append(f"{label}\t{''.join(generator.choice(list(letters), size=generator.integers(5, 40)))}\n")
    path.write_text("".join(lines))


def follow_the_readme(bake, task: str, make_data, saved: list[str], predicted: int) -> tuple[Path, list[str]]:
    """Bake ``task``, make its data, follow "Adding a dataset" and check what every project's steps give.

    The section's commands are: fit, evaluate, predict and export on the data without code,
    then the new module's test, a fit on it and an evaluation.
    """
    root = bake(task=task, github_actions="no")
    (root / "data").mkdir()
    make_data(root / "data")
    steps = dataset_steps((root / "README.md").read_text())
    assert [target for kind, target, _ in steps if kind == "save"] == saved
    outputs = follow(root, steps)
    first_fit, _, predict, export, _, own_fit, own_test = outputs
    assert "fit finished: best epoch" in first_fit and "fit finished: best epoch" in own_fit
    assert f"predictions for {predicted} inputs written to runs/lightning_logs/version_0/predictions.csv" in predict
    assert "to runs/lightning_logs/version_0/model.pt2" in export
    assert "test/acc" in own_test
    ruff = str(Path(sys.executable).with_name("ruff"))
    lint = subprocess.run(
        [ruff, "check", "."], cwd=root, stdin=subprocess.DEVNULL, capture_output=True, timeout=HANG_GUARD_S
    )
    assert lint.returncode == 0, lint.stdout.decode()
    return root, outputs


def make_image_data(folder: Path) -> None:
    make_flowers(folder / "flowers")
    make_arrays(folder / "arrays.npz")


def make_sequence_data(folder: Path) -> None:
    make_sequences(folder / "sequences.npz")
    make_lines(folder / "lines.tsv")


@pytest.mark.slow
def test_an_image_project_trains_on_folders_and_on_its_own_data_module_from_the_readme(bake):
    saved = ["src/vision_project/data/arrays.py", "configs/arrays.yaml", "tests/test_arrays.py"]
    root, _ = follow_the_readme(bake, "image", make_image_data, saved, predicted=12)
    rows = (root / "runs/lightning_logs/version_0/predictions.csv").read_text().splitlines()
    assert rows[0] == "file,predicted,p_daisy,p_rose,p_tulip"
    assert sum(row.split(",")[1] == "rose" for row in rows[1:]) >= 9  # colours this far apart are learnt


@pytest.mark.slow
def test_a_sequence_project_trains_on_its_file_and_on_its_own_data_module_from_the_readme(bake):
    saved = ["src/vision_project/data/text.py", "configs/text.yaml", "tests/test_text.py"]
    follow_the_readme(bake, "sequence", make_sequence_data, saved, predicted=300)
