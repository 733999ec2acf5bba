"""The explanation of a failure: what a GPU would say, at which hook and line of your code, and the fix.

``explain`` turns what stopped a run on the simulated GPU into a ``DevicePlacementError`` where a GPU would refuse
the same operation, or else into one line saying why the run stopped there.
"""

import ast
import linecache
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch

from ..errors import exception_chain, first_line
from ..guide import cite
from ..upstream.torch import tree_flatten
from . import batches, simulated
from .simulated import DEVICE_TYPE, SimulatedDeviceError
from .simulated.devices import INSTALLED
from .verdict import STEP_OF_STAGE, DevicePlacementError

# The fix for each kind of bug, and the rule of the guide that explains it.
FIXES = {
    "mixed devices": (
        "create new tensors on the input's device (torch.arange(n, device=x.device), x.new_zeros(...)), keep "
        "constants and state as buffers, metrics and modules as attributes or in nn.ModuleDict/ModuleList, and "
        "never .cpu() or .to('cpu') inside a step",
        "rules 2 to 9",
    ),
    "another GPU": (
        "every DDP process has its own GPU: take the device from the data or the module (x.device, self.device), "
        "never a fixed one such as cuda:0 or device index 0",
        "rule 11",
    ),
    "generator": ("make the generator on the device it draws for: torch.Generator(device=x.device)", "rule 10"),
    "collective": (
        "NCCL, CUDA's collective backend, takes tensors on the process's own GPU only: make the tensor on the "
        "module's device (torch.tensor(..., device=self.device), x.new_tensor(...)) before the collective, "
        "or use self.all_gather / self.log(..., sync_dist=True)",
        "rule 16",
    ),
    "autocast": (
        "use the operation's autocast-safe form (binary_cross_entropy_with_logits on the logits, or "
        "nn.BCEWithLogitsLoss), or compute it outside the autocast region on .float() inputs",
        "rule 15",
    ),
    "dtype": (
        "under autocast (16-mixed, bf16-mixed) matmuls and convolutions return float16/bfloat16: make a tensor "
        "that will hold their values with their dtype (y.new_zeros(...), torch.zeros(..., dtype=y.dtype)), or "
        "cast where they meet (.to(y.dtype), .float()); fill with torch.finfo(y.dtype).min, not a constant "
        "float16 cannot hold (-1e9)",
        "rule 15",
    ),
    "pin memory": (
        "pin CPU tensors only, where they are made (DataLoader(pin_memory=True) pins each batch before Lightning "
        "copies it to the GPU): a tensor on the GPU needs no pinning",
        "rule 6",
    ),
    "host tensor": (
        "PyTorch reads these lengths or sizes on the CPU, even on a GPU: pass a CPU tensor (lengths.cpu()) or a list",
        "rule 13",
    ),
    "numpy": (
        "log tensors with self.log, which reads them when it needs to; where NumPy is really needed, "
        "collect .detach().cpu() copies and convert them at the end of the epoch",
        "rule 6",
    ),
    "root gradient": (
        "make the gradient you give backward() or torch.autograd.grad (gradient=, grad_outputs=, grad_tensors=) "
        "on the output's device: torch.ones_like(loss), loss.new_ones(n); only a 0-dim one may stay on the CPU",
        "rule 17",
    ),
    "deterministic": (
        "in deterministic mode CUDA refuses a kernel that has no deterministic implementation: use an operation "
        "that has one (a loss with reduction='none', then .mean(); an adaptive pool to 1x1; bincount without "
        'weights), or accept this one\'s small run-to-run differences with Trainer(deterministic="warn") '
        "(torch.use_deterministic_algorithms(True, warn_only=True)), which warns instead",
        "rule 20",
    ),
    "unused parameters": (
        "under DDP (Lightning's strategy for more than one GPU) every trainable parameter must reach the loss of "
        "each step: use it, freeze it before fit (requires_grad_(False) in __init__ or setup: DDP takes the "
        "parameters to reduce as it wraps the model, so one frozen later still counts) or leave it out of the model; "
        'or let DDP look for unused ones each step with strategy="ddp_find_unused_parameters_true" (slower)',
        "rule 22",
    ),
    "lazy modules": (
        "under DDP (Lightning's strategy for more than one GPU) the model is wrapped before the first batch and "
        "before configure_optimizers, and DDP cannot wrap an uninitialised parameter: materialise lazy modules "
        "before fit, with a dry run on an example input in __init__ or in setup() (before Lightning moves the "
        "model), or give the layers their input sizes",
        "rule 19",
    ),
    "DDP": (
        "under DDP (Lightning's strategy for more than one GPU) DistributedDataParallel checks the model as it wraps "
        "it, before the first step, and refuses what it says above: a sparse buffer (DDP broadcasts buffers from "
        "rank 0 and cannot broadcast a sparse one: DDPStrategy(broadcast_buffers=False), or keep the tensor out of "
        "the buffers), a model with no trainable parameter (nothing for DDP to do: train on one device)",
        "rule 22",
    ),
    "reentrant": (
        "under DDP each parameter's gradient is reduced once a step, which a module run twice in one step breaks "
        "when autograd re-enters it (torch.utils.checkpoint with use_reentrant=True, the default of Hugging Face's "
        "gradient_checkpointing_enable): checkpoint with use_reentrant=False, or DDPStrategy(static_graph=True)",
        "rule 22",
    ),
    "cudnn RNN": (
        "a backward pass through an RNN, LSTM or GRU runs in training mode only on a GPU: keep the module in "
        "training mode where gradients flow through it (with dropout=0 it computes the same), or run that block "
        "without cuDNN (with torch.backends.cudnn.flags(enabled=False): ...)",
        "rule 23",
    ),
    "CUDA in a worker": (
        "a DataLoader's workers are processes forked from one that uses CUDA, where CUDA cannot start again: make "
        "batches on the CPU (in the Dataset and collate_fn, never .to(device) or .cuda()); Lightning moves each "
        "batch to the GPU after, and DataLoader(pin_memory=True) speeds that copy",
        "rule 1",
    ),
    "sync_dist": (
        "under DDP, NCCL all-reduces GPU tensors only: log the tensor as it is (no .cpu()), or a Python number",
        "rule 12",
    ),
    "collective mismatch": (  # ranks.py
        "call every collective on every process, with tensors of the same shape: log with sync_dist=True on every "
        "rank (never inside `if self.trainer.is_global_zero:`; rank_zero_only is for files and prints), compute a "
        "torchmetrics metric on every rank, and pad a tensor whose size depends on the data before all_gather (or "
        "gather Python objects with torch.distributed.all_gather_object)",
        "rule 22",
    ),
}
# The fix of an "unmoved batch" (a tensor of the batch that Lightning could not move) is its own: batches.Unmoved.fix.


