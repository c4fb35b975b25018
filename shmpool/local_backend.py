"""The local pool's backend: worker processes pinned to cores, stepping envs in one shared-memory region.

:class:`LocalBackend` answers the surface's verbs (:mod:`shmpool.backend`) with the rooms of one job each
(see ARCHITECTURE.md): ``region.Region`` (the shared memory), ``workerset.WorkerSet`` (processes, pipes,
liveness), ``dispatch.Dispatch`` (what is in flight), ``supervisor.Supervisor`` (the waits and the side
channels) and ``restarts.Restarts`` (only with ``on_worker_error="restart"``).  The rooms are handed their
parts, the pool's ``Lifecycle`` and a weak ``fatal`` callback (the surface's fatal path); none holds the pool.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import layout as L
from . import openmp
from . import protocol as P
from .actions import ActionWriter
from .autoreset_modes import DISABLED, SAME_STEP
from .batched import check_hosting
from .dispatch import Dispatch
from .infos import InfoReader
from .memory import check_room
from .pickled import LatestValues, PickledActionSender, PickledLeaves, warn_pickled
from .plan import PoolPlan
from .region import Region
from .reset_args import ResetRequest, reset_request
from .restarts import RestartRecord, Restarts
from .state import INTERRUPTED, Lifecycle
from .supervisor import Supervisor
from .workerset import SLICE_NS, WorkerSet

_LIVE: weakref.WeakSet = weakref.WeakSet()   # started backends, for the fork hook below


class LocalBackend:
    """One local pool's rooms, started: the workers spawned, their envs built, the region mapped.

    ``plan`` is the pool's resolved settings (``shmpool.plan``); ``fatal`` the surface's fatal path
    (called through a weak reference).  A start-up that fails stops whatever it started and raises."""

    interrupted = INTERRUPTED
    entry_check = None

    def __init__(self, fns: list, plan: PoolPlan, *, seeds: list, autoreset_mode: str, copy: bool, strict: bool,
                 observation_mode: str, start_method: str | None, startup_timeout: float | None,
                 fatal: Callable[[], None]) -> None:
        self.plan = plan
        self.num_envs = plan.num_envs
        self.num_workers = plan.num_workers
        self.batch_size = plan.batch_size
        self.wait_policy, self.worker_wait_policy = plan.wait_choice.parent, plan.wait_choice.worker
        self.autoreset_mode = autoreset_mode
        self.copy = copy
        self.strict = strict
        self.observation_mode = observation_mode
        self.fatal = fatal
        self.spin = openmp.NOT_HELD   # its share of openmp.QUIET once started: told of every step
        self.restart_record = RestartRecord(plan.num_workers)
        self.replacing = plan.on_worker_error == "restart"
        self.region: Region | None = None
        self.supervisor = self.restarts_room = None   # built by _start (the restart room in restart mode only)
        self.workers = WorkerSet(mp.get_context(start_method), plan.bounds, list(plan.worker_cpus),
                                 plan.pinned, plan.parent_shard)
        self.life = life = Lifecycle()   # open, NEEDS_RESET: the pool's once start-up succeeded
        try:
            self._start(fns, seeds, startup_timeout, life)
        except BaseException:
            self.workers.abort_startup()
            self.workers.kill_now()
            self._release()
            raise
        _LIVE.add(self)
        self.spin = openmp.hold(plan.openmp)

    # --- start-up -----------------------------------------------------------------------

    def _start(self, fns, seeds, startup_timeout: float | None, life: Lifecycle) -> None:
        workers, plan = self.workers, self.plan
        deadline = None if startup_timeout is None else time.monotonic() + startup_timeout
        workers.spawn_all(fns, seeds, deadline)
        workers.guard(self)
        sizes = list(plan.shard_sizes)
        layout: L.Layout | None = None

        def lay_out_and_check(first: P.Spaces) -> None:
            # A region too large is refused from worker 0's spaces alone, before the others are read.
            nonlocal layout
            layout = L.Layout.build(self.num_envs, sizes, first.observation_space, first.action_space,
                                    final_obs=self.autoreset_mode == SAME_STEP)
            check_room(layout.size)

        described = workers.agreed_spaces(deadline, lay_out_and_check)
        first = described[0]
        obs_space, act_space = first.observation_space, first.action_space
        check_hosting(first.hosting, self.num_envs, self.batch_size, self.autoreset_mode)  # batched envs only
        self.observation_spaces = L.observation_spaces(workers.bounds, described, self.observation_mode)
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.metadata = first.metadata
        self.render_mode = first.render_mode
        self.spec = first.spec
        # Leaves that cannot live in shared memory travel pickled (shmpool.pickled).
        self.obs_pickled = PickledLeaves.of(obs_space)
        warn_pickled(self.obs_pickled, PickledLeaves.of(act_space), stacklevel=5)
        self.region = region = Region(layout, sizes, plan.use_semaphores)
        map_msg = P.MapRegion(layout, self.worker_wait_policy, SLICE_NS, region.semaphore_names,
                              self.autoreset_mode, self.strict)
        workers.map_region(list(range(self.num_workers)), map_msg, region, deadline)
        region.started(keep_fd=self.replacing)

        self.views = views = region.views()
        self.actions = ActionWriter(act_space, layout, views, self.strict)
        self.dispatch = dispatch = Dispatch(region.wire, plan.owner, life, self.batch_size, plan.max_lead)
        store_pickled_obs = None
        if self.obs_pickled is None:
            self.obs_views = L.assemble(obs_space, views.obs)
        else:
            self.obs_views = None   # rebuilt per call around the latest pickled values
            self.pickled_obs = LatestValues(self.obs_pickled, self.num_envs)
            store_pickled_obs = self.pickled_obs.store
        if self.actions.pickled is not None:
            self.pickled_actions = PickledActionSender(views.act_version, plan.owner, dispatch.all_ids)
        self.supervisor = supervisor = Supervisor(
            workers, dispatch, views.status, InfoReader(views, region.map, obs_space), life,
            self.wait_policy, plan.step_timeout, self.fatal, store_pickled_obs)
        if self.replacing:
            self.restarts_room = Restarts(self.restart_record, workers, region, dispatch, supervisor.status,
                                          supervisor.early, map_msg, (obs_space, act_space), startup_timeout,
                                          self.fatal)
            supervisor.use_restarts(self.restarts_room)

    # --- reset ---------------------------------------------------------------------------

    def reset_request(self, seed: Any, options: Any) -> ResetRequest:
        return reset_request(seed, options, self.num_envs)

    def reset(self, request: ResetRequest) -> None:
        self.supervisor.drain()
        self.supervisor.reset(request)

    def reset_result(self) -> tuple[Any, dict]:
        infos = self.supervisor.collect(None, "reset")
        return self._out_obs(), infos

    # --- sync step ---------------------------------------------------------------------------

    def post_step(self, actions: Any) -> None:
        if self.autoreset_mode == DISABLED:
            self._refuse_ended_envs()
        pickled = self.actions.write(actions)
        versions = None if pickled is None else self.pickled_actions.stamp(None)
        self.dispatch.post_step(P.CMD_STEP)
        self.spin.stepped()
        if pickled is not None:
            self._send_pickled_actions(None, versions, pickled)

    def wait_step(self, timeout: float | None) -> None:
        self.workers.serve_hosted()
        dispatch, policy = self.dispatch, self.wait_policy
        wire = dispatch.wire
        if not wire.wait_sync(dispatch.step_target, policy,
                              SLICE_NS if timeout is None else min(SLICE_NS, int(timeout * 1e9))):
            # A restart during the step re-targets it (Supervisor.wait): read the target each slice.
            self.supervisor.wait("step", lambda slice_ns: wire.wait_sync(dispatch.step_target, policy, slice_ns),
                                 timeout)
        dispatch.step_done()

    def step_result(self) -> tuple:
        infos = self.supervisor.collect(None, "step")
        v = self.views
        if self.copy:
            return self._out_obs(), v.reward.copy(), v.terminated.copy(), v.truncated.copy(), infos
        obs = self.obs_views if self.obs_pickled is None else self._out_obs()
        return obs, v.reward, v.terminated, v.truncated, infos

    # --- async ----------------------------------------------------------------------------------

    def async_reset(self) -> None:
        self.supervisor.drain()
        dispatch = self.dispatch
        dispatch.dispatch(dispatch.claim(None), reset=True)

    def send(self, actions: Any, env_ids: Any) -> None:
        dispatch = self.dispatch
        ids = dispatch.claim(env_ids)
        try:
            if self.autoreset_mode == DISABLED:
                self._refuse_ended_envs(ids)
            pickled = self.actions.write(actions, ids)
        except BaseException:
            dispatch.unclaim(ids)
            raise
        versions = None if pickled is None else self.pickled_actions.stamp(ids)
        dispatch.dispatch(ids, reset=False)
        self.spin.stepped()
        if pickled is not None:
            self._send_pickled_actions(ids, versions, pickled)

    def _send_pickled_actions(self, ids, versions, values: list[tuple]) -> None:
        """After the dispatch (a worker reads them when its step needs them, so a large
        message never waits for a worker that is not reading): see ``shmpool.pickled``."""
        for k, msg in self.pickled_actions.messages(ids, versions, values):
            try:
                P.send(self.workers.conns[k], msg)
            except OSError:
                # Dead: the wait that follows finds it.  A replacement's envs answer their
                # next step with the restart result, which needs no action.
                pass

    def recv(self) -> tuple:
        b = self.batch_size
        dispatch = self.dispatch
        out = dispatch.batch_ids
        got = dispatch.take_in_turn(out, b, self.supervisor.recv_take)
        ids = out[:got].astype(np.int32)
        dispatch.received(ids)
        v = self.views
        rewards, terminated, truncated = v.reward.take(ids), v.terminated.take(ids), v.truncated.take(ids)
        infos = self.supervisor.collect(ids, "recv")
        rows = [a.take(ids, axis=0) for a in v.obs]
        if self.obs_pickled is None:
            obs = L.assemble(self.single_observation_space, rows)
        else:  # after collect: it brings the pickled leaves
            obs = self.obs_pickled.assemble(rows, self.pickled_obs.batch(ids.tolist()))
        infos["env_id"] = ids
        return obs, rewards, terminated, truncated, infos

    # --- per-env messages -------------------------------------------------------------------------

    def per_env(self, op: str, name: str, ids: list[int], payloads: list) -> tuple:
        """Only the workers that own ``ids`` are asked."""
        return self.supervisor.ask_envs(op, name, ids, payloads)

    # --- counters and closing ---------------------------------------------------------------------

    @property
    def restarts(self) -> int:
        return self.restart_record.count

    @property
    def restart_log(self):
        return self.restart_record.log

    def close(self) -> None:
        _LIVE.discard(self)
        self.spin.end()
        failures = self.workers.stop(self.dispatch.wire)
        self._release()
        if failures:
            k, failure = failures[0]
            raise self.workers.env_error(k, failure, then="the pool is closed")

    def kill(self) -> None:
        _LIVE.discard(self)
        self.spin.end()
        self.workers.kill_now()
        self._release()

    def forgotten(self) -> bool:
        return True

    def forked(self) -> None:
        """In a forked child: the pool is its parent's; refuse its use, and make sure nothing in the
        child (``__del__``, the finalizer) touches the parent's workers."""
        self.life.forked()
        self.workers.disown()

    def _release(self) -> None:
        """Drop every view of the region the pool made, then the region itself: a closed
        pool holds no memory unless the caller still holds arrays it returned."""
        self.views = self.obs_views = self.actions = None
        self.dispatch = self.supervisor = self.restarts_room = None
        if self.region is not None:
            self.region.release()
            self.region = None

    def _out_obs(self):
        if self.obs_pickled is not None:
            arrays = [a.copy() for a in self.views.obs] if self.copy else self.views.obs
            return self.obs_pickled.assemble(arrays, self.pickled_obs.batch(None))
        if not self.copy:
            return self.obs_views
        return L.assemble(self.single_observation_space, [a.copy() for a in self.views.obs])

    def _refuse_ended_envs(self, ids: np.ndarray | None = None) -> None:
        """Without autoreset, stepping an env whose episode ended is a caller bug."""
        v = self.views
        done = v.terminated | v.truncated
        ended = np.flatnonzero(done) if ids is None else ids[done[ids]]
        if len(ended):
            raise ValueError(
                f"envs {ended.tolist()} ended their episodes and autoreset is disabled: reset them with "
                "reset(options={'reset_mask': mask}) before stepping")


def _forked_child() -> None:
    """In a forked child: every pool is its parent's."""
    for backend in list(_LIVE):
        backend.forked()
    _LIVE.clear()


os.register_at_fork(after_in_child=_forked_child)

__all__ = ["LocalBackend"]
