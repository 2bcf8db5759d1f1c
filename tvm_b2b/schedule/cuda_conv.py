"""CUDA tensor-core rule of the single convolution (op.conv, any kh x kw, stride, padding; dense, or grouped
with 16+ channels a group): the fused pair's template (cuda_wmma) on one implicit GEMM, a grouped conv's groups
each their own GEMM (blockIdx.z; op.conv._grouped_gemm_form). Each block computes `m_tile` output pixels
x `n1_tile` channels: im2col and weight tiles gathered into shared memory (zero padding by
predicate; cp.async `pipeline` steps ahead), ldmatrix + mma.sync (WMMA before sm_80), then the
scale/bias/[residual]/act epilogue from the accumulators. The reduction (kh*kw*c) is padded as a
whole; a strided conv of few channels (a 7x7 stem) runs as its space-to-depth stride-1 conv (input_form).
Parameters are the pair's WmmaConfig; the conv uses m_tile, warps, n1_tile, k_tile, pipeline, mma and
epilogue (n2_tile is the pair's second GEMM's, unused here).
"""
from __future__ import annotations

import dataclasses
import os

from tvm import s_tir

from ..op.conv import (ConvSpec, InputForm, conv_prim_func, padded_conv_extents, space_to_depth, split_prim_funcs,
                       stem)
from ..target import max_shared_bytes
from .cuda_wmma import (CHANNEL_UNIT, DTYPE_BYTES, KNOBS, MIN_BLOCKS, WmmaConfig, aligned_row, buildable_schedules,
                        TensorCoreRule, check_fields, marked, pixel_unit, stages_residual, unsupported_reason)


