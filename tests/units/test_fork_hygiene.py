"""What a worker lets go of after a fork from the trainer is one room (``workers/inherited.py``): one function
the worker's entry calls first, its steps in their order."""
import inspect

import shmpool.workers.inherited as inherited
from shmpool.workers import loop


def test_the_steps_run_in_their_order(monkeypatch):
    done = []
    for step in ("set_aside_trainer_objects", "drop_inherited_regions", "shed_sockets", "one_thread_each"):
        monkeypatch.setattr(inherited, step, lambda *args, step=step: done.append((step, args)))
    inherited.let_go_of_the_trainer({7}, "libraries")
    # The trainer's objects first (any later step allocates), other pools' regions before this worker maps
    # its own, the thread limits before any env is built.
    assert done == [("set_aside_trainer_objects", ()), ("drop_inherited_regions", ()), ("shed_sockets", ({7},)),
                    ("one_thread_each", ("libraries",))]


def test_the_worker_entry_lets_go_first():
    body = inspect.getsource(loop.main).split('"""')[-1]
    calls = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert calls[:2] == ["try:", "let_go_of_the_trainer({conn.fileno()}, libraries)"], calls[:3]
