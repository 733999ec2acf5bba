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
this bake created, and deletes the record. A re-bake that would write through a
link (a path the template writes, or a folder on its way, that links out of the
project) stops here instead, before anything is written.
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
# Every answer, to render the template's file names as cookiecutter does (JSON in a string: `null` is no Python);
# the template's folder as the user named it.
CONTEXT = json.loads({{cookiecutter | tojson | tojson}})
TEMPLATE_FOLDER = {{(cookiecutter.get("_repo_dir") or "") | tojson}}

# Top-level modules that a generated project's runs, tests and tools import, from its dependencies (every extra)
# and theirs, and the optional packages Lightning and jsonargparse import where one of that name is found: a package
# with the project's slug would be imported in their place, and the project would crash on start.
# tests/test_hooks.py bakes each task, collects every module a run imports, and names any missing here.
# A block of names, not a list literal: 130 lines of one name each would hide what is in it.
DEPENDENCY_MODULES = frozenset(
    """
    absl aiohappyeyeballs aiohttp aiosignal alembic annotated_doc annotated_types anyio argcomplete arrow attr attrs
    backports binaryornot bitsandbytes bottle cachetools certifi cffi cfgv charset_normalizer click cloudpickle
    colorlog comet_ml contourpy cookiecutter coreweave_evaluations cruft cryptography cuda cycler cython_runtime
    databricks dateutil deepspeed distlib distro docstring_parser dotenv execnet fastapi filelock frozenlist fsspec
    functorch git gitdb google greenlet grpc h11 httpcore httptools httpx hydra identify idna importlib_metadata
    iniconfig isympy jaraco jinja2 jsonargparse jsonschema kiwisolver lightning lightning_fabric lightning_kit
    lightning_sdk lightning_utilities litdata litlogger litmodels litserve mako markdown markdown_it markupsafe
    matplotlib mdurl ml_dtypes mlflow more_itertools mpi4py mpl_toolkits mpmath multidict multipart neptune networkx
    nodeenv numpy nvidia omegaconf onnx onnx_ir onnxscript opentelemetry optuna optuna_dashboard packaging
    pkg_resources platformdirs pluggy pre_commit pre_commit_hooks propcache psutil psycopg psycopg_binary py pyasn1
    pyasn1_modules pycparser pydantic pydantic_core pygments pylab pyparsing pytest pytest_cookies python_discovery
    python_multipart pytorch_lightning requests rich ruamel ruff scipy setuptools shellingham shtab six slugify
    smmap sniffio sqlalchemy sqlparse starlette sympy tabulate tensorboard tensorboard_data_server text_unidecode
    toml torch torch_tensorrt torch_xla torchgen torchmetrics torchvision tqdm transformer_engine triton typer
    typeshed_client typing_extensions typing_inspection tzdata urllib3 uvicorn uvloop virtualenv wandb watchfiles
    websockets werkzeug xdist xxhash yaml yarl zipp zmq
    """.split()  # noqa: SIM905
)
# The standard library that sys.stdlib_module_names of the Python running this hook leaves out: `test`, left out of
# it by design, and the modules a Python the project admits (3.10 to 3.14) has and this one may not.
OTHER_STDLIB = frozenset(
    """
    aifc annotationlib asynchat asyncore audioop cgi cgitb chunk compression crypt distutils imghdr imp lib2to3
    mailcap msilib nis nntplib ossaudiodev pipes smtpd sndhdr spwd sunau telnetlib test tomllib uu xdrlib
    """.split()  # noqa: SIM905
)
# Names the project gives its own modules and folders: `python train.py` imports train.py as `train`, ahead of
# any package; pytest imports tests/conftest.py and each tests/test_*.py under its file name.
OWN_NAMES = {
    "conftest": "tests/conftest.py",
    "src": "src/ folder",
    "tests": "tests/ folder",
    "train": "train.py",
}
SLUG = re.compile(r"[a-z][a-z0-9_]*")
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
    PACKAGE / "data" / "cifar10.py",
    PACKAGE / "data" / "synthetic.py",
    Path("tests") / "test_images.py",
    Path("tests") / "test_cifar10.py",
    Path("tests") / "test_cnn.py",
    Path("tests") / "test_synthetic.py",
    Path("configs") / "cifar10.yaml",
    Path("configs") / "image_folder.yaml",
    PACKAGE / "models" / "attention.py",
    PACKAGE / "data" / "sequences.py",
    Path("tests") / "test_sequences.py",
    Path("tests") / "test_attention.py",
    Path("configs") / "from_file.yaml",
]
REMOVABLE_TREE = Path(".github")


def slug_problem(slug: str) -> str | None:
    """What is wrong with ``slug`` as the project's package name, or None where nothing is."""
    if not slug:
        return (
            "project_slug is empty: give a project_name with letters or digits, "
            "or a project_slug such as 'vision_project'"
        )
    if len(slug) > MAX_SLUG_LENGTH:
        # A default slug arrives cut at one character more than the limit, so its length is not told.
        return (
            f"project_slug is longer than {MAX_SLUG_LENGTH} characters: use at most {MAX_SLUG_LENGTH}, "
            "from a shorter project_name or given explicitly, e.g. 'vision_project'"
        )
    if not SLUG.fullmatch(slug):
        return (
            f"project_slug {slug!r} is not a valid package name: "
            "use lowercase ASCII letters, digits and underscores, starting with a letter"
        )
    if keyword.iskeyword(slug) or keyword.issoftkeyword(slug):
        return f"project_slug {slug!r} is a Python keyword: choose another package name"
    if slug in sys.stdlib_module_names or slug in OTHER_STDLIB or slug in DEPENDENCY_MODULES:
        return (
            f"project_slug {slug!r} would shadow the package of that name: "
            "choose a name of your own, e.g. 'vision_project'"
        )
    own = OWN_NAMES.get(slug, "test modules (tests/test_*.py)" if slug.startswith("test_") else None)
    if own is not None:
        return (
            f"project_slug {slug!r} is the name of the project's own {own}, which would be imported in its place: "
            "choose a name of your own, e.g. 'vision_project'"
        )
    return None


