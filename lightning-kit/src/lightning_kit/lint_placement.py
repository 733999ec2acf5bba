"""Find manual device placement in Python files, reading them (nothing is imported or run)::

    python -m lightning_kit.lint_placement FILES...   # no FILES: src/ and train.py of the current folder

Each placement is printed as ``path:line: <what> — <the fix>``, citing the placement guide's rule (``python -m
lightning_kit.guide``), and the exit status is 1; else 0. With no FILES and neither ``src/`` nor ``train.py`` here,
nothing is checked: that is said in one line, exit status 2. ``--help`` prints this text.

Found: ``.cuda()`` and ``.cpu()`` (also uncalled, or through ``getattr``); ``.to(...)`` a device (``"cuda"``, ``0``,
``device``, ``x.device``, ``torch.device(...)``); ``torch.device`` of an accelerator or an index; a device written into
a call (``device="cuda:1"``, ``device=local_rank``, ``device_ids=[0]``, ``torch.autocast("cuda")``); ``map_location``
onto an accelerator; ``non_blocking``; the global default (``DEFAULTS``); the legacy CUDA tensor types (also as a
string); tensors made from nothing without ``device=`` (``torch.arange(T)``) in ``forward``, a step or a batch or epoch
hook, or kept as a plain attribute of a module (``self.mean = torch.tensor(...)`` in its ``__init__``).

Left alone: what takes the device from the data (``device=x.device``, ``x.new_zeros(...)``, ``.type_as(x)``, buffers,
parameters, tensors made in a data module); a ``.cpu()`` copy that leaves the device's computation (``.detach().cpu()``,
``.cpu().numpy()``, ``.item()``, NumPy, a list's ``append``, ``torch.save``) or goes where PyTorch reads it on the host
(``pack_padded_sequence(x, lengths.cpu())``: rule 13), itself or through the one name it is given; dtype conversions
(``.to(torch.float16)``); ``map_location="cpu"``; ``.to(device)`` in ``transfer_batch_to_device``, where Lightning
hands the device over (rule 1); ``pin_memory``. Reading alone cannot tell a device from a dtype in a variable of another
name (``.to(d)``): the device audit finds what those do wrong.
"""

import ast
import re
import sys
from importlib.util import decode_source
from pathlib import Path
from typing import NamedTuple

from .errors import command, first_line
from .files import NotAFileError, open_regular
from .guide import cite

# Skipped: the library's files that play Lightning's part on a GPU (the simulated GPU, its Lightning side and its
# model of Lightning's batch moves) and the benchmark's own loop; a project's files never are.
EXEMPT = ("gpu_audit/simulated/", "gpu_audit/lightning.py", "gpu_audit/batches.py", "bench.py")
LIBRARY = Path(__file__).resolve().parent  # lightning_kit/, where it is installed
MOVED = "delete it: Lightning moves the model and the batches; make new tensors with device=x.device"
# The fix of each kind of placement, and the guide's rules that explain it.
_FIXES_AND_RULES = {
    "cuda": (MOVED, "rules 1 to 2"),
    "cpu": ("keep tensors where Lightning put them: log them with self.log", "rule 6"),
    "to": (f"{MOVED}, and constants as registered buffers", "rules 1 to 3"),
    "device": ("take the device from the data or the module: x.device, self.device, pl_module.device", "rule 11"),
    "default": ("delete it: Lightning gives each process its device; a default moves every tensor", "rule 11"),
    "legacy": ("name a dtype, not a CUDA tensor type: .float(), torch.float16; .type_as(x) follows x", "rule 11"),
    "non_blocking": ("delete the transfer: Lightning moves the batches, overlapping the copies", "rule 1"),
    "map_location": ('load onto the CPU (map_location="cpu"): Lightning moves the model afterwards', "rule 1"),
    "made": (
        "give it the data's device: device=x.device, x.new_zeros(...); a constant as a registered buffer",
        "rules 2 to 3",
    ),
    "attribute": ('register it as a buffer, which moves with the module: self.register_buffer("name", ...)', "rule 3"),
}
FIXES = {kind: f"{fix} ({rules}: {cite(rules)})" for kind, (fix, rules) in _FIXES_AND_RULES.items()}

