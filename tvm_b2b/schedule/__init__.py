"""Schedules of the fused op, one rule per file (dlight style: each takes a PrimFunc and returns
its Schedule). `scheduled_funcs` picks the rule for a target and returns the kernels to build:
one for the fused op, or two (stage 1 then stage 2) for the unfused baseline or a fallback.
"""
from __future__ import annotations

import logging

from ..op.spec import FusedConvSpec
from ..target import cuda_arch_number

log = logging.getLogger("tvm_b2b")


def scheduled_funcs(spec: FusedConvSpec, target, fused: bool = True) -> tuple[list, tuple | None]:
    """(scheduled PrimFuncs for `target`, each with its own global symbol, in run order; shape of
    the intermediate's global buffer when there are two, else None)."""
    kind = target.kind.name
    if kind == "llvm":
        from . import cpu
        from ..op.compute import fused_prim_func, unfused_prim_funcs

        funcs = [fused_prim_func(spec)] if fused else list(unfused_prim_funcs(spec))
        return [cpu.apply(f, target).mod["main"] for f in funcs], None if fused else (spec.m, spec.k1)
    if kind == "cuda":
        from . import cuda_wmma

        arch = cuda_arch_number(target)
        reason = cuda_wmma.unsupported_reason(spec, arch)
        if reason:
            raise ValueError(f"target: no CUDA schedule for this spec: {reason}")
        cfg = cuda_wmma.fit_config(spec, cuda_wmma.WmmaConfig())
        need, have = cuda_wmma.shared_bytes(spec, cfg), cuda_wmma.max_shared_bytes(arch)
        if fused and need > have:
            log.warning("not fused: %s needs %d KiB of shared memory, sm_%d has %d KiB; running two "
                        "tensor-core kernels instead", spec.to_string(), need // 1024, arch, have // 1024)
            fused = False
        ext = cuda_wmma.extents(spec, cfg)
        return cuda_wmma.scheduled_funcs(spec, fused, cfg), None if fused else (ext["m"], ext["k1"])
    raise ValueError(f"target: no schedule for {kind} targets (use llvm or cuda)")
