"""The simulated GPU in Lightning: ``--accelerator simgpu``, and the audit's strategy for one GPU or a DDP rank."""

import contextlib
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parameter import is_lazy

from ..upstream.lightning import device_dtype_mixin
from . import batches, simulated
from .explain import explain, is_user_code
from .simulated import SimulatedDeviceError
from .simulated.collectives import nccl_refusal, note

SIMULATED = simulated.DEVICE_TYPE  # --accelerator simgpu
# DistributedDataParallel's own refusals as it wraps a module (torch/nn/parallel/distributed.py), as on GPUs.
_DDP_REFUSES = re.compile(
    r"any parameter that requires a gradient|sparse|same type of devices|SyncBatchNorm layers only work|"
    r"DDP expects same model across all ranks",
    flags=re.IGNORECASE,
)
MIXED = {"16-mixed": "16-mixed", "bf16-mixed": "bf16-mixed", "16": "16-mixed", "bf16": "bf16-mixed", 16: "16-mixed"}


def mixed_precision(precision: str | int) -> MixedPrecision | None:
    """Lightning's mixed precision on the simulated GPU (CUDA's autocast policy), for a mixed ``precision``."""
    return MixedPrecision(MIXED[precision], device=SIMULATED) if precision in MIXED else None


class SimulatedGPUAccelerator(Accelerator):
    """Lightning's accelerator for the simulated GPU: ``--accelerator simgpu``."""

    def setup_device(self, device: torch.device) -> None:
        simulated.enable()
        simulated.set_device(device)

    def teardown(self) -> None:
        pass

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return {}

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> list[int]:
        if devices in ("auto", -1, "-1"):
            return [0]
        if isinstance(devices, str):
            devices = [int(index) for index in devices.split(",") if index.strip()] if "," in devices else int(devices)
        indexes = list(range(devices)) if isinstance(devices, int) else list(devices)
        if not indexes or max(indexes) >= simulated.DEVICE_COUNT or min(indexes) < 0:
            last = simulated.DEVICE_COUNT - 1
            raise ValueError(f"--devices {devices}: the simulated GPU has devices 0 to {last}")
        return indexes

    @staticmethod
    def get_parallel_devices(devices: list[int]) -> list[torch.device]:
        return [simulated.device(index) for index in devices]

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True

    @classmethod
    def name(cls) -> str:
        return SIMULATED


if SIMULATED not in AcceleratorRegistry:
    AcceleratorRegistry.register(
        SIMULATED, SimulatedGPUAccelerator, description="A CUDA GPU simulated on the CPU (the device audit)"
    )


