"""CUDA rule of the grouped single convolution (op.conv with groups > 1: MobileNet's depthwise 3x3,
ResNeXt's grouped 3x3 of 4 and 8 channels a group, wherever they do not fuse with a 1x1; cuda_conv takes groups of
16-channel multiples on tensor cores), on CUDA cores: these have too little reduction per output (kh kw c / groups)
for tensor cores, and are bound by memory.

One thread per `channel_lanes` consecutive output channels of a pixel: its accumulators in registers,
the taps unrolled, x and w read along the channels as vectors of 4 fp16 (8 bytes: float32 vectors are
at most 4 wide, common.vectorize_float32; the window's reuse across neighbouring pixels comes from L1),
the padding by predicate, the scale/bias/[residual]/act epilogue stored the same way. No parameters to tune.
Tried and dropped (H200, bench/results/convs_grouped_h200_s16_split_lanes.txt): each output's reduction split
over 8 threads (4-channel slices, a warp-shuffle sum), for ResNeXt-50's 16-32 channels a group at batch 1: slower
everywhere (7x7 1024 groups=32: 19.3 against 14.0 us; 14x14 512: 22.8 against 7.3; ResNeXt-50 b1 479 against 392
us), its weight reads 2 KB apart per thread along the reduction (HWIO's k fastest). A split that keeps the lanes
on k (the reduction over threadIdx.y, a shared-memory sum) or (k, c) weights is the next thing to try.
"""
from __future__ import annotations

from tvm import s_tir

from ..op.conv import ConvSpec, conv_prim_func
from .common import ParameterlessRule, conv_in_registers, vector_lanes, vectorize_float32

THREADS = 128


def channel_lanes(spec: ConvSpec) -> int:
    """Output channels per thread: 8 (two 8-byte vectors) for a depthwise conv, whose channels read distinct
    inputs; 2 where a group has several input channels, all of a thread's outputs then reading the same
    ones (a long reduction per output: more threads hide its latency; ResNeXt-50's 7x7 layers at batch 1)."""
    return vector_lanes(spec.k, 8 if spec.c == spec.groups else 2)


def schedule_grouped_conv(func, spec: ConvSpec) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    out, conv = sch.get_sblock("out"), sch.get_sblock("conv")
    pixels, channels = sch.get_loops(out)
    channels, vector = sch.split(channels, [None, channel_lanes(spec)])  # before fusing: see cuda_grouped_pair
    block, thread = sch.split(sch.fuse(pixels, channels), [None, THREADS])
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.compute_inline(sch.get_sblock("pad"))
    conv_in_registers(sch, conv, thread)
    vectorize_float32(sch, vector)
    return sch


class GroupedConvRule(ParameterlessRule):
    """Grouped convs (groups > 1) in float16 or float32 on any CUDA GPU; no parameters."""

    name = "CUDA"
    what = "the grouped conv's CUDA-core schedule"

    def can_implement(self, spec: ConvSpec, info) -> str | None:
        if spec.groups == 1:
            return "a dense conv (groups=1): the tensor-core rule's"
        return None

    def workload(self, spec: ConvSpec):
        """The conv's PrimFunc as an IRModule ("main"): what its measured record (tune, one trial: no
        parameters) is keyed on, so that a pair's fusion can be decided by measurement."""
        import tvm

        return tvm.IRModule({"main": conv_prim_func(spec)})

    def plan(self, spec: ConvSpec, info, config=None, fused: bool = True, policy: bool = False, unfused: bool = True):
        from . import Plan

        sch = schedule_grouped_conv(conv_prim_func(spec), spec)
        return Plan([sch.mod["main"]], True, None, "", None, [sch], kernel="cuda-core")


RULE = GroupedConvRule()
