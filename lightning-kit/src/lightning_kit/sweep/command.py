"""Hyperparameter sweeps and cross-validation: many runs of a project's fit as one resumable Optuna study.

Each trial is a run folder, runs/sweeps/<study>/trial_<number>/; the same command again continues after any stop.
"""

import argparse
import inspect
import itertools
import math
import re
import signal
import statistics
import sys
import threading
import warnings
from pathlib import Path

import optuna
from jsonargparse.typing import restricted_number_type
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from ..building import build_all
from ..cli import SUBCOMMANDS, GenericCLI, KitCLI
from ..errors import ConfigError, OneLineParser, command, invoked_as
from ..gpu_audit.lightning import simulated_run
from ..installation import check_installation
from ..messages import errors_as_messages, report
from ..passwords import hidden, scrubbed, shown_command
from ..stores import STUDY_DB
from ..supervision import leave_process_group
from .fingerprint import configuration, data_fingerprint
from .queue import COUNTED, CROSS_VALIDATION, RUN_FOLDER, queue_retry, run_trials, signals_held
from .space import SearchSpace, argument_names, refusal
from .store import open_storage, write_study_file
from .study import StudyDiffersError, open_study
from .trial import AFTER_IT, DISK_FULL, ONE_DEVICE, SIGNAL, InterruptionError, Plan, run_trial, stop_of_the_process

STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
MAX_GRID = 10_000  # a grid of more trials than this is a mistake
MAX_NEW_STUDIES = 100  # --new_study tries name-2, name-3, ... up to this
MAX_TRIALS = 1_000_000  # past it, counts stop being numbers Optuna stores
Trials = restricted_number_type(f"int from 1 to {MAX_TRIALS}", int, [(">=", 1), ("<=", MAX_TRIALS)])
Folds = restricted_number_type(f"int from 2 to {MAX_GRID}", int, [(">=", 2), ("<=", MAX_GRID)])
PruneAfter = restricted_number_type(f"int from 0 to {MAX_TRIALS}", int, [(">=", 0), ("<=", MAX_TRIALS)])


@command
def main(args: list[str] | None = None, cli_class: type[KitCLI] = GenericCLI, prog: str | None = None) -> None:
    """Run the sweep that ``args`` describe over ``cli_class``'s fit."""
    check_installation(cli_class.__module__)
    prog = prog or invoked_as(f"python -m {__package__}")
    parser = OneLineParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    one = parser.add_mutually_exclusive_group(required=True)
    one.add_argument("--space", type=Path, help="the search space: a YAML file of fit's flags and their ranges")
    one.add_argument("--folds", type=Folds, help="instead of --space: cross-validate over this many folds")
    parser.add_argument("--trials", type=Trials, help="trials to complete (or prune), across every worker")
    parser.add_argument("--study", help="the study's name (default: the space file's name, or folds)")
    parser.add_argument(
        "--new_study",
        action="store_true",
        help="if the study was started on other data, arguments or space: start a new one beside it (name-2, ...)",
    )
    parser.add_argument("--storage", help="a database URL shared by the workers (default: study.db beside the trials)")
    parser.add_argument("--sampler", choices=("tpe", "random", "grid"), default="tpe", help="(default tpe)")
    parser.add_argument("--pruner", choices=("median", "none"), default="median", help="(default median)")
    parser.add_argument(
        "--prune_after", type=PruneAfter, default=5, help="trials finished before any is pruned (default 5, Optuna's)"
    )
    options, train_args = parser.parse_known_args(args)
    # Optuna's heartbeat is experimental since 2.9, and meant for Study.optimize: this is how a sweep uses it.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # each trial's end is reported here, in a line of ours
    if options.folds is not None and (options.trials is not None or options.sampler != "tpe"):
        parser.error("--folds runs one trial per fold: leave out --trials and --sampler")
    if options.space is not None and options.trials is None and options.sampler != "grid":
        parser.error(f"--trials N is needed with --sampler {options.sampler}: how many trials to run")
    if options.study is not None and not STUDY_NAME.fullmatch(options.study):
        parser.error(f"--study must be a folder name of letters, digits, '.', '_' and '-', got {options.study!r}")
    if train_args[:1] == ["fit"]:
        train_args = train_args[1:]
    elif train_args and train_args[0] in SUBCOMMANDS:
        parser.error(f"a sweep trains: give the arguments of fit, not of {train_args[0]}")
    # SIGTERM between trials stops the sweep as Ctrl-C does; during a trial, the trial's own handlers take over.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if main_thread else None
    with simulated_run:
        try:
            with errors_as_messages():
                sweep(options, train_args, args if args is not None else sys.argv[1:], cli_class, prog)
        finally:
            leave_process_group()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