class SimulatedGPUStrategy(ParallelStrategy):
    """One process on ``simgpu:<rank>``; with ``world_size`` 2, that rank of a DDP run, whose collectives act as if
    every process held the same values, after NCCL's check that the tensors are on this process's GPU."""

    strategy_name = SIMULATED

    def __init__(self, rank: int = 0, world_size: int = 1, ddp_options: dict[str, Any] | None = None) -> None:
        device = simulated.device(rank)
        super().__init__(accelerator=SimulatedGPUAccelerator(), parallel_devices=[device])
        self._rank, self._world_size = rank, world_size
        self._ddp_options = dict(ddp_options or {})  # DistributedDataParallel's arguments
        self._process_rank: int | None = None  # Lightning's rank of this process, given back at teardown

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """While fitting as a DDP rank: the module in PyTorch's own DistributedDataParallel, whose reducer finds what
        a GPU run's does."""
        if not self.is_distributed or self.lightning_module.trainer.state.fn != TrainerFn.FITTING:
            return model
        lazy = [name for name, parameter in model.named_parameters() if is_lazy(parameter)]
        if lazy:  # DDP's own check, before the first batch could materialise them; named here
            raise SimulatedDeviceError(
                "Modules with uninitialized parameters can't be used with `DistributedDataParallel`. Run a dummy "
                f"forward pass to correctly initialize the modules (uninitialized: {', '.join(lazy)})",
                kind="lazy modules",
                operation="DistributedDataParallel",
            )
        if self._ddp_options.get("find_unused_parameters") or self._ddp_options.get("static_graph"):
            # No error of that kind to find, and DDP's map of unused parameters needs pinned memory: left unwrapped.
            return model
        level = torch.distributed.get_debug_level()
        torch.distributed.set_debug_level(torch.distributed.DebugLevel.INFO)  # the reducer names unused parameters
        try:
            wrapped = DistributedDataParallel(module=model, device_ids=None, **self._ddp_options)
        except (RuntimeError, ValueError) as refused:
            if not _DDP_REFUSES.search(str(refused)):
                raise  # not a refusal of DDP's own: what the simulation could not do, a gap
            raise SimulatedDeviceError(str(refused), kind="DDP", operation="DistributedDataParallel") from refused
        finally:
            torch.distributed.set_debug_level(level)
        wrapped.logger = _WithoutTimings(wrapped.logger)
        return wrapped

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        module = self.lightning_module
        before = vars(module).get("forward")
        try:
            return super().training_step(*args, **kwargs)
        finally:
            # Lightning points forward at training_step while DDP's runs: put back where a reducer's error stopped it.
            if before is None:
                vars(module).pop("forward", None)
            else:
                vars(module)["forward"] = before

    @property
    def root_device(self) -> torch.device:
        return simulated.told(simulated.device(self._rank))  # cuda:N to the user's code, as a GPU run's

    @property
    def global_rank(self) -> int:
        return self._rank

    local_rank = global_rank  # one process per simulated node

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def is_distributed(self) -> bool:
        return self._world_size > 1

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        return {"num_replicas": self._world_size, "rank": self._rank} if self.is_distributed else None

    def setup_environment(self) -> None:
        super().setup_environment()
        # The rank is this process's only while it runs: with rank 1 left, later runs would skip rank 0's files.
        self._process_rank = rank_zero_only.rank
        rank_zero_only.rank = self._rank
        batches.forget()

    def teardown(self) -> None:
        if isinstance(self.model, DistributedDataParallel):
            self.model = self.lightning_module  # unwrapped, as Lightning's DDP strategy does
        if self._process_rank is not None:
            rank_zero_only.rank, self._process_rank = self._process_rank, None
        super().teardown()

    def model_to_device(self) -> None:
        self.model.to(self.root_device)  # each parameter keeps its object, attributes and hooks (simulated/in_place.py)

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Lightning's move of ``batch``, keeping what it left on the CPU (``batches.py``)."""
        moved = super().batch_to_device(batch, device, dataloader_idx)
        batches.record(moved, self._batch_mover)
        return moved

    def _batch_mover(self) -> str | None:
        """The user's ``transfer_batch_to_device`` that Lightning calls instead of its own, if any."""
        model = self.lightning_module
        for owner, base in ((model.trainer.datamodule, L.LightningDataModule), (model, L.LightningModule)):
            if owner is not None and is_overridden("transfer_batch_to_device", owner, base):
                return f"{type(owner).__name__}.transfer_batch_to_device"
        return None

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not isinstance(tensor, torch.Tensor) or not self.is_distributed:
            return tensor
        note("all_reduce", tensor)
        self.check_collective(tensor, "all_reduce")
        return tensor * self._world_size if "sum" in str(reduce_op).lower() else tensor

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        if not self.is_distributed:
            return tensor
        note("all_gather", tensor)
        self.check_collective(tensor, "all_gather")
        return torch.stack([tensor] * self._world_size)

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if self.is_distributed:
            note("barrier", ())

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.is_distributed:
            note("broadcast", obj)
        return obj

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if self.is_global_zero:
            super().save_checkpoint(simulated.to_cpu(checkpoint), filepath, storage_options)

    def check_collective(self, tensor: torch.Tensor, operation: str) -> None:
        """Raise ``SimulatedDeviceError`` where NCCL would refuse ``tensor``: off this process's GPU."""
        if tensor.device != self.root_device:
            name = f"torch.distributed.{operation}"
            raise nccl_refusal(operation, tensor, self._rank, kind="sync_dist", operation=name)


