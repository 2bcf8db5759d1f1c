"""Schedules of the fused op, one rule per target kind and file: `cpu` (llvm; also a dlight-style
`apply(func, target)`) and `cuda_wmma` (tensor cores). Each rule's `scheduled_funcs` builds the
op's PrimFuncs in the form it schedules and returns the kernels to build: one for the fused op,
or two (stage 1 then stage 2) for the unfused baseline or a fallback.
"""
from __future__ import annotations

from ..op.spec import FusedConvSpec


def scheduled_funcs(spec: FusedConvSpec, target, fused: bool = True) -> tuple[list, tuple | None]:
    """(scheduled PrimFuncs for `target`, each with its own global symbol, in run order; shape of
    the intermediate's global buffer when there are two, else None)."""
    kind = target.kind.name
    if kind == "llvm":
        from . import cpu

        return cpu.scheduled_funcs(spec, fused)
    if kind == "cuda":
        from . import cuda_wmma

        return cuda_wmma.scheduled_funcs(spec, target, fused)
    raise ValueError(f"target: no schedule for {kind} targets (use llvm or cuda)")
