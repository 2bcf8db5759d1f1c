"""CPU (llvm) schedule of the fused op: one parallel loop over tiles of output pixels; each tile
computes its 3x3-conv rows for all k1 channels into a small float32 buffer (cache-resident),
then the 1x1 conv on them, vectorized over output channels.

Also schedules either stage of the unfused baseline, with the same tiling.
"""
from __future__ import annotations

from tvm import s_tir

from ..op.compute import fused_prim_func, unfused_prim_funcs
from ..target import target_info
from .common import ParameterlessRule, has_block, vector_lanes

PIXELS_PER_TILE = 16
# Register block of the reductions: REG_PIXELS x REG_CHANNELS float32 accumulators stay in
# vector registers through the reduction (4 x 64 = 16 AVX-512 registers, 32 AVX2 ones).
REG_PIXELS = 4
REG_CHANNELS = 64


def schedule_reduction(sch, block, tile_loop, vec_extent: int):
    """compute_at `block` (a GEMM-like reduction over (m, k)) under `tile_loop` and register-block
    it: for each group of REG_PIXELS pixels x REG_CHANNELS channels, run the whole reduction
    with the accumulators in vector registers (inner loops unrolled), then move on."""
    sch.compute_at(block, tile_loop, preserve_unit_loops=True)
    # the tile loop is the outermost one (see tile_output): the block's own loops follow it
    m, k, *reduction = sch.get_loops(block)[1:]
    lanes = vector_lanes(vec_extent)
    vectors = max(1, min(REG_CHANNELS // lanes, vec_extent // lanes))
    while (vec_extent // lanes) % vectors:
        vectors -= 1
    k_outer, k_mid, k_inner = sch.split(k, [None, vectors, lanes])
    m_outer, m_inner = sch.split(m, [None, REG_PIXELS])
    sch.reorder(k_outer, m_outer, *reduction, m_inner, k_mid, k_inner)
    # vectorize before decomposing: the update block alone is not a complete block
    sch.vectorize(k_inner)
    sch.unroll(k_mid)
    sch.unroll(m_inner)
    init = sch.decompose_reduction(block, reduction[0])
    sch.vectorize(sch.get_loops(init)[-1])


def _schedule_elementwise(sch, block, tile_loop, extent: int):
    sch.compute_at(block, tile_loop, preserve_unit_loops=True)
    inner = sch.get_loops(block)[-1]
    _, lanes = sch.split(inner, [None, vector_lanes(extent)])
    sch.vectorize(lanes)


def tile_output(sch, block_name: str):
    """Split the output block's m loop into parallel tiles; return (tile loop, output loops)."""
    block = sch.get_sblock(block_name)
    m, k = sch.get_loops(block)
    tile, pixel = sch.split(m, [None, PIXELS_PER_TILE])
    sch.parallel(tile)
    return block, tile, k


def schedule_cpu(func) -> s_tir.Schedule:
    """Schedule the fused PrimFunc, or either unfused stage (recognized by its blocks)."""
    sch = s_tir.Schedule(func)
    fused = has_block(sch, "conv1") and has_block(sch, "conv2")
    last = "out" if has_block(sch, "out") else "mid"
    out, tile, k = tile_output(sch, last)
    out_extent = int(sch.get(k).extent)
    _, lanes = sch.split(k, [None, vector_lanes(out_extent)])
    sch.vectorize(lanes)
    if has_block(sch, "conv2"):
        k2 = int(sch.get(sch.get_loops(sch.get_sblock("conv2"))[-2]).extent)
        schedule_reduction(sch, sch.get_sblock("conv2"), tile, k2)
    if fused:
        k1 = int(sch.get(sch.get_loops(sch.get_sblock("mid"))[-1]).extent)
        _schedule_elementwise(sch, sch.get_sblock("mid"), tile, k1)
    if has_block(sch, "conv1"):
        sch.compute_inline(sch.get_sblock("pad"))
        k1 = int(sch.get(sch.get_loops(sch.get_sblock("conv1"))[-4]).extent)
        schedule_reduction(sch, sch.get_sblock("conv1"), tile, k1)
    return sch


def apply(func, target) -> s_tir.Schedule | None:
    """dlight-style entry: a schedule for llvm targets, None for any other."""
    if target_info(target).kind != "llvm":
        return None
    return schedule_cpu(func)


class CpuRule(ParameterlessRule):
    """The CPU rule: any spec, no parameters; fused whenever asked (no fusion policy)."""

    name = "CPU"
    what = "the CPU schedule"

    def can_implement(self, spec, info) -> str | None:
        return None

    def plan(self, spec, info, config=None, fused: bool = True, policy: bool = False,
             unfused: bool = True):
        from . import Plan

        funcs = [fused_prim_func(spec)] if fused else list(unfused_prim_funcs(spec))
        schedules = [schedule_cpu(f) for f in funcs]
        return Plan([s.mod["main"] for s in schedules], fused, None, "" if fused else "the two-kernel form was asked for",
                     None if fused else (spec.m, spec.k1), schedules, kernel="cpu")


RULE = CpuRule()