def explain(
    err: BaseException,
    *,
    stage: str,
    rank: int,
    world_size: int,
    model: L.LightningModule | None = None,
    hook: str | None = None,
) -> DevicePlacementError | str:
    """A ``DevicePlacementError`` for what a GPU would refuse in ``err``, or else why the run stopped there."""
    chain = _with_what_torchscript_lost(exception_chain(err))
    device_error = None
    for index, link in enumerate(chain):
        device_error = _as_device_error(link, world_size)
        if device_error is not None:
            chain = chain[: index + 1]
            break
    action = next((link._audit_action for link in chain if getattr(link, "_audit_action", None)), None)
    hook = hook or _hook(action, model)
    frame = _user_frame(chain)
    node = next((link._audit_backward_of for link in chain if getattr(link, "_audit_backward_of", None)), None)
    at = file_line(frame.filename, frame.lineno) if frame else "a line outside your code"
    forward = getattr(device_error, "forward_line", None)
    if frame is None and forward is not None:  # a backward kernel: the line that ran its forward operation
        frame = traceback.FrameSummary(*forward, "forward")
        at = f"{file_line(frame.filename, frame.lineno)}, in its backward pass" + (f" ({node})" if node else "")
    elif frame is None and node:
        at += f" (the backward pass's {node})"
    here = (frame.filename, frame.lineno) if frame else None
    if device_error is None:
        reason = _limitation(chain) or first_line(err, typed=True)
        return f"{hook} stopped at {at}: {reason}"
    kind = device_error.kind
    ddp = f" as DDP rank {rank} of {world_size}" if world_size > 1 else ""
    lines = [f"{stage} on {simulated.device(rank)}{ddp}, {hook}: {device_error.operation} at {at}"]
    if frame and frame.line:
        lines.append(f"    {frame.line}")
    lines.append(f"On a GPU: {'TypeError' if kind == 'numpy' else 'RuntimeError'}: {device_error}")
    if device_error.culprit is None and kind == "mixed devices":
        device_error.culprit = _cpu_operand(chain)
    unmoved = batches.left_on_cpu(device_error.culprit) if kind == "mixed devices" else None
    made = None
    if unmoved is not None:  # the batch's own tensor, which Lightning could not move: that is the cause
        kind = "unmoved batch"
        lines.append(unmoved.cause())
    else:
        culprit = _culprit(device_error, model)
        made = _made_at(device_error.culprit, chain) if kind == "mixed devices" else None
        if made is not None and made == here:
            lines.append("The tensor on cpu is made on that line.")
        elif made is not None:
            line = linecache.getline(made[0], made[1]).strip()
            lines += [f"The tensor on cpu was made at {file_line(*made)}:", *([f"    {line}"] if line else [])]
        if culprit:
            lines.append(culprit)
        if kind == "mixed devices":
            lines += _batch_hint(device_error, model)
    fix, rule = (unmoved.fix(), "rule 1") if unmoved is not None else FIXES[kind]
    at_line = f" at {file_line(*made)}" if made is not None and here not in (None, made) else ""
    lines.append(f"Fix{at_line}: {fix}. See {rule} of the placement guide: {cite(rule)}.")
    (filename, lineno), (made_filename, made_lineno) = here or ("", 0), made or ("", 0)
    return DevicePlacementError(
        "\n".join(lines),
        kind=kind,
        stage=stage,
        rank=rank,
        hook=hook,
        operation=device_error.operation,
        filename=filename,
        lineno=lineno,
        made_filename=made_filename,
        made_lineno=made_lineno,
    )


