"""A space seen as a tree: its leaves in one order, each with its path, and values split into
leaf values and assembled back.

The one definition of leaf order, which the region's layout, the actions written into it, the
pickled leaves and the worker's shard all share: depth first, a Dict's keys in ``space.spaces``
order (gymnasium keeps them sorted unless it was given an ``OrderedDict``), a Tuple's items in
order.  Every other space is a leaf, custom ``Space`` subclasses included (the default branch
of :func:`branch`); what becomes of a leaf (a shared-memory array, or a value that travels pickled) is the
caller's choice (``layout``, ``pickled``).

The space is walked once, when its :class:`SpaceTree` is built; ``split`` and ``assemble`` are
closures made from that walk, so a step pays for no recursion over the space.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import singledispatch
from itertools import islice
from operator import itemgetter
from typing import Any

from gymnasium import spaces

from .gym_compat import DICT_TYPE

# A Dict's values split exactly from a plain dict or the mapping the installed gymnasium's Dict gives.
_MAPPINGS = frozenset({dict, DICT_TYPE})


@dataclass(frozen=True)
class Branch:
    """The children of a Dict or Tuple space.

    ``steps``: the path step to each child (a Dict's key, a Tuple's index).  ``take(value)``: a
    tuple of the children's values of one value.  ``build(items)``: a value from its children's
    values (a plain ``dict`` or ``tuple``, as gymnasium's spaces sample them).  ``fits(value)``:
    whether a value is exactly that plain container with these steps."""

    steps: tuple
    children: tuple[spaces.Space, ...]
    take: Callable[[Any], Any]
    build: Callable[[Sequence], Any]
    fits: Callable[[Any], bool]


class MissingItems(ValueError):
    """A value of a Tuple space with fewer items than the space has."""


@singledispatch
def branch(space: spaces.Space) -> Branch | None:
    """The children of a composite space; None for a leaf: every space but Dict and Tuple
    (Box, Discrete, Text, Sequence, Graph, OneOf, custom spaces)."""
    return None


@branch.register(spaces.Dict)
def _dict_branch(space: spaces.Dict) -> Branch:
    keys = tuple(space.spaces)
    key_set = frozenset(keys)
    # A value's children by key, so any mapping with these keys splits (KeyError otherwise).
    if len(keys) > 1:
        take = itemgetter(*keys)   # gives a tuple
    elif keys:
        key = keys[0]

        def take(value) -> tuple:
            return (value[key],)
    else:
        def take(value) -> tuple:
            return ()
    return Branch(keys, tuple(space.spaces.values()), take,
                  lambda items: DICT_TYPE(zip(keys, items)),
                  lambda value: type(value) in _MAPPINGS and value.keys() == key_set)


@branch.register(spaces.Tuple)
def _tuple_branch(space: spaces.Tuple) -> Branch:
    n = len(space.spaces)

    def fits(value) -> bool:
        return type(value) is tuple and len(value) == n

    def take(value) -> tuple:
        # Any iterable splits and items past n are ignored, as gymnasium's iterate and concatenate
        # index them; one short of items is refused (its missing leaves would keep stale values).
        if fits(value):
            return value
        items = tuple(islice(value, n))
        if len(items) < n:
            raise MissingItems(f"a Tuple of {n} items, got {len(items)}")
        return items
    return Branch(tuple(range(n)), tuple(space.spaces), take, tuple, fits)


@dataclass(frozen=True)
class LeafSpace:
    """One leaf of a space: ``path`` the keys/indices from the root, ``space`` the leaf's space."""

    path: tuple
    space: spaces.Space


class SpaceTree:
    """The leaves of one space and how its values split into them and assemble back.

    Leaf values are whatever the caller holds for a leaf (one env's value, a batch's array with
    a leading env axis, a shared-memory view): the tree looks only at the Dict/Tuple levels.
    ``leaves``: every leaf in the tree's order; ``paths`` their paths; ``is_leaf``: the space
    is its own one leaf (path ``()``).  ``split(value)``: the leaf values of a value
    of the space (or of a batch of them, any structure of dicts/tuples shaped like the space),
    in leaf order.  ``assemble(parts)``: the value (dicts/tuples) around a sequence of leaf
    values in leaf order; the parts themselves are placed, never copied.
    ``split_exact(value)``: ``split``, but None unless every Dict/Tuple level of the value is a
    plain ``dict`` with exactly the space's keys or a ``tuple`` of exactly its length."""

    def __init__(self, space: spaces.Space) -> None:
        self.space = space
        self.is_leaf = branch(space) is None   # the space is its own one leaf
        self.leaves: tuple[LeafSpace, ...] = tuple(_walk(space, ()))
        self.paths: tuple[tuple, ...] = tuple(leaf.path for leaf in self.leaves)
        if self.is_leaf:
            self.split: Callable[[Any], Sequence] = _one_leaf
            self.split_exact: Callable[[Any], Sequence | None] = _one_leaf
            self.assemble: Callable[[Sequence], Any] = itemgetter(0)
        else:
            self.split = _splitter(space, exact=False)
            self.split_exact = _splitter(space, exact=True)
            self.assemble = _assembler(space, 0)[0]


def _walk(space: spaces.Space, path: tuple):
    node = branch(space)
    if node is None:
        yield LeafSpace(path, space)
        return
    for step, child in zip(node.steps, node.children):
        yield from _walk(child, path + (step,))


def _one_leaf(value) -> list:
    return [value]


def _splitter(space: spaces.Space, exact: bool):
    """None for a leaf, else ``value -> leaf values`` (``exact``: None unless ``Branch.fits``
    holds at every level)."""
    node = branch(space)
    if node is None:
        return None
    subs = [_splitter(child, exact) for child in node.children]
    take, fits = node.take, node.fits
    if not exact and all(sub is None for sub in subs):   # all leaves: their values are the leaves
        return take

    def split(value) -> list | None:
        if exact and not fits(value):
            return None
        out: list = []
        for sub, part in zip(subs, take(value)):
            if sub is None:
                out.append(part)
                continue
            parts = sub(part)
            if parts is None:
                return None
            out += parts
        return out
    return split


def _assembler(space: spaces.Space, first: int) -> tuple[Callable[[Sequence], Any], int]:
    """``parts -> value`` for the subtree whose leaves are ``parts[first:first + count]``, and
    that count."""
    node = branch(space)
    if node is None:
        return itemgetter(first), 1
    subs = []
    stop = first
    for child in node.children:
        sub, count = _assembler(child, stop)
        subs.append(sub)
        stop += count
    build = node.build
    if all(branch(child) is None for child in node.children):   # all leaves: one slice
        return (lambda parts: build(parts[first:stop])), stop - first
    return (lambda parts: build([sub(parts) for sub in subs])), stop - first


# Trees by space identity, each kept only while someone holds it (a tree holds its space, so
# while it lives no other space can have that id): callers that hold only a space (the pool's
# ``layout.assemble``) reuse the tree its pool's parts hold.
_trees: weakref.WeakValueDictionary[int, SpaceTree] = weakref.WeakValueDictionary()


def tree_of(space: spaces.Space) -> SpaceTree:
    """The :class:`SpaceTree` of ``space``: the one already built for this space object while
    it is in use, else a new one."""
    tree = _trees.get(id(space))
    if tree is None:
        tree = _trees[id(space)] = SpaceTree(space)
    return tree