def input_form(spec: ConvSpec) -> InputForm | None:
    """How the kernel takes x and w, where not as given (op.conv.InputForm; the caller makes them:
    Plan.input_form). A strided conv of fewer than 8 channels (a stem) as its space-to-depth stride-1
    conv: H200, ResNet-50's 7x7 stem at batch 32 153 -> 58 us, at batch 1 12.0 -> 4.8
    (bench/results/convs_h200_s13_stem_s2d.txt; padding its 12 channels to 16 measured the same at
    batch 32, slower at batch 1). Then fewer than 8 channels padded to 4 or 8, and cells' channels to
    a multiple of 4, so that each tap's channels load as 8- or 16-byte vectors; 3 channels otherwise
    gather 2-byte elements (H200, ResNet-50 batch 32: 268 us of 2209, before space-to-depth)."""
    if spec.groups > 1:
        merged = merged_groups(spec)
        return InputForm(groups=merged) if merged else None
    cells = stem(spec)
    c = space_to_depth(spec).c if cells else spec.c
    if c < 8:
        channels = 4 if c < 4 else 8
    elif cells and c % 4:  # an odd stride's cells: 27 channels for 3 at stride 3
        channels = -(-c // 4) * 4
    else:
        channels = None
    return InputForm(cells, channels) if cells or channels else None


def kernel_spec(spec: ConvSpec) -> ConvSpec:
    """The conv the kernel computes (input_form's; the spec itself where that is None)."""
    form = input_form(spec)
    return form.spec(spec) if form else spec


GROUP_UNIT = 16  # a grouped conv's per-group reduction and channels are padded to one MMA edge (ResNeXt's 9x16, 9x32)


def extents(spec: ConvSpec) -> dict[str, int]:
    """The padded GEMM extents of the kernel's spec, fixed per spec (every config schedules the same PrimFunc);
    a grouped conv's reduction and channels are one group's."""
    unit = GROUP_UNIT if spec.groups > 1 else CHANNEL_UNIT
    return padded_conv_extents(kernel_spec(spec), pixel_unit(spec), unit, unit)


GROUPED_ENV = "TVM_B2B_GROUPED_TC"  # "0": grouped convs on CUDA cores only (cuda_grouped_conv); "all": 4-channel groups too
GROUP_CHANNELS = 16  # a group's input and output channels must be multiples of this for tensor cores


def merged_groups(spec: ConvSpec) -> int | None:
    """The groups the kernel takes where 2 consecutive groups of 8 channels (4 of 4 with TVM_B2B_GROUPED_TC=all)
    merge into one of 16 (block-diagonal weights: InputForm.groups), else None. H200, ResNeXt-50's grouped 3x3s
    (bench/results/convs_grouped_merged_s17.txt against convs_grouped_tc0_h200_s17.txt, CUDA cores): 8 channels a
    group 4.5-4.7 us against 5.5-5.6 at batch 1, 40.5 and 64.3 against 83.0 and 87.6 at batch 32; 4 channels slower
    (56x56 128: 6.3 against 5.5, 90.3 against 85.4): twice and four times the multiply-adds."""
    cg, kg = spec.c // spec.groups, spec.k // spec.groups
    if cg not in ((4, 8) if os.environ.get(GROUPED_ENV, "") == "all" else (8,)):
        return None
    merged = GROUP_CHANNELS // cg
    return spec.groups // merged if spec.groups % merged == 0 and kg * merged % GROUP_CHANNELS == 0 else None


def grouped_problem(spec: ConvSpec) -> str | None:
    """Why a grouped conv does not run on this rule's tensor cores (the CUDA-core rule's then), or None. H200
    (bench/results/convs_grouped_tc*_h200_s17.txt, ResNeXt-50's grouped 3x3s against the CUDA-core rule): 16 and 32
    channels a group 3.5-4.0 us against 7.0-13.9 at batch 1, 13.6-29.3 against 71-78 at batch 32. 4 and 8 channels
    a group taken as they are computed WRONG results with this template (8: both batches; 4: batch 1; likely where a
    group's channels are padded to a tile: the output tile of group g then covers group g + 1's first channels, which
    the block does not compute): refused, not miscompiled; merged_groups makes them groups of 16."""
    if os.environ.get(GROUPED_ENV, "") == "0":
        return f"grouped conv (groups={spec.groups}): tensor cores turned off ({GROUPED_ENV}=0)"
    cg, kg = spec.c // spec.groups, spec.k // spec.groups
    if cg % GROUP_CHANNELS or kg % GROUP_CHANNELS:
        return (f"grouped conv with {cg} input and {kg} output channels a group: tensor cores take multiples of "
                f"{GROUP_CHANNELS}")
    return None


def grouped_config(spec: ConvSpec, ext: dict[str, int]) -> WmmaConfig:
    """The untuned choice for a grouped conv: a group's channels in one tile (up to 64), 2 warps along the pixels,
    32-deep steps where they divide the reduction, the largest pixel tile (128/64/32) that still gives MIN_BLOCKS
    blocks (pixel tiles x groups x channel tiles), loads one step ahead."""
    n1_tile = next(t for t in (64, 32, 16) if ext["k"] % t == 0)
    warps_n = 2 if n1_tile >= 32 else 1
    chunks = spec.groups * ext["k"] // n1_tile
    tiles = [t for t in (128, 64, 32) if ext["m"] % t == 0]
    m_tile = next((t for t in tiles if ext["m"] // t * chunks >= MIN_BLOCKS), tiles[-1])
    return WmmaConfig(m_tile=m_tile, warps_m=2, warps_n=warps_n, k_tile=32 if ext["r"] % 32 == 0 else 16, n1_tile=n1_tile,
                      pipeline=1, mma=1, epilogue=2 if m_tile >= 64 else 0)


def default_config(spec: ConvSpec, arch: int = 80) -> WmmaConfig:
    """The untuned choice, 2x2 warps: wide_config where it applies, else 64-channel chunks. sm_80 and
    newer: ldmatrix + mma.sync, loads one 64-deep step ahead, the largest pixel tile (128/64/32) that
    still gives MIN_BLOCKS blocks (pixel tiles x channel chunks), epilogue from the registers through
    the fp16 tile from 64-pixel tiles up (as the pair's default, cuda_wmma.default_config). Older
    GPUs: WMMA, 64-pixel tiles."""
    ext = extents(spec)
    if arch < 80:
        return WmmaConfig(m_tile=32) if ext["m"] % 64 else WmmaConfig()
    if spec.groups > 1:
        return grouped_config(spec, ext)
    wide = wide_config(ext)
    if wide is not None:
        return wide
    chunks = ext["k"] // 64
    tiles = [t for t in (128, 64, 32) if ext["m"] % t == 0]
    m_tile = next((t for t in tiles if ext["m"] // t * chunks >= MIN_BLOCKS), tiles[-1])
    return WmmaConfig(m_tile=m_tile, k_tile=64, pipeline=1, mma=1, epilogue=2 if m_tile >= 64 else 0)


WIDE_MIN_REDUCTION = 1024  # reduction depth (kh*kw*c) from which wide tiles measured faster


def wide_config(ext: dict[str, int]) -> WmmaConfig | None:
    """128-channel tiles (2x2 warps of 64x64, or 32x64 on 64-pixel tiles; 32-deep steps on 128-pixel
    tiles for shared memory), loads two steps ahead, for deep reductions whose wide tiles still make
    MIN_BLOCKS / 2 blocks; None elsewhere (batch 1 keeps the narrow tiles and split-K). H200, ResNet-50
    at batch 32, against the 64-channel default (bench/results/convs_h200_s12_configs.txt): 3x3 convs
    14x14 256 38.8 -> 36.4 us, 7x7 512 52.9 -> 42.6, 28x28 128 31.5 -> 29.8, stride 2 28->14 256
    42.6 -> 35.1; 1x1 14x14 1024->256 20.8 -> 17.6. Shallower reductions lost: 1x1 56x56 64->256
    28.9 -> 31.7, 7x7 512->2048 +residual 23.6 -> 25.5."""
    if ext["k"] % 128 or ext["r"] < WIDE_MIN_REDUCTION:
        return None
    for m_tile, k_tile in ((128, 32), (64, 64)):
        if ext["m"] % m_tile == 0 and ext["m"] // m_tile * (ext["k"] // 128) >= MIN_BLOCKS // 2:
            return WmmaConfig(m_tile=m_tile, k_tile=k_tile, n1_tile=128, pipeline=2, mma=1, epilogue=2)
    return None


def split_factor(spec: ConvSpec, cfg: WmmaConfig) -> int:
    """How many ways the default kernel splits its reduction (split-K, op.conv.split_prim_funcs): where
    its tiles make fewer than MIN_BLOCKS / 2 blocks, the most slices that keep the blocks within
    2 MIN_BLOCKS and 4 or more reduction steps each. A conv with several taps splits between taps
    (3 or 9 ways for a 3x3): a slice starting inside a tap's channels makes TVM gather the im2col tile
    element by element instead of with cp.async (H200: 21 us instead of 16 for ResNet-50's 14x14 3x3
    at batch 1). ResNet-50's 7x7 and 14x14 layers at batch 1 (49 or 196 pixels: 16-32 blocks for 132 SMs,
    each running the whole reduction alone) split 8-9 ways. TVM_B2B_SPLIT_DEEP=W (deep_split_waves; off until
    measured: `bash bench/gpu_session.sh splitk`) also splits deep reductions of more blocks: DeepLabV3's ASPP 3x3s at
    batch 1 make 104 blocks of 288 steps each (122-144 us on the H100, bench/results/e2e_h100_s32_breakdown.txt)."""
    ext = extents(spec)
    if kernel_spec(spec).groups > 1:  # (op.conv.split_prim_funcs is dense: a grouped conv's groups are its blocks)
        return 1
    blocks = ext["m"] // cfg.m_tile * (ext["k"] // cfg.n1_tile)
    steps = ext["r"] // cfg.k_tile
    if blocks < MIN_BLOCKS // 2:
        fits = [t for t in split_candidates(spec, cfg) if blocks * t <= 2 * MIN_BLOCKS and steps // t >= 4]
        return max(fits, default=1)
    waves = deep_split_waves()
    if waves and steps >= DEEP_STEPS and blocks < waves * MIN_BLOCKS:
        fits = [t for t in split_candidates(spec, cfg) if blocks * t <= waves * MIN_BLOCKS and steps // t >= 8]
        return max(fits, default=1)
    return 1


DEEP_SPLIT_ENV = "TVM_B2B_SPLIT_DEEP"  # W: split deep reductions (DEEP_STEPS or more) of 64 or more blocks up to W * MIN_BLOCKS
DEEP_STEPS = 32


def deep_split_waves() -> int:
    """TVM_B2B_SPLIT_DEEP as a number of MIN_BLOCKS waves (0 where unset: deep reductions of 64 blocks or more
    unsplit); anything but a whole number is a ValueError naming the switch."""
    text = os.environ.get(DEEP_SPLIT_ENV, "0")
    if not text.isdigit():
        raise ValueError(f"{DEEP_SPLIT_ENV}={text}: a whole number of {MIN_BLOCKS}-block waves")
    return int(text)


def split_candidates(spec: ConvSpec, cfg: WmmaConfig) -> list[int]:
    """The split-K factors over 1 that the kernel takes for this config: whole taps per slice, each a whole number of
    steps (a conv of several taps), else powers of two of the steps up to 32."""
    ext, spec = extents(spec), kernel_spec(spec)
    taps, steps = spec.kh * spec.kw, ext["r"] // cfg.k_tile
    if taps > 1:
        return [t for t in range(2, taps + 1) if taps % t == 0 and (spec.r // t) % cfg.k_tile == 0 and ext["r"] == spec.r]
    return [2 ** i for i in range(1, 6) if steps % 2 ** i == 0]


def schedule_split_sum(func) -> s_tir.Schedule:
    """The split-K sum and epilogue (op.conv.split_prim_funcs' second kernel): one thread per output
    element, reading its slices' partial sums (coalesced along the channels)."""
    sch = s_tir.Schedule(func)
    m, k = sch.get_loops(sch.get_sblock("out"))
    block, thread = sch.split(sch.fuse(m, k), [None, SUM_THREADS])
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    total = sch.get_sblock("sum")
    sch.compute_at(total, thread)
    sch.set_scope(total, 0, "local")
    return sch


SUM_THREADS = 256


def check_config(spec: ConvSpec, cfg: WmmaConfig, arch: int = 80) -> WmmaConfig:
    """The config if its tiles divide the spec's padded extents and the arch has what it uses, else
    ValueError naming the field."""
    ext = extents(spec)
    return check_fields(spec, cfg, arch, (("m_tile", ext["m"], "pixel rows"), ("k_tile", ext["r"], "reduction"),
                                          ("n1_tile", ext["k"], "output channels")))


def shared_bytes(spec: ConvSpec, cfg: WmmaConfig) -> int:
    """Shared memory the kernel needs (an upper bound of what tvm_b2b.lower plans): the operand tiles
    per pipeline step, the epilogue's tile and the residual tile."""
    e = DTYPE_BYTES[spec.dtype]
    operands = cfg.m_tile * aligned_row(cfg.k_tile, 64, 8) + cfg.k_tile * aligned_row(cfg.n1_tile, 64, 8)
    acc = {0: cfg.m_tile * aligned_row(cfg.n1_tile, 32, 4) * 4, 1: 0,
           2: cfg.m_tile * aligned_row(cfg.n1_tile, 64, 8) * e}[cfg.epilogue]
    residual = cfg.m_tile * aligned_row(cfg.n1_tile, 64, 8) * e if stages_residual(spec, cfg) else 0
    return e * operands * (cfg.pipeline + 1) + acc + residual + 5 * 128


def workload(spec: ConvSpec):
    """The conv's PrimFunc in the padded GEMM form this rule schedules, as an IRModule ("main")."""
    import tvm

    return tvm.IRModule({"main": conv_prim_func(kernel_spec(spec), extents(spec))})


class ConvTensorCoreRule(TensorCoreRule):
    """The CUDA tensor-core rule of the single convolution: the pair's (fp16 on sm_70+, WmmaConfig
    parameters) with this op's extents, defaults, shared memory and plan."""

    knobs = {k: v for k, v in KNOBS.items() if k != "frags_n2"}
    workload = staticmethod(workload)
    extents = staticmethod(extents)
    kernel_spec = staticmethod(kernel_spec)
    check_config = staticmethod(check_config)
    shared_bytes = staticmethod(shared_bytes)

    def can_implement(self, spec: ConvSpec, info) -> str | None:
        return (spec.groups > 1 and grouped_problem(kernel_spec(spec))) or unsupported_reason(spec, info.arch)

    def default_config(self, spec: ConvSpec, info) -> WmmaConfig:
        return default_config(spec, info.arch)

    def plan(self, spec: ConvSpec, info, config: WmmaConfig | None = None, fused: bool = True, policy: bool = False,
             unfused: bool = True):
        """One kernel (`fused` does not apply: there is nothing to split), with the default config
        where none is given, the reduction split over two kernels where that config makes too few
        blocks (split_factor); the staged epilogue's fallback as for the pair."""
        from . import Plan

        cfg = check_config(spec, default_config(spec, info.arch) if config is None else config, info.arch)
        if shared_bytes(spec, cfg) > max_shared_bytes(info.arch):
            raise ValueError(f"config: {cfg.to_string()} needs {shared_bytes(spec, cfg) // 1024} KiB of shared memory, "
                             f"sm_{info.arch} has {max_shared_bytes(info.arch) // 1024} KiB")
        padded, ext = kernel_spec(spec), extents(spec)
        splits = split_factor(spec, cfg) if config is None else 1  # a given or tuned config runs as measured: whole
        if splits > 1:  # the partial sums are float32: the staged epilogue stores them
            cfg = dataclasses.replace(cfg, epilogue=0)
            first, second = split_prim_funcs(padded, ext, splits)
            (sch,), used = buildable_schedules([first], padded, cfg, info.target, given=config is not None)
            total = schedule_split_sum(second)
            return Plan([marked(sch), total.mod["main"]], False, used, "", (splits, ext["m"], ext["k"]), [sch, total],
                        input_form=input_form(spec), mid_dtype="float32")
        schedules, used = buildable_schedules([conv_prim_func(padded, ext)], padded, cfg, info.target, given=config is not None)
        return Plan([marked(sch) for sch in schedules], True, used, "", None, schedules, input_form=input_form(spec))


RULE = ConvTensorCoreRule()