# Methods that move a tensor or module to a device, and the fix for each.
MOVES = {"cuda": "cuda", "cpu": "cpu", "xpu": "cuda", "mps": "cuda", "hpu": "cuda", "ipu": "cuda", "mtia": "cuda"}
# A string naming a device type, with or without an index, is a device written in.
DEVICE_TYPES = "cpu|cuda|mps|xpu|xla|hpu|ipu|npu|mtia|hip|meta|lazy|vulkan|privateuseone"
DEVICE = re.compile(rf"^({DEVICE_TYPES})(:\d+)?$")
DEVICE_PREFIX = re.compile(rf"^({DEVICE_TYPES})(:|$)")  # of an f-string: f"cuda:{rank}"
HOST = ("cpu", "meta")  # devices that a checkpoint may be loaded onto, or a torch.device may name
LEGACY_TYPE = re.compile(r"^torch\.cuda\.\w*Tensor$")
# Global device settings; any call of them is placement by hand.
DEFAULTS = ("torch.set_default_device", "torch.set_default_tensor_type", "torch.cuda.set_device", "torch.cuda.device")
DEFAULTS += ("torch.cuda.current_device",)
# Keywords that put what a call makes on a device (or run it for one: autocast's device_type).
DEVICE_KEYWORDS = ("device", "output_device", "device_ids", "device_type")
DEVICE_TYPE_FIRST = ("torch.autocast", "torch.amp.autocast")  # whose first argument is a device type: "cuda"
# Names of variables that hold a device (or an index of one): device, dev, gpu, local_rank, ...
DEVICE_NAME = re.compile(r"(^|_)(device|devices|dev|gpu|gpus|cuda|rank)($|_)", re.IGNORECASE)
# Of those, the ones that hold an index or a GPU rather than a device taken from the data.
DEVICE_INDEX_NAME = re.compile(r"(^|_)(gpu|gpus|cuda|rank)($|_)", re.IGNORECASE)
# Modules whose attributes named `cuda` or `cpu` are modules, not methods (torch.cuda, torch.backends.cpu).
MODULES = ("torch", "lightning", "L", "pl", "pytorch_lightning")

# Where a model runs on its device: forward, the steps (training_step, a shared _step) and the batch and epoch hooks.
RUNS_ON_THE_DEVICE = re.compile(r"^(forward|\w*_step|on_(train|validation|test|predict)_(batch|epoch)_(start|end))$")
# torch's functions that make a tensor from nothing, on the default device (the CPU) unless given `device=`.
FACTORIES = {
    *("arange", "range", "zeros", "ones", "empty", "full", "eye", "linspace", "logspace", "tensor", "as_tensor"),
    *("rand", "randn", "randint", "randperm", "normal", "empty_strided", "tril_indices", "triu_indices"),
    *("hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window", "from_numpy"),
    *("Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor"),
    *("ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"),
}
# A `.cpu()` whose value leaves the device's computation is right: host data, or an argument PyTorch reads on the host
# (rule 13). The methods that take it off to host data:
TO_HOST_DATA = ("numpy", "tolist", "item", "detach")
# The functions that read an argument on the host (the simulated GPU's HOST_ARGUMENTS): by position and by name.
HOST_READERS = {
    "pack_padded_sequence": (1, ("lengths",)),
    "tensor_split": (1, ("indices_or_sections", "indices", "sections")),  # x.tensor_split(points): the first
    "randint_like": (1, ("high",)),
}
# Calls that take a copy away from the device's computation: NumPy's, saving, collecting for the epoch's end.
HOST_TAKERS = re.compile(r"^(np|numpy|plt|pd)\.|(^|\.)(append|extend|save|imshow|savefig)$")


