"""CUDA rule of the grouped 3x3 -> 1x1 pair (MobileNet's depthwise, ResNeXt's grouped 3x3; op.spec
with groups > 1): ONE kernel, the 3x3 on CUDA cores, the 1x1 on tensor cores.

Each thread block owns `m_tile` output pixels and one chunk of `n2_tile` output channels, and walks conv2's
reduction `k_tile` channels of mid at a time; each step:
  1. all its threads compute the grouped 3x3 for the block's pixels and the step's channels, each thread
     `channel_lanes` channels of one pixel at a time (8-byte loads of x and w1 along the channels;
     a depthwise tap is 9 multiply-adds per channel, no GEMM), with s1/b1/act1, into `mid`'s step, a
     shared fp16 tile (m_tile x k_tile, double-buffered, pipelined with w2's tile of the step);
  2. that step of mid @ w2 on tensor cores, exactly as the dense pair's second GEMM (cuda_wmma: ldmatrix +
     mma.sync, w2 staged `pipeline` steps ahead); after the last step, its epilogue (s2/b2/residual/act2).
The chunks of a pixel tile are separate blocks, each recomputing the 3x3 (9 c/g multiply-adds per
mid element against n2_tile for the 1x1): a batch-1 layer then still has many blocks; n2_tile (a knob)
trades that recompute against parallelism. The intermediate never goes to global memory, which is
the depthwise pair's point: it is memory-bound, and mid is most of its traffic.
Parameters: WmmaConfig's m_tile, warps, k_tile (mid's step), n2_tile, pipeline, mma, epilogue (n1_tile, the
dense 3x3 GEMM's, is unused but in the two-kernel form). The two-kernel form (fused=False) is the same template split at mid.
"""
from __future__ import annotations

import dataclasses

from tvm import s_tir

from ..op.compute import channel_lanes, padded_extents
from ..op.spec import FusedConvSpec
from ..target import max_shared_bytes
from .common import conv_in_registers, has_block, vectorize_float32
from .cuda_wmma import (DTYPE_BYTES, KNOBS, MIN_BLOCKS, WARP, TensorCoreRule, WmmaConfig,
                        WmmaFusedSchedule, aligned_row, check_fields, pixel_unit, stages_residual, unsupported_reason)


class GroupedPairSchedule(WmmaFusedSchedule):
    """The fused grouped pair, or either stage of its two-kernel form (recognized by blocks)."""

    def run(self) -> s_tir.Schedule:
        sch, knob = self.sch, self.knob
        has1, has2 = has_block(sch, "conv1"), has_block(sch, "conv2")
        if not has1:
            return super().run()  # the 1x1 alone: the dense pair's second stage
        block_x, n_chunk = self._output_tiles("out_pad" if has2 else "mid", knob["frags_n2" if has2 else "frags_n1"])
        sch.bind(n_chunk, "blockIdx.y")
        if has2:
            sch.compute_at(sch.get_sblock("conv2"), n_chunk)
            self._stage2(fused=True)  # mid, and the 3x3 inside it, placed per reduction step (_place_mid)
        else:
            self._grouped_stage1()
        return sch

    def _conv2_k_frags(self) -> int:
        return self.knob["frags_k"]

    def _place_mid(self, g) -> None:
        """mid computed per reduction step of conv2 (k_tile channels of the block's pixels), into a
        shared tile that conv2's fragments read: one more pipelined stage beside w2's tile, so that the
        3x3's loads of the next step are in flight while the tensor cores run this one, and shared
        memory holds a step, not all k1 channels (more blocks per SM)."""
        sch = self.sch
        mid = self._shared_at(sch.get_sblock("mid"), g)
        sch.storage_align(mid, 0, axis=-2, factor=64, offset=8)
        g.staged += 1
        self._grouped_stage1()
        if staged_taps():
            self._stage_taps(g)

    def _stage_taps(self, g) -> None:
        """xcol's tile of the step (the taps of every pixel and channel: 9 x the pixels' inputs) copied to shared
        memory with 16-byte cp.async, zero-filled outside the image, `pipeline` steps ahead like w2's tile, the
        3x3 then reading shared memory: its loads leave the step's chain of latencies."""
        taps = self._shared_at(self.sch.get_sblock("xcol"), g)
        g.staged += 1
        _, _, vector = self._spread_vectors(self.sch.get_loops(taps)[-5:])
        self.sch.vectorize(vector)
        g.late = 1  # mid, computed in the step that uses it: only the copies run ahead

    def _grouped_stage1(self):
        """mid's elements spread over all threads, `channel_lanes` channels per thread and step; each
        thread's 3x3 accumulators in registers (the taps unrolled), vectorized along the channels."""
        sch = self.sch
        mid, conv1 = sch.get_sblock("mid"), sch.get_sblock("conv1")
        if not staged_taps() or not has_block(sch, "conv2"):
            sch.compute_inline(sch.get_sblock("xcol"))  # x read directly
        vectors, thread, vector = self._spread_vectors(sch.get_loops(mid)[-2:])
        sch.unroll(vectors)  # a thread's vectors of one step (check_config: a whole number) issue their loads together
        conv_in_registers(sch, conv1, thread)
        vectorize_float32(sch, vector)

    def _shared_at(self, block, g):
        """`block` in shared memory, computed per step of conv2's reduction. The scope is set before compute_at:
        only then is the block's tile relaxed over the warps (threadIdx.y), which k_outer lies in; else each warp's
        region would be its own rows, copied by threads of every warp."""
        self.sch.set_scope(block, 0, "shared.dyn")
        self.sch.compute_at(block, g.k_outer, preserve_unit_loops=True)
        return block

    def _spread_vectors(self, loops):
        """The (..., channels) loops of a block spread over all threads, `channel_lanes` channels a thread at a
        time: (the loop over each thread's vectors, the thread loop, the vector loop, left to the caller)."""
        sch, knob = self.sch, self.knob
        *outer, channels = loops
        channels, vector = sch.split(channels, [None, channel_lanes(self.spec)])  # (not after a fuse: the
        # accumulators' index would then be a difference TVM cannot simplify, putting them in local memory)
        vectors, ty_m, ty_n, thread = sch.split(sch.fuse(*outer, channels), [None, knob["warps_m"], knob["warps_n"], WARP])
        sch.bind(sch.fuse(ty_m, ty_n), "threadIdx.y")
        sch.bind(thread, "threadIdx.x")
        return vectors, thread, vector


