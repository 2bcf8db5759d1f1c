"""CUDA tensor-core schedule of the fused op (WMMA 16x16x16, fp16 in, fp32 accumulate): ONE kernel.

Each thread block owns `m_tile` output pixels (rows of both implicit GEMMs):
  1. conv1 = im2col(x) @ w1, in chunks of `n1_tile` channels: im2col and w1 tiles are gathered
     into shared memory by all threads (zero padding by predicate, never materialized in global
     memory), multiplied on tensor cores into fp32 WMMA accumulators, staged in shared memory;
  2. the s1/b1/act1 epilogue writes the chunk as fp16 into `mid`, a shared buffer holding all k1
     channels of the block's pixels (rows padded: no bank conflicts on fragment loads);
  3. conv2 = mid @ w2 in chunks of `n2_tile` channels, A operand read straight from `mid`, w2
     staged through shared memory; the s2/b2/residual/act2 epilogue stores to global memory.
All extents are padded to whole tiles (tvm_b2b.op.compute.padded_extents), so any shape is exact.
The same template, split after step 2 with `mid` in global memory, is the unfused baseline.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from tvm import s_tir

from ..op.compute import fused_prim_func, padded_extents, round_up, unfused_prim_funcs
from ..op.spec import FusedConvSpec
from ..target import cuda_arch_number
from .common import has_block, vector_lanes

log = logging.getLogger(__name__)

MMA = 16  # WMMA fragment edge
WARP = 32
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class WmmaConfig:
    """The template's choices (the tuner samples these)."""

    m_tile: int = 64  # output pixels per thread block
    warps_m: int = 2
    warps_n: int = 2
    k_tile: int = 32  # reduction depth staged in shared memory per step
    n1_tile: int = 64  # conv1 output channels per accumulator pass
    n2_tile: int = 64  # conv2 output channels per accumulator pass

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * WARP

    @classmethod
    def parse(cls, text: str) -> "WmmaConfig":
        """'m_tile=128,warps_m=4' -> WmmaConfig (fields not given keep defaults)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, raw = (p.strip() for p in item.partition("="))
            if key not in fields:
                raise ValueError(f"{key}: not a WmmaConfig field (expected one of {', '.join(fields)})")
            default = fields[key].default
            if isinstance(default, bool):
                values[key] = raw.lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                values[key] = int(raw)
            else:
                values[key] = raw
        return cls(**values)


def fit_config(spec: FusedConvSpec, cfg: WmmaConfig) -> WmmaConfig:
    """Shrink the tiles for small channel counts. Each warp keeps at least two fragments along n
    and k: with one, TVM 0.27 lowers a fragment's access pointer with the wrong element type
    ("tvm_access_ptr element type must match the source buffer")."""
    n_unit = MMA * cfg.warps_n * 2
    return dataclasses.replace(
        cfg,
        n1_tile=min(cfg.n1_tile, round_up(spec.k1, n_unit)),
        n2_tile=min(cfg.n2_tile, round_up(spec.k2, n_unit)),
        k_tile=min(cfg.k_tile, round_up(9 * spec.c, 2 * MMA)),
    )


def extents(spec: FusedConvSpec, cfg: WmmaConfig) -> dict[str, int]:
    ext = padded_extents(spec, cfg.m_tile, k_tile=cfg.k_tile, n_tile=cfg.n1_tile)
    ext["k2"] = round_up(spec.k2, cfg.n2_tile)
    return ext


def _aligned_row(row: int, factor: int, offset: int) -> int:
    """Row stride after storage_align(factor, offset): the smallest >= row that is offset mod factor."""
    return round_up(row - offset, factor) + offset


def shared_bytes(spec: FusedConvSpec, cfg: WmmaConfig) -> int:
    """Shared memory the fused kernel needs, with the padded row strides the schedule asks for
    (upper bound: TVM may overlap dead buffers): the intermediate, one chunk of fp32
    accumulators, the operand tiles."""
    ext, e = extents(spec, cfg), DTYPE_BYTES[spec.dtype]
    mid = cfg.m_tile * _aligned_row(ext["k1"], 64, 8) * e
    acc = cfg.m_tile * _aligned_row(max(cfg.n1_tile, cfg.n2_tile), 32, 4) * 4
    stage1 = cfg.m_tile * _aligned_row(cfg.k_tile, 64, 8) + cfg.k_tile * _aligned_row(cfg.n1_tile, 64, 8)
    stage2 = cfg.k_tile * _aligned_row(cfg.n2_tile, 64, 8)
    return mid + acc + e * max(stage1, stage2)


def max_shared_bytes(arch: int) -> int:
    """Dynamic shared memory per block, by compute capability (CUDA programming guide)."""
    if arch >= 90:
        return 227 * 1024
    if arch in (80, 87):
        return 163 * 1024
    if arch >= 86:
        return 99 * 1024
    if arch == 75:
        return 64 * 1024
    return 96 * 1024


def unsupported_reason(spec: FusedConvSpec, arch: int) -> str | None:
    """Why this template cannot run the spec on tensor cores (None when it can)."""
    if arch < 70:
        return f"sm_{arch} has no tensor cores (needs sm_70 or newer)"
    if spec.dtype != "float16":
        return f"the WMMA template takes float16 only, got {spec.dtype}"
    return None


# -- scheduling -----------------------------------------------------------------------------------
class _Gemm:
    """Loop handles of one tensorized GEMM block."""

    def __init__(self, outer, inner, chunk, warp, k_outer, k_inner):
        self.outer, self.inner, self.chunk, self.warp = outer, inner, chunk, warp
        self.k_outer, self.k_inner = k_outer, k_inner
        self.tensorize_at: list = []
        self.init = None


class WmmaFusedSchedule:
    """Schedules the fused PrimFunc, or either stage of the unfused baseline (recognized by blocks)."""

    def __init__(self, func, spec: FusedConvSpec, cfg: WmmaConfig):
        from tvm.s_tir.tensor_intrin import cuda as intrin  # slow import (~15-60 s): only here

        self.intrin = {
            "load_a": intrin.WMMA_LOAD_16x16x16_F16_A_DYN_INTRIN,
            "load_b": intrin.WMMA_LOAD_16x16x16_F16_B_DYN_INTRIN,
            "sync": intrin.WMMA_SYNC_16x16x16_f16f16f32_INTRIN,
            "fill": intrin.WMMA_FILL_16x16x16_F32_INTRIN,
            "store": intrin.WMMA_STORE_16x16x16_F32_SHARED_DYN_INTRIN,
        }
        self.sch = s_tir.Schedule(func)
        self.spec, self.cfg = spec, cfg

    def run(self) -> s_tir.Schedule:
        sch, cfg = self.sch, self.cfg
        has1, has2 = has_block(sch, "conv1"), has_block(sch, "conv2")
        last = sch.get_sblock("out_pad" if has2 else "mid")  # tiles cover the padded extents
        m, n = sch.get_loops(last)
        block_x, m_in = sch.split(m, [None, cfg.m_tile])
        sch.bind(block_x, "blockIdx.x")
        n_chunk, n_in = sch.split(n, [None, cfg.n2_tile if has2 else cfg.n1_tile])
        sch.reorder(block_x, n_chunk, m_in, n_in)
        if not (has1 and has2):
            # one stage alone: its channel chunks are independent, so they are blocks too (many
            # blocks even where few pixels give few row tiles)
            sch.bind(n_chunk, "blockIdx.y")
        if has2:
            sch.compute_at(sch.get_sblock("conv2"), n_chunk)
        if has1 and has2:
            sch.compute_at(sch.get_sblock("mid"), block_x)
        if has1:
            sch.compute_at(sch.get_sblock("conv1"), block_x if has2 else n_chunk)
            self._stage1(block_x, fused=has2)
        if has2:
            self._stage2(fused=has1)
        return sch

    def _stage1(self, block_x, fused: bool):
        sch, spec = self.sch, self.spec
        g = self._gemm(sch.get_sblock("conv1"), self.cfg.n1_tile, self.cfg.k_tile)
        # the epilogue runs per channel chunk, right after that chunk's accumulators are stored
        mid = sch.get_sblock("mid")
        sch.reverse_compute_at(mid, g.chunk, preserve_unit_loops=True)
        self._to_shared(g, 0, vector_lanes(spec.c, 8))
        self._to_shared(g, 1, vector_lanes(spec.k1, 8))
        sch.compute_inline(sch.get_sblock("im2col"))
        sch.compute_inline(sch.get_sblock("w1_gemm"))
        self._fragments(g)
        if fused:
            sch.set_scope(mid, 0, "shared.dyn")
            sch.storage_align(mid, 0, axis=-2, factor=64, offset=8)
        self._threads(mid, vector_lanes(spec.k1, 4))
        self._tensorize(g)

    def _stage2(self, fused: bool):
        sch, spec = self.sch, self.spec
        k_tile = 2 * MMA  # divides the padded k1 (a multiple of n1_tile >= 2 * MMA * warps_n)
        g = self._gemm(sch.get_sblock("conv2"), self.cfg.n2_tile, k_tile)
        if not fused:  # mid comes from global memory: stage it like any operand
            self._to_shared(g, 0, 8)
        self._to_shared(g, 1, vector_lanes(spec.k2, 8))
        sch.compute_inline(sch.get_sblock("w2_gemm"))
        self._fragments(g)
        # the epilogue reads the accumulators once and trims the padding as it stores y
        sch.compute_inline(sch.get_sblock("out_pad"))
        out = sch.get_sblock("out")
        sch.reverse_compute_at(out, g.chunk, preserve_unit_loops=True)
        self._threads(out, vector_lanes(spec.k2, 4))
        self._tensorize(g)

    def _gemm(self, block, n_tile: int, k_tile: int) -> _Gemm:
        """Blockize the (m, n, k) loops under the tile into 16x16x16 MMAs, spread over warps."""
        sch, cfg = self.sch, self.cfg
        m, n, k = sch.get_loops(block)[-3:]
        m, m_i = sch.split(m, [None, MMA])
        n, n_i = sch.split(n, [None, MMA])
        k, k_i = sch.split(k, [None, MMA])
        sch.reorder(m, n, k, m_i, n_i, k_i)
        outer = sch.blockize(m_i)
        warp_m, frag_m = sch.split(m, [cfg.warps_m, None])
        chunk, warp_n, frag_n = sch.split(n, [None, cfg.warps_n, n_tile // MMA // cfg.warps_n])
        k_outer, k_inner = sch.split(k, [None, k_tile // MMA])
        sch.reorder(chunk, warp_m, warp_n, k_outer, k_inner, frag_m, frag_n)
        warp = sch.fuse(warp_m, warp_n)
        sch.bind(warp, "threadIdx.y")
        return _Gemm(outer, block, chunk, warp, k_outer, k_inner)

    def _to_shared(self, g: _Gemm, operand: int, lanes: int):
        """Stage one GEMM operand tile in shared memory, loaded cooperatively and vectorized."""
        sch = self.sch
        copy = sch.cache_read(g.outer, operand, "shared.dyn")
        sch.compute_at(copy, g.k_outer, preserve_unit_loops=True)
        self._threads(copy, lanes)
        # pad each row by 8 elements (16 bytes): fragment loads then hit distinct banks
        sch.storage_align(copy, 0, axis=-2, factor=64, offset=8)

    def _threads(self, block, lanes: int):
        """Spread a 2-D copy/epilogue block over all threads, `lanes` elements per access."""
        sch, cfg = self.sch, self.cfg
        fused = sch.fuse(*sch.get_loops(block)[-2:])
        _, ty, tx, vec = sch.split(fused, [None, cfg.warps_m * cfg.warps_n, WARP, lanes])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)

    def _fragments(self, g: _Gemm):
        """Operand fragments at the inner k loop; accumulators stored per warp to shared memory."""
        sch = self.sch
        frag_a = sch.cache_read(g.outer, 0, "wmma.matrix_a")
        frag_b = sch.cache_read(g.outer, 1, "wmma.matrix_b")
        sch.compute_at(frag_a, g.k_inner)
        sch.compute_at(frag_b, g.k_inner)
        acc = sch.cache_write(g.outer, 0, "wmma.accumulator")
        sch.reverse_compute_at(acc, g.warp)
        sch.set_scope(acc, 0, "shared.dyn")
        sch.storage_align(acc, 0, axis=-2, factor=32, offset=4)
        intrins = (self.intrin["load_a"], self.intrin["load_b"], self.intrin["store"])
        for block, intrin in zip((frag_a, frag_b, acc), intrins):
            i, j = sch.get_loops(block)[-2:]
            i0, i1 = sch.split(i, [None, MMA])
            j0, j1 = sch.split(j, [None, MMA])
            sch.reorder(i0, j0, i1, j1)
            g.tensorize_at.append((i1, intrin))
        g.init = sch.decompose_reduction(g.outer, g.k_outer)

    def _tensorize(self, g: _Gemm):
        sch = self.sch
        for loop, intrin in g.tensorize_at:
            sch.tensorize(loop, intrin)
        init_inner = sch.get_child_blocks(g.init)[0]
        sch.tensorize(sch.get_loops(init_inner)[-2], self.intrin["fill"])
        sch.tensorize(sch.get_loops(g.inner)[-3], self.intrin["sync"])


def scheduled_funcs(spec: FusedConvSpec, target, fused: bool, cfg: WmmaConfig | None = None):
    """The op's kernels (a schedule.Kernels) in padded GEMM form, scheduled for tensor cores.
    Falls back to two kernels, with a logged reason, where the fused kernel's shared memory
    exceeds the target's."""
    from . import Kernels

    arch = cuda_arch_number(target)
    reason = unsupported_reason(spec, arch)
    if reason:
        raise ValueError(f"target: no CUDA schedule for this spec: {reason}")
    cfg = fit_config(spec, cfg or WmmaConfig())
    need, have = shared_bytes(spec, cfg), max_shared_bytes(arch)
    if fused and need > have:
        log.warning("not fused: %s needs %d KiB of shared memory, sm_%d has %d KiB; running two "
                    "tensor-core kernels instead", spec.to_string(), need // 1024, arch, have // 1024)
        fused = False
    ext = extents(spec, cfg)
    funcs = [fused_prim_func(spec, ext)] if fused else list(unfused_prim_funcs(spec, ext))
    scheduled = [WmmaFusedSchedule(f, spec, cfg).run().mod["main"] for f in funcs]
    return Kernels(scheduled, None if fused else (ext["m"], ext["k1"]))
