"""The one walk over spaces (shmpool.spacetree): leaf order and paths, split, assemble."""
from __future__ import annotations

import gc
import random
from collections import OrderedDict

import numpy as np
import pytest
from gymnasium import spaces

from shmpool import layout as L
from shmpool.pickled import PickledLeaves
from shmpool.spacetree import SpaceTree, branch, tree_of


class Custom(spaces.Space):
    """A user's own space: no shape or dtype shmpool could lay out."""

    def sample(self, mask=None, probability=None):
        return {"anything": 1}

    def contains(self, x):
        return True


class MyDict(spaces.Dict):
    """A subclass of Dict is walked as a Dict."""


def nested() -> spaces.Dict:
    # Given as a plain dict, gymnasium sorts the keys: a, b, c (and y, z inside c).
    return spaces.Dict({
        "c": spaces.Dict({"z": spaces.MultiBinary(2), "y": spaces.Discrete(2)}),
        "b": spaces.Tuple((spaces.Discrete(3), spaces.Text(4))),
        "a": spaces.Box(-1, 1, (2,)),
    })


def same_structure(a, b) -> bool:
    """Equal containers of the same types, and the very same leaf objects."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_structure(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_structure(x, y) for x, y in zip(a, b))
    return a is b


def test_leaves_depth_first_in_the_spaces_key_order():
    tree = SpaceTree(nested())
    assert tree.paths == (("a",), ("b", 0), ("b", 1), ("c", "y"), ("c", "z"))
    kinds = [type(leaf.space).__name__ for leaf in tree.leaves]
    assert kinds == ["Box", "Discrete", "Text", "Discrete", "MultiBinary"]
    assert not tree.is_leaf


def test_an_ordered_dict_space_keeps_its_order():
    space = spaces.Dict(OrderedDict([("z", spaces.Discrete(2)), ("a", spaces.Discrete(3))]))
    assert SpaceTree(space).paths == (("z",), ("a",))


def test_split_gives_the_leaf_values_in_leaf_order():
    space = nested()
    value = space.sample()
    parts = SpaceTree(space).split(value)
    expected = [value["a"], value["b"][0], value["b"][1], value["c"]["y"], value["c"]["z"]]
    assert len(parts) == len(expected) and all(p is e for p, e in zip(parts, expected))


def test_assemble_is_splits_inverse_with_gymnasiums_containers():
    space = nested()
    tree = SpaceTree(space)
    value = space.sample()
    rebuilt = tree.assemble(list(tree.split(value)))
    assert type(rebuilt) is dict and type(rebuilt["b"]) is tuple and type(rebuilt["c"]) is dict
    assert same_structure(rebuilt, value)
    assert space.contains(rebuilt)


def test_empty_branches_take_no_leaf():
    space = spaces.Dict({"a": spaces.Discrete(3), "e": spaces.Dict(), "q": spaces.Tuple((
        spaces.Tuple((spaces.Box(-1, 1, (2,)), spaces.MultiBinary(2))),)), "t": spaces.Tuple(())})
    tree = SpaceTree(space)
    assert tree.paths == (("a",), ("q", 0, 0), ("q", 0, 1))
    value = space.sample()
    assert same_structure(tree.assemble(tree.split(value)), value)


def random_space(rng: random.Random, depth: int = 0) -> spaces.Space:
    r = rng.random()
    if depth < 3 and r < 0.35:
        return spaces.Dict({k: random_space(rng, depth + 1) for k in rng.sample("zyxabcdq", rng.randint(0, 4))})
    if depth < 3 and r < 0.6:
        return spaces.Tuple([random_space(rng, depth + 1) for _ in range(rng.randint(0, 3))])
    return rng.choice([spaces.Box(-1, 1, (2,)), spaces.Discrete(3), spaces.MultiBinary(2), spaces.Text(4)])


def reference_paths(space, path=()):
    """The order the hand-written walks kept before spacetree (the wire's order)."""
    if isinstance(space, spaces.Dict):
        return [p for key, sub in space.spaces.items() for p in reference_paths(sub, path + (key,))]
    if isinstance(space, spaces.Tuple):
        return [p for i, sub in enumerate(space.spaces) for p in reference_paths(sub, path + (i,))]
    return [path]


def test_random_nested_spaces_round_trip_in_the_old_order():
    rng = random.Random(32)
    for _ in range(300):
        space = random_space(rng)
        tree = SpaceTree(space)
        assert list(tree.paths) == reference_paths(space)
        value = space.sample()
        parts = tree.split(value)
        assert len(parts) == len(tree.leaves)
        assert same_structure(tree.assemble(parts), value)
        assert tree.split_exact(value) is not None


def test_a_space_that_is_its_own_leaf():
    space = spaces.Box(0, 1, (3,))
    tree = SpaceTree(space)
    value = space.sample()
    assert tree.is_leaf and tree.paths == ((),)
    assert list(tree.split(value)) == [value] and tree.assemble([value]) is value


def test_split_takes_any_mapping_and_sequence_as_today():
    space = spaces.Dict({"a": spaces.Discrete(2), "t": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2)))})
    tree = SpaceTree(space)
    value = OrderedDict([("t", [np.int64(1), np.int64(0)]), ("a", np.int64(1))])   # batched actions may be lists
    assert list(tree.split(value)) == [1, 1, 0]
    with pytest.raises(KeyError):
        tree.split({"t": (0, 1)})


def test_split_exact_only_for_plain_dicts_and_tuples_shaped_like_the_space():
    space = spaces.Dict({"a": spaces.Discrete(2), "t": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2)))})
    tree = SpaceTree(space)
    one, two, three = np.int64(1), np.int64(0), np.int64(1)
    assert list(tree.split_exact({"a": one, "t": (two, three)})) == [one, two, three]
    assert tree.split_exact(OrderedDict([("a", one), ("t", (two, three))])) is None
    assert tree.split_exact({"a": one, "t": [two, three]}) is None
    assert tree.split_exact({"a": one, "t": (two,)}) is None
    assert tree.split_exact({"a": one, "t": (two, three), "extra": 0}) is None


def test_a_custom_space_is_one_leaf_refused_by_the_layout_and_pickled_by_the_lane():
    space = spaces.Dict({"box": spaces.Box(0, 1, (2,)), "mine": Custom()})
    assert branch(Custom()) is None
    tree = SpaceTree(space)
    assert tree.paths == (("box",), ("mine",))
    with pytest.raises(TypeError, match="cannot lay out a Custom space"):
        L.leaves(space)
    assert [leaf.path for leaf in L.leaves(space, allow_pickled=True)] == [("box",)]
    lane = PickledLeaves.of(space)
    assert lane.names("obs") == ["obs['mine']"] and lane.kinds == ["Custom"]
    value = {"box": np.zeros(2, np.float32), "mine": {"anything": 1}}
    shared, slow = lane.split(value)
    assert same_structure(lane.assemble(shared, slow), value)


def test_a_subclass_of_dict_is_walked_as_a_dict():
    tree = SpaceTree(MyDict({"b": spaces.Discrete(2), "a": spaces.Discrete(3)}))
    assert tree.paths == (("a",), ("b",))


def test_tree_of_walks_each_space_object_once_while_in_use():
    space = nested()
    tree = tree_of(space)
    assert tree_of(space) is tree
    twin = nested()   # equal, but another object
    assert twin == space and tree_of(twin) is not tree_of(space)


def test_tree_of_does_not_keep_its_space_alive():
    import weakref

    space = nested()
    tree_of(space)
    ref = weakref.ref(space)
    del space
    gc.collect()
    assert ref() is None
