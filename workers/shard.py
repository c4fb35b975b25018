"""A worker's envs and how one result is written into shared memory."""
from __future__ import annotations

import numpy as np

from shmpool import layout as L
from shmpool import protocol as P
from shmpool.autoreset_modes import NEXT_STEP, SAME_STEP
from shmpool.gym_compat import own_info, reset_kwargs, same_step_info
from shmpool.info_rows import unbatch_info
from shmpool.infos import IN_SLOT, InfoWriter, column_dtype
from shmpool.pickled import PickledLeaves
from shmpool.spacetree import MissingItems, SpaceTree, tree_of

from . import forks
from ._rows import ResultRows


class ResultError(Exception):
    """An env returned something that does not fit its declared space."""


_UNBOUND = object()   # an env whose observation row is not its own buffer (no ``bind_obs``)
_NONE_OBS = "observation is None: an env must return an observation of its space (SyncVectorEnv refuses it too)"


def _observation_split(split):
    """``split`` of an env's observation: a Tuple short of items is the env's fault (``ResultError``)."""
    def split_observation(obs):
        try:
            return split(obs)
        except MissingItems as exc:
            raise ResultError(f"observation: {exc}") from None
    return split_observation


def _leaf_writer(arr: np.ndarray, strict: bool):
    """Copies one env's value of a leaf into its row.

    ``strict``: refuse a wrong shape (numpy would broadcast it silently) or a
    dtype that only an unsafe cast fits (floats into an integer space would be
    truncated silently).  Otherwise the value is cast as gymnasium's
    shared-memory write casts it (``np.asarray(value, dtype).flatten()`` copied
    into the row): a Python float into a uint8 Box, a scalar into shape ``(1,)``;
    what that cannot fit raises numpy's own error, as in ``AsyncVectorEnv``."""
    shape, dtype = arr.shape[1:], arr.dtype

    def write(i, value):
        if type(value) is not np.ndarray:
            value = np.asarray(value)
        if value.shape != shape:
            raise ResultError(f"observation has shape {value.shape}, the space says {shape}")
        if value.dtype != dtype and not np.can_cast(value.dtype, dtype, "same_kind"):
            raise ResultError(f"observation has dtype {value.dtype}, which the space's {dtype} cannot hold")
        arr[i] = value

    def cast(i, value):
        if type(value) is np.ndarray and value.shape == shape and value.dtype == dtype:
            arr[i] = value   # the common case: nothing to cast
            return
        np.copyto(arr[i:i + 1].reshape(-1), np.asarray(value, dtype=dtype).flatten())
    return write if strict else cast


def _final_writer(rows: list[np.ndarray], obs_tree: SpaceTree):
    """SAME_STEP: ``write(i, obs)`` copies an ended episode's last observation into env ``i``'s
    final_obs rows and returns True when the observation is built of plain dicts and tuples
    exactly as the space is and every leaf is an ndarray of exactly its row's dtype and shape, so
    that the parent hands back an equal value of the same types.  Otherwise it returns False and
    the observation travels pickled, exactly as the env gave it (an OrderedDict, a list...)."""
    if len(rows) == 1 and obs_tree.is_leaf:
        row = rows[0]
        shape, dtype = row.shape[1:], row.dtype

        def write(i, obs) -> bool:
            if type(obs) is not np.ndarray or obs.dtype != dtype or obs.shape != shape:
                return False
            row[i] = obs
            return True
        return write

    split_exact = obs_tree.split_exact

    def write_leaves(i, obs) -> bool:
        values = split_exact(obs)
        if values is None or any(type(v) is not np.ndarray or v.dtype != r.dtype or v.shape != r.shape[1:]
                                 for v, r in zip(values, rows)):
            return False
        for v, r in zip(values, rows):
            r[i] = v
        return True
    return write_leaves


def _no_final_slot(i, obs) -> bool:
    return False


