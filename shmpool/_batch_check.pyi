"""Type stubs for a whole batch's action check in one C call (see _batch_check.pyx)."""
import numpy as np

NOT_WHOLE: int
PASSED: int
CHECK_IN_PYTHON: int
SHAPE_ONLY: int
INT_RANGE: int
NO_NAN: int
FINITE: int
UNSCANNED: int

class BatchCheck:
    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], scan: int, lo: int = 0, hi: int = 0) -> None: ...
    def check(self, actions: object) -> int: ...
    def values_pass(self, actions: object) -> bool: ...
