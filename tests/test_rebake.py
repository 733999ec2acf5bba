"""Re-baking over a project (`cookiecutter -f`) removes only what the template wrote in that bake.

The user's own files survive byte for byte, whatever the new answers switch off.
"""

import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

PKG = "src/vision_project"
TASK_FILES = {
    "image": [
        f"{PKG}/models/cnn.py",
        f"{PKG}/data/images.py",
        f"{PKG}/data/cifar10.py",
        f"{PKG}/data/synthetic.py",
        "tests/test_images.py",
        "tests/test_cifar10.py",
        "tests/test_cnn.py",
        "tests/test_synthetic.py",
        "configs/cifar10.yaml",
        "configs/image_folder.yaml",
    ],
    "sequence": [
        f"{PKG}/models/attention.py",
        f"{PKG}/data/sequences.py",
        "tests/test_sequences.py",
        "tests/test_attention.py",
        "configs/from_file.yaml",
    ],
}
OTHER = {"image": "sequence", "sequence": "image"}
CI = ".github/workflows/ci.yml"
MINE = ".github/workflows/mine.yml"
# Not text the template could write, nor valid UTF-8: only a byte-exact restore gives it back.
EDIT = b"\n# the user's own change \xff\xfe\r\n"


def files(root: Path) -> dict[str, bytes]:
    """Every file under root, by relative path, with its bytes."""
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


@pytest.fixture
def records(tmp_path, monkeypatch) -> Path:
    """The folder where the hooks, run as subprocesses, keep their records; this process keeps its own."""
    folder = tmp_path / "records"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", tempfile.gettempdir())
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.fixture
def rebake(template_dir, tmp_path, records):
    """Bake with `overwrite_if_exists`, as `cookiecutter -f` does, into one output folder; return the project."""
    config = tmp_path / "config.yaml"
    config.write_text(f"cookiecutters_dir: {tmp_path / 'cookiecutters'}\nreplay_dir: {tmp_path / 'replay'}\n")

    def _rebake(output: str = "out", **answers: str) -> Path:
        root = cookiecutter(
            str(template_dir),
            no_input=True,
            overwrite_if_exists=True,
            output_dir=str(tmp_path / output),
            extra_context=answers,
            config_file=str(config),
        )
        return Path(root)

    return _rebake


@pytest.mark.parametrize(("task", "github_actions"), [("image", "yes"), ("sequence", "no")])
def test_a_first_bake_with_overwrite_has_exactly_the_files_of_a_fresh_bake(
    rebake, cookies, template_dir, records, task, github_actions
):
    """With nothing there before, `-f` changes nothing: same files, same bytes, and no record left behind."""
    fresh = cookies.bake(extra_context={"task": task, "github_actions": github_actions}, template=str(template_dir))
    assert fresh.exit_code == 0, fresh.exception
    root = rebake(task=task, github_actions=github_actions)
    assert files(root) == files(Path(fresh.project_path))
    assert not any(records.iterdir()), "the pre-generation hook's record outlived the bake"


@pytest.mark.parametrize("task", ["image", "sequence"])
def test_switching_task_keeps_the_users_files_of_the_old_task(rebake, records, task):
    """Each edited file of the old task comes back byte for byte, with its mode; the new task's files are written."""
    root = rebake(task=task)
    for name in TASK_FILES[task]:
        with (root / name).open("ab") as file:
            file.write(EDIT)
    (root / TASK_FILES[task][0]).chmod(0o755)
    before = files(root)

    root = rebake(task=OTHER[task])
    after = files(root)
    for name in TASK_FILES[task]:
        assert after[name] == before[name], f"{name}: the user's bytes were lost"
    assert stat.S_IMODE((root / TASK_FILES[task][0]).stat().st_mode) == 0o755
    assert set(TASK_FILES[OTHER[task]]) <= after.keys()
    assert not any(records.iterdir()), "the pre-generation hook's record outlived the bake"


@pytest.mark.parametrize("task", ["image", "sequence"])
def test_switching_task_does_not_bring_back_old_task_files_the_user_deleted(rebake, task):
    """Files this bake wrote for a task not chosen are removed, even beside the user's own files."""
    root = rebake(task=task)
    for name in TASK_FILES[task]:
        (root / name).unlink()

    root = rebake(task=OTHER[task])
    assert not set(TASK_FILES[task]) & files(root).keys()
    assert set(TASK_FILES[OTHER[task]]) <= files(root).keys()


def test_switching_off_github_actions_keeps_the_users_workflows_and_other_files(rebake, records):
    """The user's edited ci.yml and their own workflow survive `github_actions=no`, as does an edited task file."""
    root = rebake(task="image", github_actions="yes")
    with (root / CI).open("ab") as file:
        file.write(EDIT)
    (root / MINE).write_bytes(b"name: mine\non: push\n" + EDIT)
    with (root / TASK_FILES["image"][0]).open("ab") as file:
        file.write(EDIT)
    (root / "tests/test_images.py").unlink()
    before = files(root)

    root = rebake(task="sequence", github_actions="no")
    after = files(root)
    for name in (CI, MINE, TASK_FILES["image"][0]):
        assert after[name] == before[name], f"{name}: the user's bytes were lost"
    assert "tests/test_images.py" not in after
    assert not any(records.iterdir()), "the pre-generation hook's record outlived the bake"


def test_a_workflow_the_template_wrote_in_this_bake_is_removed_beside_the_users_own(rebake):
    """With `github_actions=no` the template's fresh ci.yml goes; the user's workflow and folders stay."""
    root = rebake(github_actions="no")
    assert not (root / ".github").exists()
    (root / ".github/workflows").mkdir(parents=True)
    (root / MINE).write_bytes(b"name: mine\n")

    root = rebake(github_actions="no")
    assert sorted(name for name in files(root) if name.startswith(".github/")) == [MINE]
    assert (root / MINE).read_bytes() == b"name: mine\n"


