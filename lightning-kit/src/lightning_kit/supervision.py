"""Supervision of a DDP run's processes: one line, and every process ends, when one of them is lost."""

import os
import re
import sys
import threading
from typing import ClassVar

import lightning as L
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .errors import ConfigError
from .upstream.lightning import other_rank_processes


class ProcessWatch(L.Callback):
    """End every process of a DDP run Lightning started (``--devices N``) when one dies, with one line: else the
    others wait half an hour in their next collective. (torchrun and SLURM watch their processes themselves.)"""

    POLL_SECONDS = 1.0
    # A rank Lightning started leaves a stop by a signal with 0: fabric's _ChildProcessObserver kills for any other.
    started_by_lightning = False
    _children: ClassVar[list] = []  # the processes of the other ranks, in the first process
    _done: threading.Event | None = None  # made when watching starts: a callback must stay copyable

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        launcher = getattr(trainer.strategy, "launcher", None)
        environment = getattr(trainer.strategy, "cluster_environment", None)
        children = other_rank_processes(launcher)
        if trainer.world_size > 1 and children is not None and isinstance(environment, LightningEnvironment):
            ProcessWatch.started_by_lightning = trainer.local_rank > 0
            ProcessWatch._children = list(children)  # in the first process only
            self._done = done = threading.Event()
            if self.started_by_lightning:
                threading.Thread(target=self._watch_first, args=(done, os.getppid()), daemon=True).start()
            for rank, child in enumerate(self._children, start=1):
                threading.Thread(target=self._watch_child, args=(done, rank, child), daemon=True).start()

    def _watch_first(self, done: threading.Event, parent: int) -> None:
        """The first process is gone when this one's parent changes."""
        while not done.wait(self.POLL_SECONDS):
            if os.getppid() != parent:
                _leave_at_once("the process of rank 0 ended")

    @staticmethod
    def _watch_child(done: threading.Event, rank: int, child) -> None:
        """Learn the moment another rank's process ends, waiting: Lightning's watch polls every 5 seconds, then kills
        this process without a word (while this thread waits, its polls see nothing)."""
        code = child.wait()
        if code != 0 and not done.is_set():
            _leave_at_once(f"the process of rank {rank} ended with exit code {code}")

    @classmethod
    def ended(cls) -> str | None:
        """Which other process ended before its time, and how."""
        for rank, child in enumerate(cls._children, start=1):
            if child.poll() not in (None, 0):
                return f"the process of rank {rank} ended with exit code {child.returncode}"
        return None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException) and self._done is not None:
            self._done.set()  # every process stops now: the others' exits are no accident

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._done is not None:
            self._done.set()


def _leave_at_once(ended: str) -> None:
    """Leave at once: the main thread may be blocked in a collective that never returns."""
    sys.stderr.write(f"{lost_process_line(ended)}\n")
    sys.stderr.flush()
    os._exit(1)


def lost_process_line(ended: str) -> str:
    """The one line a process of a DDP run leaves with when another process of it ``ended``."""
    return f"error: {ended}; this process stops too (resume with --ckpt_path last)"


# How gloo and NCCL report that another process of the run went away mid-collective.
_LOST_CONNECTION = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|NCCL communicator was aborted|ncclRemoteError|"
    r"remote process exited|Socket Timeout",
    re.IGNORECASE,
)


def lost_a_process(err: BaseException) -> bool:
    """Whether ``err`` is a collective failing because another process of the run ended."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return False
    return isinstance(err, torch.distributed.DistError) or bool(_LOST_CONNECTION.search(str(err)))


def leave_process_group() -> None:
    """Shut DDP's process group down while Python is whole (Lightning does for NCCL only): a gloo group left to
    interpreter shutdown can abort a finished run with a non-zero exit code (pytorch/pytorch#179291)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def check_cpu_processes(trainer) -> None:
    """DDP on the CPU starts one process per device: more than the machine's CPUs slows it down, or hangs it."""
    on_cpu = trainer.accelerator == "cpu" or (trainer.accelerator == "auto" and not torch.cuda.is_available())
    devices = trainer.devices
    count = devices if isinstance(devices, int) else int(devices) if str(devices).isdigit() else None
    cpus = os.cpu_count() or 1
    if on_cpu and count is not None and count > cpus:
        raise ConfigError(
            f"--devices {devices} on the CPU would start {count} processes on a machine with {cpus} CPUs: "
            f"use at most --devices {cpus} (or a GPU machine)"
        )