class Shard:
    """The envs ``start..stop-1`` of one worker, writing results by env id."""

    batched = False

    def __init__(self, envs: list, start: int, views: L.Views, buf, obs_space, act_space,
                 autoreset_mode: str = NEXT_STEP, strict: bool = True) -> None:
        self.envs = envs
        self.strict = strict   # refuse non-finite rewards and observations that need a cast
        self.start = start
        self.stop = start + len(envs)
        self.views = views
        self.infos = InfoWriter(views, buf)
        self.autoreset = [False] * len(envs)   # NEXT_STEP: reset at the next step
        self.same_step = autoreset_mode == SAME_STEP
        self.next_step = autoreset_mode == NEXT_STEP
        self.pending_seeds: list = [None] * len(envs)
        obs_tree, act_tree = tree_of(obs_space), tree_of(act_space)
        if self.same_step and views.final_obs:   # a final-obs slot (every obs leaf in shared memory)
            self.write_final = _final_writer(views.final_obs, obs_tree)
            self.infos.reserve_final_obs()
        else:   # no slot: final observations travel pickled
            self.write_final = _no_final_slot
        writers = [_leaf_writer(a, strict) for a in views.obs]
        if len(writers) == 1 and obs_tree.is_leaf:
            self.write_obs = writers[0]
        else:
            split_obs = _observation_split(obs_tree.split)

            def write_obs(i, obs):
                for w, v in zip(writers, split_obs(obs)):
                    w(i, v)
            self.write_obs = write_obs
        # Recipes that can assemble their observation straight into their shared row
        # do (``bind_obs``); their step then returns that row and nothing is copied.
        # Not when the buffer is the env's state (Atari's frame stack): a trainer may
        # write into the views a step returns.
        self.bound: list = [_UNBOUND] * len(envs)
        if len(views.obs) == 1 and obs_tree.is_leaf:
            rows = views.obs[0]
            for j, env in enumerate(envs):
                # Looked up on the class: the env itself, never an env inside a wrapper (gymnasium
                # 0.29's Wrapper.__getattr__ would forward the lookup, with a deprecation warning).
                bind = getattr(type(env), "bind_obs", None)
                if bind is not None and not getattr(type(env), "obs_buffer_is_state", False):
                    self.bound[j] = bind(env, rows[start + j])
        acts = views.act
        if len(acts) == 1 and act_tree.is_leaf:
            single = acts[0]
            self.action = single.__getitem__
        else:
            assemble_action = act_tree.assemble

            def action(i):
                return assemble_action([a[i] for a in acts])
            self.action = action
        self._pickled_leaves(obs_space, act_space, writers)
        # The common case of a result in C; ``write_obs`` stays the definition of the rest.
        one_leaf = len(views.obs) == 1 and obs_tree.is_leaf and self.obs_pickled is None
        self.rows = ResultRows(views.reward, views.terminated, views.truncated,
                               views.obs[0] if one_leaf else None, strict)

    def _pickled_leaves(self, obs_space, act_space, writers) -> None:
        """Leaves that cannot live in shared memory (``shmpool.pickled``): their
        observation values wait in ``pickled_obs`` for the result's side message, their
        actions come from ``pickled_actions`` (the worker loop sets it)."""
        self.obs_pickled = PickledLeaves.of(obs_space)
        self.act_pickled = act_pickled = PickledLeaves.of(act_space)
        self.pickled_obs: list = [None] * len(self.envs)
        self.pickled_actions = None
        if self.obs_pickled is not None:
            split, pickled_obs, start = _observation_split(self.obs_pickled.split), self.pickled_obs, self.start

            def write_obs(i, obs):
                shared, pickled = split(obs)
                for w, v in zip(writers, shared):
                    w(i, v)
                pickled_obs[i - start] = pickled
            self.write_obs = write_obs
        if act_pickled is not None:
            acts = self.views.act

            def action(i):
                return act_pickled.assemble([a[i] for a in acts], self.pickled_actions.take(i))
            self.action = action

    def take_pickled_obs(self, i: int) -> tuple | None:
        """The pickled observation values env ``i`` wrote since the last call (None: none)."""
        j = i - self.start
        pickled, self.pickled_obs[j] = self.pickled_obs[j], None
        return pickled

    def step(self, i: int):
        """Step env ``i`` under the autoreset mode; returns its info dict after
        writing everything else in place.

        NEXT_STEP: the step after an episode ends resets instead (reward 0).
        SAME_STEP: an ending step resets at once; the info then carries
        ``final_obs`` and ``final_info`` (gymnasium's layout), the final
        observation in the region's final_obs rows when it fits them.
        DISABLED: no resets; the parent refuses to step an env that ended."""
        j = i - self.start
        v = self.views
        env = self.envs[j]
        if self.autoreset[j]:
            obs, info = env.reset()
            info = own_info(info)
            if forks.in_child:
                forks.leave_child(f"env {i}'s reset")
            self.autoreset[j] = False
            v.reward[i] = 0.0
            v.terminated[i] = False
            v.truncated[i] = False
        else:
            obs, reward, terminated, truncated, info = env.step(self.action(i))
            if forks.in_child:
                forks.leave_child(f"env {i}'s step")
            info = own_info(info)
            if not self.rows.put_status(i, reward, terminated, truncated):
                raise ResultError(f"reward is {reward}: rewards must be finite")
            if terminated or truncated:
                if self.next_step:
                    self.autoreset[j] = True
                elif self.same_step:
                    if self.write_final(i, obs):
                        final = {"final_obs": IN_SLOT, "final_info": info}
                    else:
                        # A bound row is about to be overwritten by the reset observation.
                        final = {"final_obs": obs.copy() if obs is self.bound[j] else obs, "final_info": info}
                    obs, info = env.reset()
                    if forks.in_child:
                        forks.leave_child(f"env {i}'s reset")
                    info = same_step_info(final, own_info(info))
        self._put_obs(i, j, obs)
        return info

    def _put_obs(self, i: int, j: int, obs) -> None:
        """Env ``i``'s (local ``j``) observation into its rows: nothing when the env built it there
        (``bind_obs``), the C copy when it is an exact row, else the Python writers."""
        if obs is not self.bound[j] and not self.rows.put_obs(i, obs):
            if obs is None:
                raise ResultError(_NONE_OBS)
            self.write_obs(i, obs)

    def reset(self, i: int, seed=None, options=None):
        j = i - self.start
        if seed is None:
            seed = self.pending_seeds[j]
        self.pending_seeds[j] = None
        # as the installed gymnasium's vector envs call it (1.x: options= always; 0.29: only what is given)
        obs, info = self.envs[j].reset(**reset_kwargs(seed, options))
        if forks.in_child:
            forks.leave_child(f"env {i}'s reset")
        info = own_info(info)
        self.autoreset[j] = False
        v = self.views
        v.reward[i] = 0.0
        v.terminated[i] = False
        v.truncated[i] = False
        self._put_obs(i, j, obs)
        return info


