"""The worker process: build a shard of envs, then serve commands forever.

Commands arrive through the wire (``shmpool._core``); results are written in
place into shared memory.  Only rare things use the side channel (``conn``):
the start-up handshake, tracebacks, non-numeric infos, and message commands
(reset with options, call/get_attr/set_attr).
"""
from __future__ import annotations

import os
import signal

import psutil

from shmpool import _core
from shmpool import layout as L
from shmpool import protocol as P
from shmpool.batched import BatchedEnvs, hosting_info
from shmpool.constructors import ShardConstructors
from shmpool.errors import PoolResourceError
from shmpool.gym_compat import own_info, same_step_info
from shmpool.memory import receive_region
from shmpool.neighbours import name_this_worker

from . import forks
from .inbox import PickledActionInbox
from .inherited import let_go_of_the_trainer
from .shard import BatchShard, Shard


class ParentWatch:
    """Tells whether the pool's process is still alive.

    A direct child (fork, spawn) compares getppid(); under forkserver the
    parent is the server, so the pool's pid and start time are checked
    instead (pid reuse safe).  The kernel's parent-death signal is asked for
    only when the pool was built on the main thread: it fires when the
    *thread* that forked exits, which would kill a pool built in a
    short-lived thread while the process still uses it."""

    def __init__(self, parent_pid: int, parent_started: float, main_thread: bool) -> None:
        self.parent_pid = parent_pid
        self.direct = os.getppid() == parent_pid
        if self.direct:
            if main_thread:
                _core.set_parent_death_signal(signal.SIGKILL)
            # The parent may have died before prctl ran.
            if os.getppid() != parent_pid:
                os._exit(1)
        else:
            self._started = parent_started
            if not self.alive():
                os._exit(1)

    def alive(self) -> bool:
        if self.direct:
            return os.getppid() == self.parent_pid
        try:
            return psutil.Process(self.parent_pid).create_time() == self._started
        except psutil.Error:
            return False


def _setup_process(cpu: int | None, parent_pid: int, parent_started: float, main_thread: bool) -> ParentWatch:
    """The worker's own set-up under any start method (what a fork copied is let go of before:
    ``workers.inherited``)."""
    watch = ParentWatch(parent_pid, parent_started, main_thread)
    # Ctrl-C reaches the whole process group; the parent decides what to do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    return watch


def _error(conn, env_id, phase: str, exc: BaseException) -> None:
    P.report(conn, P.Failure.of(env_id, phase, exc))


# The two lookups below ask the env's class, so that gymnasium 0.29's Wrapper.__getattr__ (which
# forwards to the inner env with a deprecation warning) is never asked for them.


def _get(env, name: str):
    """gymnasium's lookup through wrappers, as its vector envs do; plain getattr otherwise."""
    getter = getattr(type(env), "get_wrapper_attr", None)
    return getter(env, name) if getter is not None else getattr(env, name)


def _set(env, name: str, value) -> None:
    """gymnasium 1.x's ``set_wrapper_attr``; plain setattr on the outermost env where there is
    none (gymnasium 0.29, whose AsyncVectorEnv sets it so)."""
    setter = getattr(type(env), "set_wrapper_attr", None)
    if setter is not None:
        setter(env, name, value)
    else:
        setattr(env, name, value)


def main(conn, index: int, cpu: int | None, parent: tuple[int, float, bool], constructors: ShardConstructors,
         start: int, seeds: list, libraries=None) -> None:
    """Entry point of worker ``index`` owning envs ``start..start+len(constructors.per_env)-1``.

    ``parent`` is the pool process's (pid, psutil create_time, built on its main thread); ``libraries``
    the BLAS and OpenMP libraries it found just before forking this worker (``shmpool.thread_limits``;
    None: this worker finds its own)."""
    try:
        # Inside the try: a failure setting the process up reaches the parent's error with its traceback
        # (the worker's stderr may be a progress display's, or nobody's).  First of all (its first step
        # before anything here can trigger a collection): what the fork copied from the trainer.
        let_go_of_the_trainer({conn.fileno()}, libraries)
        watch = _setup_process(cpu, *parent)
        name_this_worker(index)   # what another pool on these cores finds (shmpool.neighbours)
        forks.watch_forks()       # a process an env forks never acts as this worker
        _run(conn, index, watch, constructors, start, seeds)
    except Exception as exc:
        # A bug outside env code: leave the traceback for the parent's error.
        _error(conn, None, "worker loop", exc)
        raise


