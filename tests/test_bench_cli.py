"""The command line every benchmark shares: defaults, --quick, explicit options, errors."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from bench import cli


def parser(json: str | None = None) -> argparse.ArgumentParser:
    p = cli.parser("python -m bench demo", "First paragraph.\n\nThe rest: how to read it.")
    p.add_argument("--num-envs")
    cli.add_run_options(p, cli.RunDefaults(seconds=(4.0, 0.5), warmup=(1.0, 0.0), json=json), quick="tiny")
    return p


def test_normal_and_quick_defaults_and_explicit_options_win():
    normal = cli.parse(parser(), [])
    assert (normal.seconds, normal.warmup, normal.repeats) == (4.0, 1.0, 3)
    quick = cli.parse(parser(), ["--quick"])
    assert (quick.seconds, quick.warmup, quick.repeats) == (0.5, 0.0, 1)
    explicit = cli.parse(parser(), ["--quick", "--seconds", "2", "--repeats", "5"])
    assert (explicit.seconds, explicit.repeats) == (2.0, 5)
    assert explicit.command == "python -m bench demo --quick --seconds 2 --repeats 5"
    assert not hasattr(explicit, "run_defaults")


def test_the_tracked_results_file_is_written_only_with_save():
    # A user's run leaves the checkout clean (issue 33); --save writes what the docs quote.
    assert cli.parse(parser("out.json"), []).json is None
    assert cli.parse(parser("out.json"), ["--save"]).json == "out.json"
    assert cli.parse(parser("out.json"), ["--quick", "--save"]).json is None
    assert cli.parse(parser("out.json"), ["--quick"]).json is None
    assert cli.parse(parser("out.json"), ["--quick", "--json", "x.json"]).json == "x.json"
    assert cli.parse(parser(), []).json is None


@pytest.mark.parametrize("argv, message", [
    (["--seconds", "0"], "--seconds must be > 0"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_bad_run_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse(parser(), argv)
    assert message in capsys.readouterr().err


def test_positive_ints(capsys):
    p = parser()
    assert cli.positive_ints(p, "--num-envs", "8, 32,8") == [8, 32]
    for text, message in (("8,x", "must be a comma list of integers"), ("0,8", "of positive integers")):
        with pytest.raises(SystemExit):
            cli.positive_ints(p, "--num-envs", text)
        assert message in capsys.readouterr().err


def test_help_says_what_is_measured(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "First paragraph." in out and "The rest: how to read it." in out
    assert "(default 4, --quick 0.5)" in out


def test_entry_point_lists_every_command():
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for command in ("core", "train", "fairness", "tasks", "throughput", "latency"):
        assert command in proc.stdout
