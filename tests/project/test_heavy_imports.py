"""tests/heavy_imports.py: the libraries that make every fork of the test process dearer stay out of it
until the tests marked for them run, last."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import heavy_imports
import pytest


def test_collecting_the_suite_left_the_heavy_libraries_out(request):
    found = request.config.stash.get(heavy_imports.AT_COLLECTION, None)
    assert found is not None, "conftest.py recorded nothing at collection"
    assert found == (), (f"collecting the tests imported {', '.join(found)}: a test module imports it at module "
                         "level (use heavy_imports.require and heavy_imports.names or module)")


def _item(name: str, heavy: bool):
    return SimpleNamespace(name=name, get_closest_marker=lambda mark: object() if heavy and mark ==
                           heavy_imports.MARK else None)


def test_marked_items_run_after_the_others_each_group_in_its_order():
    items = [_item("a", True), _item("b", False), _item("c", True), _item("d", False), _item("e", False)]
    heavy_imports.run_last(items)
    assert [item.name for item in items] == ["b", "d", "e", "a", "c"]


@pytest.fixture
def fake_heavy(tmp_path, monkeypatch):
    """A module ``heavy_fake`` on the path, counted as heavy, not yet imported."""
    (tmp_path / "heavy_fake.py").write_text("VALUE = 7\nitems = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(heavy_imports, "HEAVY", (*heavy_imports.HEAVY, "heavy_fake"))
    monkeypatch.delitem(sys.modules, "heavy_fake", raising=False)
    yield "heavy_fake"
    sys.modules.pop("heavy_fake", None)


def test_names_and_module_import_on_first_use_only(fake_heavy):
    names = heavy_imports.names(VALUE=fake_heavy)
    lazy = heavy_imports.module(fake_heavy)
    assert not hasattr(lazy, "__test__")   # pytest's probe at collection: answered without importing
    assert fake_heavy not in sys.modules
    assert names.VALUE == 7 and fake_heavy in sys.modules
    lazy.VALUE = 8   # a write reaches the module itself (monkeypatch.setattr on a proxy)
    assert sys.modules[fake_heavy].VALUE == 8 == lazy.VALUE


def test_a_test_that_leaves_a_heavy_library_loaded_is_named_with_the_fix(fake_heavy):
    before = heavy_imports.loaded()
    assert heavy_imports.newly_loaded("tests/x.py::t", before) is None
    __import__(fake_heavy)
    assert heavy_imports.newly_loaded("tests/x.py::t", before) == (
        "tests/x.py::t imported heavy_fake into the test process: mark it @pytest.mark.heavy_imports so that it "
        "runs after the tests that fork pools (tests/heavy_imports.py)")
    assert heavy_imports.newly_loaded("tests/x.py::t", heavy_imports.loaded()) is None


def test_require_skips_a_missing_module_without_importing_it():
    with pytest.raises(pytest.skip.Exception, match="could not import 'no_such_module_here': not installed"):
        heavy_imports.require("no_such_module_here")
    heavy_imports.require("json")   # installed: no skip


def test_monkeypatch_on_a_proxy_patches_the_module_and_a_failed_import_is_not_a_missing_name(
        fake_heavy, tmp_path, monkeypatch):
    """Issue 68: ``monkeypatch.setattr(faults, "ray", fake)`` on a proxy failed with ``<heavy_imports.module ...>
    has no attribute 'ray'`` from the second test of a file on (pytest 9.2, a fresh venv's): its undo restored
    the value it read from the proxy's own ``__dict__``, where there was none, so it deleted the module's.
    Also, monkeypatch reads the old value with ``getattr(target, name, default)``, which takes
    any AttributeError for a missing name, one raised while the module imports included: a proxy's import that
    fails says so as an ImportError, with its cause."""
    lazy = heavy_imports.module(fake_heavy)
    for patched in (9, 10):   # twice: pytest 9.2's undo restores what it read from the target's __dict__
        monkeypatch.setattr(lazy, "VALUE", patched)
        assert sys.modules[fake_heavy].VALUE == patched
        monkeypatch.undo()
        assert sys.modules[fake_heavy].VALUE == 7
    assert lazy.__dict__ is vars(sys.modules[fake_heavy])

    (tmp_path / "heavy_broken.py").write_text("import json\njson.no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = heavy_imports.module("heavy_broken")
    with pytest.raises(ImportError, match=r"importing heavy_broken failed: AttributeError.*no_such_name"):
        monkeypatch.setattr(broken, "VALUE", 1)
    assert "heavy_broken" not in sys.modules
