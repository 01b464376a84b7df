"""Run-time switches shared by notebooks, benchmarks and tests."""
from __future__ import annotations

import os

__all__ = ["fast_mode", "pick"]


def fast_mode() -> bool:
    """True when ``SAZO_FAST=1`` (set by ``make test``): notebooks shrink steps, seeds and grids."""
    return os.environ.get("SAZO_FAST", "0").strip().lower() in ("1", "true", "yes")


def pick(full, fast):
    """``fast`` in fast mode, ``full`` otherwise: ``steps = pick(5000, 300)``."""
    return fast if fast_mode() else full