def _cpu_operand(chain: list[BaseException]) -> torch.Tensor | None:
    """The CPU tensor among the operands that PyTorch's own device check refused, preferring one seen made."""
    for link in chain:
        operands = getattr(link, "_audit_operands", None)
        if operands is None:
            continue
        found = [leaf for leaf in tree_flatten(operands)[0] if _cpu(leaf)]
        if found:
            return next((tensor for tensor in found if simulated.made_at(tensor) is not None), found[0])
    return None


def _made_at(tensor: torch.Tensor | None, chain: list[BaseException]) -> tuple[str, int] | None:
    """Where the user's code made the CPU ``tensor``: where the simulated GPU saw it made; else where a variable of
    the user's frames (outermost first) holding its memory was made or last assigned; else the one CPU tensor the
    failing function made."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        return None
    made = simulated.made_at(tensor)
    if made is not None:
        return made
    frames = [
        frame
        for link in reversed(chain)
        for frame, _ in traceback.walk_tb(link.__traceback__)
        if is_user_code(frame.f_code.co_filename)
    ]
    for frame in frames:  # outermost first: where it was made, before it was handed on
        code = frame.f_code
        passed = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        for name, value in frame.f_locals.items():
            if value is not tensor and not (_cpu(value) and batches.same_memory(value, tensor)):
                continue
            made = simulated.made_at(value)
            if made is None and name not in passed:
                made = _assigned(code, name, frame.f_lineno)
            if made is not None:
                return made
    failing = frames[-1].f_locals.values() if frames else ()
    seen = {simulated.made_at(value) for value in failing if _cpu(value)} - {None}
    return seen.pop() if len(seen) == 1 else None


def _cpu(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() > 0


def _assigned(code: Any, name: str, before: int) -> tuple[str, int] | None:
    """The file and line of the last assignment of ``name`` at or before line ``before`` in ``code``'s function."""
    try:
        tree = ast.parse("".join(linecache.getlines(code.co_filename)))
    except (SyntaxError, ValueError, RecursionError):
        return None
    functions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name == code.co_name
        and min([node.lineno, *(d.lineno for d in node.decorator_list)]) == code.co_firstlineno
    ]
    lines = [
        node.lineno
        for function in functions[:1]
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store) and node.lineno <= before
    ]
    return (code.co_filename, max(lines)) if lines else None


