"""Whether the library installed is the one the project names, and has what it needs: one line at start-up (README:
"The library installed is the one the project names"). The standard library only: imported before the requirements.
"""

import importlib.metadata
import json
import os
import re
import shlex
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from .files import NotAFileError, open_regular
from .passwords import scrubbed
from .project import DISTRIBUTION, ProjectFile, find_project, marker_applies

# Set to the project's pyproject.toml once said, for this process and those it starts (DDP ranks, trials, servers).
CHECKED = "LIGHTNING_KIT_INSTALLATION_CHECKED"
# The processes of a distributed run that are not its first: they stay quiet.
_RANKS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")  # SHA-1's 40 hex digits, SHA-256's 64, or a prefix of either
# The most a git file read may hold: HEAD, a ref, "gitdir: <path>" are one line; packed-refs a line per ref.
_SMALL, _PACKED = 4096, 1 << 20
# A branch or tag HEAD names: "refs/heads/<name>", with none of the parts git refuses ("..", a leading "/" or "-").
_REF = re.compile(r"refs/(?:[A-Za-z0-9_][A-Za-z0-9_.+-]*/)*[A-Za-z0-9_][A-Za-z0-9_.+-]*")
# The user information of a URL (git+https://<token>@host/...): a token pip is given, which no message shows.
_CREDENTIALS = re.compile(r"(?<=://)[^/\s@:]*(?::[^\s@]*)?@")
# The commit in a version setuptools-scm derived from git: 0.1.1.dev5+g1a2b3c4d5 (and .d20261202 when dirty).
_VERSION_COMMIT = re.compile(r"\+g([0-9a-f]{7,40})\b")


@dataclass(frozen=True)
class Installed:
    """The library in this environment: its version and where pip took it from (PEP 610's direct_url.json)."""

    version: str
    url: str | None = None  # the URL pip installed from: a git repository, or a file:// folder
    commit: str | None = None  # the commit pip checked out, for a git URL
    editable: bool = False
    requested: str | None = None  # the revision the requirement named when pip installed it (a tag, a branch)

    @property
    def version_commit(self) -> str | None:
        found = _VERSION_COMMIT.search(self.version)
        return found[1] if found else None

    def described(self) -> str:
        source = f"{self.url}@{self.commit[:9]}" if self.url and self.commit else self.url
        how = "editable, " if self.editable else ""
        return f"lightning-kit {self.version}" + (f" ({how}from {source})" if source else "")


def installed() -> Installed | None:
    """The library installed where this process imports from; None when there is none."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        direct = json.loads(distribution.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    direct = direct if isinstance(direct, dict) else {}
    vcs = direct.get("vcs_info") if isinstance(direct.get("vcs_info"), dict) else {}
    folder = direct.get("dir_info") if isinstance(direct.get("dir_info"), dict) else {}
    url = direct.get("url") if isinstance(direct.get("url"), str) else None
    commit = vcs.get("commit_id") if isinstance(vcs.get("commit_id"), str) else None
    requested = vcs.get("requested_revision") if isinstance(vcs.get("requested_revision"), str) else None
    return Installed(distribution.version, url, commit, bool(folder.get("editable")), requested)


def missing_requirements() -> list[str]:
    """The library's own requirements (not its extras') that this environment lacks: ``pip install --no-deps``."""
    try:
        required = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for text in required:
        marker = text.partition(";")[2]
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
        if "extra" in marker or name is None or not marker_applies(marker):
            continue  # an extra's, or not for this environment
        try:
            importlib.metadata.distribution(name[1])
        except importlib.metadata.PackageNotFoundError:
            missing.append(name[1])
    return missing


def difference(library: Installed | None, project: ProjectFile) -> str | None:
    """Why ``library`` is not the one ``project`` names, in words; None where it is (or where it cannot be told)."""
    named_url = project.url
    if library is None or (named_url is None and not project.specifier):
        return None  # run from its source folder, not installed; or named by no version
    if named_url is None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version

        try:
            accepted = SpecifierSet(project.specifier).contains(Version(library.version), prereleases=True)
        except (InvalidSpecifier, InvalidVersion):
            return None
        return None if accepted else f"version {library.version} is outside {project.specifier}"
    if named_url.startswith("git+"):
        # git+https://host/repo@<rev>#subdirectory=...: the repository's URL and the revision (None if none).
        base = named_url.removeprefix("git+").partition("#")[0]
        parsed = urllib.parse.urlsplit(base)
        path, at, revision = parsed.path.rpartition("@")
        base, revision = (urllib.parse.urlunsplit(parsed._replace(path=path)), revision) if at else (base, None)
        installed_commit = library.commit or library.version_commit
        if revision is None or not _COMMIT.fullmatch(revision):
            # A tag or branch: from that repository, at the revision pip was given (where a branch is now needs git).
            if library.url is None or library.url.removeprefix("git+").rstrip("/") != base.rstrip("/"):
                return "it was installed from elsewhere"
            if revision is not None and library.requested is not None and library.requested != revision:
                return f"it was installed at {library.requested}, not {revision}"
            return None
        if installed_commit is None:
            return "it is not from a commit of the template's repository"
        if not (installed_commit.startswith(revision) or revision.startswith(installed_commit)):
            return f"it is commit {installed_commit[:9]}, not {revision[:9]}"
        return None
    if named_url.startswith("file:"):
        named_folder = _file_path(named_url)
        if library.url is None or not library.url.startswith("file:") or _file_path(library.url) != named_folder:
            return "it was installed from elsewhere"
        if library.editable:
            return None  # it is that folder, as the folder is now
        now = _head_commit(named_folder)
        if now is not None and library.version_commit is not None and not now.startswith(library.version_commit):
            return f"it was copied from that folder at commit {library.version_commit}, which is at {now[:9]} now"
        return None
    return None if library.url == named_url else "it was installed from elsewhere"


def _file_path(url: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).resolve()


def _head_commit(folder: Path) -> str | None:
    """The commit checked out in the git repository ``folder`` lies in, its files read as bounded data (git is not
    run); HEAD's ``ref:`` is followed only inside the repository (``refs/...``). None where it cannot be told."""
    for candidate in [folder, *folder.parents][:8]:
        git = candidate / ".git"
        if git.is_file():  # a worktree or submodule: "gitdir: <path>"
            pointer = _small(git, _SMALL) or ""
            if not pointer.startswith("gitdir:"):
                return None
            git = candidate / pointer.removeprefix("gitdir:").strip()
        if not git.is_dir():
            continue
        head = (_small(git / "HEAD", _SMALL) or "").strip()
        if not head.startswith("ref:"):
            return head if _COMMIT.fullmatch(head) else None
        ref = head.removeprefix("ref:").strip()
        if not _REF.fullmatch(ref):
            return None
        named = (_small(git / ref, _SMALL) or "").strip()
        if _COMMIT.fullmatch(named):
            return named
        packed = _small(git / "packed-refs", _PACKED) or ""
        found = next((line.split()[0] for line in packed.splitlines() if line.endswith(f" {ref}")), None)
        return found if found is not None and _COMMIT.fullmatch(found) else None
    return None


