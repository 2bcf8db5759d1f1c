"""CUDA rule of the grouped single convolution (op.conv with groups > 1: MobileNet's depthwise 3x3,
ResNeXt's grouped 3x3, wherever they do not fuse with a 1x1), on CUDA cores: a grouped conv has too
little reduction per output (kh kw c / groups) for tensor cores, and is bound by memory.

One thread per `channel_lanes` consecutive output channels of a pixel: its accumulators in registers,
the taps unrolled, x and w read along the channels as vectors of 4 fp16 (8 bytes: float32 vectors are
at most 4 wide, common.vectorize_float32; the window's reuse across neighbouring pixels comes from L1),
the padding by predicate, the scale/bias/[residual]/act epilogue stored the same way.

Where a group has many input channels and the conv few outputs (ResNeXt-50's 14x14 and 7x7 layers at batch 1:
16 and 32 channels a group, 9 taps), that leaves few threads each with a long serial reduction. There the
reduction is split instead ("reduction=split"): SPLIT_THREADS threads (threadIdx.x) share each output, each
taking every SPLIT_THREADS-th 4-channel vector of its taps, summed across them by warp shuffles (TVM's
cross-thread reduction). The one parameter, `reduction` ("thread" or "split"), is chosen by `default_config`;
nothing is searched.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir

from ..op.conv import ConvSpec, conv_prim_func
from .common import conv_in_registers, vector_lanes, vectorize_float32

THREADS = 128
SPLIT_THREADS = 8  # threads sharing one output's reduction (threadIdx.x; 4 outputs a warp)
SPLIT_LANES = 4  # input channels a thread reads at once (an 8-byte vector of fp16)
SPLIT_MIN_CHANNELS = 16  # input channels per group from which a reduction may be split
SPLIT_BELOW_THREADS = 64 * 1024  # split where the one-thread form has fewer threads than this


@dataclass(frozen=True)
class GroupedConvConfig:
    reduction: str = "thread"  # "thread": each thread its outputs' whole reduction; "split": SPLIT_THREADS per output

    def to_string(self) -> str:
        return f"reduction={self.reduction}"

    @classmethod
    def parse(cls, text: str) -> "GroupedConvConfig":
        fields = dict(item.split("=", 1) for item in text.split(",") if item)
        if set(fields) - {"reduction"} or fields.get("reduction", "thread") not in ("thread", "split"):
            raise ValueError(f"config: the grouped conv takes reduction=thread or reduction=split, got {text!r}")
        return cls(**fields)


def default_config(spec: ConvSpec) -> GroupedConvConfig:
    """The split reduction where a group's channels make a long reduction and the one-thread form few threads."""
    per_group = spec.c // spec.groups
    threads = spec.m * spec.k // channel_lanes(spec)
    split = per_group >= SPLIT_MIN_CHANNELS and per_group % SPLIT_LANES == 0 and threads < SPLIT_BELOW_THREADS
    return GroupedConvConfig("split" if split else "thread")


def channel_lanes(spec: ConvSpec) -> int:
    """Output channels per thread: 8 (two 8-byte vectors) for a depthwise conv, whose channels read distinct
    inputs; 2 where a group has several input channels, all of a thread's outputs then reading the same
    ones (a long reduction per output: more threads hide its latency; ResNeXt-50's 7x7 layers at batch 1)."""
    return vector_lanes(spec.k, 8 if spec.c == spec.groups else 2)


def schedule_grouped_conv(func, spec: ConvSpec, cfg: GroupedConvConfig | None = None) -> s_tir.Schedule:
    if (cfg or default_config(spec)).reduction == "split":
        return schedule_split_reduction(func, spec)
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


def schedule_split_reduction(func, spec: ConvSpec) -> s_tir.Schedule:
    """Each output's reduction over SPLIT_THREADS threads (threadIdx.x), THREADS // SPLIT_THREADS outputs a block
    (threadIdx.y); a thread's partial sum in a register, the partial sums added by TVM's cross-thread reduction."""
    if (spec.c // spec.groups) % SPLIT_LANES:
        raise ValueError(f"config: reduction=split needs input channels per group in multiples of {SPLIT_LANES}")
    sch = s_tir.Schedule(func)
    out, conv = sch.get_sblock("out"), sch.get_sblock("conv")
    pixels, channels = sch.get_loops(out)
    block, output = sch.split(sch.fuse(pixels, channels), [None, THREADS // SPLIT_THREADS])
    sch.bind(block, "blockIdx.x")
    sch.bind(output, "threadIdx.y")
    sch.compute_inline(sch.get_sblock("pad"))
    sch.compute_at(conv, output, preserve_unit_loops=True)
    sch.set_scope(conv, 0, "local")
    *_, rh, rw, rc = sch.get_loops(conv)
    vectors, lane = sch.split(rc, [None, SPLIT_LANES])
    _, thread = sch.split(sch.fuse(rh, rw, vectors), [None, SPLIT_THREADS])
    sch.bind(thread, "threadIdx.x")
    sch.unroll(lane)
    return sch


class GroupedConvRule:
    """Grouped convs (groups > 1) in float16 or float32 on any CUDA GPU; one parameter (`reduction`), not searched."""

    name = "CUDA"
    knobs: dict = {}

    def can_implement(self, spec: ConvSpec, info) -> str | None:
        if spec.groups == 1:
            return "a dense conv (groups=1): the tensor-core rule's"
        return None

    def workload(self, spec: ConvSpec):
        """The conv's PrimFunc as an IRModule ("main"): what its measured record (tune, one trial: no
        parameters) is keyed on, so that a pair's fusion can be decided by measurement."""
        import tvm

        return tvm.IRModule({"main": conv_prim_func(spec)})

    def default_config(self, spec: ConvSpec, info) -> GroupedConvConfig:
        return default_config(spec)

    def parse_config(self, config):
        return GroupedConvConfig.parse(config) if isinstance(config, str) else config

    def plan(self, spec: ConvSpec, info, config=None, fused: bool = True, policy: bool = False, unfused: bool = True):
        from . import Plan

        cfg = config or default_config(spec)
        sch = schedule_grouped_conv(conv_prim_func(spec), spec, cfg)
        return Plan([sch.mod["main"]], True, cfg, "", None, [sch], kernel="cuda-core")


RULE = GroupedConvRule()