class Finding(NamedTuple):
    line: int
    what: str
    fix: str


def _name(node: ast.expr) -> str:
    """``torch.cuda.set_device`` for that attribute chain; '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def _written(node: ast.expr, host_ok: bool = False) -> bool:
    """Whether ``node`` is a device written in (``"cuda:0"``, ``0``, ``f"cuda:{rank}"``, ``torch.device``); with
    ``host_ok``, the CPU and the meta device are not counted (``map_location="cpu"``)."""
    match node:
        case ast.Constant(value=str(value)):
            return DEVICE.match(value) is not None and not (host_ok and value in HOST)
        case ast.Constant(value=int(value)):
            return not isinstance(value, bool)
        case ast.JoinedStr(values=[ast.Constant(value=head), *_]):
            return DEVICE_PREFIX.match(str(head)) is not None
        case ast.Call() if _name(node.func) == "torch.device":
            return not (host_ok and _torch_device_is_host(node))
        case ast.List(elts=items) | ast.Tuple(elts=items) | ast.Set(elts=items):
            return any(_written(item, host_ok) for item in items)
        case ast.Dict(values=values):  # map_location={"cpu": "cuda:0"}
            return any(_written(value, host_ok) for value in values if value is not None)
    return False


def _torch_device_is_host(node: ast.Call) -> bool:
    """Whether a ``torch.device(...)`` call names the CPU or the meta device, or the device of data (``x.device``)."""
    given = [*node.args, *(keyword.value for keyword in node.keywords)]
    return len(given) == 1 and (  # not torch.device("cuda", 0)
        (isinstance(given[0], ast.Constant) and given[0].value in HOST) or getattr(given[0], "attr", None) == "device"
    )


def _names_a_device(node: ast.expr, names: re.Pattern = DEVICE_NAME) -> bool:
    """Whether ``node`` is a device: written in, or a variable or attribute holding one (``device``, ``x.device``)."""
    name = getattr(node, "attr", None) or getattr(node, "id", None)  # an attribute's or a variable's
    return _written(node) or (name is not None and names.search(name) is not None)


def _is_module(node: ast.expr) -> bool:
    """Whether ``node`` names a module (``torch.backends``), not a tensor or a class."""
    name = _name(node)
    return name.split(".")[0] in MODULES and name == name.lower()


class _Finder(ast.NodeVisitor):
    def __init__(self, tree: ast.AST) -> None:
        self.findings: list[Finding] = []
        self._parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}

    def _around(self, node: ast.AST, kind: type | tuple = (ast.FunctionDef, ast.AsyncFunctionDef)) -> list:
        """The functions (or other nodes of ``kind``) that ``node`` is in, innermost first."""
        found = []
        while (node := self._parents.get(node)) is not None:
            if isinstance(node, kind):
                found.append(node)
        return found

    def _add(self, node: ast.AST, what: str, kind: str) -> None:
        self.findings.append(Finding(node.lineno, what, FIXES[kind]))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if LEGACY_TYPE.match(name := _name(node)):
            self._add(node, f"`{name}`", "legacy")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (found := self._placement(node)) is not None:
            self._add(node, *found)
        # `.cuda` and `.cpu` passed on uncalled: `map(torch.Tensor.cuda, xs)`, `apply(lambda m: m.cuda())` is a call
        for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
            if isinstance(argument, ast.Attribute) and argument.attr in MOVES and not _is_module(argument.value):
                self._add(argument, f"`{ast.unparse(argument)}`", MOVES[argument.attr])
        self.generic_visit(node)

    def _placement(self, node: ast.Call) -> tuple[str, str] | None:
        """What the call places by hand and the kind of its fix, or None."""
        func, name = node.func, _name(node.func)
        method = func.attr if isinstance(func, ast.Attribute) else None
        arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
        shown = f"`{ast.unparse(node)}`"
        if name in DEFAULTS:
            return shown, "default"
        if method in MOVES and not _is_module(func.value):
            if method == "cpu" and self._leaves_the_device(node):
                return None
            return f"`.{method}()`", MOVES[method]
        if method == "to" and (devices := _devices(node)):
            if self._handed_over(node, devices):
                return None  # in transfer_batch_to_device, to the device Lightning hands over
            shown = f"`.to({', '.join(ast.unparse(arg) for arg in [*node.args, *node.keywords])})`"
            if all(map(_is_the_host, devices)):  # .cpu() by another name
                return None if self._leaves_the_device(node) else (shown, "cpu")
            return shown, "to"
        if (made := self._made_without_a_device(node, name)) is not None:
            return made
        if any(keyword.arg == "non_blocking" for keyword in node.keywords):
            return shown, "non_blocking"
        moved_by_name = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value
        if name == "getattr" and moved_by_name in (*MOVES, "to"):
            return shown, "to"
        if method in ("type", "set_default_tensor_type") and any(
            isinstance(arg, ast.Constant) and LEGACY_TYPE.match(str(arg.value)) for arg in arguments
        ):
            return shown, "legacy"
        if name == "torch.device" and not _torch_device_is_host(node):
            return shown, "device"
        if name in DEVICE_TYPE_FIRST and node.args and _written(node.args[0]):
            return shown, "device"
        for keyword in node.keywords:
            if keyword.arg in DEVICE_KEYWORDS and (_written(keyword.value) or _index_variable(keyword.value)):
                return f"`{ast.unparse(keyword)}`", "device"
            if keyword.arg == "map_location" and _written(keyword.value, host_ok=True):
                return f"`{ast.unparse(keyword)}`", "map_location"
        return None

    def _made_without_a_device(self, node: ast.Call, name: str) -> tuple[str, str] | None:
        """What a factory call (``torch.arange(n)``) makes on the CPU that the model's device will meet, and the
        kind of fix; None where it is given a device (or ``**options``), or made elsewhere."""
        module, _, factory = name.rpartition(".")
        if module != "torch" or factory not in FACTORIES:
            return None
        if any(keyword.arg in ("device", "out", None) for keyword in node.keywords):
            return None
        functions = self._around(node)
        if running := next((f.name for f in reversed(functions) if RUNS_ON_THE_DEVICE.match(f.name)), None):
            return f"`{ast.unparse(node)}` in `{running}` is made on the CPU whatever device the model runs on", "made"
        # Kept as a plain attribute of a module in its __init__: `self.mean = torch.tensor(...)`.
        assigned = self._parents.get(node)
        kept = [_name(item) for item in getattr(assigned, "targets", ()) if _name(item).startswith("self.")]
        classes = self._around(node, ast.ClassDef)
        if kept and functions and functions[0].name == "__init__" and classes and _is_a_module(classes[0]):
            return f"`{kept[0]}` is a plain tensor attribute: it stays on the CPU when the module moves", "attribute"
        return None

    def _leaves_the_device(self, node: ast.Call) -> bool:
        """Whether a ``.cpu()``'s value leaves the device's computation (rules 6 and 13), itself or through the name
        it is given (``lengths = lengths.cpu()`` where every later use does)."""
        receiver = node.func.value  # of .cpu() or .to(...): x.detach().cpu() is a copy taken off
        detached = isinstance(receiver, ast.Call) and getattr(receiver.func, "attr", None) == "detach"
        if detached or self._taken_to_the_host(node):
            return True
        assigned = self._parents.get(node)
        target = assigned.targets[0] if isinstance(assigned, ast.Assign) and len(assigned.targets) == 1 else None
        if not isinstance(target, ast.Name) or not (functions := self._around(node)):
            return False
        uses = [
            use
            for use in ast.walk(functions[0])
            if isinstance(use, ast.Name) and use.id == target.id and isinstance(use.ctx, ast.Load)
            if (use.lineno, use.col_offset) >= (assigned.end_lineno, assigned.end_col_offset)
        ]
        return bool(uses) and all(self._taken_to_the_host(use) for use in uses)

    def _taken_to_the_host(self, node: ast.expr) -> bool:
        """Whether the value of ``node`` goes straight to host data or to an argument PyTorch reads on the host."""
        parent = self._parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.attr in TO_HOST_DATA:
            return True
        keyword = parent.arg if isinstance(parent, ast.keyword) else None
        call = self._parents.get(parent) if isinstance(parent, ast.keyword) else parent
        if not isinstance(call, ast.Call) or node is call.func:
            return False
        called = _name(call.func) or getattr(call.func, "attr", "")
        if HOST_TAKERS.search(called):
            return True
        if (reader := HOST_READERS.get(called.rpartition(".")[2])) is None:
            return False
        position, names = reader
        if keyword is not None:
            return keyword in names
        if called.endswith("tensor_split") and isinstance(call.func, ast.Attribute) and not _is_module(call.func.value):
            position -= 1  # the tensor's own method: its first argument
        return any(index == position and arg is node for index, arg in enumerate(call.args))

    def _handed_over(self, node: ast.Call, devices: list[ast.expr]) -> bool:
        """Whether every device of a ``.to(...)`` is a parameter of the ``transfer_batch_to_device`` it is in."""
        hooks = [function.args for function in self._around(node) if function.name == "transfer_batch_to_device"]
        hook = {given.arg for args in hooks[:1] for given in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        return all(isinstance(device, ast.Name) and device.id in hook for device in devices)


def _devices(node: ast.Call) -> list[ast.expr]:
    """The devices a ``.to(...)`` call names (none: it converts the dtype, ``.to(torch.float16)``)."""
    given = [*node.args[:1], *(keyword.value for keyword in node.keywords if keyword.arg == "device")]
    return [argument for argument in given if _names_a_device(argument)]


def _is_the_host(device: ast.expr) -> bool:
    """``"cpu"``, or a ``torch.device`` of the host: a ``.to()`` onto it is ``.cpu()`` by another name."""
    if isinstance(device, ast.Call) and _name(device.func) == "torch.device":
        return _torch_device_is_host(device)
    return isinstance(device, ast.Constant) and device.value == "cpu"


def _is_a_module(node: ast.ClassDef) -> bool:
    """Whether a class derives from a module by its bases' names (``nn.Module``, ``L.LightningModule``), not a data
    module (``LightningDataModule``), whose tensors Lightning does not move."""
    bases = [_name(base).rpartition(".")[2] for base in node.bases]
    return any(base.endswith("Module") and not base.endswith("DataModule") for base in bases)


def _index_variable(node: ast.expr) -> bool:
    """A variable holding a device index or a GPU (``device=local_rank``), not a device from the data."""
    if isinstance(node, ast.List | ast.Tuple):
        return any(_index_variable(item) for item in node.elts)
    return isinstance(node, ast.Name | ast.Attribute) and _names_a_device(node, DEVICE_INDEX_NAME)


def manual_placements(source: str) -> list[Finding]:
    """Each line of ``source`` that puts a tensor or module on a device by hand, in order; a source nested past
    Python's parser (which Python cannot run either) is ``UnreadableError``."""
    try:
        tree = ast.parse(source)
        finder = _Finder(tree)
        finder.visit(tree)
    except (RecursionError, MemoryError):
        raise UnreadableError(
            "cannot be checked: it nests deeper than Python's parser goes, so Python cannot run it"
        ) from None
    first = {}  # the outermost call of a line: `.to(torch.device("cuda"))` once, not twice
    for finding in finder.findings:
        first.setdefault(finding.line, finding)
    return sorted(first.values())


