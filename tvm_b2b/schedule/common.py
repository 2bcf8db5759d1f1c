"""Helpers shared by the schedule rules."""
from __future__ import annotations

from tvm import s_tir


def vector_lanes(extent: int, widest: int = 16) -> int:
    """The widest power-of-two vector <= `widest` that divides `extent` (1 when it is odd): the
    vectorized loop then needs no tail predicate."""
    lanes = widest
    while lanes > 1 and extent % lanes:
        lanes //= 2
    return lanes


def has_block(sch: s_tir.Schedule, name: str) -> bool:
    try:
        sch.get_sblock(name)
        return True
    except Exception:  # noqa: BLE001 - tvm raises its own error type for a missing block
        return False
