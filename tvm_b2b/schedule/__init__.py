"""Schedules of the fused op, one rule per target kind and file: `cpu` (llvm; also a dlight-style
`apply(func, target)`) and `cuda_wmma` (tensor cores). Each rule's `scheduled_funcs` builds the
op's PrimFuncs in the form it schedules and returns the kernels to build: one for the fused op,
or two (stage 1 then stage 2) for the unfused baseline or a fallback.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..op.spec import FusedConvSpec
from ..target import target_info


@dataclass
class Kernels:
    """What a schedule rule hands to the build."""

    funcs: list  # scheduled PrimFuncs, each with its own global symbol, in run order
    mid_shape: tuple | None = None  # the intermediate's global buffer when there are two


def scheduled_funcs(spec: FusedConvSpec, target, fused: bool = True, config=None) -> Kernels:
    """The op's kernels for `target`; `config` is the rule's parameter set (None: defaults)."""
    kind = target_info(target).kind
    if kind == "llvm":
        from . import cpu

        if config is not None:
            raise ValueError("config: the CPU schedule takes no parameters")
        return cpu.scheduled_funcs(spec, fused)
    if kind == "cuda":
        from . import cuda_wmma

        if isinstance(config, str):
            config = cuda_wmma.WmmaConfig.parse(config)
        return cuda_wmma.scheduled_funcs(spec, target, fused, config)
    raise ValueError(f"target: no schedule for {kind} targets (use llvm or cuda)")