def _run(conn, index: int, watch: ParentWatch, constructors: ShardConstructors, start: int, seeds: list) -> None:
    try:
        fns = constructors.unpack()   # one object per env, as one process per env would have
    except Exception as exc:
        _error(conn, None, "unpickle env constructors", exc)
        return
    built = build_envs(conn, fns, start)
    if built is None:
        return
    msg = P.next_command(conn)
    if type(msg) is not P.MapRegion:  # Abort: start-up failed in another worker
        return
    try:
        region = receive_region(conn, msg.layout.size)
    except PoolResourceError as exc:   # this worker's own fd or memory limit: the pool's error, not an env's
        _error(conn, None, "map region", exc)
        return
    server = bind_server(conn, index, built, msg, region, seeds, watch)
    if server is None:
        return
    try:
        server.serve()
    finally:
        server.wire.release()


class BuiltEnvs:
    """A shard's envs, built and described (start-up step one): ``envs`` (one per env) or
    ``batch_env`` (one batched env for the whole shard), and their spaces."""

    def __init__(self, start: int, envs: list | None, batch_env, obs_space, act_space) -> None:
        self.start = start
        self.envs = envs
        self.batch_env = batch_env
        self.obs_space = obs_space
        self.act_space = act_space

    def close(self) -> None:
        for env in self.envs or [self.batch_env]:
            close_quietly(env)


def build_envs(conn, fns, start: int) -> BuiltEnvs | None:
    """Build the shard's envs from their constructors and report their ``Spaces``; None
    (with a ``Failure`` reported) when a constructor raised or the action spaces differ."""
    if isinstance(fns, BatchedEnvs):
        # One batched env for the whole shard (shmpool.batched).
        try:
            batch_env = fns.build(start)
        except Exception as exc:
            _error(conn, start, "make", exc)
            return None
        obs_space, act_space = batch_env.single_observation_space, batch_env.single_action_space
        P.report(conn, P.Spaces(obs_space, act_space, getattr(batch_env, "metadata", {}),
                                getattr(batch_env, "render_mode", None), getattr(batch_env, "spec", None),
                                hosting_info(batch_env)))
        return BuiltEnvs(start, None, batch_env, obs_space, act_space)
    envs = []
    for k, fn in enumerate(fns):
        try:
            envs.append(fn())
        except Exception as exc:
            _error(conn, start + k, "make", exc)
            for env in envs:
                close_quietly(env)
            return None
    first = envs[0]
    differing = False   # observation spaces that differ: the pool judges them (observation_mode)
    for k, env in enumerate(envs[1:], 1):
        obs_space, act_space = env.observation_space, env.action_space
        if not L.same_space(obs_space, first.observation_space):
            differing = True
        if not L.same_space(act_space, first.action_space):
            P.report(conn, P.Failure(start + k, "make", "ValueError",
                                     f"env {start + k} has observation/action spaces {obs_space}, "
                                     f"{act_space}; env {start} has {first.observation_space}, "
                                     f"{first.action_space}: all envs of a pool must share their spaces"))
            for env in envs:
                close_quietly(env)
            return None
    obs_space, act_space = first.observation_space, first.action_space
    P.report(conn, P.Spaces(obs_space, act_space, getattr(first, "metadata", {}),
                            getattr(first, "render_mode", None), getattr(first, "spec", None),
                            observation_spaces=[env.observation_space for env in envs] if differing else None))
    return BuiltEnvs(start, envs, None, obs_space, act_space)