class _NoPerEnvObjects:
    """``Shard.envs`` of a batched shard: iterating gives the one batched env (so closing
    works); indexing one env is refused (call/get_attr/set_attr/apply need env objects)."""

    def __init__(self, env) -> None:
        self.env = env

    def __iter__(self):
        yield self.env

    def __len__(self) -> int:
        return 1

    def __getitem__(self, k):
        raise TypeError(
            f"the envs of this worker are one batched env ({type(self.env).__name__}): per-env "
            "call/get_attr/set_attr/apply are not supported")


class BatchShard:
    """The envs ``start..stop-1`` of one worker as one batched env (``shmpool.batched``).

    Same role as :class:`Shard` for the worker loop, with shard-level calls:
    :meth:`run` steps or resets a set of envs in one call of the batched env and
    writes their statuses and infos; :meth:`serve_requests` does it for popped
    async requests and publishes them; :meth:`reset_message` serves ``reset()``."""

    batched = True
    obs_pickled = act_pickled = None

    def __init__(self, env, start: int, views: L.Views, buf, obs_space, act_space,
                 autoreset_mode: str = NEXT_STEP, strict: bool = True) -> None:
        if PickledLeaves.of(obs_space) is not None or PickledLeaves.of(act_space) is not None:
            raise TypeError("a batched env's spaces must lie entirely in shared memory (Box, Discrete, "
                            "MultiDiscrete, MultiBinary and Dict/Tuple of them); Text, Sequence, Graph, OneOf "
                            "and custom spaces are only supported for envs stepped one at a time")
        self.env = env
        self.strict = strict   # refuse non-finite rewards
        self.envs = _NoPerEnvObjects(env)
        self.start = start
        self.n = n = env.num_envs
        self.stop = start + n
        self.views = views
        self.infos = InfoWriter(views, buf)
        self.pending_seeds: list = [None] * n
        self.all_ids = np.arange(n, dtype=np.int64)
        rows = slice(start, self.stop)
        env.bind(tree_of(obs_space).assemble([a[rows] for a in views.obs]), views.reward[rows],
                 views.terminated[rows], views.truncated[rows], autoreset_mode)
        self._acts = [a[rows] for a in views.act]
        act_tree = tree_of(act_space)
        self._assemble_actions = act_tree.assemble
        self._structured = len(self._acts) != 1 or not act_tree.is_leaf

    def actions(self, ids: np.ndarray):
        full = len(ids) == self.n
        leaves = [a if full else a[ids] for a in self._acts]
        return self._assemble_actions(leaves) if self._structured else leaves[0]

    def _seeds(self, ids: np.ndarray, seeds) -> list:
        """Explicit seeds, else the seeds waiting for the first reset; those are used up."""
        pending = self.pending_seeds
        out = []
        for k, j in enumerate(ids.tolist()):
            s = seeds[k] if seeds is not None else None
            out.append(pending[j] if s is None else s)
            pending[j] = None
        return out

    def run(self, ids: np.ndarray, reset: bool, finish_env, fail_env, seeds=None, options=None) -> None:
        """Reset or step the local envs ``ids`` (ascending) in one call; write statuses and infos.

        ``finish_env(i, info)`` / ``fail_env(i, phase, exc)`` (global ids) are the
        worker's per-env paths for infos that need the side channel and for errors;
        they are called in ascending env order."""
        v, g = self.views, ids + self.start
        phase = "reset" if reset else "step"
        try:
            if reset:
                info = self.env.reset(ids, self._seeds(ids, seeds), options)
                if forks.in_child:
                    forks.leave_child("a batched shard's reset")
                v.reward[g] = 0.0
                v.terminated[g] = False
                v.truncated[g] = False
            else:
                if not self.env.supports_subsets and len(ids) != self.n:
                    raise ValueError(
                        f"a gymnasium VectorEnv steps all its envs at once: got {len(ids)} of envs "
                        f"{self.start}..{self.stop - 1} in one send(); send all of them together or use "
                        "a shmpool.batched.BatchEnv")
                info = self.env.step(ids, self.actions(ids))
                if forks.in_child:
                    forks.leave_child("a batched shard's step")
                bad = ~np.isfinite(v.reward[g]) if self.strict else None
                if bad is not None and bad.any():
                    self._finish(ids, info, finish_env, fail_env, bad)
                    return
        except Exception as exc:
            for i in g.tolist():
                fail_env(i, phase, exc)
            return
        self._finish(ids, info, finish_env)

    def _finish(self, ids: np.ndarray, info: dict, finish_env, fail_env=None, bad: np.ndarray | None = None) -> None:
        """Statuses and infos of ``ids`` (rows of ``info`` in the same order); ``bad``: rows
        whose reward is not finite, failed instead.  Per-env calls go in ascending order."""
        v, g = self.views, ids + self.start
        v.status[g] = P.STATUS_OK
        v.info_mask[g] = 0
        side = np.zeros(len(ids), dtype=bool)
        for key, value in (info or {}).items():
            if isinstance(key, str) and key.startswith("_") and key[1:] in info:
                continue
            mask = info.get(f"_{key}")
            present = np.ones(len(ids), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
            col = self._column(key, value)
            if col is None:
                side |= present
                continue
            at = g[present]
            col.values[at] = value[present]
            v.info_mask[at] |= np.uint64(col.bit)
        if bad is not None:
            side |= bad
        for row in np.flatnonzero(side).tolist():
            i = int(g[row])
            if bad is not None and bad[row]:
                try:
                    raise ResultError(f"reward is {v.reward[i]}: rewards must be finite")
                except ResultError as exc:
                    fail_env(i, "step", exc)
            else:
                # Everything of that env (its numeric keys again too) through the per-env path.
                finish_env(i, unbatch_info(info, row))

    def _column(self, key, value):
        """The shared-memory column of a numeric 1-d info array, or None (side channel).

        Shares the InfoWriter's registry of keys, so per-env writes agree with these."""
        if not isinstance(value, np.ndarray) or value.ndim != 1:
            return None
        sample = value.dtype.type(0) if value.dtype != object else None
        if column_dtype(sample) != value.dtype:
            return None
        col = self.infos.column(key, sample)
        return col if col is not None and col.dtype == value.dtype else None

    def serve_requests(self, reqs: list[int], finish_env, fail_env, publish) -> None:
        """Serve popped async requests (global ids with the reset flag): one call for the
        resets, one for the steps, then publish each env (ascending within each group)."""
        arr = np.array(reqs, dtype=np.int64)
        is_reset = (arr & P.REQ_RESET) != 0
        ids = (arr & P.REQ_ENV_MASK) - self.start
        for reset in (True, False):
            sel = np.sort(ids[is_reset == reset])
            if len(sel):
                self.run(sel, reset, finish_env, fail_env)
                for i in (sel + self.start).tolist():
                    publish(i)

    def reset_message(self, seeds, options, mask, finish_env, fail_env) -> None:
        """``reset()``: every env (or those of ``mask``) in one call; the others keep their results."""
        if mask is None:
            ids = self.all_ids
        else:
            keep = np.asarray(mask, dtype=bool)
            ids = self.all_ids[keep]
            others = self.all_ids[~keep] + self.start
            self.views.info_mask[others] = 0
            self.views.status[others] = P.STATUS_OK
            if isinstance(options, list):
                options = [options[j] for j in ids.tolist()]
            seeds = [seeds[j] for j in ids.tolist()]
        if len(ids):
            self.run(ids, True, finish_env, fail_env, seeds, options)
