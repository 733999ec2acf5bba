"""``python -m lightning_kit.runs [FOLDER]``, ``... --sort=-val/acc``, ``... --status finished --markdown runs.md``.

It reads run folders as data (``folders``), whichever project wrote them, and imports no PyTorch.
"""

import argparse
import os
import sys
from pathlib import Path

from ..errors import OneLineParser, UserError, command, first_line, invoked_as
from ..files import check_output_file
from ..installation import check_installation
from ..run_record import ENDINGS, RUNNING, write_whole
from .folders import UNKNOWN, UNREADABLE, find_folders, link_resumed, read_run
from .sweeps import summary
from .table import FORMATS, Table, printable

STATUSES = (RUNNING, *ENDINGS, UNKNOWN, UNREADABLE)
OUTPUTS = ("csv", "markdown")


@command
def main(args: list[str] | None = None, prog: str | None = None) -> None:
    """List the runs ``args`` ask for (default: ``sys.argv[1:]``); ``prog`` names the command."""
    check_installation()
    parser = OneLineParser(
        prog=prog or invoked_as("python -m lightning_kit.runs"),
        description="List the runs below FOLDER: status, the settings that differ, best and test metrics, checkpoint.",
    )
    parser.add_argument("folder", nargs="?", default="runs", metavar="FOLDER", help="where to look (default: runs)")
    parser.add_argument("--sort", metavar="COLUMN", help="order by this column (-COLUMN or --desc: largest first)")
    parser.add_argument("--desc", action="store_true", help="sort in descending order")
    parser.add_argument("--status", action="append", choices=STATUSES, help="only runs with this status (repeatable)")
    parser.add_argument("--format", choices=tuple(FORMATS), default="table", help="what to print (default: table)")
    parser.add_argument("--csv", metavar="PATH", help="also write the table to this CSV file")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table to this Markdown file")
    parser.add_argument("--overwrite", action="store_true", help="replace files that --csv and --markdown name")
    options = parser.parse_args(_sort_values(sys.argv[1:] if args is None else list(args)))
    try:
        _list(options)
    except UserError as err:
        parser.exit(1, f"error: {err}\n")


def _list(options: argparse.Namespace) -> None:
    root = Path(options.folder)
    if not root.is_dir():
        problem = "is not a folder" if root.exists() else "does not exist"
        raise UserError(f"FOLDER {root} {problem}: give the folder of your runs (by default runs/)")
    outputs = {name: getattr(options, name) for name in OUTPUTS if getattr(options, name) is not None}
    for name, path in outputs.items():
        check_output_file(path, f"--{name}", overwrite=options.overwrite, overwrite_flag="--overwrite")
    if len({os.path.abspath(path) for path in outputs.values()}) < len(outputs):
        raise UserError(f"{' and '.join(f'--{name}' for name in outputs)} name the same file: give each its own")
    runs, sweep_folders, notes = find_folders(root)
    for run in runs:
        read_run(run, root)
    link_resumed(runs)
    below = "".join(f"{printable(line)}\n" for folder in sweep_folders for line in summary(folder, root, runs))
    if options.status:
        runs = [run for run in runs if run.status in options.status]
    if not runs:
        which = f" with status {' or '.join(options.status)}" if options.status else ""
        raise UserError(f"no runs{which} below {root} (a run folder holds config.yaml, and metrics.csv or run.json)")
    table = Table(runs)
    sort = options.sort
    if sort:
        table.sort(sort.removeprefix("-") if sort not in table.columns else sort, options.desc or sort.startswith("-"))

    def rendered(form: str) -> str:  # a CSV file holds the table alone
        return FORMATS[form](table) + (f"\n{below}" if below and form != "csv" else "")

    sys.stdout.write(rendered(options.format))
    for note in notes:
        sys.stderr.write(f"note: {printable(note)}\n")
    for name, path in outputs.items():
        try:  # beside it, then renamed into place (a link there is replaced, not written through)
            write_whole(Path(path), rendered(name))
        except OSError as err:
            raise UserError(f"{path} cannot be written ({first_line(err)}): give a file in a folder with room") from err
        sys.stderr.write(f"written: {printable(path)}\n")


def _sort_values(args: list[str]) -> list[str]:
    """``--sort -val/loss`` as ``--sort=-val/loss``: argparse would take ``-val/loss`` for an option."""
    joined: list[str] = []
    for arg in args:
        if joined and joined[-1] == "--sort" and arg.startswith("-"):
            joined[-1] = f"--sort={arg}"
        else:
            joined.append(arg)
    return joined
