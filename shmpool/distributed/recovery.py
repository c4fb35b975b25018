"""What a :class:`~shmpool.distributed.RayPool` makes of its pools' answers: values; errors raised
in a pool, with global env ids; and deaths, fatal (the RayPool closes) or, with
``on_worker_error="restart"``, rebuilt pools whose envs come back flagged ``worker_restarted``."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import EnvError
from ..state import add_note
from .actor import Resets
from .batches import Rows, mark_restarted
from .faults import Outcome, RemotePoolDiedError
from .fleet import Fleet
from .ledger import Ledger
from .placement import describe_range


class Recovery:
    """The fault policy of one RayPool.  ``shut_down()`` closes the RayPool (its caller holds the
    pool's entry); every method that raises a fatal error calls it first."""

    def __init__(self, fleet: Fleet, ledger: Ledger, on_worker_error: str, shut_down: Callable[[], None]) -> None:
        self.fleet = fleet
        self.ledger = ledger
        self.on_worker_error = on_worker_error
        self.shut_down = shut_down

    def settle(self, outcomes: list[Outcome], op: str, *, restart: bool, seeds: list | None = None,
               options: list | None = None) -> list:
        """The values of a sync call's outcomes.  Dead pools first: rebuilt (``restart`` and
        ``on_worker_error="restart"``: their value is their restart rows) or fatal; then the first
        error raised in a pool is raised, the others noted on it."""
        errors = [o for o in outcomes if o.error is not None]
        for o in outcomes:
            if o.death is None:
                continue
            if not restart or self.on_worker_error != "restart":
                err = self.fleet.death_error(o.pool, op, o.death, o.node_gone)
                for e in errors:
                    add_note(err, f"pool {e.pool} also raised during {op}: {e.error!r}")
                self.fatal(err, o.death)
            o.value = self.restart_sync(o.pool, op, o.death, seeds, options)
        if errors:
            err = self.global_error(errors[0].pool, errors[0].error)
            for e in errors[1:]:
                add_note(err, f"pool {e.pool} also raised during {op}: {e.error!r}")
            raise err
        return [o.value for o in outcomes]

    def global_error(self, k: int, err: BaseException) -> BaseException:
        """Pool ``k``'s exception as the caller should see it: an ``EnvError`` gets the global
        env id (``env_id``) and the pool's node in its message."""
        if isinstance(err, EnvError) and err.env_id is not None:
            r = self.fleet.placement.env_range(k)
            err.env_id = int(err.env_id) + r.start
            err.args = (f"env {err.env_id} (pool {k} on node {self.fleet.node_of(k)}, envs {describe_range(r)}; "
                        f"local ids below count from {r.start}): {err.args[0] if err.args else ''}",)
        return err

    def fatal(self, err: BaseException, cause: BaseException) -> None:
        """Close the RayPool, then raise ``err`` (from ``cause``)."""
        self.shut_down()
        raise err from cause

    def rebuild(self, k: int, op: str, exc: BaseException, seeds: list | None, options: Any) -> Resets:
        """Pool ``k`` rebuilt and reset; a rebuild that failed everywhere is fatal."""
        try:
            return self.fleet.rebuild(k, op, exc, seeds, options)
        except RemotePoolDiedError:
            self.shut_down()
            raise

    def restart_sync(self, k: int, op: str, exc: BaseException, seeds: list | None,
                     options: list | None) -> Resets | Rows:
        """Rebuild pool ``k`` during a sync call; returns what the call expected of it, flagged restarted."""
        r = self.fleet.placement.env_range(k)
        opts = None if options is None else options[k]
        if isinstance(opts, dict) and "reset_mask" in opts:  # a new pool resets all its envs
            opts = {key: v for key, v in opts.items() if key != "reset_mask"} or None
        resets = self.rebuild(k, op, exc, None if seeds is None else seeds[r.start:r.stop], opts)
        if op == "reset":
            return Resets(resets.obs, mark_restarted(resets.infos, len(r), np.arange(len(r))))
        if self.ledger.next_step:
            self.ledger.sync_autoreset[k] = resets.obs
        return Rows.restarted(np.arange(len(r)), resets.obs, resets.infos)

    def async_death(self, o: Outcome, op: str) -> None:
        """A pool died during async use: fatal, or rebuilt with its envs' restart rows queued."""
        if self.on_worker_error != "restart":
            self.fatal(self.fleet.death_error(o.pool, op, o.death, o.node_gone), o.death)
        resets = self.rebuild(o.pool, op, o.death, None, None)
        self.ledger.pool_rebuilt(o.pool, resets.obs, resets.infos)