def test_folders_the_template_created_in_this_bake_are_removed_and_the_users_empty_ones_kept(rebake):
    """Only .github/workflows, created by this bake, goes: the user's other file and empty folder stay."""
    root = rebake(github_actions="no")
    (root / ".github/ISSUE_TEMPLATE").mkdir(parents=True)
    (root / ".github/dependabot.yml").write_bytes(b"version: 2\n")

    root = rebake(github_actions="no")
    assert sorted(os.listdir(root / ".github")) == ["ISSUE_TEMPLATE", "dependabot.yml"]
    assert (root / ".github/dependabot.yml").read_bytes() == b"version: 2\n"


def test_re_baking_with_the_same_task_does_not_bring_back_the_other_tasks_files(rebake, records):
    """The other task's files are written again by every bake, and removed again, since they are not the user's."""
    first = files(rebake(task="image", github_actions="no"))
    root = rebake(task="image", github_actions="no")
    assert files(root).keys() == first.keys()
    assert not set(TASK_FILES["sequence"]) & files(root).keys()
    assert not any(records.iterdir()), "the pre-generation hook's record outlived the bake"


def test_a_rejected_re_bake_leaves_the_project_as_it_was(rebake, records):
    """A bad answer stops a re-bake before anything is written: the user's project is untouched."""
    root = rebake(task="image")
    with (root / TASK_FILES["image"][0]).open("ab") as file:
        file.write(EDIT)
    before = files(root)
    with pytest.raises(FailedHookException):
        rebake(task="sequence", version="one")
    assert files(root) == before
    assert not any(records.iterdir()), "a rejected bake left a record behind"


# A path the template writes, made a link by the user: the file a re-bake would overwrite, and what replaces it.
LINKED = [
    "README.md",
    "configs/synthetic.yaml",
    f"{PKG}/data/sequences.py",  # the other task's file: written by each bake, then removed
    ".cruft.json",  # written by the post-generation hook where there is none
]


@pytest.mark.parametrize("name", LINKED)
def test_a_re_bake_never_writes_through_a_symbolic_link(rebake, records, capfd, tmp_path, name):
    """A linked file the template writes stops the re-bake in one line: the file it points to keeps its bytes."""
    root = rebake(task="image")
    target = tmp_path / "shared" / Path(name).name
    target.parent.mkdir()
    target.write_bytes(b"shared with other projects\n" + EDIT)
    (root / name).unlink(missing_ok=True)
    (root / name).symlink_to(target)
    before = files(root)
    capfd.readouterr()

    with pytest.raises(FailedHookException):
        rebake(task="image")
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert errors == [
        f"ERROR: {name} is a symbolic link to {target}: a re-bake would write the template's file into the file it "
        "points to; replace the link with a copy of its target, or move it out of the project, and bake again"
    ]
    assert target.read_bytes() == b"shared with other projects\n" + EDIT
    assert os.readlink(root / name) == str(target)
    assert files(root) == before
    assert not any(records.iterdir()), "a rejected bake left a record behind"


def _files_below(folder):
    """Each file below ``folder`` (its subfolders too), by relative path, with its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def test_a_re_bake_never_writes_into_a_linked_folder_nor_through_a_dangling_link(rebake, records, capfd, tmp_path):
    """A linked folder the template writes into, and a link to no file yet, are each named; nothing is written."""
    root = rebake(task="sequence")
    shared = tmp_path / "shared-configs"
    (root / "configs").rename(shared)
    (root / "configs").symlink_to(shared)
    (root / "README.md").unlink()
    (root / "README.md").symlink_to(tmp_path / "nowhere.md")
    before = _files_below(shared)
    capfd.readouterr()

    with pytest.raises(FailedHookException):
        rebake(task="image")
    errors = [line.split(" is ")[0] for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert errors == ["ERROR: README.md", "ERROR: configs"]
    assert _files_below(shared) == before
    assert not (tmp_path / "nowhere.md").exists()
    assert not any(records.iterdir()), "a rejected bake left a record behind"


def test_a_re_bake_never_writes_into_a_file_with_other_hard_links(rebake, capfd, tmp_path):
    """Overwriting a hard-linked file would change its other names too: the re-bake stops and names it."""
    root = rebake()
    other = tmp_path / "elsewhere.yaml"
    os.link(root / "configs/synthetic.yaml", other)
    with (root / "configs/synthetic.yaml").open("ab") as file:
        file.write(EDIT)
    before = other.read_bytes()
    capfd.readouterr()

    with pytest.raises(FailedHookException):
        rebake()
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert errors == [
        "ERROR: configs/synthetic.yaml is a file with 1 other hard link(s): a re-bake would write into it and change "
        "them too; replace it with a copy of its own (cp, then mv over it), and bake again"
    ]
    assert other.read_bytes() == before


def test_links_where_the_template_writes_nothing_are_left_alone(rebake, tmp_path):
    """A linked data folder, a linked notes file and a venv's links do not stop a re-bake, and stay links."""
    root = rebake()
    datasets, notes = tmp_path / "datasets", tmp_path / "notes.md"
    datasets.mkdir()
    notes.write_bytes(b"notes\n")
    (root / "data").symlink_to(datasets)
    (root / "notes.md").symlink_to(notes)
    (root / ".venv/bin").mkdir(parents=True)
    (root / ".venv/bin/python").symlink_to(sys.executable)

    root = rebake()
    assert os.readlink(root / "data") == str(datasets) and os.readlink(root / "notes.md") == str(notes)
    assert notes.read_bytes() == b"notes\n" and not any(datasets.iterdir())