def file_line(filename: str, lineno: int) -> str:
    """``filename:lineno``, the file relative to the working folder when it is inside it."""
    path = Path(filename)
    return f"{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else filename}:{lineno}"


# PyTorch's own checks of devices (an LSTM's hidden state; "hook 'h' has changed the type of value (was ...)").
_PYTORCH_DEVICE_CHECK = re.compile(
    rf"device.*\b{DEVICE_TYPE}(:\d+)?\b.*\bcpu\b|device.*\bcpu\b.*\b{DEVICE_TYPE}\b|"
    rf"changed the type of value \(was {DEVICE_TYPE}\w* got (torch\.)?\w+\)|"
    rf"changed the type of value \(was (torch\.)?\w+ got {DEVICE_TYPE}\w*\)",
    flags=re.IGNORECASE,
)

# Operations that refuse a mix of dtypes, as CUDA does; the CPU's own limits, "(CPU)", are not bugs.
_DTYPE_MISMATCH = re.compile(
    r"dtypes? (to )?match|same dtype|dtype.* to be equal|expected scalar type \w+ but found \w+|"
    r"type \(.+\) and \w+ type \(.+\) should be the same|must have the same scalar type|"
    r"cannot be converted to type \S+ without overflow",
    flags=re.IGNORECASE,
)
# A frame of the traceback a DataLoader worker sends back as text.
_WORKER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# A metric EarlyStopping, ModelCheckpoint or a scheduler watches, which this DDP rank did not log (logged under
# `if self.trainer.is_global_zero:`).
_MISSING_ON_A_RANK = re.compile(r"conditioned on metric .* which is not available|could not find the monitored key")
# "Input type (torch.FloatTensor) and weight type (simgpuFloatType) should be the same": types that name devices.
_TYPES_OF_TWO_DEVICES = re.compile(r"type \(([\w.]+)\) and \w+ type \(([\w.]+)\) should be the same")


def _as_device_error(err: BaseException, world_size: int) -> SimulatedDeviceError | None:
    """``err`` as a ``SimulatedDeviceError`` where a GPU (of ``world_size``) would refuse it too, else None."""
    if isinstance(err, SimulatedDeviceError):
        return err
    said, line = str(err), first_line(err)
    if _MISSING_ON_A_RANK.search(said) and world_size > 1:  # Lightning's MisconfigurationException too
        return SimulatedDeviceError(line, kind="collective mismatch", operation="a callback, on this rank")
    if not isinstance(err, RuntimeError):
        return None
    types = _TYPES_OF_TWO_DEVICES.search(said)
    if _PYTORCH_DEVICE_CHECK.search(said):
        return SimulatedDeviceError(
            simulated.as_cuda(line), kind="mixed devices", operation="PyTorch's own device check"
        )
    if types is not None and (DEVICE_TYPE in types[1]) != (DEVICE_TYPE in types[2]):
        message = re.sub(rf"{DEVICE_TYPE}(\w+)Type", r"torch.cuda.\1Tensor", line)
        return SimulatedDeviceError(message, kind="mixed devices", operation="PyTorch's own device check")
    if "Expected to have finished reduction in the prior iteration" in said:  # DDP's reducer, at the second step
        names = re.search(r"Parameters which did not receive grad for rank \d+: (.+)", said)
        message = (
            "Expected to have finished reduction in the prior iteration before starting a new one. This error "
            "indicates that your module has parameters that were not used in producing loss."
        ) + (f" Parameters which did not receive grad: {names[1].strip()}" if names else "")
        return SimulatedDeviceError(message, kind="unused parameters", operation="DistributedDataParallel's reducer")
    if simulated.code_checks.FORKED_WORKER in said:  # raised in a worker, given back as text (ExceptionWrapper)
        frames = [(path, int(line), name, None) for path, line, name in _WORKER_FRAME.findall(said)]
        err._audit_stack = traceback.StackSummary.from_list(frames)  # the worker's frames, for _user_frame
        return SimulatedDeviceError(
            simulated.code_checks.FORKED_WORKER, kind="CUDA in a worker", operation="a DataLoader worker"
        )
    if "Expected to mark a variable ready only once" in said:
        return SimulatedDeviceError(line, kind="reentrant", operation="DistributedDataParallel's reducer")
    if "does not have a deterministic implementation, but you set" in said:
        return SimulatedDeviceError(line, kind="deterministic", operation="PyTorch's deterministic mode")
    if _DTYPE_MISMATCH.search(said) and "(CPU)" not in said:
        return SimulatedDeviceError(line, kind="dtype", operation="PyTorch's own dtype check")
    return None