def problems() -> list[str]:
    found = []
    if not PROJECT_NAME.strip():
        found.append("project_name is empty: give the project a name, e.g. 'Vision Project'")
    elif len(PROJECT_NAME) > MAX_NAME_LENGTH:
        found.append(
            f"project_name is {len(PROJECT_NAME)} characters long: use at most {MAX_NAME_LENGTH}, e.g. 'Vision Project'"
        )
    if (slug := slug_problem(PROJECT_SLUG)) is not None:
        found.append(slug)
    if not EMAIL.fullmatch(AUTHOR_EMAIL):
        found.append(f"author_email {AUTHOR_EMAIL!r} is not an email address: use the form name@example.com")
    if not PEP440.fullmatch(VERSION):
        found.append(f"version {VERSION!r} is not a PEP 440 version: use a form such as 0.1.0 or 1.0.0rc1")
    return found


def template_folder() -> Path | None:
    """The template's folder, or None where it cannot be told (the post-generation hook's rule).

    Cookiecutter and cruft run this hook from inside the template's folder, which Linux
    shows as the parent's working folder; elsewhere the folder as given, made absolute
    with the shell's $PWD where it is relative. Each counts only if it holds a cookiecutter.json.
    """
    candidates = [Path("/proc", str(os.getppid()), "cwd")]
    if TEMPLATE_FOLDER:
        candidates.append(Path(os.environ.get("PWD", ""), TEMPLATE_FOLDER))
    for candidate in candidates:
        try:
            resolved = candidate.resolve(strict=True)
        except OSError:
            continue
        if (resolved / "cookiecutter.json").is_file():
            return resolved
    return None


def project_paths() -> list[Path]:
    """Every path already in the project but in what the template never writes: git's folder, data/, runs/, venvs."""
    found = []
    for root, dirs, files in os.walk("."):
        users_own = {".git", "data", "runs"} if root == "." else {".git"}
        dirs[:] = [name for name in dirs if name not in users_own and not Path(root, name, "pyvenv.cfg").exists()]
        found += [Path(root, name) for name in dirs + files]
    return found


def written_paths() -> list[Path] | None:
    """Every path this bake may write, relative to the project, folders included; None where it cannot be told.

    That is each file and folder of the template, its name rendered with the answers as
    cookiecutter renders it, and the two files the post-generation hook writes.
    """
    folder = template_folder()
    if folder is None:
        return None
    template = next((path for path in folder.iterdir() if path.is_dir() and "cookiecutter." in path.name), None)
    if template is None:
        return None
    # Cookiecutter's own renderer, in the Python that runs cookiecutter and so this hook.
    from cookiecutter.environment import StrictEnvironment

    environment = StrictEnvironment(context={"cookiecutter": CONTEXT})
    written = [Path(".cookiecutter.json"), Path(".cruft.json")]
    for root, dirs, files in os.walk(template):
        for name in dirs + files:
            relative = Path(root, name).relative_to(template).as_posix()
            rendered = environment.from_string(relative).render(cookiecutter=CONTEXT)
            if rendered:
                written.append(Path(rendered))
    return written


def links_in_the_way() -> list[str]:
    """A line for each link through which this bake would write what is not the project's own file.

    `cookiecutter -f` opens each path for writing, following a symbolic link, in a folder
    that may itself be a link; a file with other hard links shares its bytes with them.
    Either way the template's text would land in a file outside the project, so the bake
    stops before writing anything, rather than replacing the link: the link is what the
    user made, and where it points is theirs to decide. Where the template's folder cannot
    be found (cruft, off Linux), each link in the project that the template might write counts.
    """
    written = written_paths()
    if written is None:
        paths, would, unsure = set(project_paths()), "might write", " (the template's folder was not found)"
    else:
        paths = {path for path in written for path in (path, *path.parents) if path != Path(".")}
        would, unsure = "would write", ""
    found, linked = [], []
    for path in sorted(paths):
        if any(folder in path.parents for folder in linked) or not os.path.lexists(path):
            continue
        if path.is_symlink():
            linked.append(path)
            what = "files into the folder" if path.is_dir() else "file into the file"
            found.append(
                f"{path.as_posix()} is a symbolic link to {os.readlink(path)}: a re-bake {would} the template's "
                f"{what} it points to; replace the link with a copy of its target, or move it out of the project, "
                f"and bake again{unsure}"
            )
        elif path.is_file() and path.stat().st_nlink > 1:
            found.append(
                f"{path.as_posix()} is a file with {path.stat().st_nlink - 1} other hard link(s): a re-bake {would} "
                "into it and change them too; replace it with a copy of its own (cp, then mv over it), "
                f"and bake again{unsure}"
            )
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
    errors = problems() or links_in_the_way()
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    if errors:
        sys.exit(1)
    record_existing_files()
