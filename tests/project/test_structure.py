"""The shape of the code, checked as a maintainer would read it (issue "one room per job"):
no import circle between the files of ``shmpool/`` and ``workers/`` (imports under
TYPE_CHECKING and inside functions count), no reach into another object's underscored
attributes beyond the few named below; the rooms past a size guide are reported, never failed."""
from __future__ import annotations

import ast
import graphlib
import pathlib
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The reads of another object's underscored names that stay, and why.
ALLOWED_REACH_INS = {
    # namedtuple's public API is spelled with an underscore
    ("shmpool/envpool_env.py", "self.config._asdict"),
    # the standard library's exit without cleanup (a worker must not run the trainer's atexit)
    ("workers/loop.py", "os._exit"),
    ("workers/forks.py", "os._exit"),   # a child an env forked, ending before it acts as the worker
    # a subclass calling its base class's hook
    ("workers/recipes/mujoco.py", "super()._healthy"),
}
# Size guides: reported when passed (test_sizes_are_reported_never_enforced), never enforced.
MAX_CLASS_LINES = 450    # code lines of a class, its docstring not counted
MAX_MODULE_LINES = 700
MAX_BENCH_LINES = 4000   # all of bench/'s Python: a benchmark suite a reader can check (EnvPool's is ~700)


def _sources() -> dict[str, pathlib.Path]:
    """Module name -> file, for ``shmpool/`` and ``workers/`` (installed as ``shmpool.workers``)."""
    out = {}
    for path in sorted([*(ROOT / "shmpool").rglob("*.py"), *(ROOT / "workers").rglob("*.py")]):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("shmpool", "workers"):   # a symlink some checkouts have
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[0] == "workers":
            parts.insert(0, "shmpool")
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The project modules ``module`` imports, anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found.update(n for n in names if n in known and n not in (module, "shmpool"))
    return found


def _circle(sources: dict[str, pathlib.Path]) -> list[str] | None:
    """One import circle among ``sources``, or None."""
    graph = {module: _imports(module, path, set(sources)) for module, path in sources.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def test_no_import_circle():
    circle = _circle(_sources())
    assert circle is None, f"modules importing each other in a circle: {' -> '.join(circle)}"


def _reach_ins() -> set[tuple[str, str]]:
    out = set()
    for path in _sources().values():
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                out.add((rel, ast.unparse(node)))
    return out


def test_no_reach_into_other_objects():
    extra = _reach_ins() - ALLOWED_REACH_INS
    assert not extra, f"reads or writes of another object's underscored names: {sorted(extra)}"


def test_every_allowed_reach_in_is_still_there():
    """An allowance whose reach-in is gone would let it come back unseen: drop it with the code."""
    stale = ALLOWED_REACH_INS - _reach_ins()
    assert not stale, f"allowed reach-ins found nowhere now, remove them from ALLOWED_REACH_INS: {sorted(stale)}"


def test_the_checks_see_what_they_forbid(tmp_path):
    """The walkers above find a circle and a reach-in when there is one."""
    (tmp_path / "a.py").write_text("from . import b\nx = other._hidden\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n")
    sources = {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    assert _imports("p.a", sources["p.a"], set(sources)) == {"p.b"}
    assert _imports("p.b", sources["p.b"], set(sources)) == {"p.a"}
    assert set(_circle(sources)) == {"p.a", "p.b"}
    tree = ast.parse(sources["p.a"].read_text())
    assert [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)] == ["other._hidden"]


def _class_sizes(sources: dict[str, pathlib.Path] | None = None):
    for module, path in (sources or _sources()).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                doc = ast.get_docstring(node, clean=False)
                doc_lines = 0 if doc is None else node.body[0].end_lineno - node.body[0].lineno + 1
                yield f"{module}.{node.name}", node.end_lineno - node.lineno + 1 - doc_lines


class SizeNote(UserWarning):
    """A room past the size guide: information for a reader, never a failure."""


def _sizes_past_the_guides() -> list[str]:
    notes = [f"class {name}: {n} lines of code (guide {MAX_CLASS_LINES})"
             for name, n in _class_sizes() if n > MAX_CLASS_LINES]
    files = [*_sources().values(), *(ROOT / "shmpool").glob("*.pyx"), *(ROOT / "workers").rglob("*.pyx")]
    notes += [f"module {f.relative_to(ROOT)}: {n} lines (guide {MAX_MODULE_LINES})"
              for f in files if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES]
    bench = sum(len(f.read_text().splitlines()) for f in (ROOT / "bench").glob("*.py"))
    if bench > MAX_BENCH_LINES:
        notes.append(f"bench/: {bench} lines of Python (guide {MAX_BENCH_LINES})")
    return notes


def test_sizes_are_reported_never_enforced(tmp_path):
    """Sizes describe; they never decide (a docstring shortened or a feature dropped to meet one is a
    defect).  The rooms past a guide are shown as warnings in pytest's summary; the gauge itself is
    checked here on a class whose size is known."""
    (tmp_path / "m.py").write_text('class A:\n    """Two\n    lines."""\n\n    x = 1\n    y = 2\n')
    assert list(_class_sizes({"p.m": tmp_path / "m.py"})) == [("p.m.A", 4)]
    for note in _sizes_past_the_guides():
        warnings.warn(SizeNote(note), stacklevel=1)
