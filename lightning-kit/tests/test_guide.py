"""The placement guide ships with the library: ``python -m lightning_kit.guide`` prints it, or a rule, or its path;
every rule the audit's fixes and the linter cite is in it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S

from lightning_kit import guide, lint_placement
from lightning_kit.gpu_audit import explain


def test_the_guide_is_installed_with_the_library_and_numbers_its_rules_from_1():
    text = guide.text()
    assert text.startswith("# Device placement")
    numbers = [int(number) for number in re.findall(r"^## (\d+)\. ", text, flags=re.MULTILINE)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 19, numbers
    assert "{{" not in text and "{%" not in text and "docs/device-placement.md" not in text


@pytest.mark.parametrize(("asked", "first", "last"), [("13", 13, 13), ("2-9", 2, 9), ("19", 19, 19), ("1-1", 1, 1)])
def test_a_rule_or_a_range_prints_those_rules_whole_and_no_others(asked, first, last, capsys):
    guide.main([asked])
    out = capsys.readouterr().out
    assert [int(n) for n in re.findall(r"^## (\d+)\. ", out, flags=re.MULTILINE)] == list(range(first, last + 1))
    assert "## The audit" not in out  # the last rule ends where the next section starts


@pytest.mark.parametrize(
    ("asked", "said"),
    [
        ("40", "rules 1 to 23"),
        ("1-999", "rules 1 to 23"),
        ("0-5", "rules 1 to 23"),
        ("3-1", "the range is reversed: give 1-3"),
        ("x", "not a rule"),
        ("3-", "not a rule"),
    ],
)
def test_a_rule_that_is_not_there_is_one_line_and_exit_status_2(asked, said, capsys):
    with pytest.raises(SystemExit) as stop:
        guide.main([asked])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith("error: ") and said in err and "\n" not in err, err


def test_the_path_is_the_file_the_guide_is_read_from(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "lightning_kit.guide", "--path"],
        capture_output=True, text=True, cwd=tmp_path, timeout=HANG_GUARD_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_text(encoding="utf-8") == guide.text()


def test_every_rule_a_fix_cites_is_in_the_guide():
    """The audit's fixes and the linter's name rules by number, with the command that prints them."""
    cited = [rules for _, rules in explain.FIXES.values()]
    cited += [fix for fix in lint_placement.FIXES.values()]
    numbers = {int(n) for text in cited for n in re.findall(r"\d+", text.split("guide")[-1])}
    present = {int(n) for n in re.findall(r"^## (\d+)\. ", guide.text(), flags=re.MULTILINE)}
    assert numbers and numbers <= present, numbers - present
