"""CUDA tensor-core schedule of the fused op (WMMA 16x16x16, or ldmatrix + mma.sync m16n8k16 with
mma=1; fp16 in, fp32 accumulate): ONE kernel.

Each thread block owns `m_tile` output pixels (rows of both implicit GEMMs):
  1. conv1 = im2col(x) @ w1, in chunks of `n1_tile` channels: im2col and w1 tiles are gathered
     into shared memory by all threads (zero padding by predicate, never materialized in global
     memory), multiplied on tensor cores into fp32 WMMA accumulators, staged in shared memory;
  2. the s1/b1/act1 epilogue writes the chunk as fp16 into `mid`, a shared buffer holding all k1
     channels of the block's pixels (rows padded: no bank conflicts on fragment loads);
  3. conv2 = mid @ w2 in chunks of `n2_tile` channels, A operand read straight from `mid`, w2
     staged through shared memory; the s2/b2/residual/act2 epilogue stores to global memory.
With mma=1 and epilogue=1 both epilogues read the accumulator registers instead (no fp32 staging);
epilogue=2 (the sm_80+ default from 64-pixel tiles) also stages what they store to global memory
as fp16 in shared memory (128-bit stores), and loads the residual into shared memory the same way.
All extents are padded per spec (`extents`: rows to 32/64/128, channels and the reduction to 64), so
any shape is exact and every config schedules the same PrimFunc. Tile sizes are knobs (`KNOBS`)
drawn with sample_categorical: fixed to a WmmaConfig for a build, searched by tvm_b2b.tune.
`pipeline=d` loads the operand tiles d steps ahead into d+1 buffers (cp.async on sm_80+). Shared memory is planned by
tvm_b2b.lower (functions marked POOL_ATTR), not by TVM 0.27 (which gets it wrong for many tilings).
The same template, split after step 2 with `mid` in global memory, is the unfused baseline.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from tvm import s_tir

from ..op.compute import fused_prim_func, padded_extents, round_up, unfused_prim_funcs
from ..op.spec import FusedConvSpec
from ..target import max_shared_bytes, target_info
from .common import cuda_tensor_intrinsics, has_block, vector_lanes

log = logging.getLogger(__name__)

MMA = 16  # WMMA fragment edge
WARP = 32
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


# The template's knobs, each sampled by MetaSchedule (sample_categorical) and used directly as a
# split factor, so that a tuning record replays exactly.
KNOBS: dict[str, tuple[int, ...]] = {
    "warps_m": (1, 2, 4),  # warps along the pixel rows
    "warps_n": (1, 2, 4),  # warps along the channels
    "frags_m": (1, 2, 4),  # 16-row fragments per warp: m_tile = 16 * warps_m * frags_m
    "frags_n1": (1, 2, 4),  # conv1 channel fragments per warp: n1_tile = 16 * warps_n * frags_n1
    "frags_n2": (1, 2, 4, 8),  # conv2 channel fragments per warp: n2_tile = 16 * warps_n * frags_n2
    "frags_k": (1, 2, 4),  # conv1 reduction fragments per shared-memory step: k_tile = 16 * frags_k
}
CHANNEL_UNIT = 64  # channels and the 3x3 reduction are padded to this: every channel tile divides
PIPELINE_DEPTHS = (0, 1, 2, 3)  # reduction steps the operand loads run ahead (0: not pipelined)
EPILOGUES = (0, 1, 2)  # 0 fp32 staging in shared memory; 1 from the mma registers; 2 as 1, global stores staged as fp16
CONV2_K_FRAGS = 2  # conv2's reduction step in fragments (32 channels): divides the padded k1


CONFIG_ANNOTATION = "tvm_b2b.config."  # + a knob or a FIXED_FIELDS name: the root block's annotations
FIXED_FIELDS = ("pipeline", "mma", "epilogue")  # config fields that are not sampled knobs


def config_of(trace) -> "WmmaConfig | None":
    """The config a schedule of this template was made with, read from its trace: the root block's
    CONFIG_ANNOTATION annotations, each a sampled knob (its decision) or a constant. None for a trace
    without them (a record tuned before they existed: bench/migrate_records.py converts those)."""
    samples = [inst for inst in trace.insts if inst.kind.name == "SampleCategorical"]
    values = {}
    for inst in trace.insts:
        key = str(inst.attrs[0]) if inst.kind.name == "Annotate" else ""
        if not key.startswith(CONFIG_ANNOTATION):
            continue
        value = inst.inputs[1]  # the sampled variable, or a constant
        sample = next((s for s in samples if s.outputs[0].same_as(value)), None)
        values[key.removeprefix(CONFIG_ANNOTATION)] = (
            int(sample.attrs[0][int(trace.decisions[sample])]) if sample is not None else int(value))
    if set(values) != set(KNOBS) | set(FIXED_FIELDS):
        return None
    return WmmaConfig.from_knobs({k: values[k] for k in KNOBS}, **{k: values[k] for k in FIXED_FIELDS})


@dataclass(frozen=True)
class WmmaConfig:
    """The template's choices in tile sizes (what users write; `knobs()` is what is sampled)."""

    m_tile: int = 64  # output pixels per thread block
    warps_m: int = 2
    warps_n: int = 2
    k_tile: int = 32  # conv1 reduction depth staged in shared memory per step
    n1_tile: int = 64  # conv1 output channels per accumulator pass
    n2_tile: int = 64  # conv2 output channels per accumulator pass
    pipeline: int = 0  # d > 0: operand tiles loaded d reduction steps ahead (d + 1 buffers; cp.async on sm_80+)
    mma: int = 0  # 1 (sm_80+): ldmatrix + mma.sync m16n8k16 (fragments in registers) instead of WMMA
    epilogue: int = 0  # mma only: 1 the epilogues read the accumulator registers (no fp32 staging); 2 as 1, stores to global memory staged as fp16 in shared memory

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * WARP

    def knobs(self) -> dict[str, int]:
        """The knob values of this config, or ValueError naming the field no knob can express."""
        values = {
            "warps_m": ("warps_m", self.warps_m, 1),
            "warps_n": ("warps_n", self.warps_n, 1),
            "frags_m": ("m_tile", self.m_tile, MMA * self.warps_m),
            "frags_n1": ("n1_tile", self.n1_tile, MMA * self.warps_n),
            "frags_n2": ("n2_tile", self.n2_tile, MMA * self.warps_n),
            "frags_k": ("k_tile", self.k_tile, MMA),
        }
        knobs = {}
        for knob, (field, value, unit) in values.items():
            if value % unit or value // unit not in KNOBS[knob]:
                allowed = " or ".join(str(unit * c) for c in KNOBS[knob])
                raise ValueError(f"config: {field}={value} is not a tile this template takes (with these warps: {allowed})")
            knobs[knob] = value // unit
        return knobs

    @classmethod
    def from_knobs(cls, k: dict[str, int], pipeline: int = 0, mma: int = 0, epilogue: int = 0) -> "WmmaConfig":
        return cls(
            m_tile=MMA * k["warps_m"] * k["frags_m"], warps_m=k["warps_m"], warps_n=k["warps_n"],
            k_tile=MMA * k["frags_k"], n1_tile=MMA * k["warps_n"] * k["frags_n1"],
            n2_tile=MMA * k["warps_n"] * k["frags_n2"], pipeline=pipeline, mma=mma, epilogue=epilogue,
        )

    def to_string(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    @classmethod
    def parse(cls, text: str) -> "WmmaConfig":
        """'m_tile=128,warps_m=4' -> WmmaConfig (fields not given keep defaults)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, int] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, raw = (p.strip() for p in item.partition("="))
            if key not in fields:
                raise ValueError(f"{key}: not a WmmaConfig field (expected one of {', '.join(sorted(fields))})")
            try:
                values[key] = int(raw)
            except ValueError:
                raise ValueError(f"{key}: expected an integer, got {raw!r}") from None
        return cls(**values)


def pixel_unit(spec: FusedConvSpec) -> int:
    """Rows are padded to this: it is the largest M tile a spec can use (small layers keep small
    tiles so that they still make several blocks)."""
    return 128 if spec.m >= 2048 else 64 if spec.m >= 256 else 32


def extents(spec: FusedConvSpec) -> dict[str, int]:
    """The padded GEMM extents: fixed per spec (not per config), so that every config schedules
    the same PrimFunc, which is the tuning workload."""
    return padded_extents(spec, pixel_unit(spec), k_tile=CHANNEL_UNIT, n_tile=CHANNEL_UNIT)


MIN_BLOCKS = 128  # about one thread block per SM of a large GPU (the H200 has 132)


def default_config(spec: FusedConvSpec, arch: int = 80) -> WmmaConfig:
    """The untuned choice, 2x2 warps. sm_80 and newer: ldmatrix + mma.sync, operand loads one
    64-deep reduction step ahead (cp.async), and the largest pixel tile (128/64/32) that still gives
    MIN_BLOCKS blocks. Epilogues from the registers with 128-bit stores (epilogue=2) from 64-pixel
    tiles up, the staged epilogue (0) on 32-pixel tiles, where it measured faster (H200, 56x56
    64->64->k2: N=32 k2=128 41.5 vs 45.0 us, +r k2=256 68.9 vs 76.1; m_tile=64 50.3 vs 52.6; N=1
    (m_tile=32) k2=128 7.1 vs 7.6, k2=256 8.2 vs 9.3, +r 9.4 vs 11.9; bench/results/h200_s6_1_*,
    h200_s7_1_*, fused_h200_s7_*). Older GPUs: WMMA, 64-pixel tiles (32 where the padded rows take
    only 32)."""
    m = extents(spec)["m"]
    if arch < 80:
        return WmmaConfig(m_tile=32) if m % 64 else WmmaConfig()
    tiles = [t for t in (128, 64, 32) if m % t == 0]
    m_tile = next((t for t in tiles if m // t >= MIN_BLOCKS), tiles[-1])
    return WmmaConfig(m_tile=m_tile, k_tile=64, pipeline=1, mma=1, epilogue=2 if m_tile >= 64 else 0)


def stages_residual(spec: FusedConvSpec, cfg: WmmaConfig) -> bool:
    """Whether the schedule loads the residual into a shared tile: with epilogue=2 (the register
    epilogue would otherwise read it from global memory in the 2-byte pieces of the mma layout: H200,
    N=32 56x56 64->64->256 +r 68.9 us with the tile, 79.4 without, bench/results/h200_s7_1_*)."""
    return bool(spec.residual and cfg.mma and cfg.epilogue == 2)


def check_config(spec: FusedConvSpec, cfg: WmmaConfig, arch: int = 80) -> WmmaConfig:
    """The config if its tiles divide the spec's padded extents and the arch has what it uses,
    else ValueError naming the field."""
    ext = extents(spec)
    return check_fields(spec, cfg, arch, (("m_tile", ext["m"], "pixel rows"), ("k_tile", ext["r"], "3x3 reduction"),
                                          ("n1_tile", ext["k1"], "k1 channels"), ("n2_tile", ext["k2"], "k2 channels")))


def check_fields(spec, cfg: WmmaConfig, arch: int, tiled) -> WmmaConfig:
    """check_config of any op this template schedules: `tiled` lists (field, padded extent, what it
    tiles), each field of cfg having to divide its extent."""
    cfg.knobs()
    if cfg.pipeline not in PIPELINE_DEPTHS:
        raise ValueError(f"config: pipeline={cfg.pipeline} is not a depth this template takes ({', '.join(map(str, PIPELINE_DEPTHS))})")
    if cfg.epilogue not in EPILOGUES:
        raise ValueError(f"config: epilogue={cfg.epilogue} is not an epilogue this template has ({', '.join(map(str, EPILOGUES))})")
    if cfg.epilogue and not cfg.mma:
        raise ValueError(f"config: epilogue={cfg.epilogue} reads mma.sync accumulator registers: it needs mma=1")
    if cfg.mma and arch < 80:
        raise ValueError(f"config: mma=1 needs sm_80 or newer (mma.sync m16n8k16), not sm_{arch}")
    for field, extent, what in tiled:
        if extent % getattr(cfg, field):
            raise ValueError(f"config: {field}={getattr(cfg, field)} does not divide the {extent} padded {what} of {spec.to_string()}")
    return cfg


def aligned_row(row: int, factor: int, offset: int) -> int:
    """Row stride after storage_align(factor, offset): the smallest >= row that is offset mod factor."""
    return round_up(row - offset, factor) + offset


def shared_bytes(spec: FusedConvSpec, cfg: WmmaConfig) -> int:
    """Shared memory the fused kernel needs, with the padded row strides the schedule asks for: an
    upper bound of what tvm_b2b.lower plans (each GEMM's phase holds the intermediate, one chunk of
    fp32 accumulators and its operand tiles, conv2's also the residual tile if staged;
    tests/test_lower.py checks the bound)."""
    ext, e = extents(spec), DTYPE_BYTES[spec.dtype]
    mid = cfg.m_tile * aligned_row(ext["k1"], 64, 8) * e
    widest = max(cfg.n1_tile, cfg.n2_tile)
    # the epilogues' shared tile: fp32 accumulators (epilogue=0), none (1), the fp16 tile that global
    # stores read (2; fused: conv2's chunk, unfused: the wider one)
    acc = {0: cfg.m_tile * aligned_row(widest, 32, 4) * 4, 1: 0, 2: cfg.m_tile * aligned_row(widest, 64, 8) * e}[cfg.epilogue]
    stage1 = cfg.m_tile * aligned_row(cfg.k_tile, 64, 8) + cfg.k_tile * aligned_row(cfg.n1_tile, 64, 8)
    stage2 = CONV2_K_FRAGS * MMA * aligned_row(cfg.n2_tile, 64, 8)
    copies = cfg.pipeline + 1  # one buffer per step in flight
    residual = cfg.m_tile * aligned_row(cfg.n2_tile, 64, 8) if stages_residual(spec, cfg) else 0  # live in conv2's phase
    alignment = 6 * 128  # tvm_b2b.lower starts each of (at most 6) buffers on a 128-byte boundary
    return mid + acc + e * max(stage1 * copies, stage2 * copies + residual) + alignment


FUSION_MAX_K1 = 64


def fusion_loss_reason(spec: FusedConvSpec) -> str | None:
    """Why this template's fused kernel is expected to be slower than its two-kernel form (None
    when fusing pays). Measured on the H200 (bench/results/fused_h200_tuned_20261202.txt): fused
    wins at k1 = 64 for every N (1.02-2.0x), loses from k1 = 128 on (0.1-0.9x): each block then
    runs a long conv1 reduction over all k1 channels alone, where two kernels spread channel
    chunks over more blocks. On sm_90 too where the 3x3 alone would run on the Hopper conv kernel
    (bench/results/fused_singles_h200_s16.txt, the two convs as a model runs them unfused): N=32 56x56
    64->64->256 +r fused 67.9 us against 79.3; 64->64->64 35.9 against 37.7; N=8 23.4 against 23.0."""
    if spec.k1 > FUSION_MAX_K1:
        return (f"k1={spec.k1} > {FUSION_MAX_K1}: this fused kernel measured slower than two kernels at "
                f"such widths (H200)")
    return None


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
        self.staged = 0  # operand copies inside k_outer
        self.late = 0  # of those, the last ones that the pipeline leaves in the step of the MMAs
        self.acc_name = ""  # the block storing the accumulators to shared memory
        self.tensorize_at: list = []
        self.init = None


class WmmaFusedSchedule:
    """Schedules the fused PrimFunc, or either stage of the unfused baseline (recognized by blocks).
    Every tile size comes from a sampled knob (`KNOBS`): fixed to `cfg` when one is given, drawn
    at random otherwise (MetaSchedule's design space, tvm_b2b.tune)."""

    def __init__(self, sch: s_tir.Schedule, spec: FusedConvSpec, cfg: WmmaConfig | None, arch: int = 80):
        intrin = cuda_tensor_intrinsics()  # slow import (1.5 s on 2 cores; 7 s without moduleless_files_known): only here

        self.mma = bool(cfg and cfg.mma)
        self.from_registers = bool(cfg and cfg.mma and cfg.epilogue)
        self.stage_output = bool(cfg and cfg.mma and cfg.epilogue == 2)
        self.residual_tile = bool(cfg and stages_residual(spec, cfg))
        if self.mma:  # fragments in registers ("warp" scope) in the ldmatrix layout
            self.intrin = {
                "load_a": intrin.LDMATRIX_f16_A_DYN_INTRIN, "load_b": intrin.LDMATRIX_f16_B_DYN_INTRIN,
                "sync": intrin.MMA_f16f16f32_INTRIN, "fill": intrin.MMA_fill_16x16_f32_INTRIN,
                "store": intrin.MMA_store_16x16_f32_shared_dyn_INTRIN,
            }
            self.layout = intrin.shared_16x16_to_ldmatrix_32x8_layout
        else:
            self.intrin = {
                "load_a": intrin.WMMA_LOAD_16x16x16_F16_A_DYN_INTRIN,
                "load_b": intrin.WMMA_LOAD_16x16x16_F16_B_DYN_INTRIN,
                "sync": intrin.WMMA_SYNC_16x16x16_f16f16f32_INTRIN,
                "fill": intrin.WMMA_FILL_16x16x16_F32_INTRIN,
                "store": intrin.WMMA_STORE_16x16x16_F32_SHARED_DYN_INTRIN,
            }
        self.sch, self.spec = sch, spec
        self.pipeline, self.arch = cfg.pipeline if cfg else 0, arch
        chosen = cfg.knobs() if cfg else {}
        # a single conv has no second GEMM: its frags_n2 is recorded as a constant, not searched
        unused = {"frags_n2"} if has_block(sch, "w_gemm") else set()
        self.knob = {
            name: sch.sample_categorical(list(c), [1 / len(c)] * len(c),
                                         decision=c.index(chosen[name]) if chosen else None)
            if name not in unused else chosen.get(name, c[0])
            for name, c in KNOBS.items()
        }
        # the config, recorded on the schedule itself (config_of reads it back from any trace of it)
        root = sch.get_sblock("root")
        for name, knob in self.knob.items():
            sch.annotate(root, CONFIG_ANNOTATION + name, knob)
        for name in FIXED_FIELDS:
            sch.annotate(root, CONFIG_ANNOTATION + name, getattr(cfg, name) if cfg else 0)

    def run(self) -> s_tir.Schedule:
        sch, knob = self.sch, self.knob
        if has_block(sch, "w_gemm"):
            return self._single_conv()
        has1, has2 = has_block(sch, "conv1"), has_block(sch, "conv2")
        # tiles cover the padded extents
        block_x, n_chunk = self._output_tiles("out_pad" if has2 else "mid", knob["frags_n2" if has2 else "frags_n1"])
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
            self._stage1(fused=has2)
        if has2:
            self._stage2(fused=has1)
        return sch

    def _output_tiles(self, block: str, frags_n):
        """Tiles the padded output `block`: (pixel tiles, bound to blockIdx.x; channel chunks of
        `frags_n` fragments per warp)."""
        sch, knob = self.sch, self.knob
        *outer, m, n = sch.get_loops(sch.get_sblock(block))
        if outer:  # split-K slices (op.conv.split_prim_funcs) or a grouped conv's groups: a grid dimension of their own
            sch.bind(outer[0], "blockIdx.z")
        block_x, *m_in = sch.split(m, [None, knob["warps_m"], knob["frags_m"], MMA])
        n_chunk, *n_in = sch.split(n, [None, knob["warps_n"], frags_n, MMA])
        sch.reorder(block_x, n_chunk, *m_in, *n_in)
        sch.fuse(*m_in)
        sch.fuse(*n_in)
        sch.bind(block_x, "blockIdx.x")
        return block_x, n_chunk

    def _single_conv(self) -> s_tir.Schedule:
        """One convolution (op.conv's GEMM form): a pixel tile and a channel chunk per block (the
        chunks are blocks too: many blocks even where few pixels give few row tiles), its im2col and
        weight tiles staged like the pair's conv1, its epilogue like the pair's conv2."""
        sch, spec = self.sch, self.spec
        split = not has_block(sch, "out_pad")  # a split-K slice: its partial sums are the output
        _, n_chunk = self._output_tiles("out" if split else "out_pad", self.knob["frags_n1"])
        sch.bind(n_chunk, "blockIdx.y")
        sch.compute_at(sch.get_sblock("conv"), n_chunk)
        g = self._gemm(sch.get_sblock("conv"), self.knob["frags_n1"], self.knob["frags_k"])
        channels = spec.k // spec.groups  # a grouped conv's GEMMs are its groups' (blockIdx.z: _output_tiles)
        self._to_shared(g, 0, vector_lanes(spec.c // spec.groups, 8))
        self._to_shared(g, 1, vector_lanes(channels, 8))
        sch.compute_inline(sch.get_sblock("im2col"))
        sch.compute_inline(sch.get_sblock("w_gemm"))
        if not split:
            sch.compute_inline(sch.get_sblock("out_pad"))
        self._epilogue(g, sch.get_sblock("out"), channels, to_global=True)
        if self.residual_tile:
            self._residual_tile(g, sch.get_sblock("out"), channels)
        self._tensorize(g)
        return sch

    def _stage1(self, fused: bool):
        sch, spec = self.sch, self.spec
        g = self._gemm(sch.get_sblock("conv1"), self.knob["frags_n1"], self.knob["frags_k"])
        self._to_shared(g, 0, vector_lanes(spec.c, 8))
        self._to_shared(g, 1, vector_lanes(spec.k1, 8))
        sch.compute_inline(sch.get_sblock("im2col"))
        sch.compute_inline(sch.get_sblock("w1_gemm"))
        mid = sch.get_sblock("mid")
        self._epilogue(g, mid, spec.k1, to_global=not fused)
        if fused:
            sch.set_scope(mid, 0, "shared.dyn")
            sch.storage_align(mid, 0, axis=-2, factor=64, offset=8)
        self._tensorize(g)

    def _stage2(self, fused: bool):
        sch, spec = self.sch, self.spec
        g = self._gemm(sch.get_sblock("conv2"), self.knob["frags_n2"], self._conv2_k_frags())
        if not fused:  # mid comes from global memory: stage it like any operand
            self._to_shared(g, 0, 8)
        self._to_shared(g, 1, vector_lanes(spec.k2, 8))
        if fused:
            self._place_mid(g)
        sch.compute_inline(sch.get_sblock("w2_gemm"))
        # the epilogue reads the accumulators once and trims the padding as it stores y
        sch.compute_inline(sch.get_sblock("out_pad"))
        self._epilogue(g, sch.get_sblock("out"), spec.k2, to_global=True)
        if self.residual_tile:
            self._residual_tile(g, sch.get_sblock("out"), spec.k2)
        self._tensorize(g)

    def _conv2_k_frags(self) -> int:
        """conv2's reduction step in fragments."""
        return CONV2_K_FRAGS

    def _place_mid(self, g: _Gemm) -> None:
        """Where the fused kernel computes mid relative to conv2's GEMM: here all of it before (run puts
        it at the pixel tile), a rule may compute it per reduction step instead."""

    def _epilogue(self, g: _Gemm, block, channels: int, to_global: bool):
        """Places the GEMM's epilogue `block` (`channels` wide): per channel chunk, right after that
        chunk's accumulators are staged in shared memory, all threads reading them (epilogue=0); or per
        warp, each lane reading its accumulator registers (1, 2). With epilogue=2 what it writes to
        global memory goes through a padded fp16 shared tile, which all threads store with 128-bit
        accesses (epilogue=1's own stores are the 2-byte pieces of the mma layout: 1.6x slower on the
        H200)."""
        sch = self.sch
        if not self.from_registers:
            sch.reverse_compute_at(block, g.chunk, preserve_unit_loops=True)
        store = sch.cache_write(block, 0, "shared.dyn") if self.stage_output and to_global else None
        self._fragments(g, block)
        if not self.from_registers:
            self._threads(block, vector_lanes(channels, 4))
        if store is not None:
            sch.reverse_compute_at(store, g.chunk, preserve_unit_loops=True)
            sch.storage_align(block, 0, axis=-2, factor=64, offset=8)
            self._threads(store, vector_lanes(channels, 8))

    def _residual_tile(self, g: _Gemm, block, channels: int):
        """The residual tile of the chunk loaded by all threads with 128-bit accesses into shared
        memory, before the chunk's GEMM, where the register epilogue reads it (it would otherwise read
        global memory in the 2-byte pieces of the mma layout)."""
        sch = self.sch
        index = next(i for i, region in enumerate(sch.get(block).reads) if "residual" in str(region.source))
        tile = sch.cache_read(block, index, "shared.dyn")
        sch.compute_at(tile, g.chunk, preserve_unit_loops=True)
        sch.storage_align(tile, 0, axis=-2, factor=64, offset=8)
        self._threads(tile, vector_lanes(channels, 8))

    def _gemm(self, block, frags_n, frags_k) -> _Gemm:
        """Blockize the (m, n, k) loops under the tile into 16x16x16 MMAs, spread over warps."""
        sch, knob = self.sch, self.knob
        m, n, k = sch.get_loops(block)[-3:]
        m, m_i = sch.split(m, [None, MMA])
        n, n_i = sch.split(n, [None, MMA])
        k, k_i = sch.split(k, [None, MMA])
        sch.reorder(m, n, k, m_i, n_i, k_i)
        outer = sch.blockize(m_i)
        warp_m, frag_m = sch.split(m, [knob["warps_m"], knob["frags_m"]])
        chunk, warp_n, frag_n = sch.split(n, [None, knob["warps_n"], frags_n])
        k_outer, k_inner = sch.split(k, [None, frags_k])
        sch.reorder(chunk, warp_m, warp_n, k_outer, k_inner, frag_m, frag_n)
        warp = sch.fuse(warp_m, warp_n)
        sch.bind(warp, "threadIdx.y")
        return _Gemm(outer, block, chunk, warp, k_outer, k_inner)

    def _to_shared(self, g: _Gemm, operand: int, lanes: int):
        """Stage one GEMM operand tile in shared memory, loaded cooperatively and vectorized."""
        sch = self.sch
        copy = sch.cache_read(g.outer, operand, "shared.dyn")
        sch.compute_at(copy, g.k_outer, preserve_unit_loops=True)
        g.staged += 1
        self._threads(copy, lanes)
        # pad each row by 8 elements (16 bytes): fragment loads then hit distinct banks
        sch.storage_align(copy, 0, axis=-2, factor=64, offset=8)

    def _threads(self, block, lanes: int):
        """Spread a 2-D copy/epilogue block over all threads, `lanes` elements per access."""
        sch, knob = self.sch, self.knob
        fused = sch.fuse(*sch.get_loops(block)[-2:])
        _, ty_m, ty_n, tx, vec = sch.split(fused, [None, knob["warps_m"], knob["warps_n"], WARP, lanes])
        sch.bind(sch.fuse(ty_m, ty_n), "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)

    def _fragments(self, g: _Gemm, epilogue):
        """Operand fragments at the inner k loop; accumulators stored per warp to shared memory,
        where `epilogue` reads them, or (mma, epilogue=1) `epilogue` reads the accumulator registers
        itself, each lane its own elements (no fp32 staging in shared memory, no barrier around it)."""
        sch = self.sch
        frag_a = sch.cache_read(g.outer, 0, "warp" if self.mma else "wmma.matrix_a")
        frag_b = sch.cache_read(g.outer, 1, "warp" if self.mma else "wmma.matrix_b")
        sch.compute_at(frag_a, g.k_inner)
        sch.compute_at(frag_b, g.k_inner)
        acc = sch.cache_write(g.outer, 0, "warp" if self.mma else "wmma.accumulator")
        tiled = (frag_a, frag_b) if self.from_registers else (frag_a, frag_b, acc)
        # the block and side through which the accumulator buffer gets the mma layout (below)
        acc_layout_at = (g.outer, "write") if self.from_registers else (acc, "read")
        if self.from_registers:
            # the epilogue reads the registers, placed per warp while their layout is still (m, n)
            sch.compute_inline(acc)
            sch.reverse_compute_at(epilogue, g.warp)
        else:
            sch.reverse_compute_at(acc, g.warp)
            sch.set_scope(acc, 0, "shared.dyn")
            g.acc_name = sch.get(acc).name_hint
        for block, intrin in zip(tiled, (self.intrin["load_a"], self.intrin["load_b"], self.intrin["store"])):
            i, j = sch.get_loops(block)[-2:]
            i0, i1 = sch.split(i, [None, MMA])
            j0, j1 = sch.split(j, [None, MMA])
            sch.reorder(i0, j0, i1, j1)
            g.tensorize_at.append((i1, intrin))
        if self.mma:
            # (i, j) of a 2-D buffer, or of each slice of a 3-D one (split-K's accumulators: (slice, i, j))
            layout = lambda *ix: (*ix[:-2], ix[-2] // MMA, ix[-1] // MMA, *self.layout(ix[-2] % MMA, ix[-1] % MMA))  # noqa: E731
            sch.transform_layout(frag_a, ("write", 0), layout)
            sch.transform_layout(frag_b, ("write", 0), layout)
            block, side = acc_layout_at
            sch.transform_layout(block, (side, 0), layout)
        if self.from_registers:
            self._lanes(epilogue)
        g.init = sch.decompose_reduction(g.outer, g.k_outer)
        if self.pipeline:
            # k_outer's body: the operand copies, then the MMA loop; the copies run `pipeline` steps
            # ahead (cp.async where the target has it: see codegen.compile_module), which hides L2's
            # latency when one step's MMAs take less time than a load
            early = g.staged - g.late  # (the late producers last: computed in the step that uses them)
            sch.annotate(g.k_outer, "software_pipeline_stage", [0] * early + [self.pipeline] * (g.late + 1))
            sch.annotate(g.k_outer, "software_pipeline_order", list(range(g.staged + 1)))
            if self.arch >= 80:  # cp.async exists from sm_80 on; before, copies go through registers
                sch.annotate(g.k_outer, "software_pipeline_async_stages", [0])

    def _lanes(self, block):
        """The per-warp loops of `block` over the 16x16 accumulator tiles, as (lane, register) of the
        mma layout (element (i, j) of a tile: lane 4 (i % 8) + (j % 8) // 2, register 4 (j // 8) +
        2 (i // 8) + j % 2), the lane bound to threadIdx.x: each thread reads only its own registers."""
        sch = self.sch
        i, j = sch.get_loops(block)[-2:]
        i0, i_hi, i_lo = sch.split(i, [None, 2, 8])
        j0, j_hi, j_mid, j_lo = sch.split(j, [None, 2, 4, 2])
        sch.reorder(i0, j0, i_lo, j_mid, j_hi, i_hi, j_lo)
        sch.bind(sch.fuse(i_lo, j_mid), "threadIdx.x")  # (vectorizing j_lo breaks LowerWarpMemory)

    def _tensorize(self, g: _Gemm):
        sch = self.sch
        for loop, intrin in g.tensorize_at:
            sch.tensorize(loop, intrin)
        init_inner = sch.get_child_blocks(g.init)[0]
        sch.tensorize(sch.get_loops(init_inner)[-2], self.intrin["fill"])
        sch.tensorize(sch.get_loops(g.inner)[-3], self.intrin["sync"])
        if g.acc_name:
            # pad the fp32 staging rows (64 floats would put every row of a fragment store on the same
            # banks): after tensorize, which drops the annotations of the block it replaces
            sch.storage_align(sch.get_sblock(g.acc_name + "_o"), 0, axis=-2, factor=32, offset=4)


LDMATRIX_INDEX_MAP = "tirx.index_map.shared_16x16_to_ldmatrix_32x8_layout"


def register_ldmatrix_index_map() -> None:
    """CUDA codegen of ldmatrix/mma looks this index map up by name. TVM registers it when
    tvm.s_tir.tensor_intrin.cuda is imported (1.5 s: cuda_tensor_intrinsics); a build worker that only compiles already
    scheduled modules registers this copy instead (the same map: element (i, j) of a 16x16 tile ->
    (lane, register); the generated CUDA is identical). Only for processes that never import
    tensor_intrin afterwards: TVM's own registration would then fail as a duplicate."""
    import tvm_ffi

    if tvm_ffi.get_global_func(LDMATRIX_INDEX_MAP, allow_missing=True) is not None:
        return

    def index_map(ind):
        from tvm.runtime import convert

        i, j = ind[0], ind[1]
        return convert([4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + (i // 8) * 2 + (j % 2)])

    tvm_ffi.register_global_func(LDMATRIX_INDEX_MAP, index_map)


def workload(spec: FusedConvSpec):
    """The fused op's PrimFunc in the padded GEMM form this template schedules, as an IRModule
    ("main"): what MetaSchedule tunes and what tuning records are keyed on."""
    import tvm

    return tvm.IRModule({"main": fused_prim_func(spec, extents(spec))})


def marked(sch: s_tir.Schedule):
    """The scheduled PrimFunc, marked for our shared-memory planning (tvm_b2b.lower)."""
    from ..lower import POOL_ATTR

    return sch.mod["main"].with_attr(POOL_ATTR, True)


class TensorCoreRule:
    """The CUDA tensor-core rule (this template): fp16 on sm_70+, WmmaConfig parameters."""

    name = "CUDA"
    knobs = KNOBS
    schedule_class = WmmaFusedSchedule  # what schedules a config (the tuner's design space too)

    def workload(self, spec):
        """The pair's PrimFunc in this rule's padded form (`extents`), as an IRModule ("main"): what
        MetaSchedule tunes and tuning records are keyed on (the dense pair's: module-level `workload`)."""
        import tvm

        return tvm.IRModule({"main": fused_prim_func(spec, self.extents(spec))})

    def can_implement(self, spec, info) -> str | None:
        if spec.groups > 1:
            return f"a grouped conv (groups={spec.groups}): not a dense GEMM"
        return unsupported_reason(spec, info.arch)

    def default_config(self, spec: FusedConvSpec, info) -> WmmaConfig:
        return default_config(spec, info.arch)

    def parse_config(self, config):
        return WmmaConfig.parse(config) if isinstance(config, str) else config

    check_config = staticmethod(check_config)
    shared_bytes = staticmethod(shared_bytes)
    extents = staticmethod(extents)
    fusion_loss_reason = staticmethod(fusion_loss_reason)

    def fits(self, spec, cfg: WmmaConfig, arch: int) -> bool:
        """Whether cfg tiles the spec and its kernel fits the arch's shared memory (a tuning draw)."""
        try:
            self.check_config(spec, cfg, arch)
        except ValueError:
            return False
        return self.fits_shared_memory(spec, cfg, arch)

    def plan(self, spec: FusedConvSpec, info, config: WmmaConfig | None = None, fused: bool = True, policy: bool = False,
             unfused: bool = True):
        """The op in padded form (`extents`), scheduled by `schedule_class`, and the one decision whether
        it runs fused: not when asked for two kernels, nor with `policy` where fusing measured slower
        (`fusion_loss_reason`; then with the default config), nor where the fused kernel's shared memory
        (after any epilogue fallback) exceeds the GPU's. unfused=False: where it does not fuse, the plan
        has no kernels (a model's frontend runs such a pair's convs as single convs: the two-kernel form
        is not scheduled for nothing). The rules of pairs share it, each with its own hooks."""
        from . import Plan

        arch = info.arch
        slower = self.fusion_loss_reason(spec) if fused and policy else None  # its tuned config is the fused kernel's
        reason = slower or (None if fused else "the two-kernel form was asked for")
        cfg = self.check_config(spec, self.default_config(spec, info) if config is None or slower else config, arch)
        if not reason and not self.fits_shared_memory(spec, cfg, arch):
            reason = self._too_large(spec, cfg, arch)
        if reason and not unfused:
            return Plan([], False, cfg, reason, fusable=reason == slower)
        given = config is not None and not slower
        schedules, used = buildable_schedules(self._funcs(spec, not reason), spec, cfg, info.target, self.schedule_class,
                                              given)
        if not reason and used != cfg and not self.fits_shared_memory(spec, used, arch):
            reason = self._too_large(spec, used, arch)  # the staged epilogue's fallback needs more: two kernels
            if not unfused:
                return Plan([], False, used, reason, fusable=False)
            schedules, used = buildable_schedules(self._funcs(spec, False), spec, used, info.target, self.schedule_class,
                                                  given)
        ext = self.extents(spec)
        return Plan([marked(sch) for sch in schedules], not reason, used, reason or "",
                    (ext["m"], ext["k1"]) if reason else None, schedules, fusable=not reason or reason == slower)

    def _funcs(self, spec: FusedConvSpec, fused: bool) -> list:
        ext = self.extents(spec)
        return [fused_prim_func(spec, ext)] if fused else list(unfused_prim_funcs(spec, ext))

    def fits_shared_memory(self, spec, cfg: WmmaConfig, arch: int) -> bool:
        """Whether the fused kernel's shared memory (the rule's shared_bytes) fits the arch's."""
        return self.shared_bytes(spec, cfg) <= max_shared_bytes(arch)

    def _too_large(self, spec, cfg: WmmaConfig, arch: int) -> str:
        """The reason (logged) why a fused kernel with cfg does not fit the arch's shared memory."""
        reason = (f"too large for shared memory ({self.shared_bytes(spec, cfg) // 1024} KiB with {cfg.to_string()}, "
                  f"sm_{arch} has {max_shared_bytes(arch) // 1024} KiB)")
        log.warning("not fused: %s: %s; running two kernels instead", spec.to_string(), reason)
        return reason


RULE = TensorCoreRule()


def buildable_schedules(funcs, spec: FusedConvSpec, cfg: WmmaConfig, target,
                        schedule_class=None, given: bool = True) -> tuple[list[s_tir.Schedule], WmmaConfig]:
    """The PrimFuncs scheduled with cfg, and cfg; where TVM 0.27 cannot schedule or lower cfg's
    register epilogue (1, 2) for this shape (e.g. k2=16 at stride 2: LowerWarpMemory cannot map the
    trimmed output onto the mma layout), scheduled with the staged epilogue (0, same tiles) and that
    config, with a logged reason: a warning where the config was given (a user's or a tuned record's), at
    INFO where it is the rule's default (the fallback is then how the default builds: a MobileNetV2 compile
    printed a TVM check failure per narrow conv). Register-epilogue kernels are therefore lowered once here,
    where a fallback is still possible (a model build lowers all its kernels together). What a build runs
    and what the tuner measures as the default both come from here."""
    from ..lower import error_line, lowering_error

    arch, error, schedule_class = target_info(target).arch, None, schedule_class or WmmaFusedSchedule
    try:
        schedules = [schedule_class(s_tir.Schedule(f), spec, cfg, arch).run() for f in funcs]
        if cfg.epilogue:
            error = lowering_error([marked(sch) for sch in schedules], target)
    except s_tir.ScheduleError as err:
        if not cfg.epilogue:
            raise
        error = error_line(err)
    if error is None:
        return schedules, cfg
    log.log(logging.WARNING if given else logging.INFO, "%s: epilogue=%d does not build for this shape in TVM 0.27 (%s); "
            "using the staged epilogue (epilogue=0) with the same tiles", spec.to_string(), cfg.epilogue, error)
    return buildable_schedules(funcs, spec, dataclasses.replace(cfg, epilogue=0), target, schedule_class, given)
