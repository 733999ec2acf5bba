"""Remove what the answers switched off, and record the answers for later template updates.

Only what the template wrote in this bake is removed. On a re-bake (`cookiecutter -f`
over an existing project) the template has just overwritten the project's files; a
path the pre-generation hook recorded as there before is the user's, so it gets its
recorded bytes back instead of being removed.

A plain `cookiecutter` bake also gets the `.cruft.json` that `cruft create` would have
written: the template's source and commit, and the answers, so that `cruft update` can
bring the template's later changes. One already there (a re-bake) is the project's and
stays as it is; under cruft itself (create, update), cruft writes it.
"""

import base64
import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

TASK = {{cookiecutter.task | tojson}}
GITHUB_ACTIONS = {{cookiecutter.github_actions | tojson}}
PACKAGE = Path("src") / {{cookiecutter.project_slug | tojson}}
# The template as the user named it, its folder on this machine (as typed, maybe relative) and the git reference
# asked for; cruft gives neither folder nor reference ("").
TEMPLATE = {{cookiecutter._template | tojson}}
TEMPLATE_FOLDER = {{(cookiecutter.get("_repo_dir") or "") | tojson}}
CHECKOUT = {{(cookiecutter.get("_checkout") or "") | tojson}}
# Cruft renders with the commit in `_commit` and writes .cruft.json itself, after this hook.
UNDER_CRUFT = {{"_commit" in cookiecutter}}
COMMIT = {{(cookiecutter.get("_commit") or "") | tojson}}
# The library every project depends on: its folder in the template's repository, beside the template, and its name.
LIBRARY = "lightning-kit"
# Its requirements in pyproject.toml, with or without extras, as the template writes them: "lightning-kit[serve]".
LIBRARY_REQUIREMENT = re.compile(r'"lightning-kit(\[[a-z,]+\])?"')
CRUFT_FILE = Path(".cruft.json")
# The questions in cookiecutter.json's order, which is cruft's; .cookiecutter.json has them sorted.
QUESTIONS = {{cookiecutter.keys() | list | tojson}}
# Never changed by `cruft update`: the project's git folder, and the data and runs that are the user's alone.
CRUFT_SKIP = [".git", "data/", "runs/"]