STAGED_TAPS_ENV = "TVM_B2B_DW_STAGED"  # 1: the fused pair stages xcol's tiles in shared memory (experiment)


def staged_taps() -> bool:
    import os

    return os.environ.get(STAGED_TAPS_ENV, "0") == "1"


CHANNEL_UNIT = 32  # k1 and k2 are padded to this (conv2's reduction step; MobileNetV2's k2 = 24 wastes 8, not 40)


def extents(spec: FusedConvSpec) -> dict[str, int]:
    """The padded extents (rows as the dense pair's; the 3x3 has no GEMM to pad), fixed per spec."""
    return padded_extents(spec, pixel_unit(spec), k_tile=1, n_tile=CHANNEL_UNIT)


WIDE_STEP_K1, WIDE_STEP_CHANNELS = 192, 64  # from k1 = 192: 32-pixel tiles, 64 channels a step two steps ahead,
# 32-channel chunks
# (H100, fused_dw_n*_h100_s20: faster than 32-channel steps in 13 of MobileNetV2's 16 such cases, e.g. N=1 7x7 960->160
# 30.0 us against 55.0, N=32 14x14 384->64 17.2 against 28.7; slower by 6-9% in 3: more blocks, half the steps);
# two steps ahead (fused_dw_n32_h100_s20_pipeline.txt) 3-16% faster than one in 7 of the 8 at N=32, e.g. 28x28 192->32
# 16.0 us against 17.9 (N=1 not measured)
STEP_CHANNELS = 32  # default k_tile: mid's channels per reduction step (one 8-channel vector per thread of 4 warps, 32 pixels)


