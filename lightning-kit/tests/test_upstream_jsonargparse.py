"""jsonargparse's wording that the library reads (``lightning_kit.upstream.jsonargparse``), held against what the
installed jsonargparse says of real bad command lines: a release that words them otherwise fails here, not in a
person's terminal as a nest of alternatives."""

import enum
import re
from pathlib import Path

import jsonargparse
import pytest
from jsonargparse import ArgumentParser
from jsonargparse.typing import OpenUnitInterval, PositiveInt
from lightning import LightningDataModule

from lightning_kit.arguments import BatchSize, PositiveFloat32
from lightning_kit.parser import KitArgumentParser, one_line
from lightning_kit.upstream import jsonargparse as said


class Net:
    def __init__(self, width: PositiveInt = 8) -> None:
        self.width = width


class Data(LightningDataModule):
    def __init__(self, batch_size: PositiveInt = 64, share: OpenUnitInterval | None = None, net: Net | None = None):
        super().__init__()


def refusal(args: list[str], required: bool = False) -> str:
    """What the installed jsonargparse says of ``args`` given to a parser of a data module, as LightningCLI's is."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data", required=required)
    with pytest.raises(jsonargparse.ArgumentError) as refused:
        parser.parse_args(args)
    return str(refused.value)


BATCH_SIZE_0 = ["--data", f"{__name__}.Data", "--data.batch_size", "0"]
SHARE_1 = ["--data", f"{__name__}.Data", "--data.share", "1"]
WIDTH_0 = ["--data", f"{__name__}.Data", "--data.net", f"{__name__}.Net", "--data.net.width", "0"]

# Each pattern: a command line whose message it matches, and what it finds there.
MATCHES = {
    "HEADINGS": (WIDTH_0, ["data", None, "net", None, "width"]),
    "NOISE": (SHARE_1, "Does not validate against"),
    "RESTRICTION": (BATCH_SIZE_0, "v>0"),
    "NULL_ALTERNATIVE": (SHARE_1, "<class 'NoneType'>"),
    "GIVEN_VALUE": (SHARE_1, "1"),
}


def test_every_pattern_is_held_against_a_real_message():
    patterns = {name for name, value in vars(said).items() if isinstance(value, re.Pattern)}
    assert set(MATCHES) | {"REQUIRED"} == patterns


@pytest.mark.parametrize("name", sorted(MATCHES))
def test_each_pattern_matches_what_the_installed_jsonargparse_says(name):
    args, expected = MATCHES[name]
    message = refusal(args)
    pattern = getattr(said, name)
    if name == "HEADINGS":
        assert [found["key"] for found in pattern.finditer(message)] == expected, message
    else:
        found = pattern.search(message)
        assert found is not None and expected in found[found.lastindex or 0], message


def test_the_required_pattern_matches_argparses_message():
    message = refusal([], required=True)
    found = said.REQUIRED.match(message.strip())
    assert found is not None and found[1] == "data", message  # parser.KitArgumentParser.error reads the names


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (BATCH_SIZE_0, "--data.batch_size must be v>0, got 0"),
        (SHARE_1, "--data.share must be v>0 and v<1 or null, got 1"),
        (WIDTH_0, "--data.net.init_args.width must be v>0, got 0"),
    ],
)
def test_a_value_out_of_its_types_bounds_is_one_line_naming_its_flag(args, line):
    """The patterns together: the flag (with init_args for a class inside --data), what is accepted, the value."""
    assert one_line(refusal(args)) == line


def test_the_known_versions_start_at_the_lowest_declared():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'"jsonargparse\[signatures\]>=([\d.]+)"', pyproject)
    assert declared is not None and declared[1] == said.KNOWN_VERSIONS[0], declared


def test_only_jsonargparse_bounded_numbers_are_made_plain():
    """What the parser turns back into a plain int or float: jsonargparse's bounded types, not a user's own ints."""

    class Mode(enum.IntEnum):
        FAST = 1

    assert said.is_bounded_number(BatchSize(8)) and said.is_bounded_number(PositiveFloat32(0.1))
    assert said.is_bounded_number(PositiveInt(3))
    assert not any(said.is_bounded_number(value) for value in (8, 0.1, True, Mode.FAST, "8"))


class Other(LightningDataModule):
    def __init__(self, batch_size: PositiveInt = 4) -> None:
        super().__init__()


@pytest.mark.parametrize("by_path_alone", [True, False])
def test_a_class_chosen_in_place_of_a_default_class_takes_its_own_defaults(by_path_alone):
    """jsonargparse keeps a default class's values for the arguments a class chosen in its place also takes: with
    the default named by its path alone (``KitArgumentParser.class_defaults``), the chosen class's are filled in."""
    parser = KitArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data")
    parser.set_defaults({"data": {"class_path": f"{__name__}.Data"}})
    parser.class_defaults = ("data",) if by_path_alone else ()
    assert parser.parse_args([]).data.init_args.batch_size == 64
    chosen = parser.parse_args(["--data", f"{__name__}.Other"]).data
    assert (chosen.class_path, chosen.init_args.batch_size) == (f"{__name__}.Other", 4 if by_path_alone else 64)