class _WithoutTimings:
    """DDP's logger without the timings it takes on CPUs and CUDA GPUs only (and complains of on any other device)."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def set_runtime_stats_and_log(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


class StageMemory(L.Callback):
    """Of each stage: the size of its batches, and the bytes held on the GPU besides a batch's own (after a training
    step, with the gradients and the optimizer's state). Fit's are its training's."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.held: dict[str, int] = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any) -> None:
        with contextlib.suppress(Exception):  # a batch Lightning cannot size: no estimate by batch size
            self.sizes[trainer.state.fn.value] = extract_batch_size(batch)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.held[trainer.state.fn.value] = simulated.memory.stage_allocated()

    def _batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any) -> None:
        stage = trainer.state.fn.value
        if not trainer.training and not trainer.sanity_checking:  # fit's own are its training's
            if stage not in self.sizes:  # sized as a training batch is, until one can be
                self.on_train_batch_start(trainer, pl_module, batch)
            self.held.setdefault(stage, simulated.memory.stage_allocated())

    on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _batch_start


class HookTracker(PassThroughProfiler):
    """Lightning names every hook and loop step to its profiler: mark each exception with the innermost one."""

    def __init__(self, progress: Any = None) -> None:
        super().__init__()
        self.actions: set[str] = set()
        self.progress = progress  # told each action as it starts

    @contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        self.actions.add(action_name)
        if self.progress is not None:
            self.progress.at_hook(action_name)
        try:
            yield action_name
        except BaseException as err:
            if getattr(err, "_audit_action", None) is None:
                err._audit_action = action_name
            raise


def _module_device(module: L.LightningModule) -> torch.device:
    """``LightningModule.device`` while simulating: ``cuda:N`` to the user's code, ``simgpu:N`` to Lightning's."""
    device = module._device
    if device.type == "cuda":  # moved by the user's code to a CUDA device, which is the simulated GPU
        device = simulated.device(simulated.current_device().index if device.index is None else device.index)
    return simulated.told(device)


_MIXIN = device_dtype_mixin()
_LIGHTNING_DEVICE = vars(_MIXIN)["device"]


@contextmanager
def simulating(rank: int = 0) -> Iterator[None]:
    """``simulated.simulating`` for a Lightning run: the user's code is told CUDA's answers, ``self.device`` too."""
    with simulated.simulating(rank, is_user_code):
        _MIXIN.device = property(_module_device)
        try:
            yield
        finally:
            _MIXIN.device = _LIGHTNING_DEVICE


class SimulatedRun(ExitStack):
    """A run with --accelerator simgpu: from when the configuration asks for it to main()'s end."""

    stage: str | None = None  # the subcommand running on the simulated GPU, if any

    def start(self, stage: str) -> None:
        self.enter_context(simulating(0))
        self.stage = stage

    def __exit__(self, *exc_info: Any) -> bool:
        self.stage = None
        return super().__exit__(*exc_info)


simulated_run = SimulatedRun()


def run_on_simulated_gpu(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``function`` (code outside a LightningModule, such as an on-device augmentation) with its tensor
    arguments on the simulated GPU; raises ``DevicePlacementError`` where a GPU would fail."""
    batches.forget()
    with simulating(0):
        args, kwargs = move_data_to_device((args, kwargs), simulated.device(0))
        try:
            return function(*args, **kwargs)
        except SimulatedDeviceError as err:
            name = getattr(function, "__qualname__", repr(function))
            raise explain(err, stage="call", rank=0, world_size=1, hook=name) from None
