"""Benchmark the training path against a hand-written PyTorch loop, the data pipeline, and per-step overhead.

    python -m my_project.bench --config configs/synthetic.yaml --accelerator cpu   # a project's own command line
    python -m lightning_kit.bench --model their.Module --data their.DataModule --accelerator gpu

Measured in one process, on the same batches, alternating the contenders, because timings on a shared machine drift
between runs. Each contender's figure is its best run: what else the machine does can only add time, so the fastest
of several is the steadiest estimate of the code's own cost (as ``timeit`` reports); the per-step ratios (e) and (f)
are also given as the median over repeats of each pair of runs. It measures:

  (a) the project's own training path: the Trainer, callbacks and logging its KitCLI builds from the arguments;
  (b) a minimal hand-written PyTorch loop doing the same work;
  (c) the data pipeline alone (batches sliced, moved and augmented, on one thread), against (d) the training
      throughput of (a);
  (e) per-step overhead with a near-zero-cost network: the project's path against ``Trainer(barebones=True)`` and a
      hand-written loop, a Trainer's step timed within an epoch, from its start to the next one's (the end of an
      epoch, a checkpoint or the epoch's metrics, is a cost per epoch, which (a) counts and (e) does not);
  (f) with the default logger, what its TensorBoard event files cost a step: (e)'s project path against the same with
      ``--trainer.logger.init_args.tensorboard false``.

The hand-written contenders are timed by ``torch.utils.benchmark.Timer``, which synchronises the accelerator. The
model needs a ``net`` (the network it trains) and the data module a ``batch_size``; callbacks that would end training
before the timed steps (``EarlyStopping``, ``Timer``) are left out, as validation is.
"""

import argparse
import collections
import copy
import functools
import gc
import itertools
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, Timer
from torch import nn
from torch.utils import benchmark

from .building import build_all
from .cli import GenericCLI, KitCLI
from .errors import OneLineParser, UserError, command, invoked_as
from .installation import check_installation
from .loggers import CSVAndTensorBoardLogger
from .messages import errors_as_messages

STOPPING_CALLBACKS = (EarlyStopping, Timer)  # they would end a run before its timed steps


class NearZeroNet(nn.Module):
    """Logits from a learnt bias alone: a network that costs next to nothing, to expose framework overhead."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(inputs.shape[0], -1)


class StepWindow(L.Callback):
    """Times the ``steps`` after ``warmup``: the whole window's ``seconds``, and ``step_seconds`` (module's (e))."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps
        self.seconds = self.step_seconds = float("nan")
        self._starts: list[tuple[int, int, float]] = []  # (epoch, batch index, time) of each timed step's start

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step == self.warmup:
            self._start = benchmark.timer()  # the accelerator synchronised first
        if self.warmup <= trainer.global_step <= self.warmup + self.steps:
            self._starts.append((trainer.current_epoch, batch_idx, time.perf_counter()))

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.warmup + self.steps:
            self.seconds = benchmark.timer() - self._start
            within = [
                later - earlier
                for (epoch, index, earlier), (next_epoch, next_index, later) in itertools.pairwise(self._starts)
                if (next_epoch, next_index) == (epoch, index + 1)
            ]
            if within:
                self.step_seconds = statistics.fmean(within)


def lightning_path(make, warmup: int, steps: int, net: nn.Module, barebones: bool = False) -> tuple[float, float]:
    """Seconds for ``steps`` training steps of a copy of ``net`` through a Trainer, the project's own unless
    ``barebones``: the whole window's, and the mean of a step within an epoch (``StepWindow``)."""
    model, datamodule, trainer = make()
    model.net = copy.deepcopy(net)
    window = StepWindow(warmup, steps)
    if barebones:
        # Barebones mode forbids self.log; the same step code runs with logging switched off.
        model.log = lambda *args, **kwargs: None
        trainer = L.Trainer(
            barebones=True,
            accelerator=trainer.accelerator,
            devices=1,
            max_steps=warmup + steps,
            limit_val_batches=0,
            callbacks=[window],
        )
    else:
        trainer.callbacks.append(window)
    gc.collect()  # the garbage of the run before is not this one's to collect
    trainer.fit(model, datamodule=datamodule)
    if math.isnan(window.seconds):
        raise UserError(
            f"training stopped at step {trainer.global_step}, before the {warmup + steps} steps the benchmark "
            "runs: leave out the callbacks or settings that end it early"
        )
    if math.isnan(window.step_seconds):
        raise UserError(
            f"no epoch of {type(datamodule).__name__} has two of the timed steps in a row: time more steps "
            "(--steps) or give it more batches in an epoch"
        )
    return window.seconds, window.step_seconds


