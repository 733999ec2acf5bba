"""Remove what the answers switched off, and record the answers for later template updates."""

import json
import shutil
from pathlib import Path

TASK = {{cookiecutter.task | tojson}}
GITHUB_ACTIONS = {{cookiecutter.github_actions | tojson}}
PACKAGE = Path("src") / {{cookiecutter.project_slug | tojson}}

IMAGE_FILES = [
    PACKAGE / "models" / "cnn.py",
    PACKAGE / "data" / "images.py",
    Path("tests") / "test_images.py",
    Path("configs") / "cifar10.yaml",
]
SEQUENCE_FILES = [
    PACKAGE / "models" / "attention.py",
    PACKAGE / "data" / "sequences.py",
    Path("tests") / "test_sequences.py",
    Path("configs") / "from_file.yaml",
]


def remove_files(paths: list[Path]) -> None:
    for path in paths:
        path.unlink()


def remove_github_actions() -> None:
    shutil.rmtree(".github")


def record_answers() -> None:
    """Keep the user's answers, not the paths of the machine that baked the project."""
    path = Path(".cookiecutter.json")
    answers = json.loads(path.read_text(encoding="utf-8"))
    kept = {key: value for key, value in answers.items() if not key.startswith("_") or key == "_template"}
    path.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    remove_files(SEQUENCE_FILES if TASK == "image" else IMAGE_FILES)
    if GITHUB_ACTIONS != "yes":
        remove_github_actions()
    record_answers()
