"""The CLI in a subprocess: exit codes, and an empty stderr on success."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from harness.cli import main
from tests.conftest import DATA, REPO, run_cli

VALID = str(DATA / "cards" / "valid.yaml")


def test_validate_ok_has_empty_stderr() -> None:
    result = run_cli("validate", VALID)
    assert result.code == 0, result.stderr
    assert result.stderr == ""
    assert "ok:" in result.stdout


def test_validate_bad_card_exits_2_without_traceback() -> None:
    result = run_cli("validate", str(DATA / "cards" / "invalid" / "unknown-key.yaml"))
    assert result.code == 2
    assert "Traceback" not in result.stderr
    assert "unknown-key.yaml:9: cells.b.evn: unknown key; did you mean `env`?" in result.stderr


def test_validate_reports_every_bad_card_and_still_checks_good_ones() -> None:
    bad = str(DATA / "cards" / "invalid" / "zero-cycles.yaml")
    worse = str(DATA / "cards" / "invalid" / "unknown-gate.yaml")
    result = run_cli("validate", bad, VALID, worse)
    assert result.code == 2
    assert "zero-cycles.yaml:8" in result.stderr and "unknown-gate.yaml:8" in result.stderr
    assert "ok:" in result.stdout


def test_debug_shows_a_traceback() -> None:
    result = run_cli("--debug", "validate", str(DATA / "cards" / "invalid" / "tabs.yaml"))
    assert result.code == 2
    assert "Traceback" in result.stderr


def test_plan_json_lists_runs_in_execution_order() -> None:
    result = run_cli("plan", VALID, "--json")
    assert result.code == 0 and result.stderr == ""
    runs = json.loads(result.stdout)["runs"]
    assert len(runs) == 48
    keys = {"run_id", "cell", "cycle", "slot", "repeat", "cache_state", "box"}
    assert keys <= set(runs[0])
    first_cycle = [r["cell"] for r in runs if r["cycle"] == 0 and r["repeat"] == 0]
    assert first_cycle[:4] == ["control", "fitted", "fitted", "control"]


def test_plan_table_shows_estimate() -> None:
    result = run_cli("plan", VALID)
    assert result.code == 0 and result.stderr == ""
    assert "estimated:" in result.stdout


def test_usage_error_exits_2() -> None:
    result = run_cli("no-such-verb")
    assert result.code == 2


def test_unknown_benchmark_is_bad_input() -> None:
    result = run_cli("bench", "no-such-bench")
    assert result.code == 2
    assert "unknown benchmark" in result.stderr


def test_cycles_without_resume_is_bad_input() -> None:
    result = run_cli("run", VALID, "--cycles", "4")
    assert result.code == 2
    assert result.stderr.strip() == (
        "--cycles extends a campaign: give it with --resume DIR "
        "(for a new campaign, set design.cycles on the card)"
    )


def test_the_cli_starts_without_the_heavy_stages() -> None:
    # Every verb registers without importing its stage, so `harness --help` and `--version`
    # (which a campaign runs on each box) load no numerics, tables or plots, and `validate` no
    # compiler, tables or plots (numpy reads a card's rowmap); neither imports asyncio (only
    # a drive's signal handling needs it).
    heavy = ("asyncio", "numpy", "numba", "pandas", "pyarrow", "scipy", "matplotlib", "jinja2")
    probe = (
        "import io, sys, harness.cli\n"
        f"heavy = {heavy!r}\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
        "code = harness.cli.main(sys.argv[1:], out=io.StringIO())\n"
        "print(code, ','.join(m for m in heavy if m in sys.modules and m != 'numpy'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "validate", VALID],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert done.stdout.splitlines() == ["", "0 "], done.stdout + done.stderr


def test_a_named_verb_imports_only_its_own_registration() -> None:
    # The router's table names each module's verbs: every one registers exactly those.
    import argparse
    import importlib

    from harness.cli import VERBS, build_parser

    for module, names in VERBS:
        verbs = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(verbs)
        assert tuple(verbs.choices) == names, module
    assert set(build_parser().parse_args(["validate", VALID]).__dict__) >= {"cards", "handler"}
    probe = (
        "import io, sys, harness.cli\n"
        "harness.cli.main(sys.argv[1:], out=io.StringIO())\n"
        "print(sorted(m for m in sys.modules if m.endswith('.commands')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "--debug", "validate", VALID],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert done.stdout.strip() == "['harness.plan.commands']", done.stdout + done.stderr


def test_the_terminal_counts_comparisons_and_says_when_none_was_decided() -> None:
    from harness.report.terminal import label_tally

    assert label_tally([], True) == ""
    text = label_tally(["inconclusive", "inconclusive"], True)
    assert "2 inconclusive (more cycles would decide)" in text
    assert "no comparison was decided" in text
    mixed = label_tally(["better", "worse", "carry-over"], False)
    assert "1 better, 1 worse" in mixed and "1 flagged" in mixed
    assert "no comparison was decided" not in mixed


def test_an_unexpected_error_is_an_internal_error_exit_3_never_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Output to a file object already closed: a ValueError that no reader or writer of ours
    # turns into a HarnessError. Python's own exit for it is 1, "the gate failed" to a CI; the
    # router says it is a harness bug, not a verdict, and exits 3 (--debug adds the traceback).
    closed = io.StringIO()
    closed.close()
    assert main(["validate", VALID], out=closed) == 3
    err = capsys.readouterr().err
    assert "internal error: ValueError" in err and "not a verdict" in err
    assert "Traceback" not in err
    assert main(["--debug", "validate", VALID], out=closed) == 3
    assert "Traceback" in capsys.readouterr().err


def test_every_positional_says_what_it_takes_and_gate_lists_its_exit_codes() -> None:
    import argparse

    from harness.cli import build_parser

    def parsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
        found = [(parser.prog, parser)]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    found += parsers(child)
        return found

    silent = [
        f"{prog} {action.metavar or action.dest}"
        for prog, parser in parsers(build_parser())
        for action in parser._actions
        if not action.option_strings and not action.help
    ]
    assert silent == []
    gate = run_cli("gate", "--help")
    assert gate.code == 0
    text = " ".join(gate.stdout.split())
    for code in ("0 pass", "1 a gate failed or is undecided", "2 bad input", "3 runs incomplete"):
        assert code in text, code
