"""The command line every benchmark shares: the run options declared once, parsed and checked once.

    p = cli.parser("python -m bench core", __doc__)
    p.add_argument("--tasks", ...)                     # the benchmark's own options
    cli.add_run_options(p, cli.RunDefaults(), quick="CartPole-v1 N=8, 0.2 s, 1 repeat")
    args = cli.parse(p, argv)                          # args.command, defaults filled, values checked

Every option left unset takes its normal default, or its ``--quick`` one; an option
given explicitly always wins over ``--quick``.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunDefaults:
    """Defaults as ``(normal, --quick)`` pairs; ``repeats=None``: the command has no repetitions.

    ``json``: the tracked results file ``--save`` writes (never with ``--quick``); without ``--save``
    or ``--json`` a run writes nothing, so a user's run leaves the checkout as it was."""

    seconds: tuple[float, float] = (2.0, 0.2)
    warmup: tuple[float, float] = (0.3, 0.1)
    repeats: tuple[int, int] | None = (3, 1)
    json: str | None = None


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser for a benchmark module: ``--help`` shows the options between the first paragraph
    of ``doc`` (the module docstring) and the rest of it (what is measured, how to read it)."""
    first, _, rest = (doc or "").strip().partition("\n\n")
    return argparse.ArgumentParser(prog=prog, description=first, epilog=rest or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_run_options(p: argparse.ArgumentParser, defaults: RunDefaults, *, quick: str,
                    seconds_help: str = "timed seconds per repetition") -> None:
    """Declare ``--seconds --warmup [--repeats] --json --quick``; ``quick`` says what ``--quick`` runs."""
    p.set_defaults(run_defaults=defaults)
    s, w = defaults.seconds, defaults.warmup
    p.add_argument("--seconds", type=float, help=f"{seconds_help} (default {s[0]:g}, --quick {s[1]:g})")
    p.add_argument("--warmup", type=float, help=f"untimed seconds before each repetition (default {w[0]:g}, "
                                                f"--quick {w[1]:g})")
    if defaults.repeats is not None:
        r = defaults.repeats
        p.add_argument("--repeats", type=int, help=f"interleaved repetitions per cell (default {r[0]}, --quick {r[1]})")
    p.add_argument("--json", metavar="PATH", help="write every raw measurement and the configuration here, the "
                                                  "report beside it (.md)")
    if defaults.json:
        p.add_argument("--save", action="store_true",
                       help=f"write them to the tracked results file {defaults.json} (what the docs quote)")
    p.add_argument("--quick", action="store_true", help=f"tiny run for tests: {quick} (explicit options still win)")


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None,
          **more_defaults: tuple[Any, Any]) -> argparse.Namespace:
    """Parse, record the command (``args.command``), fill every unset run option (and ``more_defaults``,
    more ``name=(normal, quick)`` pairs) and check the run options' values."""
    args = p.parse_args(argv)
    defaults: RunDefaults = args.run_defaults
    del args.run_defaults
    args.command = " ".join([p.prog, *(sys.argv[1:] if argv is None else argv)])
    pairs = {"seconds": defaults.seconds, "warmup": defaults.warmup, **more_defaults}
    if defaults.repeats is not None:
        pairs["repeats"] = defaults.repeats
    for name, (normal, quick) in pairs.items():   # explicit options always win over --quick
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else normal)
    if args.seconds <= 0:
        p.error(f"--seconds must be > 0, got {args.seconds:g}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup:g}")
    if defaults.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.json is None and not args.quick and getattr(args, "save", False):
        args.json = defaults.json
    return args


def comma_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [t.strip() for t in text.split(",") if t.strip()]


def choice_list(p: argparse.ArgumentParser, option: str, text: str, allowed: Sequence[str]) -> list[str]:
    """A non-empty comma list of names out of ``allowed``, duplicates dropped (first kept); a usage error
    otherwise."""
    values = list(dict.fromkeys(comma_list(text)))
    if not values or not set(values) <= set(allowed):
        names = [repr(a) for a in allowed]
        p.error(f"{option} takes {', '.join(names[:-1])} and/or {names[-1]}, not {text!r}")
    return values


def positive_ints(p: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """A comma list of positive integers, duplicates dropped (first kept); a usage error otherwise."""
    try:
        values = [int(t) for t in comma_list(text)]
    except ValueError:
        p.error(f"{option} must be a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        p.error(f"{option} must be a comma list of positive integers, got {text!r}")
    return list(dict.fromkeys(values))
