"""Remove what the answers switched off, and record the answers for later template updates.

Only what the template wrote in this bake is removed. On a re-bake (`cookiecutter -f`
over an existing project) the template has just overwritten the project's files; a
path the pre-generation hook recorded as there before is the user's, so it gets its
recorded bytes back instead of being removed.
"""

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path

TASK = {{cookiecutter.task | tojson}}
GITHUB_ACTIONS = {{cookiecutter.github_actions | tojson}}
PACKAGE = Path("src") / {{cookiecutter.project_slug | tojson}}

IMAGE_FILES = [
    PACKAGE / "models" / "cnn.py",
    PACKAGE / "data" / "images.py",
    PACKAGE / "data" / "folders.py",
    Path("tests") / "test_images.py",
    Path("tests") / "test_folders.py",
    Path("configs") / "cifar10.yaml",
    Path("configs") / "image_folder.yaml",
]
SEQUENCE_FILES = [
    PACKAGE / "models" / "attention.py",
    PACKAGE / "data" / "sequences.py",
    Path("tests") / "test_sequences.py",
    Path("configs") / "from_file.yaml",
]
GITHUB = Path(".github")
# What the template writes and these hooks may take away again.
TEMPLATE_FILES = {*IMAGE_FILES, *SEQUENCE_FILES, GITHUB / "workflows" / "ci.yml"}


def record_path() -> Path:
    """Where the pre-generation hook left its record: outside the project, named after its absolute path."""
    digest = hashlib.sha256(os.fsencode(Path.cwd())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"cookiecutter-rebake-{digest}.json"


def load_record() -> dict:
    """Which removable paths existed before this bake, and the bytes of each file; none on a first bake."""
    try:
        return json.loads(record_path().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"existed": [], "contents": {}}


def restore(path: Path, saved: dict) -> None:
    data = base64.b64decode(saved["data"])
    if path.read_bytes() != data:
        path.write_bytes(data)
    os.chmod(path, saved["mode"])


def remove_file(path: Path, record: dict) -> None:
    """Remove a file this bake created, or one that was the template's own, unedited; give any other its bytes back."""
    key = path.as_posix()
    saved = record["contents"].get(key)
    unedited = saved is not None and path in TEMPLATE_FILES and base64.b64decode(saved["data"]) == path.read_bytes()
    if saved is not None and not unedited:
        restore(path, saved)
    elif key not in record["existed"] or unedited:
        path.unlink()


def remove_files(paths: list[Path], record: dict) -> None:
    for path in paths:
        remove_file(path, record)


def remove_github_actions(record: dict) -> None:
    """Remove the workflow files and folders this bake created; keep the user's own, as they were."""
    for root, dirs, files in os.walk(GITHUB, topdown=False):
        for name in files:
            remove_file(Path(root, name), record)
        for name in dirs:
            if Path(root, name).as_posix() not in record["existed"]:
                Path(root, name).rmdir()
    if GITHUB.as_posix() not in record["existed"]:
        GITHUB.rmdir()


def record_answers() -> None:
    """Keep the user's answers, not the paths of the machine that baked the project."""
    path = Path(".cookiecutter.json")
    answers = json.loads(path.read_text(encoding="utf-8"))
    kept = {key: value for key, value in answers.items() if not key.startswith("_") or key == "_template"}
    path.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    record = load_record()
    remove_files(SEQUENCE_FILES if TASK == "image" else IMAGE_FILES, record)
    if GITHUB_ACTIONS != "yes":
        remove_github_actions(record)
    record_answers()
    record_path().unlink(missing_ok=True)