def bind_server(conn, index: int, built: BuiltEnvs, msg: P.MapRegion, region, seeds: list,
                watch: ParentWatch | None) -> Server | None:
    """Start-up step two: bind the built envs to their rows of the mapped ``region`` and
    report ``Ready``; the command loop that serves them, or None (a ``Failure`` reported)."""
    layout = msg.layout
    sems = None
    if msg.semaphores is not None:
        import posix_ipc
        sems = [posix_ipc.Semaphore(n) for n in msg.semaphores]
    wire = _core.Wire(region, layout.shard_sizes, num_envs=layout.num_envs, sems=sems, slice_ns=msg.slice_ns)
    wire.check_header()
    views = L.Views(layout, region)
    start, obs_space, act_space = built.start, built.obs_space, built.act_space
    if built.batch_env is not None:
        try:
            shard = BatchShard(built.batch_env, start, views, region, obs_space, act_space, msg.autoreset_mode,
                               msg.strict)
        except Exception as exc:
            _error(conn, start, "bind", exc)
            built.close()
            wire.release()
            return None
    else:
        shard = Shard(built.envs, start, views, region, obs_space, act_space, msg.autoreset_mode, msg.strict)
        if shard.act_pickled is not None:
            shard.pickled_actions = PickledActionInbox(conn, views.act_version)
    shard.pending_seeds = list(seeds)
    P.report(conn, P.Ready())
    return Server(conn, index, wire, views, shard, msg.policy, msg.slice_ns, watch)


def restarted(shard: Shard, views) -> None:
    """This worker replaces one that died: reset every env (unseeded), and make the
    first step (or step request) of each env report that reset observation with
    reward 0, terminated False, truncated True and info ``worker_restarted`` instead
    of stepping.  Under NEXT_STEP the step after it is then an autoreset step, as
    after any truncation.  An explicit reset drops the mark.

    Unseeded: the dead worker's envs were mid-episode with RNG states nobody
    knows, so no seed reproduces them, and re-using the pool's first seeds would
    replay episodes already collected.

    The marks wrap ``shard.step``/``shard.reset`` on the instance and remove
    themselves once every env has reported, so the hot path is untouched after."""
    if getattr(shard, "batched", False):
        raise NotImplementedError("on_worker_error='restart' does not support batched envs yet")
    n = len(shard.envs)
    shard.pending_seeds = [None] * n
    shard.autoreset = [False] * n
    marks = {}
    for j, env in enumerate(shard.envs):
        marks[j] = env.reset()
    plain_step, plain_reset = shard.step, shard.reset
    same_step = getattr(shard, "same_step", False)
    next_step = getattr(shard, "next_step", False)

    def unmark(j: int):
        mark = marks.pop(j, None)
        if not marks:
            shard.__dict__.pop("step", None)
            shard.__dict__.pop("reset", None)
        return mark

    def step(i: int):
        j = i - shard.start
        mark = unmark(j)
        if mark is None:
            return plain_step(i)
        obs, info = mark
        views.reward[i] = 0.0
        views.terminated[i] = False
        views.truncated[i] = True
        shard.write_obs(i, obs)
        if next_step:
            shard.autoreset[j] = True
        info = {**own_info(info), "worker_restarted": True}
        if same_step:
            info = same_step_info({"final_obs": obs, "final_info": {}}, info)
        return info

    def reset(i: int, seed=None, options=None):
        unmark(i - shard.start)
        return plain_reset(i, seed, options)

    shard.step = step
    shard.reset = reset


def _pack_infos(extra: dict) -> bytes:
    """An env's non-numeric infos as one blob; what cannot be pickled is named (``TypeError``)."""
    try:
        return P.pack(extra)
    except Exception:
        culprit = P.first_unpicklable(extra)
        if culprit is None:
            raise
        key, exc = culprit
        raise TypeError(f"info key {key!r} cannot be pickled: {exc}") from exc


def close_quietly(env) -> None:
    try:
        env.close()
    except Exception:
        pass


