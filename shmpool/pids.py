"""Whether a process id is still alive, for waits that must not outlive their partner."""
from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """False once ``pid`` is gone for good (a process reaped behind multiprocessing's back
    keeps ``exitcode`` None forever, so its pid is what tells)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass   # alive, someone else's
    return True
