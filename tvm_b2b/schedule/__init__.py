"""Schedules of the fused op, one rule per file (dlight style: apply(func, target) -> Schedule | None).

schedule_for picks the first rule that accepts the target.
"""
from __future__ import annotations

from . import cpu

RULES = [cpu]


def schedule_for(spec, func, target):
    """The scheduled PrimFunc of `func` (the fused op or one unfused stage) for `target`."""
    for rule in RULES:
        sch = rule.apply(func, target)
        if sch is not None:
            return sch.mod["main"]
    raise ValueError(f"target: no schedule for {target.kind.name} targets yet")
