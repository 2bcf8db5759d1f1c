"""CUDA rule of the grouped 3x3 -> 1x1 pair (MobileNet's depthwise, ResNeXt's grouped 3x3; op.spec
with groups > 1): ONE kernel, the 3x3 on CUDA cores, the 1x1 on tensor cores.

Each thread block owns `m_tile` output pixels and one chunk of `n2_tile` output channels:
  1. all its threads compute the grouped 3x3 for the block's pixels and every k1 channel, each thread
     `channel_lanes` channels of one pixel at a time (8-byte loads of x and w1 along the channels;
     a depthwise tap is 9 multiply-adds per channel, no GEMM), with s1/b1/act1, into `mid`, a shared
     fp16 tile (m_tile x k1, rows padded as the dense pair's);
  2. mid @ w2 for the chunk on tensor cores, its epilogue (s2/b2/residual/act2), exactly as the
     dense pair's second GEMM (cuda_wmma: ldmatrix + mma.sync, w2 staged `pipeline` steps ahead).
The chunks of a pixel tile are separate blocks, each recomputing the 3x3 (9 c/g multiply-adds per
mid element against n2_tile for the 1x1): a batch-1 layer then still has many blocks; n2_tile (a knob)
trades that recompute against parallelism. The intermediate never goes to global memory, which is
the depthwise pair's point: it is memory-bound, and mid is most of its traffic.
Parameters: WmmaConfig's m_tile, warps, n2_tile, pipeline, mma, epilogue (k_tile and n1_tile, the
dense 3x3 GEMM's, are unused). The two-kernel form (fused=False) is the same template split at mid.
"""
from __future__ import annotations

from tvm import s_tir

