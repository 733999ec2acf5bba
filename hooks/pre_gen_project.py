"""Reject bad answers before anything is written: one line saying what is wrong and what is accepted.

Cookiecutter renders this file before running it. Each answer enters as a JSON
string literal, which is also a valid Python string literal, so quotes,
backslashes and non-ASCII characters in an answer are data, never code.

Answers accepted, it notes what a re-bake must not take away. It runs in the
project's folder before the template's files are written there. On a re-bake
(`cookiecutter -f` over an existing project) that folder holds the user's files,
which the template is about to overwrite, so the paths the post-generation hook
may remove are recorded first (whether they existed, and their bytes) in a file
outside the project; the post-generation hook restores them, removes only what
this bake created, and deletes the record.
"""

import base64
import hashlib
import json
import keyword
import os
import re
import sys
import tempfile
from pathlib import Path

PROJECT_NAME = {{cookiecutter.project_name | tojson}}
PROJECT_SLUG = {{cookiecutter.project_slug | tojson}}
AUTHOR_EMAIL = {{cookiecutter.author_email | tojson}}
VERSION = {{cookiecutter.version | tojson}}

# Packages a generated project imports, or tools that would be confused by a package of the same name.
SHADOWED = {
    "jsonargparse",
    "lightning",
    "lightning_fabric",
    "numpy",
    "pytest",
    "pytorch_lightning",
    "ruff",
    "setuptools",
    "src",
    "test",
    "tests",
    "torch",
    "torchmetrics",
    "torchvision",
}
SLUG = re.compile(r"[a-z_][a-z0-9_]*")
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
# PEP 440 public versions: 1.0, 0.1.0, 2.0.0rc1, 1.0.post2, 1.1.dev3, ...
PEP440 = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")
# The slug names a folder, a package and a distribution; the name is a README title and the slug's default.
MAX_NAME_LENGTH = 200
MAX_SLUG_LENGTH = 64

# Every path the post-generation hook may remove: keep in step with its IMAGE_FILES, SEQUENCE_FILES and .github.
PACKAGE = Path("src") / PROJECT_SLUG
REMOVABLE_FILES = [
    PACKAGE / "models" / "cnn.py",
    PACKAGE / "data" / "images.py",
    PACKAGE / "data" / "folders.py",
    Path("tests") / "test_images.py",
    Path("tests") / "test_folders.py",
    Path("configs") / "cifar10.yaml",
    Path("configs") / "image_folder.yaml",
    PACKAGE / "models" / "attention.py",
    PACKAGE / "data" / "sequences.py",
    Path("tests") / "test_sequences.py",
    Path("configs") / "from_file.yaml",
]
REMOVABLE_TREE = Path(".github")


def problems() -> list[str]:
    found = []
    if not PROJECT_NAME.strip():
        found.append("project_name is empty: give the project a name, e.g. 'Vision Project'")
    elif len(PROJECT_NAME) > MAX_NAME_LENGTH:
        found.append(
            f"project_name is {len(PROJECT_NAME)} characters long: use at most {MAX_NAME_LENGTH}, e.g. 'Vision Project'"
        )
    if not PROJECT_SLUG:
        found.append(
            "project_slug is empty: give a project_name with letters or digits, "
            "or a project_slug such as 'vision_project'"
        )
    elif len(PROJECT_SLUG) > MAX_SLUG_LENGTH:
        found.append(
            # A default slug arrives cut at one character more than the limit, so its length is not told.
            f"project_slug is longer than {MAX_SLUG_LENGTH} characters: use at most {MAX_SLUG_LENGTH}, "
            "from a shorter project_name or given explicitly, e.g. 'vision_project'"
        )
    elif not SLUG.fullmatch(PROJECT_SLUG):
        found.append(
            f"project_slug {PROJECT_SLUG!r} is not a valid package name: "
            "use lowercase ASCII letters, digits and underscores, not starting with a digit"
        )
    elif keyword.iskeyword(PROJECT_SLUG) or keyword.issoftkeyword(PROJECT_SLUG):
        found.append(f"project_slug {PROJECT_SLUG!r} is a Python keyword: choose another package name")
    elif PROJECT_SLUG in sys.stdlib_module_names or PROJECT_SLUG in SHADOWED:
        found.append(
            f"project_slug {PROJECT_SLUG!r} would shadow the package of that name: "
            "choose a name of your own, e.g. 'vision_project'"
        )
    if not EMAIL.fullmatch(AUTHOR_EMAIL):
        found.append(f"author_email {AUTHOR_EMAIL!r} is not an email address: use the form name@example.com")
    if not PEP440.fullmatch(VERSION):
        found.append(f"version {VERSION!r} is not a PEP 440 version: use a form such as 0.1.0 or 1.0.0rc1")
    return found


def record_path() -> Path:
    """Where this project's record lives: outside it, named after its absolute path (same rule in both hooks)."""
    digest = hashlib.sha256(os.fsencode(Path.cwd())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"cookiecutter-rebake-{digest}.json"


def existing_paths() -> list[Path]:
    """The removable paths already here: the task files, and everything under .github, folders included."""
    found = [path for path in REMOVABLE_FILES if os.path.lexists(path)]
    if os.path.lexists(REMOVABLE_TREE):
        found.append(REMOVABLE_TREE)
    for root, dirs, files in os.walk(REMOVABLE_TREE):
        found += [Path(root, name) for name in dirs + files]
    return found


def record_existing_files() -> None:
    """Write which removable paths exist before this bake, with the mode and bytes of each plain file."""
    existed, contents = [], {}
    for path in existing_paths():
        existed.append(path.as_posix())
        if path.is_file() and not path.is_symlink():
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            contents[path.as_posix()] = {"mode": path.stat().st_mode & 0o7777, "data": data}
    record = record_path()
    # A fresh private file renamed over the record: never writes through a link planted at that name.
    handle, temporary = tempfile.mkstemp(prefix=record.stem, dir=record.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        json.dump({"existed": existed, "contents": contents}, file)
    os.replace(temporary, record)


if __name__ == "__main__":
    errors = problems()
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    if errors:
        sys.exit(1)
    record_existing_files()
