"""Garbage the trainer holds at the moment a worker forks: a reference cycle whose finalizer says which
process ran it, and an env whose constructor collects (tests of what a forked worker must not run;
shared by the pool's and RayPool's tests)."""
from envs import ScriptEnv


class FinalizerMarker:
    """A reference cycle whose finalizer writes down the process that ran it.  Ray's zero-copy arrays
    are such objects: their release goes through the trainer's connection to its object store, and a
    forked worker that collected one exited with code 1 and no words."""

    def __init__(self, path: str):
        self.path = path
        self.me = self

    def __del__(self):
        import os
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


class _HeldUntilFork:
    held: list = []
    hooked = False


def garbage_at_next_fork(obj) -> None:
    """Hold ``obj`` until the next fork of this process, then drop it there: a cycle is garbage at the
    very moment the child is made, too young for any collection of the parent's to have run."""
    if not _HeldUntilFork.hooked:   # once per process: a fork hook cannot be removed
        import os
        os.register_at_fork(before=_HeldUntilFork.held.clear)
        _HeldUntilFork.hooked = True
    _HeldUntilFork.held.append(obj)


class CollectingEnv(ScriptEnv):
    """An env whose constructor runs a full collection (as some do, to free a previous model's memory)."""

    def __init__(self):
        import gc
        gc.collect()
        super().__init__()