_EPILOG = """The --space file is YAML, keyed by fit's own flags (without --), each a range or a list of choices:

  model.lr: {low: 1.0e-4, high: 0.1, log: true}     a float, log-uniform
  model.weight_decay: {low: 0.0, high: 0.01}         a float, uniform
  data.batch_size: [32, 64, 128]                     one of these
  model.hidden: {low: 16, high: 64, step: 16}        an integer (both ends integers)

Other arguments go to the command line's fit, as to fit itself."""


def sweep(
    options: argparse.Namespace, train_args: list[str], command: list[str], cli_class: type[KitCLI], prog: str
) -> None:
    """Run trials of ``options``' study until it has its number, then report the best (or the folds' spread)."""
    if options.space is not None and options.sampler == "grid":
        combinations = len(_grid(SearchSpace.read(options.space)))  # before anything is built: the file's mistakes
        if options.trials is not None:
            raise ConfigError(
                f"--trials is not used with --sampler grid, which runs each of its {combinations} combinations "
                "once: leave --trials out"
            )
    _, datamodule, trainer = build_all(cli_class, [*ONE_DEVICE, *train_args], prog=f"{prog} [fit arguments]")
    monitor, direction = _monitored(trainer)
    if options.folds is not None:
        space, fixed = _folds(options.folds, datamodule, train_args, cli_class), ["--data.folds", str(options.folds)]
    else:
        space, fixed = SearchSpace.read(options.space), []
        space.check(cli_class, [*ONE_DEVICE, *train_args], argument_names(trainer))
    grid = _grid(space) if options.folds is not None or options.sampler == "grid" else []
    data = data_fingerprint(datamodule)  # the data it trains on, set up once, as fit does
    datamodule = None  # its data freed: each trial loads its own
    wanted = len(grid) or options.trials
    settings = {
        "train_args": train_args,  # recorded; compared, as resolved by train.py, in "config"
        "config": configuration(trainer),
        "data": data,
        "space": {name: repr(distribution) for name, distribution in space.distributions.items()},
        "space_file": space.text,  # recorded, not compared: a comment changes no trial
        "sampler": "grid" if grid else "drawn",
        "monitor": monitor,
        "direction": direction,
    }
    # A grid's and the folds' trials are queued when the study is created: the sampler draws none of them.
    sampler = optuna.samplers.TPESampler() if options.sampler == "tpe" else optuna.samplers.RandomSampler()
    # From the second epoch on: the first one's metric says more about the initial weights than the settings.
    pruner = optuna.pruners.MedianPruner(n_startup_trials=options.prune_after, n_warmup_steps=1)
    if options.pruner == "none" or options.folds is not None:
        pruner = optuna.pruners.NopPruner()
    given = options.study or ("folds" if options.folds is not None else space.path.stem)
    for attempt in itertools.count(1):
        name = given if attempt == 1 else f"{given}-{attempt}"
        folder = Path(trainer.logger.save_dir) / "sweeps" / name
        url = options.storage or f"sqlite:///{folder.resolve() / STUDY_DB}"  # resolved: runs/ may be a link
        storage = open_storage(url, on_stale=queue_retry, beside_trials=options.storage is None)
        if name not in optuna.study.get_all_study_names(storage) and any(folder.glob("trial_*")):
            if options.new_study:
                continue
            raise ConfigError(
                f"{folder} holds trials of a study not in {hidden(url)}: give another --study or move it away"
            )
        try:
            study = open_study(name, storage, url, settings, grid, sampler, pruner)
        except StudyDiffersError as differs:
            if not options.new_study or attempt >= MAX_NEW_STUDIES:
                raise
            report(f"study {name} was started with {differs.what}: --new_study: trying study {given}-{attempt + 1}")
            continue
        break
    write_study_file(folder, study, url, monitor, options.folds)
    plan = Plan(cli_class, study, space, train_args, fixed, folder, monitor)
    report(f"study {name}: {wanted} trials, judged by {monitor} ({direction}), in {folder}")
    try:
        run_trials(study, storage, wanted, lambda trial: run_trial(plan, trial), grid)
    except (Exception, KeyboardInterrupt) as err:  # a stop in a trial, or between trials: no trial is lost by it
        trial = err if isinstance(err, InterruptionError) else None
        if (stop := (trial.reason, trial.detail) if trial else stop_of_the_process(err)) is None:
            raise
        again = f"run the same command again: {prog} {shown_command(command)}"
        where = f" in trial {trial.number}" if trial else ""
        if stop[0] == SIGNAL:
            if trial:
                saved = f"{trial.saved} saved" if trial.saved else "nothing saved yet"
                where = f" after trial {trial.number}" if stop[1] == AFTER_IT else f"{where} ({saved})"
            sys.exit(f"stopped by Ctrl-C or SIGTERM{where}: to continue the sweep, {again}")
        fix = "free some space, then" if stop[0] == DISK_FULL else "once the store can be reached,"
        resumes = "; it runs again from its newest checkpoint" if trial else ""
        sys.exit(f"error: stopped{where}: {stop[0]} ({scrubbed(stop[1])}){resumes}: {fix} {again}")
    _summary(study, options.folds, monitor)