# TorchScript's interpreter raises a RuntimeError of its own, keeping only the script's traceback, as text.
_TORCHSCRIPT_FAILURE = "The following operation failed in the TorchScript interpreter"
_TORCHSCRIPT_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in (\S+)$', flags=re.MULTILINE)


def _with_what_torchscript_lost(chain: list[BaseException]) -> list[BaseException]:
    """``chain``, and innermost the exception a TorchScript function lost, with the script's frames as its stack."""
    failed = next((link for link in chain if str(link).startswith(_TORCHSCRIPT_FAILURE)), None)
    lost = simulated.last_raised() if failed is not None else None
    if lost is None or lost in chain:
        return chain
    frames = [(path, int(line), name, None) for path, line, name in _TORCHSCRIPT_FRAME.findall(str(failed))]
    lost._audit_stack = traceback.StackSummary.from_list(frames)
    return [*chain, lost]


_ACTIONS = {  # Lightning's own actions, and its loops' steps
    "run_training_epoch": "the training epoch",
    "save_checkpoint": "saving a checkpoint",
    "train_dataloader_next": "fetching a training batch",
    "val_next": "fetching a validation batch",
    "test_next": "fetching a test batch",
    "predict_next": "fetching a prediction batch",
}


def _hook(action: str | None, model: L.LightningModule | None) -> str:
    """A Lightning profiler action in words: ``[Callback]EMA{...}.on_fit_start`` -> ``callback EMA.on_fit_start``."""
    if action is None:
        return "setting up"
    match = re.fullmatch(r"\[(\w+)\](.*)\.(\w+)", action, flags=re.DOTALL)
    if match is None:
        return _ACTIONS.get(action, action)
    kind, owner, method = match.groups()
    owner = owner.split("{")[0]
    model_name = type(model).__name__ if model is not None else "LightningModule"
    if kind == "Strategy":
        if method == "backward":
            return f"{model_name}.training_step (backward)"
        return f"{model_name}.{method}" if method in STEP_OF_STAGE.values() else f"Lightning's {method}"
    if kind == "Callback":
        return f"callback {owner}.{method}"
    if kind.startswith("_"):
        return _ACTIONS.get(method, method)
    return f"{owner}.{method}"


_OURS = str(Path(__file__).resolve().parent) + os.sep  # the audit's files, the simulated GPU's among them
# The rest of this library counts as the user's code wherever it is installed, so a bug in it is named at its line.
_KIT = str(Path(__file__).resolve().parents[1]) + os.sep
# The packages of the models and data modules audited, even installed among the libraries: count_as_user_code.
_AUDITED: set[str] = set()
# Frameworks whose own classes (a demo model, a plain DataModule) do not make their package the user's.
_FRAMEWORKS = ("lightning", "pytorch_lightning", "lightning_fabric", "lightning_kit", "torch")


def count_as_user_code(*objects: Any) -> None:
    """Count the packages that ``objects``' classes come from as the user's code, wherever they are installed."""
    for obj in objects:
        top = type(obj).__module__.partition(".")[0]
        module = sys.modules.get(top)
        if top in _FRAMEWORKS or module is None:  # None's module, builtins, has neither path nor file
            continue
        if hasattr(module, "__path__"):  # a package: its folders
            _AUDITED.update(str(Path(folder).resolve()) + os.sep for folder in module.__path__)
        elif getattr(module, "__file__", None):  # a module alone: its file
            _AUDITED.add(str(Path(module.__file__).resolve()))


