"""The audit's benchmark (``benchmarks/audit_cost.py``, the maintainers' script, not installed): every model of the
zoo passes the audit, and the table says each model's cost against a plain CPU run of the audit's schedule. It asserts
no timings: those belong in its report."""

import re
import sys
from pathlib import Path

import pytest
import torch

from lightning_kit.errors import UserError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import audit_cost as audit_bench
import zoo

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")
# The zoo's models without a package beside PyTorch, and those whose package is installed here.
INSTALLED = [name for name in zoo.ZOO if zoo.missing_package(name) is None]


@pytest.mark.parametrize("name", ["function", "script", "mobilenet_v3", "bert"])
def test_a_zoo_model_passes_the_audit(name):
    """One model of each kind the others are built like (plain PyTorch, torchvision, transformers); the benchmark's
    own runs check the rest (measure refuses an audit that does not pass, and the plain run of the test below)."""
    if name not in INSTALLED:
        pytest.skip(f"{zoo.ZOO[name].package} is not installed (pip install torchvision transformers)")
    measured = audit_bench.measure(name, "audit")
    assert measured["seconds"] > 0 and measured["peak_kib"] >= measured["added_kib"] >= 0, measured
    assert measured["operations"] > 100, measured  # an audit's simulated operations: every step of every stage


def test_the_benchmark_prints_each_models_ratio_operations_and_memory(capsys):
    """The command as a user types it, on the cheapest model: a plain run and an audit, each a process."""
    audit_bench.main(["function", "--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:5] == ["model", "kind", "plain", "s", "audit"], lines
    row = re.match(
        r"function\s+CNN with a custom autograd.Function\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d,]+)"
        r"\s+(\d+) / (\d+)\s+([\d.]+)x\s+(\d+) / (\d+)$",
        lines[1],
    )
    assert row is not None, lines
    plain, audit, ratio, operations, *memory = row.groups()
    # The ratio is of the unrounded times; each time is printed to 0.005 s, and the ratio to 0.005.
    shown = float(audit) / float(plain)
    rounding = 0.005 + shown * (0.005 / float(audit) + 0.005 / float(plain))
    assert float(ratio) == pytest.approx(shown, abs=rounding), lines
    assert int(operations.replace(",", "")) > 100 and all(int(mib) > 0 for mib in memory[:2]), lines


@pytest.mark.parametrize(
    "arguments, said",
    [
        (["resnet"], "argument MODEL: invalid choice: 'resnet' (choose from 'resnet18',"),
        (["t5", "--repeats", "0"], "--repeats: expected a positive number of runs, got 0"),
        (["t5", "--repeats", "-2"], "--repeats: expected a positive number of runs, got -2"),
        (["t5", "--trainer.max_epochs", "3"], "unrecognized arguments: --trainer.max_epochs 3"),
    ],
)
def test_a_wrong_audit_benchmark_argument_is_one_line(capsys, arguments, said):
    with pytest.raises(SystemExit) as stop:
        audit_bench.main(arguments)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_a_model_whose_package_is_missing_is_left_out_with_a_note(monkeypatch, capsys):
    entry = zoo.ZOO["bert"]
    monkeypatch.setitem(zoo.ZOO, "bert", zoo.Entry(entry.kind, entry.build, entry.task, "no_such_zoo_package"))
    assert audit_bench.selected(["bert", "function"]) == ["function"]
    assert "note: bert left out: it needs no_such_zoo_package" in capsys.readouterr().out
    with pytest.raises(UserError, match="none of the models asked for can be built here"):
        audit_bench.selected(["bert"])
    with pytest.raises(UserError, match="bert needs no_such_zoo_package, which is not installed"):
        zoo.build("bert")


def test_each_zoo_model_is_built_with_the_same_weights_in_every_process():
    first, _ = zoo.build("script")
    second, _ = zoo.build("script")
    weights = zip(first.state_dict().values(), second.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in weights)
