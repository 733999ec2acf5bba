"""Runs from a checkpoint, evaluations above all: the checkpoint chosen, and the settings, limits and output
folder that its run folder gives."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .checkpoints import latest_checkpoint
from .errors import ConfigError, UserError
from .files import check_folder_path
from .messages import report
from .trust import read_run_config

# What each evaluation runs on, and the Trainer flag that limits it.
EVALUATIONS = {
    "validate": ("validation set", "limit_val_batches"),
    "test": ("test set", "limit_test_batches"),
    "predict": ("prediction data", "limit_predict_batches"),
}
# Evaluating a model that was never trained must be asked for by name.
UNTRAINED_FLAG = "--untrained_weights"


def choose_checkpoint(subcommand: str, config) -> str | None:
    """The checkpoint a run starts from, set in ``config``: ``last`` resolved. (A run's saved ``ckpt_path: null`` is
    parsed before the flags given: ``cli.KitCLI.parse_arguments``.)"""
    if isinstance(config.get("ckpt_path"), str) and not config.ckpt_path.strip():  # an unset shell variable, say
        raise ConfigError("--ckpt_path is empty: give a .ckpt file, last for the newest run's, or null for none")
    # An evaluation scores the weights of a checkpoint it loads, or untrained weights when asked for by name.
    untrained = subcommand in EVALUATIONS and config.get(UNTRAINED_FLAG[2:])
    if subcommand in EVALUATIONS and config.get("ckpt_path") is None and not untrained:
        raise ConfigError(
            f"{subcommand} needs --ckpt_path (a .ckpt file, or last for the newest run's): without one it would "
            f"score untrained weights; to do that on purpose, give {UNTRAINED_FLAG} true"
        )
    if config.get("ckpt_path") is not None and untrained:
        raise ConfigError(f"{UNTRAINED_FLAG} true and --ckpt_path {config.ckpt_path} contradict: give one of them")
    if config.get("ckpt_path") == "last":
        # Resolved here, so the run's saved config.yaml names the file it resumed from.
        config.ckpt_path = str(latest_checkpoint(_runs_root(config.trainer.logger), report=report))
        report(f"{'resuming' if subcommand == 'fit' else 'evaluating'} from {config.ckpt_path}")
    return config.get("ckpt_path")


def checkpoint_run_settings(
    subcommand: str, ckpt_path: Path, config, run_settings: list[str]
) -> tuple[list[str], dict | None]:
    """Flags that give a run from a checkpoint the settings of the run that saved it: its ``config.yaml`` (or a run's
    given with --config: ``run_settings``, its ``config_flags``) decides the model and the data the weights were
    trained with, where no --config is given (``config``: parsed); and that ``config.yaml``, read, where it decides
    them. An evaluation also writes its logs and predictions into that run's folder."""
    run_dir, settings, trained = ckpt_path.parent.parent, list(run_settings), None
    logger = config.trainer.logger
    if not config.get("config"):  # a run's given with --config is one too
        if (run_dir / "config.yaml").is_file():
            trained = read_run_config(run_dir / "config.yaml")
            settings = config_flags(subcommand, [run_dir / "config.yaml"])
            logger = (trained.get("trainer") or {}).get("logger")
        else:
            report(f"warning: no config.yaml in {run_dir}: the model and data come from the flags alone")
    if subcommand == "fit" or ckpt_path.parent.name != "checkpoints":
        return settings, trained
    # An evaluation's logs beside the training's (runs/lightning_logs/version_3/validate/version_0/metrics.csv), not
    # in a new, mostly empty version_4.
    class_path = logger.get("class_path", "") if isinstance(logger, dict) else getattr(logger, "class_path", "")
    if str(class_path).rpartition(".")[2] in ("CSVLogger", "TensorBoardLogger", "CSVAndTensorBoardLogger"):
        settings += ["--trainer.logger.init_args.save_dir", str(run_dir), "--trainer.logger.init_args.name", subcommand]
        settings += ["--trainer.logger.init_args.version", "null"]  # the next free one, not the training's
    if subcommand == "predict":
        settings += ["--predictions.path", str(run_dir / "predictions.csv")]
    return settings, trained


def run_config_of_checkpoint(given: str | None) -> list[str]:
    """``--config`` and the ``config.yaml`` of the run that saved the checkpoint ``given`` (``last``: the newest
    run's), for a command line with no model of its own (``GenericCLI``); empty where there is none."""
    if given is None or given.strip().lower() in ("null", "none", "~"):
        return []
    try:
        checkpoint = latest_checkpoint(_runs_root(None), report=lambda line: None) if given == "last" else Path(given)
        config = checkpoint.parent.parent / "config.yaml"
        if checkpoint.parent.name == "checkpoints" and config.is_file():
            return ["--config", str(config)]  # a run's: checked as one (trust.check_command_line)
    except (OSError, ValueError, UserError):  # said in its place, when the checkpoint itself is read
        pass
    return []


def config_flags(subcommand: str | None, paths: list[Path]) -> list[str]:
    """``--config`` for each of a run's saved settings, ``paths``; for an evaluation, then the Trainer's defaults
    for its limits: a training's two validation batches are not the evaluation's, a limit given after them is."""
    flags = [flag for path in paths for flag in ("--config", str(path))]
    if flags and subcommand in EVALUATIONS:
        flags += ["--trainer.fast_dev_run", "false", "--trainer.overfit_batches", "0.0"]
        flags += [f"--trainer.{EVALUATIONS[subcommand][1]}", "null"]
    return flags


