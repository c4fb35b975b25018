"""Autoreset modes, named as gymnasium's ``AutoresetMode`` (NEXT_STEP, SAME_STEP, DISABLED)."""
from __future__ import annotations

from .gym_compat import AutoresetMode

NEXT_STEP, SAME_STEP, DISABLED = "next_step", "same_step", "disabled"
_BY_NAME = {
    NEXT_STEP: NEXT_STEP, SAME_STEP: SAME_STEP, DISABLED: DISABLED,
    AutoresetMode.NEXT_STEP.value.lower(): NEXT_STEP,
    AutoresetMode.SAME_STEP.value.lower(): SAME_STEP,
    AutoresetMode.DISABLED.value.lower(): DISABLED,
}


def parse_autoreset_mode(mode: str | AutoresetMode) -> str:
    """``"next_step"``, ``"same_step"`` or ``"disabled"`` from a name or gymnasium's enum."""
    if isinstance(mode, AutoresetMode):
        mode = mode.value
    if isinstance(mode, str) and mode.lower() in _BY_NAME:
        return _BY_NAME[mode.lower()]
    raise ValueError(
        f"unknown autoreset_mode {mode!r}; use 'next_step', 'same_step', 'disabled' or gymnasium's AutoresetMode")


def as_gymnasium(mode: str) -> AutoresetMode:
    return {NEXT_STEP: AutoresetMode.NEXT_STEP, SAME_STEP: AutoresetMode.SAME_STEP,
            DISABLED: AutoresetMode.DISABLED}[mode]
