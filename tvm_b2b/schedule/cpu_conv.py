"""CPU (llvm) rule of the single convolution (op.conv, direct form): the fused pair's CPU tiling
(cpu.py) on one convolution: a parallel loop over tiles of output pixels, the reduction over the
taps and channels register-blocked and vectorized over output channels, the padding inlined."""
from __future__ import annotations

from tvm import s_tir

from ..op.conv import ConvSpec, conv_prim_func
from .common import vector_lanes
from .cpu import CpuRule, schedule_reduction, tile_output


def schedule_conv_cpu(func) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    _, tile, k = tile_output(sch, "out")
    extent = int(sch.get(k).extent)
    _, lanes = sch.split(k, [None, vector_lanes(extent)])
    sch.vectorize(lanes)
    schedule_reduction(sch, sch.get_sblock("conv"), tile, extent)
    sch.compute_inline(sch.get_sblock("pad"))
    return sch


class ConvCpuRule(CpuRule):
    """Any conv spec, no parameters, one kernel."""

    def plan(self, spec: ConvSpec, info, config=None, fused: bool = True, policy: bool = False,
             unfused: bool = True):
        from . import Plan

        sch = schedule_conv_cpu(conv_prim_func(spec))
        return Plan([sch.mod["main"]], True, None, "", None, [sch], kernel="cpu")


RULE = ConvCpuRule()