def default_config(spec: FusedConvSpec, arch: int = 80) -> WmmaConfig:
    """The untuned choice: 2x2 warps, ldmatrix + mma.sync, w2's tile and mid's step one step ahead,
    32 channels a step, 64-channel chunks (32 where that makes too few blocks), the largest pixel tile
    (128/64/32) that still gives MIN_BLOCKS blocks; the register epilogue through the fp16 tile from
    64-pixel tiles up, as the dense pair's default. From k1 = 192 (WIDE_STEP_K1): 32-pixel tiles and
    chunks, 64 channels a step, two steps ahead."""
    ext = extents(spec)
    tiles = [t for t in (128, 64, 32) if ext["m"] % t == 0]
    wide = ext["k2"] % 64 == 0 and ext["m"] // tiles[-1] * (ext["k2"] // 64) >= MIN_BLOCKS
    n2_tile = 64 if wide else 32
    m_tile = next((t for t in tiles if ext["m"] // t * (ext["k2"] // n2_tile) >= MIN_BLOCKS), tiles[-1])
    cfg = WmmaConfig(m_tile=m_tile, k_tile=STEP_CHANNELS, n1_tile=32, n2_tile=n2_tile, pipeline=1, mma=1,
                     epilogue=2 if m_tile >= 64 else 0)
    if spec.k1 >= WIDE_STEP_K1 and ext["k1"] % WIDE_STEP_CHANNELS == 0:
        cfg = dataclasses.replace(cfg, m_tile=tiles[-1], k_tile=WIDE_STEP_CHANNELS, n2_tile=32, pipeline=2, epilogue=0)
    while cfg.m_tile > tiles[-1] and shared_bytes(spec, cfg) > max_shared_bytes(arch):  # staged taps: 9x the inputs
        cfg = dataclasses.replace(cfg, m_tile=cfg.m_tile // 2, epilogue=2 if cfg.m_tile // 2 >= 64 else 0)
    return cfg


def check_config(spec: FusedConvSpec, cfg: WmmaConfig, arch: int = 80) -> WmmaConfig:
    """As the dense pair's, k_tile (mid's channels a step) dividing the padded k1, and a step's
    vectors (m_tile x k_tile / channel_lanes) a whole number per thread: a thread without a vector
    would leave TVM unable to bound mid's step to its tile (mid then spans every pixel row)."""
    ext = extents(spec)
    check_fields(spec, cfg, arch, (("m_tile", ext["m"], "pixel rows"), ("n1_tile", ext["k1"], "k1 channels"),
                                   ("k_tile", ext["k1"], "k1 channels (mid's step)"), ("n2_tile", ext["k2"], "k2 channels")))
    vectors = cfg.m_tile * cfg.k_tile // channel_lanes(spec)
    if vectors % cfg.threads:
        raise ValueError(f"config: m_tile={cfg.m_tile} x k_tile={cfg.k_tile} makes {vectors} vectors of mid's step, "
                         f"not a multiple of the {cfg.threads} threads")
    return cfg


def shared_bytes(spec: FusedConvSpec, cfg: WmmaConfig) -> int:
    """Shared memory of the fused kernel: mid's step and w2's tile per pipeline step, the epilogue's tile
    and the residual tile (tvm_b2b.lower plans it)."""
    e = DTYPE_BYTES[spec.dtype]
    steps = cfg.pipeline + 1
    mid = cfg.m_tile * aligned_row(cfg.k_tile, 64, 8) * steps
    acc = {0: cfg.m_tile * aligned_row(cfg.n2_tile, 32, 4) * 4 // e, 1: 0,
           2: cfg.m_tile * aligned_row(cfg.n2_tile, 64, 8)}[cfg.epilogue]
    operands = cfg.k_tile * aligned_row(cfg.n2_tile, 64, 8) * steps
    residual = cfg.m_tile * aligned_row(cfg.n2_tile, 64, 8) if stages_residual(spec, cfg) else 0
    taps = cfg.m_tile * 9 * (spec.c // spec.groups) * cfg.k_tile * steps if staged_taps() else 0
    return e * (mid + acc + operands + residual + taps) + 6 * 128


FUSION_MAX_K1 = 32  # fused at any size
FUSION_MIN_PIXELS = 32 * 28 * 28  # and up to FUSION_WIDE_K1 channels from this many input pixels (n * h * w)
FUSION_WIDE_K1 = 192


def fusion_loss_reason(spec: FusedConvSpec) -> str | None:
    """Why fusing is expected to be slower than the pair's two single convs (None when fusing pays).
    Measured on the H100 (bench/results/fused_dw_n1_h100_s20.txt and _n32_: MobileNetV2's 12 depthwise pairs,
    fused with mid computed per reduction step, against our two kernels and cuDNN): fused wins at k1 = 32
    (N=1: 4.8 us against 9.8; N=32: 47.7 against 58.7) and on large layers up to k1 = 192 (N=32 56x56 144->24:
    72.6 against 92.0; N=32 28x28 192->32: 17.8 against 24.4, 192->64 stride 2: 10.3 against 11.5), and loses
    on small ones (N=1 56x56 144->24: 12.0 against 9.9; N=32 14x14 384->64: 17.2 against 15.7): there the
    kernel has few blocks and each block's steps are a chain of latencies (load the taps, 3x3, mma). N=1 112x112
    96->24 (9.6 against 10.1: within the noise of two launches) stays two kernels. A grouped
    3x3 with several channels per group also recomputes its larger reduction for every chunk of k2 channels."""
    per_group = spec.c // spec.groups
    if per_group > 1:
        return (f"grouped 3x3 with {per_group} channels per group: the fused kernel recomputes it for every "
                f"chunk of k2 channels")
    pixels = spec.n * spec.h * spec.w
    if spec.k1 > FUSION_MAX_K1 and not (pixels >= FUSION_MIN_PIXELS and spec.k1 <= FUSION_WIDE_K1):
        return (f"k1={spec.k1} > {FUSION_MAX_K1} on {pixels} input pixels (fused from {FUSION_MIN_PIXELS} up to "
                f"k1={FUSION_WIDE_K1}): this fused kernel's depthwise stage measured slower than two kernels there (H100)")
    return None


class GroupedPairRule(TensorCoreRule):
    """The grouped pair's CUDA rule: the dense pair's parameters and plan (fused unless asked for two
    kernels, or with the policy where fusing is expected slower, or where shared memory does not hold
    mid), this template's schedule, extents, defaults and fusion policy."""

    knobs = {k: v for k, v in KNOBS.items() if k != "frags_n1"}
    schedule_class = GroupedPairSchedule
    check_config = staticmethod(check_config)
    shared_bytes = staticmethod(shared_bytes)
    extents = staticmethod(extents)
    fusion_loss_reason = staticmethod(fusion_loss_reason)

    def can_implement(self, spec: FusedConvSpec, info) -> str | None:
        if spec.groups == 1:
            return "a dense 3x3 (groups=1): the tensor-core pair's"
        return unsupported_reason(spec, info.arch)

    def default_config(self, spec: FusedConvSpec, info) -> WmmaConfig:
        return default_config(spec, info.arch)


RULE = GroupedPairRule()
