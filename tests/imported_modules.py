"""Print, as JSON, every top-level module name that the baked project in the working folder can import.

Run by tests/test_hooks.py, in the template's environment standing in for the project's, from
the project's folder. Three sources, each catching what the others miss:

- ``written``: what the project's own files import (``import x``, ``from x import``,
  ``importorskip("x")``, ``import_module("x")``), anywhere in a function too, and the names
  of its own top-level modules: train.py, and tests/*.py, which pytest imports by file name;
- ``installed``: the top-level modules of every installed distribution the project
  requires (every extra) or imports, and of theirs, all the way down;
- ``loaded``: ``sys.modules`` after importing each module of the package, ``train.py --help``
  and ``train.py fit --help``, and collecting the tests (modules made at run time, plugins).
"""

import ast
import contextlib
import importlib
import importlib.metadata
import io
import json
import pkgutil
import runpy
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOADERS = ("importorskip", "import_module")


def top(name: str) -> str:
    return name.partition(".")[0]


def written(root: Path) -> set[str]:
    names = {path.stem for path in [*root.glob("*.py"), *root.glob("tests/*.py")]}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {top(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(top(node.module))
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if function in LOADERS:
                    names.add(top(str(node.args[0].value)))
    return names


def installed(root: Path, imported: set[str]) -> set[str]:
    providers = importlib.metadata.packages_distributions()
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = [text for texts in project.get("optional-dependencies", {}).values() for text in texts]
    todo = [Requirement(text) for text in [*project["dependencies"], *extras]]
    todo += [Requirement(name) for module in imported for name in providers.get(module, [])]
    seen = set()
    while todo:
        requirement = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.distribution(requirement.name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency of a dependency, not installed here
        environments = [{"extra": extra} for extra in requirement.extras] or [{"extra": ""}]
        for text in requires:
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate(env) for env in environments):
                todo.append(needed)
    distributions = {name for name, _ in seen}
    return {
        module.partition("/")[0]
        for module, names in providers.items()
        if any(canonicalize_name(name) in distributions for name in names)
    }


def loaded(root: Path) -> set[str]:
    sys.path.insert(0, str(root / "src"))
    (package,) = (path.name for path in (root / "src").iterdir() if (path / "__init__.py").is_file())
    for info in pkgutil.walk_packages([str(root / "src" / package)], prefix=f"{package}."):
        importlib.import_module(info.name)
    for argv in (["train.py", "--help"], ["train.py", "fit", "--help"]):
        sys.argv = argv
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(root / "train.py"), run_name="__main__")
    with contextlib.redirect_stdout(io.StringIO()) as output:
        collected = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"])
    assert collected == 0, output.getvalue()[-4000:]
    return {top(name) for name in sys.modules}


if __name__ == "__main__":
    root = Path.cwd()
    own = written(root)
    names = {"written": own, "installed": installed(root, own), "loaded": loaded(root)}
    print(json.dumps({source: sorted(found) for source, found in names.items()}))