def is_user_code(filename: str) -> bool:
    """Whether ``filename`` is the user's code, not the standard library's or a package's."""
    path = str(Path(filename).resolve())
    if path.startswith(_OURS) or filename.startswith("<"):
        return False
    return path.startswith((_KIT, *_AUDITED)) or not path.startswith(INSTALLED)


def _user_frame(chain: list[BaseException]) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code that the error passed; for an error kept in a backward pass
    (``simulated/containment.py``), the stack kept with it first."""
    for err in reversed(chain):
        kept = getattr(err, "_audit_stack", None) or ()
        for frame in (*reversed(kept), *reversed(traceback.extract_tb(err.__traceback__))):
            if is_user_code(frame.filename):
                return frame
    return None


_NEEDS_A_GPU = re.compile(
    r"Found no NVIDIA driver|Torch not compiled with CUDA|No CUDA GPUs are available|CUDA driver version|"
    r"CUDA error|cuda runtime error",
    flags=re.IGNORECASE,
)


def _limitation(chain: list[BaseException]) -> str | None:
    """What the simulation cannot do that the error shows, in words."""
    for err in chain:
        frames = traceback.extract_tb(err.__traceback__)
        if isinstance(err, simulated.NotSimulatedError):
            return f"{err}: this part cannot be simulated"
        if _NEEDS_A_GPU.search(str(err)):
            calls = [frame.name for frame in frames if "/torch/cuda/" in frame.filename]
            api = f"torch.cuda.{calls[0]}()" if calls and not calls[0].startswith("_") else "a torch.cuda function"
            return f"it calls {api}, which needs a real GPU: this part cannot be simulated"
        if any("/torch/jit/" in frame.filename for frame in frames):
            reason = first_line(err)
            return f"a TorchScript module cannot move to the simulated GPU ({reason}): this part cannot be simulated"
    return None


def _culprit(err: SimulatedDeviceError, model: L.LightningModule | None) -> str | None:
    """Name the tensor that is on the wrong device, when it is an attribute of the model."""
    tensor = err.culprit
    if tensor is None or model is None:
        return None
    found = _find_attribute(model, tensor)
    if found is None:
        shape, device = tuple(tensor.shape), simulated.as_cuda(tensor.device)
        argument = f"the argument `{err.argument}`" if err.argument else "one of the operation's arguments"
        return f"The tensor on {device} is {argument}, {shape} {tensor.dtype}."
    path, holder = found
    if holder == "attribute":
        return f"It is `{path}`, a plain tensor attribute, which Lightning does not move: register it as a buffer."
    return f"It belongs to `{path}`, kept in a plain {holder}, which Lightning does not move."


def _batch_hint(err: SimulatedDeviceError, model: L.LightningModule | None) -> list[str]:
    """A line naming the batch's tensors that Lightning left on the CPU, from which the tensor on the wrong device
    may have been computed (those with its first dimension, where it is on the CPU and not the model's)."""
    left, tensor = batches.in_flight(), err.culprit
    if tensor is not None and tensor.device.type == "cpu":
        if model is not None and _find_attribute(model, tensor) is not None:
            return []
        left = [spot for spot in left if spot.tensor.shape[:1] == tensor.shape[:1]]
    if not left:
        return []
    places = ", ".join(f"`{spot.path}`" for spot in left[:3]) + (", ..." if len(left) > 3 else "")
    return [
        f"The batch holds tensors that Lightning left on the CPU, {places}, in a {left[0].holder_name}; "
        f"if this one comes from them: {left[0].fix()}."
    ]


_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def _find_attribute(model: torch.nn.Module, tensor: torch.Tensor) -> tuple[str, str] | None:
    """Where in ``model`` a plain attribute holds ``tensor`` (or its storage), and in what."""

    def holds(value: Any) -> bool:
        module = isinstance(value, torch.nn.Module)
        inside = (*value.parameters(), *value.buffers(), *vars(value).values()) if module else (value,)
        return any(batches.same_memory(held, tensor) for held in inside)

    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if name in _MODULE_INTERNALS:
                continue  # parameters, buffers and submodules: Lightning moves those
            path = f"{prefix}.{name}" if prefix else name
            if batches.same_memory(value, tensor):
                return path, "attribute"
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
            for key, item in items:
                if holds(item):
                    return f"{path}[{key!r}]", type(value).__name__
    return None
