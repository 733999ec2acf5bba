"""The placement guide that ships with the library: ``python -m lightning_kit.guide [RULE] [--path]``.

    python -m lightning_kit.guide          # the whole guide, as Markdown
    python -m lightning_kit.guide 13       # rule 13
    python -m lightning_kit.guide 2-9      # rules 2 to 9 (the audit's fixes cite them so)
    python -m lightning_kit.guide --path   # where the file is, to open it in an editor or a Markdown viewer

The audit's fixes and the placement linter name its rules by number. The standard library only.
"""

import re
import sys
from importlib import resources

from .errors import OneLineParser, command

FILE = "device-placement.md"
COMMAND = "python -m lightning_kit.guide"
_RULE = re.compile(r"## (\d+)\. ")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def text() -> str:
    """The guide, as Markdown."""
    return resources.files(__package__).joinpath(FILE).read_text(encoding="utf-8")


def rules(first: int, last: int | None = None) -> str:
    """Rules ``first`` to ``last`` (or ``first`` alone) of the guide; ValueError for a reversed range or a rule not
    there (naming the rules there are)."""
    # A rule runs to the next heading of its level: the next rule's, or the section after the rules.
    sections = re.split(r"(?m)^(?=## )", text())
    numbered = {int(found[1]): section.rstrip() for section in sections if (found := _RULE.match(section))}
    last, there = first if last is None else last, f"the guide has rules 1 to {max(numbered)}"
    if last < first:
        raise ValueError(f"the range is reversed: give {last}-{first}; {there}")
    if first not in numbered or last not in numbered:
        raise ValueError(there)
    return "\n\n".join(section for number, section in numbered.items() if first <= number <= last) + "\n"


def cite(rules_cited: str) -> str:
    """How a message cites rules (``"2 to 9"``, ``"15"``): where to read them."""
    numbers = re.findall(r"\d+", rules_cited)
    shown = f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else (numbers[0] if numbers else "")
    return f"{COMMAND} {shown}".rstrip()


@command
def main(args: list[str] | None = None) -> None:
    parser = OneLineParser(prog=COMMAND, description="Print lightning-kit's device placement guide.")
    parser.add_argument("rule", nargs="?", help="a rule's number, or a range such as 2-9 (default: the whole guide)")
    parser.add_argument("--path", action="store_true", help="print where the guide's file is, instead of the guide")
    options = parser.parse_args(args)
    if options.path:
        print(resources.files(__package__).joinpath(FILE))
    elif options.rule is None:
        sys.stdout.write(text())
    elif (found := _RANGE.fullmatch(options.rule.strip())) is None:
        parser.error(f"{options.rule!r} is not a rule: give its number (13) or a range (2-9)")
    else:
        try:
            sys.stdout.write(rules(int(found[1]), int(found[2]) if found[2] else None))
        except ValueError as err:
            parser.error(f"rule {options.rule}: {err}")


if __name__ == "__main__":
    main()
