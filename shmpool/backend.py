"""What a pool's surface (:class:`shmpool.surface.PoolSurface`) asks of the machinery under it.

The surface holds everything a pool's calls share: the one :class:`~shmpool.state.Lifecycle` and its
checks and transitions, the entry lock, the argument rules common to every backend, close, the context
manager and the refusal to be copied.  A backend does the work of each call, and only that: the local one
(:mod:`shmpool.local_backend`: worker processes and one shared-memory region) and the Ray one
(:mod:`shmpool.distributed.ray_backend`: one local pool per Ray node, driven through actors).

Every verb is called by the surface inside one public call, with the entry lock held and the state
already checked; a verb raises what the call raises.  A verb never changes the pool's state
(``Lifecycle.state``) but as its contract says (an env's error: ``needs_reset``); the surface makes every
other transition around it.  The backend keeps ``life.in_flight`` (the envs its bookkeeping has out), since
only it knows which envs a ``send`` claimed and which came back.

Shapes and dtypes (``n`` is ``num_envs``, or the rows of the call): observations ``(n, *obs_shape)`` in the
space's dtype (dicts/tuples of such arrays for Dict/Tuple spaces), rewards ``(n,)`` float64,
terminated/truncated ``(n,)`` bool, infos in gymnasium's vector layout (``key`` array plus ``_key`` mask).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .state import Lifecycle

# (obs, rewards, terminated, truncated, infos)
StepResult = tuple[Any, Any, Any, Any, dict]


class PoolBackend(Protocol):
    """The verbs under a pool's calls (see the module doc for who checks what)."""

    life: Lifecycle             # the pool's one state: the surface's, handed over (in_flight, needs_reset)
    num_envs: int
    batch_size: int             # rows of one recv()
    interrupted: str            # what a Ctrl-C inside a call did, for the note it leaves with
    # what the envs reported at start-up (env 0's, but observation_spaces: one per env); the surface shows them
    observation_spaces: list
    single_observation_space: Any
    single_action_space: Any
    metadata: dict
    render_mode: str | None
    spec: Any

    # --- entry --------------------------------------------------------------------------

    entry_check: Callable[[], None] | None
    """Run first in every public call (after the entry lock is taken), or None: a refusal only this
    backend knows (Ray's: the user shut Ray down, which took the actors)."""

    # --- reset ---------------------------------------------------------------------------

    def reset_request(self, seed: Any, options: Any) -> Any:
        """``reset(seed, options)``'s arguments checked (and packed) before anything is sent: an int seed
        gives env ``i`` ``seed + i``, a list one per env; ``options`` one dict for all, a list with one per
        env, or a dict with ``"reset_mask"`` (bool ``(num_envs,)``).  Raises ValueError/TypeError."""

    def reset(self, request: Any) -> None:
        """Reset the envs ``request`` names and wait for them (envs still in flight are taken back and
        dropped first).  Raises what an env raised (the pool then still needs a reset)."""

    def reset_result(self) -> tuple[Any, dict]:
        """``(obs, infos)`` of the reset just done, obs ``(num_envs, *obs_shape)``; called once the surface
        made the pool READY (an env's error read here sets ``needs_reset``)."""

    # --- sync step --------------------------------------------------------------------------

    def post_step(self, actions: Any) -> None:
        """Check ``actions`` (``(num_envs, *act_shape)``) and start every env's step; returns at once.
        A refusal raises before anything is sent."""

    def wait_step(self, timeout: float | None) -> None:
        """Wait for the posted step (``timeout`` seconds: ``TimeoutError``, the step stays posted)."""

    def step_result(self) -> StepResult:
        """The waited step's rows in env order; called once the surface ended the pending step (an env's
        error sets ``needs_reset`` and raises)."""

    # --- async ------------------------------------------------------------------------------------

    def async_reset(self) -> None:
        """Reset every env without waiting (what was in flight is dropped first); every env is then in
        flight, its row arriving through :meth:`recv`."""

    def send(self, actions: Any, env_ids: Any) -> None:
        """Claim ``env_ids`` (int ids, every env for None; refused when out of range, repeated or
        already in flight), check ``actions`` (``(len(env_ids), *act_shape)``) and start their steps;
        returns at once.  A refusal raises before anything is sent, leaving nothing claimed."""

    def recv(self) -> StepResult:
        """The first ``batch_size`` envs to finish, in completion order, fresh arrays, with
        ``infos["env_id"]`` (int32, ``(batch_size,)``); they are no longer in flight."""

    # --- per-env messages ---------------------------------------------------------------------------

    def per_env(self, op: str, name: str, ids: list[int], payloads: list) -> tuple:
        """Run ``op`` (``"call"``, ``"get_attr"``, ``"set_attr"``, ``"apply"``) on envs ``ids`` (checked,
        repeats allowed), one payload per id: ``call`` ``(args, kwargs)``, ``apply`` ``(fn, args, kwargs)``,
        ``get_attr`` None, ``set_attr`` the value.  The results in the order of ``ids``."""

    # --- counters and closing ------------------------------------------------------------------------

    @property
    def restarts(self) -> int:
        """Replacements so far (``on_worker_error="restart"``)."""

    @property
    def restart_log(self) -> Any:
        """One entry per replacement, oldest first."""

    def close(self) -> None:
        """Stop everything, asking the envs to close (the surface has marked the pool closed); may raise
        what an env's close raised, once everything is stopped."""

    def kill(self) -> None:
        """Stop everything at once, without asking (the fatal path: a call's state is unknown)."""

    def forgotten(self) -> bool:
        """The pool was dropped unclosed: True when :meth:`close` should run now (made quick), False when
        there is nothing it could do."""