def check_evaluation(subcommand: str, config) -> None:
    """Say that an evaluation runs on part of its split: a limit given by the person (a run's own are under the
    Trainer's defaults, ``config_flags``)."""
    split, limit = EVALUATIONS[subcommand]
    applied = []
    for key in (limit, "fast_dev_run", "overfit_batches"):
        value = config.trainer.get(key)
        if value not in (None, False) and not (isinstance(value, float) and value in (0.0, 1.0)):  # 1.0 is all
            applied.append(f"--trainer.{key} {value}")
    if applied:
        report(f"{subcommand} on part of the {split} only ({', '.join(applied)}): leave it out for the whole {split}")


def warn_about_changes(trained: dict, config) -> None:
    """Say loudly where the flags given change the model or the data a checkpoint was trained with (``trained``: its
    run's config.yaml; ``config``: parsed over it)."""
    now = config.as_dict()
    for key in ("model", "data"):
        for flag, value, recorded in _changes(trained.get(key), now.get(key), f"--{key}"):
            report(f"warning: {flag} {value} differs from the {recorded!r} the checkpoint was trained with")


def _changes(recorded: Any, now: Any, flag: str) -> Iterator[tuple[str, Any, Any]]:
    """``(flag, now, recorded)`` for each value of ``recorded`` that ``now`` changes."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key in [key for key in recorded if key in now]:
            # A class's arguments are under init_args, but for --model's and --data's own (--data.batch_size).
            inner = flag if key == "class_path" or (key == "init_args" and "." not in flag) else f"{flag}.{key}"
            yield from _changes(recorded[key], now[key], inner)
        return
    now = list(now) if isinstance(now, tuple) else now  # as YAML holds it, and as the person typed it
    if recorded is not None and now != recorded:
        yield flag, now, recorded


def check_new_log_dir(trainer) -> None:
    """The folder of a run's logs can be made, and is not an earlier run's: Lightning's CSV logger would delete its
    metrics."""
    root, logger = trainer.get("default_root_dir"), trainer.get("logger")
    if root is not None:  # used: parser.check_run_arguments refuses it where the logger has a folder of its own
        check_folder_path(root, "the run's folder", "--trainer.default_root_dir")
    init_args = getattr(logger, "init_args", None) or {}
    for name in ("name", "version", "sub_dir"):
        value = init_args.get(name)
        if isinstance(value, str) and "://" in value:  # the folder's path would read as a URL of another protocol
            raise ConfigError(
                f"--trainer.logger.init_args.{name} {value!r} holds '://', which makes the run's folder a URL: give "
                f"a name of letters, digits, '-', '_' and '.' (a remote store is the save_dir's: s3://bucket/runs)"
            )
    if init_args:
        check_folder_path(_runs_root(logger), "the runs folder", "--trainer.logger.init_args.save_dir")
    version = init_args.get("version")
    if version is None:
        return
    run_dir = _runs_root(logger) / (version if isinstance(version, str) else f"version_{version}")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise ConfigError(
            f"{run_dir} holds an earlier run: choose another --trainer.logger.init_args.version, "
            "or leave it unset for a new one"
        )


def lost_run_folder(err: OSError, trainer) -> UserError | None:
    """One line for a run's failure to write into its own folder, removed or replaced while it ran; else None."""
    folder, name = trainer.log_dir, getattr(err, "filename", None)
    if folder is None or not isinstance(name, str | bytes | os.PathLike):
        return None
    path = Path(os.fsdecode(name)).absolute()
    if not path.is_relative_to(Path(folder).absolute()):
        return None
    return UserError(
        f"the run's folder {folder} cannot be written ({err.strerror or err}: {path.name}): was it removed, or "
        "replaced by a link, while the run wrote to it? Its checkpoints are where they were saved, if anywhere"
    )


def _runs_root(logger) -> Path:
    """The folder of the configured CSV or TensorBoard logger's runs (``runs/lightning_logs``)."""
    init_args = getattr(logger, "init_args", None) or {}
    return Path(init_args.get("save_dir") or "runs") / (init_args.get("name") or "lightning_logs")


@contextlib.contextmanager
def no_empty_folders_left(logger) -> Iterator[None]:
    """Run the body; if it fails (a refusal, say), remove the folders of ``logger`` that it made and left empty.

    Lightning makes a logger's run folder (``runs/lightning_logs/version_3/test/version_0``) before the data is set
    up, so a run refused then would leave it behind, empty. Removed, each only if it holds nothing (``rmdir``): that
    folder and those above it that were not there before; never a file, nor another run's (a sweep's worker's).
    """
    root = getattr(logger, "root_dir", None)
    root = Path(root) if isinstance(root, str | os.PathLike) else None
    before: set[str] = set()
    with contextlib.suppress(OSError):  # no folder yet
        before = set(os.listdir(root)) if root is not None else set()
    absent = [folder for folder in (root, *root.parents) if not folder.exists()] if root is not None else []
    try:
        yield
    except BaseException:
        # The run folder, once the logger chose its version (Lightning's CSV and TensorBoard loggers' _version).
        made = getattr(logger, "log_dir", None) if getattr(logger, "_version", None) is not None else None
        made = Path(made) if isinstance(made, str | os.PathLike) else None
        if made is not None and made.parent == root and made.name not in before and not made.is_symlink():
            for top, _, _ in os.walk(made, topdown=False):  # it and the folders in it, as far as they hold no file
                with contextlib.suppress(OSError):  # not empty: left as it is
                    os.rmdir(top)
        for folder in absent:  # root, then the folders above it, the nearest first
            with contextlib.suppress(OSError):  # not empty, or gone: left as it is
                folder.rmdir()
        raise