def _small(path: Path, most: int) -> str | None:
    """The text of ``path`` where it is a plain file of at most ``most`` bytes, else None."""
    try:
        with open_regular(path) as file:
            data = file.read(most + 1)
        return data.decode("utf-8") if len(data) <= most else None
    except (NotAFileError, OSError, UnicodeDecodeError):
        return None


def install_command(project: ProjectFile | None) -> str:
    named = project.requirement if project is not None else None
    return f"pip install {shlex.quote(named)}" if named else "pip install lightning-kit"


def missing_line(project: ProjectFile | None) -> str | None:
    """One line naming what the library lacks here and the command that installs it; None where nothing is missing."""
    if not (missing := missing_requirements()):
        return None
    needs = f"lightning-kit is installed without what it needs ({', '.join(missing)}; installed with --no-deps?)"
    return without_credentials(f"{needs}: {install_command(project)}")


def problem(start: str | Path | None = None) -> str | None:
    """One line on how the library installed differs from the one ``start``'s project names; None where they agree."""
    return _problem_of(find_project(start))


def _problem_of(project: ProjectFile | None) -> str | None:
    library = installed()
    why = difference(library, project) if project is not None and library is not None else None
    if why is None:
        return None
    command = install_command(project)
    if project.url is not None and project.url.startswith("file:"):
        # pip keeps the wheel it built of a folder by the folder's URL and counts a copy from that URL as the
        # requirement met: the folder as it is now is installed only when pip is told to build it again.
        command = command.replace("pip install ", "pip install --force-reinstall --no-deps --no-cache-dir ", 1)
    return without_credentials(
        f"{library.described()} is installed, but {project.path} names {project.requirement} ({why}): "
        f"{command} installs that one"
    )


def without_credentials(text: str) -> str:
    """``text`` with the user information of every URL in it (a token, a password) shown as ``***``."""
    return scrubbed(_CREDENTIALS.sub("***@", text))


def check_installation(module: str | None = None) -> None:
    """At a command's start: stop in one line where the library lacks what it needs; warn in one line where it is
    not the one the project names (once, by a run's first process). The project is ``module``'s, else the working
    folder's."""
    project = find_project(_folder_of(module))
    if (missing := missing_line(project)) is not None:
        sys.exit(f"error: {missing}")
    checked = str(project.path) if project is not None else ""
    if os.environ.get(CHECKED) == checked or any(os.environ.get(name, "0") not in ("", "0") for name in _RANKS):
        return
    os.environ[CHECKED] = checked
    if (found := _problem_of(project)) is not None:
        sys.stderr.write(f"warning: {found}\n")
        sys.stderr.flush()


def _folder_of(module: str | None) -> Path | None:
    """The folder of ``module``'s file (imported: it is running); None for the library's own modules."""
    if not module or module.partition(".")[0] == __package__:
        return None
    location = getattr(sys.modules.get(module), "__file__", None)
    if not location:
        return None
    folder = Path(location).resolve().parent
    # An installed copy (site-packages) has no pyproject.toml of its own: the working folder's project is asked.
    return None if "site-packages" in folder.parts or "dist-packages" in folder.parts else folder
