"""The command line every benchmark shares: defaults, --quick, explicit options, errors."""
from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

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


def help_lines() -> dict[str, str]:
    """``python -m bench --help``'s commands: name -> what it measures."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split("commands:\n", 1)[1].splitlines()
    return dict(line.strip().split(None, 1) for line in listed if line.strip())


def test_help_lists_every_command_with_what_it_measures():
    from bench.__main__ import COMMANDS
    lines = help_lines()
    assert list(lines) == list(COMMANDS) and len(lines) >= 8   # autoreset dropped on 2026-11-26
    for name, what in lines.items():
        assert len(what.split()) >= 6, (name, what)    # a sentence, not a bare name
        assert importlib.util.find_spec(COMMANDS[name][0]) is not None, name   # and it exists


def test_docs_list_the_same_commands_as_the_cli():
    root = Path(__file__).resolve().parents[2]
    documented = re.findall(r"^\| `python -m bench[ .](\S+?)[` ]", (root / "docs/benchmarks.md").read_text(), re.M)
    howto = re.findall(r"^\| `python -m bench[ .](\S+?)[` ]", (root / "bench/README.md").read_text(), re.M)
    cli_names = {name.replace("-", "_") for name in help_lines()}
    assert {d.replace("-", "_") for d in documented} == cli_names
    assert {d.replace("-", "_") for d in howto} == cli_names


def test_unknown_command_is_named(capsys):
    proc = subprocess.run([sys.executable, "-m", "bench", "poolvec"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown command 'poolvec'" in proc.stderr and "throughput" in proc.stderr


@pytest.mark.slow   # runs every quoted bench command's --help in a subprocess: ~40 s on 2 loaded cores
def test_every_command_the_docs_quote_exists_with_its_options():
    root = Path(__file__).resolve().parents[2]
    texts = [p.read_text() for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]]
    quoted = {m.strip() for t in texts for m in re.findall(r"python -m bench[ .][^`\"\n]*", t)}
    checked = 0
    for line in sorted(quoted):
        words = line.split()   # python -m bench.core ... / python -m bench <command> ...
        name = words[2][len("bench."):] if words[2].startswith("bench.") else words[3]
        if name == "--help":
            continue
        options = [w.split("=")[0] for w in words if w.startswith("--")]
        proc = subprocess.run([sys.executable, "-m", "bench", name.replace("_", "-"), "--help"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (line, proc.stderr)
        for option in options:
            assert option in proc.stdout, (line, option)
        checked += 1
    assert checked >= 10


def test_choice_list(capsys):
    p = parser()
    assert cli.choice_list(p, "--modes", "sync, async,sync", ("async", "sync")) == ["sync", "async"]
    for text in ("sync,fast", ""):
        with pytest.raises(SystemExit):
            cli.choice_list(p, "--modes", text, ("async", "sync"))
        assert f"--modes takes 'async' and/or 'sync', not {text!r}" in capsys.readouterr().err