def is_exempt(path: Path) -> bool:
    """One of this library's modules that play Lightning's part (a file of the same name elsewhere is not)."""
    resolved = path.resolve()
    return resolved.is_relative_to(LIBRARY) and resolved.relative_to(LIBRARY).as_posix().startswith(EXEMPT)


def project_files(root: Path) -> list[Path]:
    """The Python files of ``src/`` and ``train.py`` under ``root`` (either may be absent)."""
    files = [*sorted((root / "src").rglob("*.py")), root / "train.py"]
    return [path for path in files if path.is_file() and not is_exempt(path)]


MAX_SOURCE_BYTES = 4 << 20  # a Python file of more is generated, or not a source file at all


class UnreadableError(Exception):
    """A path that names no Python source the check can read: why, in words."""


def read_source(path: Path) -> str:
    """The text of the regular Python file at ``path``, of at most ``MAX_SOURCE_BYTES``; else ``UnreadableError``."""
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except FileNotFoundError:
        raise UnreadableError("does not exist") from None
    except NotAFileError as err:
        raise UnreadableError(f"is {err.kind}, not a regular file: nothing read") from None
    except OSError as err:
        raise UnreadableError(f"cannot be read ({first_line(err)})") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise UnreadableError(f"is over {MAX_SOURCE_BYTES >> 20} MiB: not a source file this check reads")
    if b"\0" in data:
        raise UnreadableError("is not a text file (it holds NUL bytes)")
    try:
        return decode_source(data)  # as Python decodes it, by its coding declaration
    except (SyntaxError, LookupError, UnicodeDecodeError) as err:
        why = (
            f"{err.reason if isinstance(err, UnicodeDecodeError) else err}; Python reads UTF-8 or a coding declaration"
        )
        raise UnreadableError(f"is not Python source text ({why})") from None