class Server:
    """The command loop of one worker."""

    def __init__(self, conn, index, wire, views, shard: Shard, policy, slice_ns, watch: ParentWatch | None) -> None:
        self.conn = conn
        self.index = index
        self.wire = wire
        self.views = views
        self.shard = shard
        self.policy = policy
        self.slice_ns = slice_ns
        self.watch = watch
        self.seen = 0                   # sequence of the last command served
        self.outbox: list = []   # side messages waiting for their results to be published
        # A shard stepped in the parent's process hands its side messages over unencoded.
        if getattr(conn, "in_process", False):
            self.encode, self.send_side = P.handed_over, conn.send_message
        else:
            self.encode, self.send_side = P.encode_for_parent, conn.send_bytes
        self.phase = "step"             # what a failing info write is reported as
        self.closing: int | None = None  # the env whose close() runs
        if shard.obs_pickled is not None:  # observation leaves that travel pickled (shmpool.pickled)
            self._finish_env = self._finish_slow_env

    def serve(self) -> None:
        wire, index = self.wire, self.index
        while True:
            if not wire.wait_command(index, self.seen, self.policy, self.slice_ns):
                if not self.watch.alive():
                    os._exit(0)
                continue
            if not self.handle():
                return

    def serve_posted(self) -> None:
        """Serve the command posted since the last one served, if any, without waiting
        (a shard the pool's own process steps: ``shmpool.hosted_shard``)."""
        if self.wire.cmd_seq(self.index) != self.seen:
            self.handle()

    def serve_some(self, limit: int) -> int:
        """A hosted shard inside ``recv``: serve the posted command (an async one only up to
        ``limit`` of its requests; the rest wait for the next call) and return how many envs
        were served.  So ``recv`` returns once its batch is full, and the worker processes
        get their next work sooner."""
        wire, index = self.wire, self.index
        if wire.cmd_seq(index) != self.seen:
            seq, cmd = wire.command(index)
            if cmd != P.CMD_ASYNC:
                self.handle()
                return 0
            wire.finish(index, seq)
            self.seen = seq
        return self.drain(limit)

    def handle(self) -> bool:
        """Carry out the newest command; False once it was ``CMD_EXIT``."""
        wire, index = self.wire, self.index
        # Commands posted since ``seen`` may overwrite one another; only an
        # async command can be overtaken (the parent steps or resets only
        # with nothing in flight), and its requests are served anyway.
        seq, cmd = wire.command(index)
        if cmd == P.CMD_STEP:
            self.step_shard()
            # Shard counter first, done sequence second: once the parent
            # reads done == posted for a worker, that worker's count is in
            # the sync counter (a restart re-bases the counter on that).
            wire.finish_shard()
            wire.finish(index, seq)
            self.flush()
        elif cmd == P.CMD_ASYNC:
            self.drain()
            wire.finish(index, seq)
        elif cmd == P.CMD_MESSAGE:
            # A call may come while envs are in flight (their async command
            # overwritten by this one): serve them first, recv() gets them.
            self.drain()
            # The message is in the pipe before its command is posted. The
            # command word can be read as a newer post's while its sequence
            # is still the older one's, so the same message command may be
            # seen twice: only a message actually waiting is answered.
            while self.conn.poll(0):
                msg = P.next_command(self.conn)
                if type(msg) is P.PickledActions:  # for steps that needed none (autoreset, restart)
                    self.shard.pickled_actions.absorb(msg)
                    continue
                self.message(msg)
                break
            wire.finish(index, seq)
        elif cmd == P.CMD_EXIT:
            self.exit(seq)
            self.seen = seq
            return False
        self.seen = seq
        return True

    def flush(self) -> None:
        """Send the side messages of results already published.

        Sending only after publishing means the parent is never waiting on a
        result while this worker waits for room in the pipe (it holds ~90 kB):
        the parent reads side messages after it has seen the result, and
        drains the pipes while it waits."""
        send = self.send_side
        for data in self.outbox:
            send(data)
        self.outbox.clear()

    def _finish_env(self, i: int, info) -> None:
        """Write the info and status of env ``i`` (results are already in place).  An info that
        cannot be written or sent fails the env (its ``EnvError`` names the key), never the worker."""
        try:
            extra = self.shard.infos.write(i, info) if info else None
            if extra:
                # Pickled now: the env may reuse these objects once stepped again.
                self.outbox.append(self.encode(P.Extra(i, _pack_infos(extra))))
                self.views.status[i] = P.STATUS_EXTRA
                return
        except Exception as exc:
            self._fail_env(i, self.phase, exc)
            return
        if not info:
            self.views.info_mask[i] = 0
        self.views.status[i] = P.STATUS_OK

    def _finish_slow_env(self, i: int, info) -> None:
        """``_finish_env`` when observation leaves travel pickled: every result that wrote
        an observation sends them in its Extra (``shmpool.pickled``)."""
        try:
            extra = self.shard.infos.write(i, info) if info else None
            if not info:
                self.views.info_mask[i] = 0
            pickled = self.shard.take_pickled_obs(i)
            if extra is None and pickled is None:
                self.views.status[i] = P.STATUS_OK
                return
            infos = _pack_infos(extra or {})
            try:
                pickled_blob = None if pickled is None else P.pack(pickled)
            except Exception as exc:  # the observation itself cannot be pickled
                self._fail_env(i, "observation", exc)
                return
            self.outbox.append(self.encode(P.Extra(i, infos, pickled_blob)))
            self.views.status[i] = P.STATUS_EXTRA
        except Exception as exc:
            self._fail_env(i, self.phase, exc)

    def _fail_env(self, i: int, phase: str, exc: BaseException) -> None:
        self.outbox.append(self.encode(P.Failure.of(i, phase, exc)))
        self.views.info_mask[i] = 0
        self.views.status[i] = P.STATUS_ERROR

    def step_shard(self) -> None:
        shard = self.shard
        self.phase = "step"
        if shard.batched:  # the whole shard in one call of its batched env
            shard.run(shard.all_ids, False, self._finish_env, self._fail_env)
            return
        step, pickled = shard.step, shard.obs_pickled is not None
        # The common case (no infos, no error) for the whole shard in two slice writes:
        # the exceptions below overwrite their env's status and mask.
        self.views.status[shard.start:shard.stop] = P.STATUS_OK
        self.views.info_mask[shard.start:shard.stop] = 0
        for i in range(shard.start, shard.stop):
            try:
                info = step(i)
            except Exception as exc:
                self._fail_env(i, "step", exc)
                continue
            if info or pickled:
                self._finish_env(i, info)

    def drain(self, limit: int = -1) -> int:
        """Serve the async request ring until it is empty (or ``limit`` envs were served),
        publishing each env; returns how many were served (a batched shard: all of them)."""
        wire, shard, index = self.wire, self.shard, self.index
        if shard.batched:
            # Every pending request first, then one call for them all, then publish each.
            served = 0
            while True:
                reqs = []
                req = wire.pop_request(index)
                while req >= 0:
                    reqs.append(req)
                    req = wire.pop_request(index)
                if not reqs:
                    return served
                served += len(reqs)
                shard.serve_requests(reqs, self._finish_env, self._fail_env, wire.publish)
                if self.outbox:
                    self.flush()
        served = 0
        while served != limit:
            req = wire.pop_request(index)
            if req < 0:
                return served
            served += 1
            i = req & P.REQ_ENV_MASK
            phase = self.phase = "reset" if req & P.REQ_RESET else "step"
            try:
                info = shard.reset(i) if req & P.REQ_RESET else shard.step(i)
            except Exception as exc:
                self._fail_env(i, phase, exc)
            else:
                self._finish_env(i, info)
            wire.publish(i)
            if self.outbox:
                self.flush()
        return served

    def message(self, msg: P.ToWorker) -> None:
        """Carry out a message command and answer it (``Reply`` or ``CallFailed``, with its call number)."""
        shard, call = self.shard, msg.call
        phase = type(msg).__name__.lower()
        try:
            if type(msg) is P.Reset:
                self.reset(msg)
                values = None
            elif type(msg) is P.Restart:
                restarted(shard, self.views)
                values = None
            elif type(msg) is P.EnvCall:
                phase = f"{msg.op} {msg.name!r}"
                values = []
                for k, blob in zip(msg.envs, msg.payloads):
                    try:
                        result = self.env_call(shard.envs[k], msg.op, msg.name, P.unpack(blob))
                    except Exception as exc:
                        self._failed(call, shard.start + k, phase, exc)
                        return
                    if msg.op != P.SET_ATTR:
                        try:
                            values.append(P.pack(result))
                        except Exception as exc:
                            self._failed(call, shard.start + k, f"{phase} (sending the result)", exc)
                            return
                if msg.op == P.SET_ATTR:
                    values = None
            else:
                raise P.ProtocolError(f"unexpected message {type(msg).__name__} after start-up")
        except Exception as exc:
            self._failed(call, None, phase, exc)
            return
        self.flush()
        P.report(self.conn, P.Reply(call, values))

    def reset(self, msg: P.Reset) -> None:
        shard, seeds, options, mask = self.shard, msg.seeds, msg.options, msg.mask
        per_env = isinstance(options, list)
        self.phase = "reset"
        try:
            if shard.batched:
                try:
                    unpacked = [P.unpack(o) for o in options] if per_env else P.unpack(options)
                except Exception as exc:
                    for k, i in enumerate(range(shard.start, shard.stop)):
                        if mask is None or mask[k]:
                            self._fail_env(i, "reset", exc)
                    return
                shard.reset_message(seeds, unpacked, mask, self._finish_env, self._fail_env)
                return
            shared = None
            if not per_env:
                try:
                    shared = P.unpack(options)
                except Exception as exc:
                    shared = exc
            for k, i in enumerate(range(shard.start, shard.stop)):
                if mask is not None and not mask[k]:
                    # A partial reset leaves this env alone; its old infos
                    # must not be read as part of this reset.
                    self.views.info_mask[i] = 0
                    self.views.status[i] = P.STATUS_OK
                    continue
                try:
                    env_options = P.unpack(options[k]) if per_env else shared
                    if isinstance(env_options, BaseException):  # the shared options could not be rebuilt
                        raise env_options
                    info = shard.reset(i, seeds[k], env_options)
                except Exception as exc:
                    self._fail_env(i, "reset", exc)
                    continue
                self._finish_env(i, info)
        finally:
            self.phase = "step"

    @staticmethod
    def env_call(env, op: str, name: str, payload):
        answer = Server.call_env(env, op, name, payload)
        if forks.in_child:
            forks.leave_child(f"the env's {name or op}")
        return answer

    @staticmethod
    def call_env(env, op: str, name: str, payload):
        if op == P.CALL:
            attr = _get(env, name)
            args, kwargs = payload
            return attr(*args, **kwargs) if callable(attr) else attr
        if op == P.GET_ATTR:
            return _get(env, name)
        if op == P.SET_ATTR:
            return _set(env, name, payload)
        fn, args, kwargs = payload
        return fn(env, *args, **kwargs)

    def _failed(self, call: int, env_id, phase: str, exc: BaseException) -> None:
        """A message command failed as a whole: this is its reply."""
        P.report(self.conn, P.CallFailed.of_call(call, env_id, phase, exc))

    def exit(self, seq: int) -> None:
        failures = []
        for k, env in enumerate(self.shard.envs):
            self.closing = self.shard.start + k   # who hung, if close() never returns (a hosted shard)
            try:
                env.close()
            except Exception as exc:
                failures.append(P.Failure.of(self.shard.start + k, "close", exc))
        P.report(self.conn, P.Closed(failures))
        self.wire.finish(self.index, seq)
