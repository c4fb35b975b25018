"""A worker killed while registering a numeric info key must not hang the others
(issue 12, bug 5): a claim (FREE -> CLAIMING) whose writer died is freed and taken over."""
import mmap
import os
import time

import gymnasium as gym
import numpy as np

from shmpool import _core, infos
from shmpool import layout as L


def _region():
    space = gym.spaces.Box(0, 1, (1,), np.float32)
    lay = L.Layout.build(2, [1, 1], space, gym.spaces.Discrete(2))
    buf = mmap.mmap(-1, lay.size)     # shared with forked children
    return buf, L.Views(lay, buf)


def _in_child(fn) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        finally:
            os._exit(0)
    return pid


def test_a_claim_whose_writer_died_is_taken_over():
    buf, views = _region()

    def die_mid_claim():
        _core.store_word = lambda *a: os._exit(0)   # killed between claiming and marking READY
        infos.InfoWriter(views, buf).write(0, {"x": 1})

    _, status = os.waitpid(_in_child(die_mid_claim), 0)
    off = views.registry_offset
    assert _core.load_word(buf, off) not in (infos.FREE, infos.READY), "the child did not die mid-claim"

    def register():
        infos.InfoWriter(views, buf).write(1, {"x": 2})

    pid = _in_child(register)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("a worker spins forever on a claim whose writer died")
    assert _core.load_word(buf, off) == infos.READY
    assert infos.read_entry(views, 0)[0] == "x"
    assert int(views.info_mask[1]) == 1