def check(paths: list[Path], errors: list[str] | None = None) -> list[str]:
    """One line per manual placement in ``paths``, ``path:line: what — fix``; exempt modules are skipped. A path
    that cannot be read (``read_source``) is said in ``errors`` where given, else raised as ``UnreadableError``."""
    lines = []
    for path in paths:
        if is_exempt(path):
            continue
        try:
            findings = manual_placements(read_source(path))
        except UnreadableError as why:
            if errors is None:
                raise UnreadableError(f"{path} {why}") from None
            errors.append(f"error: {path} {why}")
        except SyntaxError as error:
            lines.append(f"{path}:{error.lineno}: not valid Python ({error.msg}) — fix the syntax first")
        else:
            lines.extend(f"{path}:{finding.line}: {finding.what} — {finding.fix}" for finding in findings)
    return lines


@command
def main(args: list[str] | None = None) -> int:
    """Exit status 1 where a placement was found or a file could not be read, 2 where there is nothing to check,
    else 0; a folder: its files."""
    names = sys.argv[1:] if args is None else args
    if "-h" in names or "--help" in names:
        print(__doc__.strip())
        return 0
    errors = [f"error: {name!r} holds a NUL character (\\0): no file is named so" for name in names if "\0" in name]
    names = [name for name in names if "\0" not in name]
    paths = [Path(name) for name in names] if names or errors else project_files(Path.cwd())
    if not paths and not errors:
        print(f"error: nothing to check: no FILES given, and no src/ or train.py in {Path.cwd()}", file=sys.stderr)
        return 2
    found = {  # rglob does not follow links to folders, so a link back up does not loop
        path: sorted(p for p in path.rglob("*.py") if not p.is_dir()) if path.is_dir() else [path] for path in paths
    }
    for folder in (path for path, files in found.items() if not files):  # said, so as not to read as a pass
        print(f"warning: {folder} holds no .py files: nothing in it was checked", file=sys.stderr)
    paths = [file for files in found.values() for file in files]
    lines = check(paths, errors)
    for line in lines:
        print(line)
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if lines or errors else 0


if __name__ == "__main__":
    sys.exit(main())