def _monitored(trainer) -> tuple[str, str]:
    """The metric the checkpoint callback judges runs by, and the study's direction; the run folder it needs."""
    judge = trainer.checkpoint_callback
    if judge is None or not getattr(judge, "monitor", None):
        raise ConfigError(
            "a sweep judges trials by the checkpoint callback's monitored metric: this run has none: give one, "
            "--trainer.callbacks+=ModelCheckpoint --trainer.callbacks.monitor <metric> "
            "--trainer.callbacks.mode max (or min)"
        )
    if len(trainer.loggers) != 1 or not isinstance(trainer.logger, CSVLogger | TensorBoardLogger):
        raise ConfigError(
            "a sweep writes each trial's run folder with one CSVLogger or TensorBoardLogger: "
            f"give one of them as --trainer.logger, not {[type(logger).__name__ for logger in trainer.loggers]}"
        )
    if trainer.world_size > 1:
        raise ConfigError(
            "a sweep trains each trial in one process, on one device: leave out --devices and --num_nodes "
            "(more workers, sharing one --storage, run more trials at once); to train a chosen trial on more, "
            "give the training command --config <its folder>/config.yaml --devices N"
        )
    return judge.monitor, "maximize" if judge.mode == "max" else "minimize"


def _folds(folds: int, datamodule, train_args: list[str], cli_class: type[KitCLI]) -> SearchSpace:
    """The space of a cross-validation: the fold, one trial each; refused for data that cannot be split into folds."""
    if "folds" not in inspect.signature(type(datamodule)).parameters:
        raise ConfigError(
            f"--folds: {type(datamodule).__name__} cannot be split into folds (it takes no --data.folds): "
            "cross-validation needs a data module that holds its data in memory"
        )
    reason = refusal(cli_class, [*ONE_DEVICE, *train_args], {"data.folds": folds, "data.fold": folds - 1})
    if reason is not None:
        raise ConfigError(f"--folds {folds}: {reason}")
    return SearchSpace(Path("folds"), {"data.fold": CategoricalDistribution(list(range(folds)))})


def _grid(space: SearchSpace) -> list[dict]:
    """Every combination of the space's choices, in the file's order, each once."""
    lists = {name: d.choices for name, d in space.distributions.items() if isinstance(d, CategoricalDistribution)}
    if len(lists) < len(space.distributions):
        ranges = sorted(space.distributions.keys() - lists.keys())
        raise ConfigError(f"{space.path}: --sampler grid takes lists of choices only, not ranges: {', '.join(ranges)}")
    if (size := math.prod(map(len, lists.values()))) > MAX_GRID:
        raise ConfigError(f"{space.path}: the grid has {size} combinations, more than {MAX_GRID}: search it with tpe")
    return [dict(zip(lists, values, strict=True)) for values in itertools.product(*lists.values())]


def _summary(study: optuna.Study, folds: int | None, monitor: str) -> None:
    """The best trial and how to train it again; for folds, the metric's mean and spread over them."""
    counted = [trial for trial in study.get_trials(deepcopy=False) if trial.state in COUNTED]
    complete = [trial for trial in counted if trial.state == TrialState.COMPLETE]
    pruned = len(counted) - len(complete)
    report(f"{len(complete)} trials complete, {pruned} pruned")
    if not complete:
        return
    if folds is not None:
        missing = sorted(set(range(folds)) - {trial.params.get("data.fold") for trial in complete})
        if missing:  # a fold that failed by its own code: a mean without it would be of other data
            report(f"folds {', '.join(map(str, missing))} did not complete: no mean over the folds; "
                   "fix what failed and run the same command again")  # fmt: skip
            return
        values = [trial.value for trial in complete]
        mean, spread = statistics.mean(values), statistics.stdev(values)  # every fold: 2 or more
        summary = f"{monitor} over {len(values)} folds: mean {mean:.4f}, standard deviation {spread:.4f}"
        report(summary)
        with signals_held():  # shown with the study in Optuna's dashboard too
            study.set_user_attr(CROSS_VALIDATION, summary)
        return
    best = study.best_trial
    shown = ", ".join(f"{name}={value}" for name, value in best.params.items())
    report(f"best trial {best.number}: {monitor}={best.value:.4f} with {shown}")
    report(f"its run folder: {best.user_attrs.get(RUN_FOLDER)}")
    report(f"train it again: {best.user_attrs.get('command')}")
