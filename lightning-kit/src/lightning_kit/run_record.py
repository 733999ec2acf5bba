"""A run's status record, ``run.json`` in its folder: written by every ``fit``, read by the table of runs.

It says ``running`` (with the process, told apart from a later one given its id) until the run ends ``finished``,
``interrupted``, ``diverged`` or ``failed``; a run killed outright stays ``running``, and the table, finding its
process gone, calls it interrupted. The standard library only: the table of runs reads it without PyTorch.
"""

import json
import os
import socket
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from .files import pid_alive, written_whole
from .passwords import hidden_command, scrubbed

RUN_FILE = "run.json"
RUNNING, FINISHED, INTERRUPTED, DIVERGED, FAILED = "running", "finished", "interrupted", "diverged", "failed"
ENDINGS = (FINISHED, INTERRUPTED, DIVERGED, FAILED)


def now() -> str:
    """The local time with its offset: ``2026-12-01T11:30:10.250+01:00``."""
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def started_record(resumed_from: str | None) -> dict[str, Any]:
    """The record of a run starting now in this process."""
    return {
        "status": RUNNING,
        "started": now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process": process_token(os.getpid()),
        "command": hidden_command([sys.executable, *sys.argv]),  # a --storage URL's password is not recorded
        "cwd": os.getcwd(),
        "resumed_from": resumed_from,
    }


def ended_record(record: dict[str, Any], status: str, **details: Any) -> dict[str, Any]:
    """``record`` of a run that ends now with ``status``, and ``details`` (the error, the best checkpoint)."""
    details = {key: scrubbed(value) if isinstance(value, str) else value for key, value in details.items()}
    ended = now()
    duration = datetime.fromisoformat(ended) - datetime.fromisoformat(record["started"])
    return {**record, "status": status, "ended": ended, "duration_s": round(duration.total_seconds(), 1), **details}


def write_record(path: Path, record: dict[str, Any]) -> None:
    write_whole(path, json.dumps(record, indent=1))


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole (``files.written_whole``): the runs table reads records as runs write them."""
    with written_whole(path) as temporary, temporary.open("x") as file:
        file.write(text)


def process_token(pid: int) -> str | None:
    """What tells process ``pid`` apart from a later one given its id: the boot and its start tick (Linux only)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        # The command name (field 2) may hold spaces and parentheses: count the fields after its last ')'.
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return f"{boot}:{fields[19]}"  # field 22, the start time in clock ticks after boot
    except (OSError, IndexError):
        return None


def process_alive(record: dict[str, Any]) -> bool | None:
    """Whether the process that wrote ``record`` still runs; None when it ran on another host, which cannot be asked."""
    if record.get("host") != socket.gethostname():
        return None
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not pid_alive(pid):
        return False
    recorded = record.get("process")
    # Without a token (not Linux), a live process with that id is taken to be the run's.
    return recorded is None or process_token(pid) == recorded
