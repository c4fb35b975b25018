"""The shapes of CleanRL's Atari scripts as docs/porting/cleanrl.md ports them.

Each test builds the envs as the ported script builds them and uses them as its loop does (the
calls, the info keys it reads, what it computes from them), with random actions, and checks what
the script relies on against a reference where one exists: gymnasium's ``SyncVectorEnv`` for
``ppo_atari.py``, envpool itself for ``ppo_atari_envpool.py`` and ``ppo_rnd_envpool.py``.  (Our
code, not CleanRL's: the scripts' env lines are reproduced, not copied.)
"""
from __future__ import annotations

import subprocess
import sys

import pytest


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


# --- ppo_atari.py: gymnasium's Atari ids ---------------------------------------------------------


@pytest.mark.slow   # a fresh interpreter imports shmpool and ale-py: 2-10 s
def test_import_shmpool_registers_the_ids_ppo_atari_makes():
    """CleanRL's ``ppo_atari.py`` makes ``BreakoutNoFrameskip-v4`` in each env's closure.  Under
    gymnasium 0.29, ale-py >= 0.9 (the releases with ROMs, what ``shmpool[atari]`` installs)
    registers no ids on import; after ``import shmpool`` they are there under either gymnasium."""
    pytest.importorskip("ale_py")
    done = _fresh("import shmpool, gymnasium\n"
                  "for name in ('BreakoutNoFrameskip-v4', 'ALE/Pong-v5', 'shmpool/BreakoutNoFrameskip-v4'):\n"
                  "    print(gymnasium.spec(name).id)")
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split() == ["BreakoutNoFrameskip-v4", "ALE/Pong-v5", "shmpool/BreakoutNoFrameskip-v4"]