from ..op.compute import channel_lanes, padded_extents
from ..op.spec import FusedConvSpec
from ..target import max_shared_bytes
from .common import conv_in_registers, has_block, vectorize_float32
from .cuda_wmma import (CONV2_K_FRAGS, DTYPE_BYTES, KNOBS, MIN_BLOCKS, MMA, WARP, TensorCoreRule, WmmaConfig,
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
            mid = sch.get_sblock("mid")
            sch.compute_at(mid, n_chunk)
            sch.set_scope(mid, 0, "shared.dyn")
            sch.storage_align(mid, 0, axis=-2, factor=64, offset=8)
            self._stage2(fused=True)  # first: the 3x3's decomposed reduction would break its compute_at
        self._grouped_stage1()
        return sch

    def _grouped_stage1(self):
        """mid's elements spread over all threads, `channel_lanes` channels per thread and step; each
        thread's 3x3 accumulators in registers (the taps unrolled), vectorized along the channels."""
        sch, spec, knob = self.sch, self.spec, self.knob
        mid, conv1 = sch.get_sblock("mid"), sch.get_sblock("conv1")
        pixels, channels = sch.get_loops(mid)[-2:]
        channels, vector = sch.split(channels, [None, channel_lanes(spec)])  # (not after a fuse: the
        # accumulators' index would then be a difference TVM cannot simplify, putting them in local memory)
        _, ty_m, ty_n, thread = sch.split(sch.fuse(pixels, channels), [None, knob["warps_m"], knob["warps_n"], WARP])
        sch.bind(sch.fuse(ty_m, ty_n), "threadIdx.y")
        sch.bind(thread, "threadIdx.x")
        conv_in_registers(sch, conv1, thread)
        vectorize_float32(sch, vector)


CHANNEL_UNIT = 32  # k1 and k2 are padded to this (conv2's reduction step; MobileNetV2's k2 = 24 wastes 8, not 40)


def extents(spec: FusedConvSpec) -> dict[str, int]:
    """The padded extents (rows as the dense pair's; the 3x3 has no GEMM to pad), fixed per spec."""
    return padded_extents(spec, pixel_unit(spec), k_tile=1, n_tile=CHANNEL_UNIT)


def default_config(spec: FusedConvSpec, arch: int = 80) -> WmmaConfig:
    """The untuned choice: 2x2 warps, ldmatrix + mma.sync, w2 loaded one step ahead, 64-channel
    chunks (32 where that makes too few blocks), the largest pixel tile (128/64/32) that still gives
    MIN_BLOCKS blocks and fits shared memory with all k1 channels of mid; the register epilogue through
    the fp16 tile from 64-pixel tiles up, as the dense pair's default."""
    ext = extents(spec)
    tiles = [t for t in (128, 64, 32) if ext["m"] % t == 0]
    wide = ext["k2"] % 64 == 0 and ext["m"] // tiles[-1] * (ext["k2"] // 64) >= MIN_BLOCKS
    n2_tile = 64 if wide else 32
    m_tile = next((t for t in tiles if ext["m"] // t * (ext["k2"] // n2_tile) >= MIN_BLOCKS), tiles[-1])
    for tile in [t for t in tiles if t <= m_tile]:
        cfg = WmmaConfig(m_tile=tile, k_tile=16, n1_tile=32, n2_tile=n2_tile, pipeline=1, mma=1, epilogue=2 if tile >= 64 else 0)
        if shared_bytes(spec, cfg) <= max_shared_bytes(arch):
            break
    return cfg


def check_config(spec: FusedConvSpec, cfg: WmmaConfig, arch: int = 80) -> WmmaConfig:
    ext = extents(spec)
    return check_fields(spec, cfg, arch, (("m_tile", ext["m"], "pixel rows"), ("n1_tile", ext["k1"], "k1 channels"),
                                          ("n2_tile", ext["k2"], "k2 channels")))


def shared_bytes(spec: FusedConvSpec, cfg: WmmaConfig) -> int:
    """Shared memory of the fused kernel: mid (all k1 channels of the block's pixels), w2's tiles per
    pipeline step, the epilogue's tile and the residual tile (tvm_b2b.lower plans it)."""
    ext, e = extents(spec), DTYPE_BYTES[spec.dtype]
    mid = cfg.m_tile * aligned_row(ext["k1"], 64, 8)
    acc = {0: cfg.m_tile * aligned_row(cfg.n2_tile, 32, 4) * 4 // e, 1: 0, 2: cfg.m_tile * aligned_row(cfg.n2_tile, 64, 8)}[cfg.epilogue]
    operands = CONV2_K_FRAGS * MMA * aligned_row(cfg.n2_tile, 64, 8) * (cfg.pipeline + 1)
    residual = cfg.m_tile * aligned_row(cfg.n2_tile, 64, 8) if stages_residual(spec, cfg) else 0
    return e * (mid + acc + operands + residual) + 5 * 128


FUSION_MAX_K1 = 32


def fusion_loss_reason(spec: FusedConvSpec) -> str | None:
    """Why fusing is expected to be slower than the pair's two single convs (None when fusing pays).
    Measured on the H200 (bench/results/fused_h200_s10_grouped_probe.json, default configs): fused wins
    at k1 = 32 (MobileNetV2's first pair, N=1: 4.8 us against 7.4 for the two single convs) and loses
    from k1 = 144 on (N=1 56x56 144->24: 31.9 against 9.5; N=32: 269 against 91): each block computes the
    3x3 for all k1 channels of its pixels alone, few blocks, 4 warps each, and ncu shows it bound by
    instruction issue (the index arithmetic of each guarded load) at 6% occupancy. A grouped 3x3 with
    several channels per group also recomputes its larger reduction for every chunk of k2 channels."""
    per_group = spec.c // spec.groups
    if per_group > 1:
        return (f"grouped 3x3 with {per_group} channels per group: the fused kernel recomputes it for every "
                f"chunk of k2 channels")
    if spec.k1 > FUSION_MAX_K1:
        return (f"k1={spec.k1} > {FUSION_MAX_K1}: this fused kernel's depthwise stage measured slower than two "
                f"kernels at such widths (H200)")
    return None


class GroupedPairRule(TensorCoreRule):
    """The grouped pair's CUDA rule: the dense pair's parameters and plan (fused unless asked for two
    kernels, or with the policy where fusing is expected slower, or where shared memory does not hold
    mid), this template's schedule, extents, defaults and fusion policy."""

    knobs = {k: v for k, v in KNOBS.items() if k not in ("frags_n1", "frags_k")}
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