IMAGE_FILES = [
    PACKAGE / "models" / "cnn.py",
    PACKAGE / "data" / "images.py",
    PACKAGE / "data" / "cifar10.py",
    PACKAGE / "data" / "synthetic.py",
    Path("tests") / "test_images.py",
    Path("tests") / "test_cifar10.py",
    Path("tests") / "test_cnn.py",
    Path("tests") / "test_synthetic.py",
    Path("configs") / "cifar10.yaml",
    Path("configs") / "image_folder.yaml",
]
SEQUENCE_FILES = [
    PACKAGE / "models" / "attention.py",
    PACKAGE / "data" / "sequences.py",
    Path("tests") / "test_sequences.py",
    Path("tests") / "test_attention.py",
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


def git(folder: Path, *args: str) -> str | None:
    """The output of a git command in folder, or None where git is missing or fails there."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def template_folder() -> Path | None:
    """The template's folder as an absolute path, or None where it cannot be told.

    Cookiecutter gives the folder as typed: relative to where it was run, which is not
    this hook's folder (the project's). It runs its hooks from inside the template's
    folder, which Linux shows as the parent's working folder; elsewhere the shell's
    $PWD is the fallback. Either counts only if it holds a cookiecutter.json.
    """
    if not TEMPLATE_FOLDER:
        return None
    folder = Path(TEMPLATE_FOLDER)
    if folder.is_absolute():
        return folder
    candidates = [Path("/proc", str(os.getppid()), "cwd")]
    if os.environ.get("PWD"):
        candidates.append(Path(os.environ["PWD"], folder))
    for candidate in candidates:
        try:
            resolved = candidate.resolve(strict=True)
        except OSError:
            continue
        if (resolved / "cookiecutter.json").is_file():
            return resolved
    return None


def template_source() -> tuple[str, str, str | None] | None:
    """Where cruft finds the template again, its commit and its folder in that repository; None if not a git checkout.

    A local template is named by the absolute path of its repository; one cookiecutter
    cloned (a URL, `gh:org/name`) by the URL it was cloned from, which cruft can clone.
    """
    folder = template_folder()
    if folder is None:
        return None
    commit = git(folder, "rev-parse", "HEAD")
    top = git(folder, "rev-parse", "--show-toplevel")
    prefix = git(folder, "rev-parse", "--show-prefix")
    # A template folder inside someone else's repository, not committed there, is no checkout of the template.
    if not (commit and top and git(folder, "ls-files", "cookiecutter.json")):
        return None
    local = TEMPLATE_FOLDER == TEMPLATE or TEMPLATE_FOLDER.startswith(os.path.join(TEMPLATE, ""))
    source = top if local else (git(top, "remote", "get-url", "origin") or TEMPLATE)
    return source, commit, prefix.rstrip("/") or None


def library_reference(source: tuple[str, str, str | None] | None) -> str | None:
    """Where pip finds the library for this project, as a PEP 508 direct reference's URL; None where it cannot be told.

    Baked from a folder on this machine: that folder's library, as it is. Baked from a git
    repository: the library in that repository at the commit baked, which `cruft update`
    moves to the commit it updates to (it renders this template again, with that commit).
    """
    if UNDER_CRUFT:
        template, commit, directory = TEMPLATE, COMMIT, None
    elif TEMPLATE_FOLDER and (TEMPLATE_FOLDER == TEMPLATE or TEMPLATE_FOLDER.startswith(os.path.join(TEMPLATE, ""))):
        folder = template_folder()  # a local template, a git checkout or not
        return (folder / LIBRARY).as_uri() if folder is not None and (folder / LIBRARY).is_dir() else None
    elif source is None:
        return None
    else:
        template, commit, directory = source
    subdirectory = f"{directory}/{LIBRARY}" if directory else LIBRARY
    if "://" not in template and Path(template).is_absolute():  # cruft's record of a local template: its repository
        return (Path(template) / subdirectory).as_uri()
    url = template.removeprefix("git+")
    if re.fullmatch(r"[\w.-]+@[\w.-]+:.+", url):  # scp-like git@host:org/name.git, which pip does not take
        user_host, _, path = url.partition(":")
        url = f"ssh://{user_host}/{path}"
    if url.startswith("file:///"):
        # The same repository, with its host written out: the pip that Python ships (23.2, with Python 3.11) refuses a
        # `git+file:///` URL as it refused any URL without a host; git takes both.
        url = f"file://localhost/{url.removeprefix('file:///')}"
    return f"git+{url}@{commit}#subdirectory={subdirectory}"


def point_at_library(reference: str | None) -> None:
    """Make pyproject.toml's requirements of the library direct references to where it was found."""
    if reference is None:
        print(
            f"note: {LIBRARY} was not found beside the template {TEMPLATE}: the project requires it by name; "
            f"install it before the project (pip install <its folder>, or its repository's git URL with "
            f"#subdirectory={LIBRARY}), or write its location into pyproject.toml"
        )
        return
    path = Path("pyproject.toml")
    text = path.read_text(encoding="utf-8")
    path.write_text(LIBRARY_REQUIREMENT.sub(lambda m: f'"{LIBRARY}{m.group(1) or ""} @ {reference}"', text), "utf-8")


def record_answers(source: str | None) -> dict:
    """Keep the user's answers, not the paths of the machine that baked the project; return them.

    `_template` becomes the source cruft records, where there is one: the template's
    later versions, rendered by cruft, write the same line, so it never differs in an update.
    """
    path = Path(".cookiecutter.json")
    answers = json.loads(path.read_text(encoding="utf-8"))
    kept = {key: value for key, value in answers.items() if not key.startswith("_") or key == "_template"}
    if source is not None:
        kept["_template"] = source
    path.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return kept


def recorded_template() -> str | None:
    """The template source in the project's own .cruft.json, kept through a re-bake; None if it has none."""
    try:
        template = json.loads(CRUFT_FILE.read_text(encoding="utf-8")).get("template")
    except (OSError, ValueError, AttributeError):
        return None
    return template if isinstance(template, str) else None


def record_cruft_state(answers: dict, source: tuple[str, str, str | None] | None) -> None:
    """Write .cruft.json as `cruft create` does, with the skip list; without a commit, say how to link later."""
    if source is None:
        print(
            f"note: no .cruft.json: no git commit found for the template {TEMPLATE} "
            "(not a git checkout, or git is missing); "
            "to take its later changes, run `cruft link <the template's git URL>` in the project"
        )
        return
    template, commit, directory = source
    state = {
        "template": template,
        "commit": commit,
        "checkout": CHECKOUT or None,
        "context": {"cookiecutter": {**{key: answers[key] for key in QUESTIONS if key in answers}, "_commit": commit}},
        "directory": directory,
        "skip": CRUFT_SKIP,
    }
    CRUFT_FILE.write_text(json.dumps(state, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    record = load_record()
    remove_files(SEQUENCE_FILES if TASK == "image" else IMAGE_FILES, record)
    if GITHUB_ACTIONS != "yes":
        remove_github_actions(record)
    source = None if UNDER_CRUFT else template_source()
    point_at_library(library_reference(source))
    if UNDER_CRUFT:
        record_answers(None)
    elif CRUFT_FILE.exists():
        record_answers(recorded_template())
    else:
        record_cruft_state(record_answers(source[0] if source else None), source)
    record_path().unlink(missing_ok=True)