def hand_written_loop(make, warmup: int, steps: int, net: nn.Module) -> float:
    """Seconds for ``steps`` steps of a copy of ``net`` in a plain loop: move, augment, forward, backward, step."""
    model, datamodule, trainer = make()
    device = trainer.strategy.root_device
    model.net = net = copy.deepcopy(net).to(device)
    optimizer = model.configure_optimizers()
    batches = _training_batches(datamodule, device)

    def step() -> None:
        inputs, targets = next(batches)
        loss = nn.functional.cross_entropy(net(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    # As many threads as the Trainer's runs have, and the garbage collector on, as it is in theirs (timeit turns it
    # off unless its setup turns it on again).
    timer = benchmark.Timer(
        "step()", "gc.enable()", globals={"step": step, "gc": gc}, num_threads=torch.get_num_threads()
    )
    gc.collect()
    return steps * timer.timeit(steps).mean


def data_pipeline(make, batches: int) -> float:
    """Samples a second that slicing, moving and augmenting ``batches`` training batches gives, on one CPU thread."""
    _, datamodule, trainer = make()
    loader = _training_batches(datamodule, trainer.strategy.root_device)
    samples = []
    timer = benchmark.Timer("samples.append(len(next(loader)[0]))", globals={"samples": samples, "loader": loader})
    seconds = timer.timeit(batches).mean  # a batch's, on benchmark.Timer's one thread
    return statistics.fmean(samples) / seconds


def _whole_number(least: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` ``what``, else argparse's one-line error."""

    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return int(text)

    return parse


def _measured_sizes(model: L.LightningModule, datamodule: L.LightningDataModule) -> tuple[int, int]:
    """The batch size and the class count of the runs; a ``UserError`` where the model or data does not say them."""
    if not isinstance(getattr(model, "net", None), nn.Module):
        raise UserError(
            f"the model {type(model).__name__} has no net: the benchmark times the network a model trains as its "
            "`net` attribute, against the same network in a hand-written loop"
        )
    batch_size = datamodule.hparams.get("batch_size", getattr(datamodule, "batch_size", None))
    num_classes = model.hparams.get("num_classes", getattr(datamodule, "num_classes", None))
    for name, value, owner in (("batch_size", batch_size, datamodule), ("num_classes", num_classes, model)):
        if not isinstance(value, int):
            raise UserError(f"{type(owner).__name__} has no {name}: the benchmark needs it to count samples")
    return batch_size, num_classes


def _training_batches(datamodule: L.LightningDataModule, device: torch.device) -> Iterator[tuple]:
    """The data module set up for ``fit`` now; then its training batches for ever, moved to ``device`` and
    augmented as the data module augments them (its ``augment``, if it has one)."""
    augment = getattr(datamodule, "augment", None)
    datamodule.prepare_data()
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()

    def batches() -> Iterator[tuple]:
        for step, batch in enumerate(itertools.chain.from_iterable(itertools.repeat(loader))):
            batch = tuple(tensor.to(device, non_blocking=True) for tensor in batch)
            yield augment(batch, step=step) if augment is not None else batch

    return batches()


@command
def main(args: list[str] | None = None, cli_class: type[KitCLI] = GenericCLI, prog: str | None = None) -> None:
    """Benchmark the training ``cli_class`` builds from ``args``; ``prog`` names the command."""
    check_installation(cli_class.__module__)
    prog = prog or invoked_as("python -m lightning_kit.bench")
    parser = OneLineParser(
        prog=prog, description=__doc__.split("\n\n")[0], epilog=f"Other arguments go to {cli_class.command}."
    )
    steps = _whole_number(1, "a positive number of timed steps")
    parser.add_argument("--steps", type=steps, default=100, help="timed training steps per run (default 100)")
    warmup = _whole_number(0, "a number of untimed steps, 0 or more")
    parser.add_argument("--warmup", type=warmup, default=10, help="untimed steps before them (default 10)")
    repeats = _whole_number(1, "a positive number of runs")
    parser.add_argument("--repeats", type=repeats, default=7, help="alternating runs of each contender (default 7)")
    options, train_args = parser.parse_known_args(args)
    with errors_as_messages():  # a missing data folder, say: one line
        training_benchmark(options, train_args, cli_class, prog)


def training_benchmark(
    options: argparse.Namespace, train_args: list[str], cli_class: type[KitCLI] = GenericCLI, prog: str | None = None
) -> None:
    """Measure (a) to (e) on the model and data that ``cli_class`` builds from ``train_args``."""
    warmup, steps = options.warmup, options.steps

    with tempfile.TemporaryDirectory() as runs:
        fixed = ["--trainer.logger.init_args.save_dir", runs, "--trainer.max_steps", str(warmup + steps)]
        fixed += ["--trainer.max_epochs", "-1", "--trainer.limit_val_batches", "0"]
        fixed += ["--trainer.num_sanity_val_steps", "0"]

        def make(*more: str):
            model, datamodule, trainer = build_all(cli_class, [*train_args, *fixed, *more], prog=prog)
            trainer.callbacks[:] = [c for c in trainer.callbacks if not isinstance(c, STOPPING_CALLBACKS)]
            return model, datamodule, trainer

        model, datamodule, trainer = make()
        # (f): the default logger's TensorBoard files, against its CSV files alone.
        boards = len(trainer.loggers) == 1 and isinstance(trainer.logger, CSVAndTensorBoardLogger)
        boards = boards and trainer.logger.tensorboard
        csv_only = functools.partial(make, "--trainer.logger.init_args.tensorboard", "false")
        batch_size, num_classes = _measured_sizes(model, datamodule)
        initial_net = model.net
        near_zero = NearZeroNet(num_classes)
        print(
            f"{type(model.net).__name__}, batch {batch_size}, {trainer.strategy.root_device}, torch {torch.__version__}"
        )

        times: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(options.repeats):
            times["project"].append(lightning_path(make, warmup, steps, initial_net)[0])
            times["hand"].append(hand_written_loop(make, warmup, steps, initial_net))
            # Per step, near-zero network: a step's mean time within an epoch, by the whole window's steps.
            times["zero project"].append(steps * lightning_path(make, warmup, steps, near_zero)[1])
            times["zero bare"].append(steps * lightning_path(make, warmup, steps, near_zero, barebones=True)[1])
            times["zero hand"].append(hand_written_loop(make, warmup, steps, near_zero))
            if boards:
                times["zero csv"].append(steps * lightning_path(csv_only, warmup, steps, near_zero)[1])
        pipeline = [data_pipeline(make, batches=steps) for _ in range(options.repeats)]

    best = {name: min(values) for name, values in times.items()}
    rate = {name: steps * batch_size / seconds for name, seconds in best.items()}
    pipeline_rate = max(pipeline)
    per_step_ms = {name: 1000 * best[name] / steps for name in ("zero project", "zero bare", "zero hand")}
    paired = statistics.median(p / b for p, b in zip(times["zero project"], times["zero bare"], strict=True))
    print(f"best of {options.repeats} alternating runs of {steps} steps (after {warmup} warm-up steps)")
    print(f"(a) project training path   {rate['project']:>12,.0f} samples/s")
    print(f"(b) hand-written loop       {rate['hand']:>12,.0f} samples/s")
    print(f"    ratio (a)/(b)           {rate['project'] / rate['hand']:>12.3f}")
    print(f"(c) data pipeline, 1 thread {pipeline_rate:>12,.0f} samples/s")
    print(f"(d) training, (a)           {rate['project']:>12,.0f} samples/s")
    print(f"    ratio (c)/(d)           {pipeline_rate / rate['project']:>12.1f}")
    print(f"(e) per step, near-zero net: project {per_step_ms['zero project']:.2f} ms, "
          f"barebones {per_step_ms['zero bare']:.2f} ms, hand-written {per_step_ms['zero hand']:.2f} ms")  # fmt: skip
    print(f"    ratio project/barebones {per_step_ms['zero project'] / per_step_ms['zero bare']:>12.2f}")
    print(f"    median of paired runs   {paired:>12.2f}")
    if boards:
        board_ms = 1000 * (best["zero project"] - best["zero csv"]) / steps
        paired_board = statistics.median(p / c for p, c in zip(times["zero project"], times["zero csv"], strict=True))
        print(f"(f) per step, near-zero net: TensorBoard beside the CSV {per_step_ms['zero project']:.2f} ms, "
              f"CSV alone {1000 * best['zero csv'] / steps:.2f} ms: {board_ms:+.3f} ms a step")  # fmt: skip
        print(f"    median of paired runs   {paired_board:>12.2f}")


if __name__ == "__main__":
    main()
