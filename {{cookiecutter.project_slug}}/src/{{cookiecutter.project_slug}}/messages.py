"""What the person at the command line is told: a mistake of theirs as one line, never a traceback."""

import re
import sys

# Lines of jsonargparse's nested messages that say nothing about the mistake.
_NOISE = re.compile(r"Does not validate against|Subtypes:|Errors:|Expected a <class 'NoneType'>|Given value")


def one_line(message: str) -> str:
    """``Parser key "model.net": ... Parser key "width": Expected a <class 'int'>. Got value: x`` as one line."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    text = re.sub(r"""Parser key "[^"]+":|Problem with given class_path '[^']+':""", "", message)
    reasons = [line.strip(" -") for line in text.splitlines() if line.strip(" -") and not _NOISE.search(line)]
    reason = " ".join(reasons) or message.strip()
    return f"--{'.'.join(keys)}: {reason}" if keys else reason


def report(line: str) -> None:
    """Print ``line`` with one write: lines from DDP processes sharing a log (or a SLURM output file) never split."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()
