"""Find manual device placement in Python files: calls that move tensors or modules, and devices written in.

Lightning places the model and the batches; docs/device-placement.md gives the rules for the
rest. This check reads the source (nothing is imported or run), prints
``path:line: <what> — <the fix>`` for each placement it finds and exits 1, or exits 0 when
there is none. The pre-commit hook ``no-manual-placement`` runs it on every changed file in
``src/`` and ``train.py``, and ``tests/test_placement.py`` runs it on the whole project::

    python -m {{ cookiecutter.project_slug }}.lint_placement FILES...   # no FILES: src/ and train.py here
    python src/{{ cookiecutter.project_slug }}/lint_placement.py FILES...  # the same, before `pip install -e .`

Three modules of the package stand in for Lightning and are exempt: the audit and the
simulated GPU, which play Lightning's part on a GPU, and the benchmark's hand-written loop.
It needs the standard library only, so that it runs as a script too.
"""

import ast
import sys
from pathlib import Path
from typing import NamedTuple

EXEMPT = ("placement.py", "simulated_gpu.py", "bench.py")
PACKAGE = Path(__file__).resolve().parent.name
DOCS = "docs/device-placement.md"
MOVED = "delete it: Lightning moves the model and the batches; make new tensors with device=x.device"
FIXES = {
    "cuda": f"{MOVED} ({DOCS}, rules 1 and 2)",
    "cpu": f"keep tensors where Lightning put them: log them with self.log ({DOCS}, rule 6)",
    "to": f"{MOVED}, and constants as registered buffers ({DOCS}, rules 1 to 3)",
    "device": f"take the device from the data or the module: x.device, self.device, pl_module.device ({DOCS}, rule 11)",
}


class Finding(NamedTuple):
    line: int
    what: str
    fix: str


def _mentions_device(node: ast.Call) -> bool:
    args = [*node.args, *(keyword.value for keyword in node.keywords)]
    return any(
        "device" in ast.unparse(arg).lower() or "cuda" in ast.unparse(arg) or "'cpu'" in ast.unparse(arg)
        for arg in args
    ) or any(keyword.arg == "device" for keyword in node.keywords)


def _written_device(node: ast.Call) -> ast.keyword | None:
    """A ``device=`` argument that is a literal, such as ``device="cuda"`` or ``device=0``."""
    for keyword in node.keywords:
        value = keyword.value
        if keyword.arg == "device" and isinstance(value, ast.Constant) and isinstance(value.value, str | int):
            return keyword
    return None


def _placement(node: ast.Call) -> tuple[str, str] | None:
    """What the call places by hand and how to fix it, or None."""
    name = node.func.attr if isinstance(node.func, ast.Attribute) else None
    if name in ("cuda", "cpu"):
        return f"`.{name}()`", FIXES[name]
    if name == "to" and _mentions_device(node):
        return f"`.to({', '.join(ast.unparse(arg) for arg in [*node.args, *node.keywords])})`", FIXES["to"]
    if name == "device" and ast.unparse(node.func.value) == "torch" and "cuda" in ast.unparse(node):
        return f"`{ast.unparse(node)}`", FIXES["device"]
    if (keyword := _written_device(node)) is not None:
        return f"`{ast.unparse(keyword)}`", FIXES["device"]
    return None


def manual_placements(source: str) -> list[Finding]:
    """Each place in ``source`` that puts a tensor or module on a device by hand, in line order."""
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
    return sorted(Finding(node.lineno, *found) for node in calls if (found := _placement(node)) is not None)


def is_exempt(path: Path) -> bool:
    """One of the package's modules that play Lightning's part."""
    return path.name in EXEMPT and path.resolve().parent.name == PACKAGE


def project_files(root: Path) -> list[Path]:
    """The Python files of ``src/`` and ``train.py`` under ``root`` that the check applies to."""
    files = [*sorted((root / "src").rglob("*.py")), root / "train.py"]
    return [path for path in files if path.is_file() and not is_exempt(path)]


def check(paths: list[Path]) -> list[str]:
    """One line per manual placement in ``paths``, ``path:line: what — fix``; exempt modules are skipped."""
    lines = []
    for path in paths:
        if is_exempt(path):
            continue
        try:
            findings = manual_placements(path.read_text(encoding="utf-8"))
        except SyntaxError as error:
            lines.append(f"{path}:{error.lineno}: not valid Python ({error.msg}) — fix the syntax first")
            continue
        lines.extend(f"{path}:{finding.line}: {finding.what} — {finding.fix}" for finding in findings)
    return lines


def main(args: list[str] | None = None) -> int:
    names = sys.argv[1:] if args is None else args
    paths = [Path(name) for name in names] if names else project_files(Path.cwd())
    lines = check(paths)
    for line in lines:
        print(line)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
