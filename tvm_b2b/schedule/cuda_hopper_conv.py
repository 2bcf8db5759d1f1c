"""Hopper rule of the single convolution (op.conv) on sm_90: TMA copies and warpgroup MMA (wgmma), the
instructions cuBLAS and CUTLASS use on Hopper, for dense fp16 convs of any kernel size and stride. The template of
cuda_conv (ldmatrix + mma.sync) stops near 250 TFLOP/s on ResNet-50's batch-32 convs, its 1x1 convs at 110-190
(bench/results/convs_h200_s12_configs.txt).

TVM 0.27 has no schedule primitive that emits wgmma or TMA, so the kernel is written in TIRx script (TVM's
own T.ptx instructions, tests/python/tirx/codegen/test_codegen_hopper.py upstream), not scheduled from a TE
definition: it has no MetaSchedule space (its three parameters are given, not searched), and it is lowered
by TVM's TIRx pipeline (tvm_b2b.lower partitions a module by TIRX_ATTR) and compiled for sm_90a (wgmma is
an arch-specific instruction; codegen.compile_module asks for it).

y (m, k) = act(conv(x, w) * s + b [+ residual]) as an implicit GEMM over the m = n*ho*wo output pixels, the
reduction in steps of 64 channels of one tap, w as (k, kh*kw*c) (InputForm's "kc" weights: both operands K-major
in shared memory, as wgmma reads them); which pixels a block takes and how TMA reads them: Tiling.
- a block computes `bm` pixel rows x `bn` channels: bm / 64 consumer warpgroups of wgmma m64n{bn}k16, one
  producer warpgroup (or warp: producer_threads) whose first thread issues the TMA copies (warp specialization);
- `stages` buffers of 64-channel steps (128-byte rows, 128B swizzle), each with a "full" mbarrier (TMA's
  transaction count) and an "empty" one (each consumer warp arrives once wgmma.wait_group says the step's
  multiplies are done; with 2+ buffers one step's stay in flight while the next is issued);
- the epilogue from the accumulator registers (scale, bias, [residual], act) into a 128B-swizzled fp16
  tile in shared memory, two channels a store, stored by TMA in 64-channel boxes; a residual tile comes into
  that tile by TMA (y's map on r) while the mainloop runs, and the epilogue replaces it in place. TMA reads
  coordinates outside a tensor as zeros and does not write them: any pixel count works, and the conv's padding
  costs nothing;
- a dilated conv in the taps' form: each tap's box `dilation` pixels from the last (Tiling.tap; its policy leaves
  it to cuda_conv's kernel until measured: measured_slower);
- the halo form (`halo=1`, undilated stride-1 convs; Tiling): one box of x a 64-channel step for all taps, in buffers of its
  own (two: one per channel step), beside the ring of w's tap tiles; a tap's wgmma operand starts rows into it;
- a narrow conv (16 or 32 channels: narrow_taps; a stem as its space-to-depth cells, input_form) packs 4 or 2 taps
  into a step, each a box of x in rows of 32 or 64 bytes (TMA's and wgmma's 32B or 64B swizzle).

ON by default on sm_90 (`TVM_B2B_HOPPER=0` turns it off) where it measured faster than cuda_conv's kernel on the
H200 (`bash bench/gpu_session.sh hopperconvs`, bench/results/convs_h200_s15_hopper*.txt): at batch 32 every
ResNet-50 conv with 2+ reduction steps, 1.2-1.9x (3x3 7x7 512: 22.9 vs 42.4 us); `measured_slower` names where not;
in the halo form where `halo_wins`.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass, fields

from ..lower import TIRX_ATTR
from ..op.activation import activation
from ..op.conv import ConvSpec, InputForm, space_to_depth, stem
from ..target import SM90_SMS, max_shared_bytes, sm90_count

ENABLE_ENV = "TVM_B2B_HOPPER"  # "0": off (cuda_conv's kernel everywhere); "all": wherever it computes the spec
PRODUCER_ENV = "TVM_B2B_HOPPER_PRODUCER"  # "warpgroup" (default) or "warp": the producer's threads (producer_threads)
PERSIST_ENV = "TVM_B2B_HOPPER_PERSIST"  # "1" / "0": every default config takes a persistent grid where it can / none
# (unset: a conv's by persist_default's measured rule, a pair's none)
SB_ENV = "TVM_B2B_HOPPER_SB"  # "shared": the epilogues read scale and bias from shared memory (scale_bias_bytes); "global"
MIN_STEPS = 2  # reduction steps (64 channels each) below which the epilogue dominates (see measured_slower)
PERSIST_MAX_STEPS = 8  # reduction steps up to which a persistent grid measured faster (persist_default)
BK = 64  # reduction step: 64 fp16 = 128 bytes, one row of the 128B swizzle atom
WGMMA_K = 16
SWIZZLE_128B = 3  # CUtensorMapSwizzle's and the wgmma descriptor's code of the 128-byte swizzle
SWIZZLE_OF_ROW = {32: 1, 64: 2, 128: SWIZZLE_128B}  # the same codes by the bytes of a row (narrow_taps' x boxes)
CLUSTER_SIZES = (1, 2, 4, 8)  # the pair's cluster sizes (cs): portable ones that split k1 into whole 64-channel steps
MAX_GRID_Y = 65535  # the pixel blocks run along blockIdx.y: consecutive blocks share x's tile (L2) across channel blocks
CONSUMERS = 8  # the named barrier of the consumer warpgroups (0 is __syncthreads, 1 + i warpgroup i's)
DESC_LBO, DESC_SBO = 1, 64  # K-major 128B swizzle: leading offset unused; 8 rows x 128 B = 1024 B apart (16-B units)
FENCE_SOURCE = """
__forceinline__ __device__ void tvm_b2b_fence_acc(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
"""  # after wgmma.wait_group: no read of an accumulator moves above the wait (CUTLASS's warpgroup_fence_operand);
# TVM 0.27's T.cuda.wgmma.noop_barrier fails in codegen and takes its operand by value
STORE_SOURCE = """
__forceinline__ __device__ void tvm_b2b_store_half2(half* at, float lo, float hi) {
  *reinterpret_cast<half2*>(at) = __floats2half2_rn(lo, hi);
}
"""  # an accumulator pair (two adjacent channels) as one 4-byte shared store: half the epilogue's store instructions
RESIDUAL_SOURCE = {part: f"""
__forceinline__ __device__ float tvm_b2b_half2_{part}(half* at) {{ return __{part}2float(*reinterpret_cast<half2*>(at)); }}
""" for part in ("low", "high")}  # the residual's two channels of an accumulator pair, from the output tile where TMA put them
# (a function a source: codegen adds each call's source once per function name)
BARRIER_INIT_SOURCE = """
__forceinline__ __device__ void tvm_b2b_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
"""  # the mbarrier inits, visible to the cluster (CUTLASS's fence_barrier_init) before the cluster barrier
CLUSTER_SYNC_SOURCE = """
__forceinline__ __device__ void tvm_b2b_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
"""  # the kernel's last cluster barrier, where the producer's lanes come from divergent code: barrier.cluster without
# .aligned (T.cuda.cluster_sync's is .aligned, which asks every thread of a warp to execute it together)
PUSH_SOURCE = """
__forceinline__ __device__ void tvm_b2b_push_slice(void* slice, void* bar, unsigned bytes, unsigned peer) {
  unsigned src = static_cast<unsigned>(__cvta_generic_to_shared(slice));
  unsigned mbar = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  unsigned dst, peer_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(src), "r"(peer));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_bar) : "r"(mbar), "r"(peer));
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "r"(src), "r"(bytes), "r"(peer_bar) : "memory");
}
"""  # the pair's cluster form: a block's slice of mid, bulk-copied into the same offset of a peer's shared memory
# (distributed shared memory), completing on the peer's mbarrier (a TMA-class copy: no thread waits on it)
BULK_LOAD_SOURCE = """
__forceinline__ __device__ void tvm_b2b_bulk_load(void* dst, const void* src, unsigned bytes, void* bar) {
  unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  unsigned mbar = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(to), "l"(src), "r"(bytes), "r"(mbar) : "memory");
}
"""  # a block's (a persistent conv's tile's) scale and bias, into shared memory beside its first step (scale_bias_bytes; no
# tensor map: a 1-d bulk copy, 16-byte aligned, completing on the step's mbarrier)
PACK_SOURCE = """
__forceinline__ __device__ unsigned tvm_b2b_pack_half2(float lo, float hi) {
  half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}
"""  # an accumulator pair as the fp16 pair of one A-fragment register of wgmma's register form (the pair's mid)


@dataclass(frozen=True)
class HopperConfig:
    bm: int = 128  # pixels per block: 64 per consumer warpgroup
    bn: int = 128  # output channels per block: wgmma's n (64, 128 or 256)
    stages: int = 4  # operand buffers (at most one per reduction step is allocated)
    halo: int = 0  # 1: one box of x for all taps of a 64-channel step (Tiling's halo form), stride-1 convs
    warp: int = 0  # 1: the producer is one warp, not a warpgroup (producer_threads)
    cs: int = 1  # the fused pair's blocks a cluster: each computes k1 / cs channels of mid (cuda_hopper_pair)
    persist: int = 0  # 1: the blocks stay resident and loop over the tiles (persistent_grid; a conv's or a pair's)

    def to_string(self) -> str:
        return f"bm={self.bm},bn={self.bn},stages={self.stages}" + (",halo=1" if self.halo else "") + (
            ",warp=1" if self.warp else "") + (f",cs={self.cs}" if self.cs > 1 else "") + (",persist=1" if self.persist else "")

    @classmethod
    def parse(cls, text: str) -> "HopperConfig":
        values = dict(item.split("=") for item in text.replace(" ", "").split(",") if item)
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"config: {sorted(unknown)[0]} is not a parameter of sm_90's Hopper kernel (bm, bn, stages, "
                             "halo, warp, cs, persist) nor of the mma.sync template's, the kernels that run this op")
        cfg = cls(**{k: int(v) for k, v in values.items()})
        if cfg.bm not in (64, 128) or cfg.bn not in (64, 128, 256) or not 1 <= cfg.stages <= 8 or (
                {cfg.halo, cfg.warp, cfg.persist} - {0, 1} or cfg.cs not in CLUSTER_SIZES):
            raise ValueError(f"config: {cfg.to_string()}: bm is 64 or 128, bn 64, 128 or 256, stages 1 to 8, halo, warp "
                             f"and persist 0 or 1, cs one of {CLUSTER_SIZES}")
        return cfg

    @classmethod
    def default(cls, warp: int = 0, **knobs) -> "HopperConfig":
        """A default config: the knobs given, and the producer TVM_B2B_HOPPER_PRODUCER names, else `warp` (the rule's
        measured choice: producer_default)."""
        return cls(**knobs, warp=producer_default(warp))


def spec_problem(spec: ConvSpec) -> str | None:
    """Why the kernel cannot compute this conv, or None."""
    if spec.groups != 1:
        return f"groups={spec.groups} (dense convs only)"
    if spec.stride > 8:
        return f"stride {spec.stride}: TMA traverses at most every 8th element"
    if spec.dtype != "float16":
        return f"dtype {spec.dtype} (float16 only)"
    if spec.c % 8 or spec.k % 64:
        return f"c={spec.c}, k={spec.k}: TMA's rows are multiples of 16 bytes (c % 8) and the tiles of 64 channels (k % 64)"
    if not flat(spec) and spec.wo * spec.stride > min(256, 128 * spec.stride):
        return (f"{spec.wo} output columns at stride {spec.stride}: a block's pixels are whole output rows, at most 128, "
                "and TMA's box spans at most 256 input columns")
    blocks = Tiling(spec, default_config(spec).bm).blocks
    if blocks > MAX_GRID_Y:
        return f"{blocks} pixel blocks: CUDA's grid takes at most {MAX_GRID_Y} (blockIdx.y)"
    return None


def halo_problem(spec: ConvSpec, bm: int) -> str | None:
    """Why the halo form (Tiling) cannot compute this conv in tiles of bm pixels, or None."""
    if spec.dilation != 1:
        return f"halo=1 takes an undilated conv (its taps are shifts of one box), not dilation {spec.dilation}"
    if spec.stride != 1 or flat(spec):
        return f"halo=1 takes a stride-1 conv of more than one tap, not a {spec.kh}x{spec.kw} conv of stride {spec.stride}"
    if narrow_taps(spec) > 1:
        return f"halo=1 reads 64-channel boxes; a conv of {spec.c} channels packs {narrow_taps(spec)} taps a step instead"
    width = Tiling(spec, bm, True).width
    if width > min(bm, 256):
        return f"halo=1: a row of {width} input columns does not fit bm={bm} pixels (nor TMA's box, 256)"
    return None


def halo_wins(spec: ConvSpec) -> bool:
    """Where the halo form in 128-pixel tiles measured faster: x of one 64-channel step, and blocks for every SM (H100,
    batch 32, bench/results/convs_halo_h100_s23.txt: 56x56 64->64 23.3 us against 30.8 in the taps' form; with more
    channel steps no faster: 28x28 128 22.3 vs 21.1, 14x14 256 18.8 vs 19.2, 7x7 512 36.9 vs 22.2)."""
    return spec.c <= BK and not halo_problem(spec, 128) and Tiling(spec, 128, True).blocks >= SM90_SMS


def measured_slower(spec: ConvSpec, blocks: int) -> str | None:
    """Where cuda_conv's kernel measured faster than this one, or None:
    - fewer blocks than half the SMs (H200, bench/results/convs_h200_s15_hopper*.txt; batch 1: 7x7 2048->512, 14.1 vs
      6.9 us; 3x3 7x7 512, 17.1 vs 10.2; 56x56 256->64, 25 blocks, 4.5 vs 3.5; at batch 32 the fewest, 100 blocks,
      win): its split-K spreads a long reduction over more SMs, and its smaller tiles make more blocks;
    - fewer than MIN_STEPS reduction steps where the default config has no persistent grid (persist_default; a 1x1 of
      64 channels, H200, 56x56 64->256 at batch 32: 33.8 vs 28.9 us): each block's epilogue (its whole output tile
      through shared memory) then outweighs its mainloop, and only a persistent grid overlaps the two (H100, batch 32,
      same session: 27.8 us persistent, 30.4 for the mma.sync kernel in ResNet-50; 56x56 64->64 8.3 us, its roofline);
    - a narrow conv (narrow_taps: a stem's space-to-depth cells; H100, ResNet-50's at batch 32: 72.9 us, 56.8 for the
      mma.sync kernel in the model, bench/results/convs_persist0_h100_s32.txt and e2e_persist_0_h100_s32_breakdown.txt).
    A strided 1x1 (ResNet's downsampling, read through its subsampled map) runs here: H100, batch 32, 27.6, 24.9 and
    21.9 us (56x56/2 256->512, 28x28/2 512->1024, 14x14/2 1024->2048) against 31.0, 28.7 and 35.5 for the mma.sync
    kernel in the model (the same files)."""
    if blocks < SM90_SMS // 2:
        return (f"{blocks} blocks, fewer than half of sm_90's {SM90_SMS} SMs: the mma.sync kernel (split-K) "
                "measured faster at such sizes")
    if steps(spec) < MIN_STEPS and not persist_default(spec):
        return (f"{steps(spec)} reduction step(s) of {BK} channels without a persistent grid: the epilogue dominates, "
                "where the mma.sync kernel measured faster")
    if narrow_taps(spec) > 1:
        return (f"a conv of {spec.c} channels (a stem's cells) in {narrow_taps(spec)} taps a step: the mma.sync kernel "
                "measured faster (H100, ResNet-50's stem at batch 32: 56.8 against 72.9 us)")
    if spec.dilation != 1:
        return (f"dilation {spec.dilation}: the taps' form computes it (each tap's box {spec.dilation} pixels from the "
                "last), not yet measured against the mma.sync kernel")
    return None


def flat(spec: ConvSpec) -> bool:
    """A stride-1 1x1 conv: a block's pixels are any bm consecutive ones (a GEMM over the pixels)."""
    return (spec.kh, spec.kw, spec.stride, spec.pad_h, spec.pad_w) == (1, 1, 1, 0, 0)


def subsampled(spec: ConvSpec) -> bool:
    """A strided 1x1 conv without padding (ResNet's downsampling): it reads x at every stride-th column and row, which
    x's tensor map takes as a tensor of their own (its strides stride times x's), tiled like an output."""
    return (spec.kh, spec.kw, spec.pad_h, spec.pad_w) == (1, 1, 0, 0) and spec.stride > 1


def scale_bias_bytes(bn: int, k2s: int, persist: bool) -> int:
    """Shared memory for the scale and bias that a block's epilogues read, bulk-copied with its (tile's) first step
    rather than loaded from global memory by the epilogue (whose FFMAs then wait on them: Nsight Compute's source page,
    bench/results/ncu_source_h100_s28.txt): a persistent conv's two copies of its tile's bn channels (always); with
    TVM_B2B_HOPPER_SB=shared a conv's bn channels, or the pair's bn of mid and k2s of its output ("global", the default,
    keeps the loads: shared measured slower on most of ResNet-50's batch-32 convs, H100, 3x3 28x28/2 256 25.4 against
    19.3 us, bench/results/convs_persistsb_h100_s32.txt against convs_persist0_h100_s32.txt)."""
    if persist:
        return 16 * bn
    return 8 * (bn + k2s) if switch_value(SB_ENV, "global", ("global", "shared")) == "shared" else 0


def persist_default(spec: ConvSpec) -> int:
    """HopperConfig.persist of a conv's default config: 1 where its reduction has at most PERSIST_MAX_STEPS steps, whose
    epilogue (the whole output tile through shared memory, then TMA) is then a large part of a block's time and the
    persistent grid overlaps it with the next tile's loads; TVM_B2B_HOPPER_PERSIST=1 or 0 sets it for every conv.
    H100, ResNet-50's batch-32 convs (bench/results/convs_persist{0,1}_h100_s32.txt, same run): of up to 8 steps every
    one faster, 1.06-1.55x (56x56 64->256 36.9 -> 27.8 us, 14x14 256->1024 +r 18.0 -> 11.6, 28x28 512->256 21.5 ->
    16.1, 56x56/2 256->512 29.5 -> 27.6); of 16 or more slower or even (14x14 1024->256 9.9 -> 12.6, 14x14/2
    1024->2048 21.9 -> 25.3, 28x28/2 3x3 256 19.3 -> 23.1, 7x7 3x3 512 22.2 -> 21.3): a long mainloop gains more from
    the two blocks an SM of a grid a tile than from overlapping its epilogue. (Every conv persistent: ResNet-50 batch 32
    1147.0 against 1170.3 us, bench/results/e2e_persist_{1,0}_h100_s32.txt.)"""
    forced = persist_forced()
    return forced if forced is not None else int(steps(spec) <= PERSIST_MAX_STEPS)


def persist_forced() -> int | None:
    """TVM_B2B_HOPPER_PERSIST as 0 or 1 (every default config's persist, where its kernel takes one), None where unset."""
    forced = switch_value(PERSIST_ENV, None, ("0", "1"))
    return None if forced is None else int(forced)


def switch_value(name: str, default: str | None, choices: tuple[str, ...]) -> str | None:
    """Environment switch `name` (`default` where unset), one of `choices`; anything else is a ValueError naming them."""
    mode = os.environ.get(name, default)
    if mode is not None and mode not in choices:
        raise ValueError(f"{name}={mode}: {' or '.join(choices)}")
    return mode


def default_config(spec: ConvSpec) -> HopperConfig:
    """128 channels where they divide k, 256 for a reduction of 1-2 steps (an x tile read once feeds more channels:
    H200, 28x28 128->512 +r at batch 32, 25.4 vs 32.1 us); 64 pixels where 128 leave SMs idle (7x7 2048->512 at batch
    32: 52 blocks, 14.8 us; 100 blocks, 11.2) or where a block's whole rows fit 64 no worse than 128. The halo form in
    128-pixel tiles where `halo_wins`."""
    bn = 256 if steps(spec) <= 2 and spec.k % 256 == 0 else 128 if spec.k % 128 == 0 else 64
    persist = persist_default(spec)
    if halo_wins(spec):
        return HopperConfig.default(bm=128, bn=bn, halo=1, persist=persist)
    if flat(spec):
        return HopperConfig.default(bm=64 if spec.k // bn * Tiling(spec, 128).blocks < SM90_SMS else 128, bn=bn, persist=persist)
    if spec.wo > 64:
        return HopperConfig.default(bn=bn, persist=persist)
    return HopperConfig.default(bm=64 if Tiling(spec, 64).used >= Tiling(spec, 128).used else 128, bn=bn, persist=persist)


@dataclass(frozen=True)
class Tiling:
    """Which pixels a block computes, and how TMA reads them: x and y as 4-d tensor maps (channels innermost).
    A stride-1 1x1 conv: bm consecutive pixels (the maps' second dimension is every pixel). Any other: `rows`
    whole output rows of one image, each tap (rh, rw) of the conv one box of x at the tap's offset (TMA
    reads coordinates outside x as zeros: the padding), a strided conv's box traversing every stride-th
    column and row (element_strides); a `subsampled` 1x1's map is x's every stride-th pixel, its box the output's.
    The halo form (stride 1): ONE box of x a 64-channel step, the block's rows with the conv's reach around them
    (`width` columns, rows + kh - 1 rows), which all taps read: the GEMM's rows run over that box's grid (GEMM row
    m is output (m // width, m % width), the last kw - 1 columns of each row junk), so tap (rh, rw) of row m is the
    box's row m + rh * width + rw: its A operand starts `shift(t)` rows in. x's bytes from L2 a block: one box
    instead of kh * kw; the junk rows cost (kw - 1) / width of the MMAs (2 / 58 at 56x56)."""

    spec: ConvSpec
    bm: int
    halo: bool = False

    @property
    def width(self) -> int:
        """The halo box's columns: what a row of outputs reads (stride 1)."""
        return self.spec.wo + self.spec.kw - 1

    @property
    def rows(self) -> int:
        """Output rows per block (rows form): as many as bm takes, spread evenly over the image's blocks."""
        reach = self.spec.kh - 1 if self.halo else 0  # TMA's box: 256 rows at most
        box_rows = 256 if subsampled(self.spec) else 256 // self.spec.stride
        most = min(self.bm // (self.width if self.halo else self.spec.wo), self.spec.ho, box_rows - reach)
        return -(-self.spec.ho // -(-self.spec.ho // most))

    def shift(self, t):
        """The halo box's row where tap t's A operand starts (t: int or TIR expression)."""
        return t // self.spec.kw * self.width + t % self.spec.kw

    @property
    def halo_rows(self) -> int:
        """Rows of a halo buffer: the last tap's operand reaches bm - 1 + shift(last); a multiple of 8 (1024 B)."""
        return -(-(self.bm + self.shift(self.spec.kh * self.spec.kw - 1)) // 8) * 8

    def tile_row(self, m):
        """(the output tile's row, whether a pixel) of GEMM row m: the halo form's rows run `width` columns a row."""
        if not self.halo:
            return m, True
        from tvm import tirx

        return m // self.width * self.spec.wo + m % self.width, tirx.all(m % self.width < self.spec.wo,
                                                                         m // self.width < self.rows)

    @property
    def pixels(self) -> int:
        """Pixels a block's box holds (the wgmma tile's first rows; the rest of its bm rows are not read or stored)."""
        return self.bm if flat(self.spec) else self.rows * self.spec.wo

    @property
    def used(self) -> float:
        """The share of the blocks' wgmma rows that are real pixels."""
        return self.spec.m / (self.blocks * self.bm)

    @property
    def blocks(self) -> int:
        s = self.spec
        return -(-s.m // self.bm) if flat(s) else s.n * -(-s.ho // self.rows)

    def x_map(self) -> list:
        """cuTensorMapEncodeTiled's dims (innermost first), byte strides and box of x."""
        s, e = self.spec, 2
        if flat(s):
            return [s.c, s.m, 1, 1, s.c * e, s.m * s.c * e, s.m * s.c * e, BK, self.bm, 1, 1]
        st = s.stride
        if subsampled(s):  # x's pixels (st * col, st * row): a tensor of the output's shape, st times x's strides
            return [s.c, s.wo, s.ho, s.n, st * s.c * e, st * s.w * s.c * e, s.h * s.w * s.c * e, BK, s.wo, self.rows, 1]
        # a strided conv's box traverses x every st-th column and row (element_strides)
        box = [self.width, self.rows + s.kh - 1] if self.halo else [st * s.wo, st * self.rows]
        return [s.c, s.w, s.h, s.n, s.c * e, s.w * s.c * e, s.h * s.w * s.c * e, x_row(s), *box, 1]

    def element_strides(self) -> list:
        """TMA's traversal strides of x's box: it loads every stride-th element of its box (CUDA's
        cuTensorMapEncodeTiled: ceil(boxDim / elementStrides) elements a dimension)."""
        st = 1 if flat(self.spec) or subsampled(self.spec) else self.spec.stride
        return [1, st, st, 1]

    def y_map(self) -> list:
        s, e = self.spec, 2
        if flat(s):
            return [s.k, s.m, 1, 1, s.k * e, s.m * s.k * e, s.m * s.k * e, 64, self.bm, 1, 1]
        return [s.k, s.wo, s.ho, s.n, s.k * e, s.wo * s.k * e, s.ho * s.wo * s.k * e, 64, s.wo, self.rows, 1]

    def origin(self, bi):
        """(pixel or output column, output row, image) of block bi's first pixel: its boxes' coordinates."""
        if flat(self.spec):
            return bi * self.bm, 0, 0
        per_image = -(-self.spec.ho // self.rows)
        return 0, bi % per_image * self.rows, bi // per_image

    def tap(self, bi, t):
        """x's coordinates (after the channel) of tap t's box for block bi."""
        col, row, image = self.origin(bi)
        if flat(self.spec) or subsampled(self.spec):
            return col, row, image
        s = self.spec
        rh, rw = t // s.kw * s.dilation, t % s.kw * s.dilation  # (a dilated tap: its box d taps' rows and columns on)
        return col + rw - s.pad_w, s.stride * row + rh - s.pad_h, image



def producer_default(measured: int = 0) -> int:
    """HopperConfig.warp of a default config: TVM_B2B_HOPPER_PRODUCER=warp (1) or warpgroup (0), else `measured`."""
    mode = switch_value(PRODUCER_ENV, None, ("warpgroup", "warp"))
    return measured if mode is None else int(mode == "warp")


def producer_threads(cfg: HopperConfig) -> int:
    """The producer's threads: a warpgroup (128, CUTLASS's form, which setmaxnreg needs; this kernel does not use it)
    or one warp (warp=1: its first thread issues every copy either way). One warp frees 96 threads' registers a block
    (at 74 registers, 3 blocks of 288 threads fit an SM's 64K registers, 2 of 384), and with __launch_bounds__ nvcc
    keeps to as many blocks as shared memory holds (blocks_per_sm). Measured (H100, bench/results/hoppertune_*_s26.log):
    much faster for the pair at k1 = 128 (28x28 128->128->512 +r 41.4 against 60.8 us; 56x56/2 44.3 against 64.0),
    somewhat for k1 = 64 outside the halo form (56x56 64->64->256 +r 65.2 against 67.8), slower in it (64->64->128 42.7
    against 35.1) and no different at k1 = 256 (14x14 30.4 against 31.3, 28x28/2 39.3 against 38.7): the pair's
    default_config takes it where it won; tuning searches both (candidates)."""
    return 32 if cfg.warp else 128


def blocks_per_sm(dynamic_bytes: int) -> int:
    """The blocks an sm_90 SM's 228 KiB of shared memory hold (each also takes 1 KiB the driver reserves and 1 KiB of
    mbarriers), at most 3. Asked of nvcc with one producer warp (__launch_bounds__(288, 3) keeps a block to 72 registers:
    56x56 64->64->128, 75 -> 72 with 48 bytes spilled, ptxas -v)."""
    return max(1, min(3, 228 * 1024 // (dynamic_bytes + 2048)))


PERSIST_REGISTERS = 40  # a consumer thread's registers beside its accumulators (ptxas -v: 85 at 32 accumulators)
PAIR_REGISTERS = 30  # the pair's beside mid's and the second GEMM's (ptxas -v: 74-78 at k1 = 64, bn2 = 64: 48 of them)


def resident_blocks(dynamic_bytes: int, threads: int, regs: int) -> int:
    """The blocks of a persistent grid an SM holds: as shared memory holds them (blocks_per_sm), and as its 64K
    registers do at `regs` a thread (nvcc is held to that: __launch_bounds__; more blocks than it compiles for would
    not all be resident, and those left out would run after the others)."""
    return max(1, min(blocks_per_sm(dynamic_bytes), 65536 // (threads * regs)))


def block_threads(cfg: HopperConfig) -> int:
    """A block's threads: its consumer warpgroups (64 pixels each), then the producer (producer_threads)."""
    return 128 * (cfg.bm // 64) + producer_threads(cfg)


def resident_of(spec: ConvSpec, cfg: HopperConfig) -> int:
    """resident_blocks of a conv's config: its shared memory, threads and accumulators (bn / 2 a thread)."""
    return resident_blocks(shared_bytes(spec, cfg), block_threads(cfg), cfg.bn // 2 + PERSIST_REGISTERS)


def pair_registers(acc_regs: int, acc2_regs: int) -> int:
    """A persistent pair's registers a thread: the first GEMM's accumulators, or mid's packed halves beside the second
    GEMM's (the first's are dead by then), and PAIR_REGISTERS."""
    return max(acc_regs, acc_regs // 2 + acc2_regs) + PAIR_REGISTERS


def persistent_grid(tiles: int, blocks: int, sms: int = SM90_SMS) -> int:
    """persist=1: the blocks that stay resident, `blocks` an SM (resident_blocks), each computing tiles b, b + grid, ...
    (tile_at). A block's producer then loads its next tile's steps while its consumers finish the last one's epilogue
    and store (CUTLASS's persistent kernels): a block a tile leaves its SM idle while its first loads land and its
    epilogue runs, one block an SM at 160 KiB. The kernel's sms: the GPU's where the build runs on one (sm90_count)."""
    return min(tiles, sms * blocks)


def tiles_of(b, grid: int, tiles: int):
    """The tiles block b of a persistent grid computes (b: int or TIR expression)."""
    return (tiles - b + grid - 1) // grid


def tile_at(b, it, grid: int, channel_blocks: int):
    """(channel block, pixel block) of block b's it-th tile of a persistent grid: the grid's blocks take consecutive
    tiles at once, which share pixel blocks (x's tile, from L2) as the channel blocks of a block a tile do."""
    t = b + it * grid
    return t % channel_blocks, t // channel_blocks


def chunk_origin(block, j, chunks: int, grid: int, bn2: int):
    """(pixel block, first output channel) of a persistent pair block's j-th chunk: chunk j % chunks of its tile
    j // chunks (tile_at; the pair has one channel block, all of k1)."""
    return tile_at(block, j // chunks, grid, 1)[1], j % chunks * bn2


def steps(spec: ConvSpec) -> int:
    """Reduction steps: 64 channels of one tap each, or of narrow_taps' taps."""
    return spec.kh * spec.kw * -(-spec.c // BK) // narrow_taps(spec)


NARROW_CHANNELS = (16, 32)  # x's channels that narrow_taps packs into a step (one wgmma K of 16, or two, a tap)


def narrow_taps(spec: ConvSpec) -> int:
    """Taps a reduction step (BK channels) packs: BK // c consecutive kernel columns of a conv of 16 or 32 channels (a
    stem's space-to-depth cells, 16: ResNet-50's 7x7/2 stem as a 4x4 conv, 4 taps a step), each its own TMA box of x
    in rows of c * 2 bytes (TMA's and wgmma's 32- or 64-byte swizzle) rather than a 64-channel box a tap, 3/4 of it
    zeros outside x that the tensor cores would multiply; 1 for any other conv."""
    if spec.c in NARROW_CHANNELS and not flat(spec) and not subsampled(spec) and spec.kw % (BK // spec.c) == 0:
        return BK // spec.c
    return 1


def x_row(spec: ConvSpec) -> int:
    """Channels a row of x's boxes holds (BK, or a narrow conv's c: narrow_taps)."""
    return BK // narrow_taps(spec)


def fragment(tx, wg, p):
    """(tile row, channel) of a consumer thread's accumulator pair p (registers 2p, 2p + 1: channels ch and ch + 1 of
    one row) in wgmma m64nNk16's f32 layout: row 16 * warp + lane / 4 (+8 for odd p), channel 8 * (p // 2) +
    2 * (lane % 4). tx, wg: the thread's index and warpgroup (ints or TIR expressions)."""
    return wg * 64 + tx % 128 // 32 * 16 + tx % 32 // 4 + p % 2 * 8, p // 2 * 8 + tx % 4 * 2


def mid_register(kc, kk, i):
    """The pair's mid register (accumulator pair p of the first GEMM, packed: fragment) that is register i of wgmma's
    A fragment for k-slice kk of the second GEMM's step kc (channels 64 kc + 16 kk on). The A fragment of m64k16 (PTX
    ISA, wgmma register fragments) holds (row, col 2 (lane % 4) + {0, 1}), then row + 8, then col + 8, then both, the
    rows of `fragment`: accumulator pairs 4j .. 4j + 3 of k-slice j = 4 kc + kk, in that order (FlashAttention-3 feeds
    its P to the second GEMM the same way). Registers, not shared memory: no store, no proxy fence, no smem read."""
    return 16 * kc + 4 * kk + i


def swizzled(row, ch, bm: int):
    """The element offset of (row, channel) in a tile of 64-channel boxes of bm rows, 128B-swizzled as TMA reads and
    writes it and wgmma reads an operand: 16-byte chunk (ch % 64) / 8 of a row at chunk ((ch % 64) / 8) ^ (row % 8)."""
    return ch // 64 * bm * 64 + row * 64 + (ch % 64 // 8 ^ row % 8) * 8 + ch % 8


def x_buffers(spec: ConvSpec, cfg: HopperConfig) -> tuple[int, int]:
    """(x's buffers, rows each): one per step of the ring (at most one per reduction step), bm rows; in the halo form
    two (one per channel step, at most; a persistent grid's two, the next tile's box loading during this tile's taps),
    of Tiling.halo_rows."""
    if cfg.halo:
        return 2 if cfg.persist else min(2, -(-spec.c // BK)), Tiling(spec, cfg.bm, True).halo_rows
    return min(cfg.stages, steps(spec)), cfg.bm


def shared_bytes(spec: ConvSpec, cfg: HopperConfig) -> int:
    """Shared memory: x's buffers, w's (at most one per reduction step) and the output tile (dynamic); the scale and
    bias where they are in shared memory (scale_bias_bytes)."""
    xs, x_rows = x_buffers(spec, cfg)
    sb = scale_bias_bytes(cfg.bn, 0, bool(cfg.persist))
    return (xs * x_rows + min(cfg.stages, steps(spec)) * cfg.bn) * BK * 2 + cfg.bm * cfg.bn * 2 + sb


def second_tile_apart(x_elements: int, bm: int, bn2: int, chunks: int, persist: bool = False) -> bool:
    """Whether the pair's second output tile needs shared memory of its own. The pair's chunks alternate between two
    output tiles (one's TMA store runs on while the next chunk is computed); the second goes into x's buffers
    (x_elements), which are free once the first GEMM is done, where they hold it. Not in a persistent grid, whose
    producer fills them with the next tile's steps meanwhile (and whose tiles' chunks alternate on: one chunk too)."""
    return persist or (chunks > 1 and bm * bn2 > x_elements)


def outputs(act, lo, hi, tiles, at, add_residual: bool):
    """The epilogue's two channel values of an accumulator pair (scale and bias applied): act of them, plus the residual
    tile's elements where they sit in the output tile (`at`) when add_residual. TIR expressions, for the kernel's
    half2 store."""
    from tvm.script import tirx as T

    if add_residual:  # the pair as one 4-byte load (nvcc merges the two calls' loads of one address), not two 2-byte ones
        r_lo, r_hi = (T.cuda.func_call(f"tvm_b2b_half2_{part}", T.address_of(tiles[at]), source_code=RESIDUAL_SOURCE[part],
                                       return_type="float32") for part in ("low", "high"))
        return act(lo + r_lo), act(hi + r_hi)
    return act(lo), act(hi)


@dataclass(frozen=True)
class Second:
    """The fused pair's second GEMM (schedule/cuda_hopper_pair.py): a 1x1 conv of the first's output, which stays
    in registers (`mid`: the first's accumulators as fp16 pairs, wgmma's A operand in its register form: see
    mid_register), to k2 channels in chunks of bn2."""

    k2: int
    bn2: int
    act: str
    residual: bool


def memory_problem(needed: int, cfg: HopperConfig, arch: int) -> str | None:
    """Why a config's `needed` bytes of dynamic shared memory do not fit sm_`arch`'s, or None."""
    if needed > max_shared_bytes(arch):
        return f"{cfg.to_string()} needs {needed // 1024} KiB of shared memory"
    return None


def conv_config_problem(spec: ConvSpec, cfg: HopperConfig) -> str | None:
    """Why the kernel cannot compute this conv with these parameters (shared memory aside), or None."""
    return spec_problem(spec) or (cfg.cs > 1 and f"cs={cfg.cs}: a cluster is the fused pair's (k1 split), not a conv's") or (
        spec.k % cfg.bn and f"k is not a multiple of bn={cfg.bn}") or (
        not flat(spec) and spec.wo > cfg.bm and f"{spec.wo} output columns do not fit bm={cfg.bm} pixels") or (
        cfg.halo and halo_problem(spec, cfg.bm)) or None


def conv_func(spec: ConvSpec, cfg: HopperConfig, name: str = "conv2d_wgmma"):
    """The kernel as a TIRx PrimFunc (x (n, h, w, c), w (k, kh*kw*c), s, b, [residual (m, k)], y (m, k)): the
    parameters of cuda_conv's kernel, with w as InputForm(weights="kc") makes it."""
    problem = conv_config_problem(spec, cfg)
    if problem:
        raise ValueError(f"{spec.to_string()}: {problem}")
    return kernel_func(spec, cfg, None, name)


def kernel_func(spec: ConvSpec, cfg: HopperConfig, second: Second | None, name: str):
    """conv_func's kernel; with `second`, the fused pair's (x, w (k1, kh*kw*c), s, b, w2 (k2, k1), s2, b2,
    [residual (m, k2)], y (m, k2)): spec the first conv (its k all of k1, one block's channels: cfg.bn == spec.k),
    its epilogue into `mid` (registers), then per chunk of bn2 channels the second GEMM (64 channels of mid a step, w2's
    tiles through the same buffers), its epilogue into one of two output tiles (chunks alternate) and its store,
    which runs on while the next chunk is computed. Where cfg.bn < spec.k (the pair's cluster form: k // bn blocks a
    cluster, blockIdx.x its rank), the epilogue writes the rank's slice of mid into shared memory, pushes it into the
    peers' (PUSH_SOURCE), and the second GEMM reads all of mid from there for the rank's k2 / cs output channels.
    Its callers check what the spec and config take."""
    from tvm import tirx
    from tvm.script import tirx as T

    m, c, k, bm, bn, halo = spec.m, spec.c, spec.k, cfg.bm, cfg.bn, bool(cfg.halo)
    tiling = Tiling(spec, bm, halo)
    n_steps, c_steps, wgs, acc_regs, boxes = steps(spec), -(-c // BK), bm // 64, bn // 2, bn // 64
    taps = spec.kh * spec.kw
    fused = second is not None
    k2, bn2 = (second.k2, second.bn2) if fused else (k, bn)
    cs = k // bn if fused else 1  # the pair's cluster: block rank bk computes mid's channels bk * bn on (Second)
    cluster = cs > 1
    k2s = k2 // cs  # the output channels a block computes (the pair's: its cluster rank's share of k2)
    k1_steps, chunks = k // BK, k2s // bn2  # the second GEMM's steps per chunk of its channels, and its chunks
    all_steps = n_steps + (chunks * k1_steps if fused else 0)
    stages = min(cfg.stages, n_steps)  # more buffers than steps only cost shared memory (fewer blocks per SM)
    threads = block_threads(cfg)  # the consumer warpgroups, then the producer (warp wgs * 4 on)
    tx_bytes = ((0 if halo else tiling.pixels) + bn) * BK * 2  # what TMA's boxes hold (zeros read outside x included)
    halo_bytes = tiling.width * (tiling.rows + spec.kh - 1) * BK * 2 if halo else 0  # (a flat 1x1 wider than bm has no rows)
    xs, x_rows = x_buffers(spec, cfg)  # x's buffers (the halo form's: of channel steps, beside the ring of w's)
    r_dim = spec.kh * spec.kw * c
    out = dataclasses.replace(spec, k=k2)  # the output tensor's conv (the second GEMM's when fused)
    tps, xw = narrow_taps(spec), x_row(spec)  # taps a step, channels a row of x's boxes
    x_map_args = tiling.x_map() + tiling.element_strides() + [0, SWIZZLE_OF_ROW[xw * 2], 0, 0]  # interleave, swizzle, ...
    w_map_args = [r_dim, k, r_dim * 2, BK, bn, 1, 1, 0, SWIZZLE_128B, 0, 0]
    w2_map_args = [k, k2, k * 2, BK, bn2, 1, 1, 0, SWIZZLE_128B, 0, 0]
    y_map_args = Tiling(out, bm, halo).y_map() + [1, 1, 1, 1, 0, SWIZZLE_128B, 0, 0]  # stores in boxes of 64 channels
    res_bytes = bn2 // 64 * tiling.pixels * 64 * 2  # a residual tile, loaded by TMA in y's boxes into the output tile
    mma = f"wgmma.mma_async.sync.aligned.m64n{bn}k{WGMMA_K}.f32.f16.f16"
    mma2 = f"wgmma.mma_async.sync.aligned.m64n{bn2}k{WGMMA_K}.f32.f16.f16"
    load = "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
    store = "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
    w_load = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
    residual = second.residual if fused else bool(spec.residual)
    act, act2 = activation(spec.act).te, activation(second.act if fused else spec.act).te
    # one step's wgmma left in flight (CUTLASS's mainloop): its buffer is released a step later, which needs a
    # second buffer for the producer to fill meanwhile (both of the pair's GEMMs; a chunk's last step is waited for)
    overlap = stages >= 2
    b_rows = max(bn, bn2) if fused else bn
    w_at = xs * x_rows * BK  # element offsets in the one dynamic shared allocation TVM allows, 1024-byte aligned
    y_at = w_at + stages * b_rows * BK
    pool = y_at + bm * bn2
    persist = bool(cfg.persist)  # (persistent_grid; the pair's: outside the cluster form, its callers check)
    y2_at = pool if fused and second_tile_apart(w_at, bm, bn2, chunks, persist) else 0  # the pair's other output tile
    pool += bm * bn2 if y2_at else 0
    mid_at = pool  # the cluster's mid (bm rows x k1, 64-channel boxes as x's tile): each block's slice, its peers' pushed in
    pool += bm * k if cluster else 0
    slice_bytes = bm * bn * 2  # a block's slice of mid
    channel_blocks = k // bn  # (the pair's: 1, a block computes all of k1)
    n_tiles = channel_blocks * tiling.blocks
    acc2_regs = bn2 // 2 if fused else 1
    resident = 1  # a persistent grid's blocks an SM: the pair's by its shared memory and registers, a conv's resident_of
    if persist:
        resident = resident_blocks(pool * 2, threads, pair_registers(acc_regs, acc2_regs)) if fused else resident_of(spec, cfg)
    grid = persistent_grid(n_tiles, resident, sm90_count()) if persist else 0  # (sized for the GPU here, if any)
    # (one producer warp: as many blocks an SM as shared memory holds; a persistent grid: as it takes)
    min_blocks = resident if persist else blocks_per_sm(pool * 2) if cfg.warp else 1
    consumers = 128 * wgs  # named barrier CONSUMERS: the consumer warpgroups alone (the producer runs on)
    # (a persistent pair's tiles share their channels: one copy, with the first tile's first step)
    sb_floats = scale_bias_bytes(bn, k2s if fused else 0, persist and not fused) // 8  # each of s_tile and b_tile (0: none)
    sb_step_bytes = 8 * (bn + (k2s if fused else 0)) if sb_floats else 0  # what a (tile's) first step copies of them

    def first_step_bytes(ko):
        """Bytes that step ko's mbarrier expects beyond x's and w's boxes: the scale and bias with the first step."""
        return T.if_then_else(ko == 0, sb_step_bytes, 0) if sb_step_bytes else 0

    def out_tile(jc):
        """Where chunk jc's output tile starts: chunks alternate between the two tiles."""
        return y_at + jc % 2 * (y2_at - y_at)

    def out_channel(bk):
        """Block bk's first output channel: its channel block's (a conv), its cluster rank's share of k2 (the pair)."""
        return bk * (k2s if fused else bn)

    @T.macro
    def load_residual(tiles, r_map, res_full, bi, at, channel, tile):
        """bn2 channels of the residual from `channel` on, into the output tile at `at` (y's boxes), on res_full[tile]"""
        T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(res_full[tile]), T.uint32(res_bytes))
        for box in T.serial(bn2 // 64):
            T.ptx[load](T.address_of(tiles[at + box * bm * 64]), T.address_of(r_map), channel + box * 64,
                        *tiling.origin(bi), T.address_of(res_full[tile]))

    def first_tile(bk, bi):
        """(channel block, pixel block) of the block's first tile: its own (a block a tile), or tile_at's."""
        return tile_at(bi, 0, grid, channel_blocks) if persist else (bk, bi)

    @T.macro
    def load_scale_bias(s, b, s2, b2, s_tile, b_tile, at, bk, bar):
        """Channel block bk's scale and bias into s_tile and b_tile at `at` (the pair's s2 and b2 of its output
        channels after them), 1-d bulk copies completing on bar (a first step's mbarrier: first_step_bytes)."""
        T.cuda.func_call("tvm_b2b_bulk_load", T.address_of(s_tile[at]), T.address_of(s[bk * bn]), 4 * bn, bar,
                         source_code=BULK_LOAD_SOURCE)
        T.cuda.func_call("tvm_b2b_bulk_load", T.address_of(b_tile[at]), T.address_of(b[bk * bn]), 4 * bn, bar,
                         source_code=BULK_LOAD_SOURCE)
        if fused:
            T.cuda.func_call("tvm_b2b_bulk_load", T.address_of(s_tile[bn]), T.address_of(s2[out_channel(bk)]), 4 * k2s, bar,
                             source_code=BULK_LOAD_SOURCE)
            T.cuda.func_call("tvm_b2b_bulk_load", T.address_of(b_tile[bn]), T.address_of(b2[out_channel(bk)]), 4 * k2s, bar,
                             source_code=BULK_LOAD_SOURCE)

    @T.macro
    def load_tap_step(tiles, full, x_map, w_map, g, ko, bk, bi, more_bytes):
        """load_step's taps' form: x's box of step ko's tap(s) and w's tile, into ring buffer g % stages."""
        T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(full[g % stages]), T.uint32(tx_bytes + more_bytes))
        if tps > 1:  # taps ko * tps on, each a box of xw channels into its own bm x xw part of the buffer
            for j in T.unroll(tps):
                T.ptx[load](T.address_of(tiles[g % stages * bm * BK + j * bm * xw]), T.address_of(x_map), 0,
                            *tiling.tap(bi, ko * tps + j), T.address_of(full[g % stages]))
        else:
            T.ptx[load](T.address_of(tiles[g % stages * bm * BK]), T.address_of(x_map), ko % c_steps * BK,
                        *tiling.tap(bi, ko // c_steps), T.address_of(full[g % stages]))
        # w's K of the step: its taps' channels (a narrow step's BK of tps taps; else tap ko // c_steps's ko-th 64)
        w_column = T.meta_var(ko * BK if tps > 1 else ko // c_steps * c + ko % c_steps * BK)
        T.ptx[w_load](T.address_of(tiles[w_at + g % stages * b_rows * BK]), T.address_of(w_map), w_column, bk * bn,
                      T.address_of(full[g % stages]))

    @T.macro
    def load_step(tiles, full, x_full, x_empty, x_map, w_map, g, x_base, ko, bk, bi, more_bytes):
        """Step ko of tile (bk, bi) into ring buffer g % stages: x's box of its tap (the taps' form), w's tile (and
        more_bytes the caller copies, on the same mbarrier). In the halo form step ko is tap ko % taps of channel step
        ko // taps, the block's x_base + ko // taps-th, whose box its first tap loads, once that x buffer's last box
        is done (xs channel steps earlier: the last tile's, in a persistent grid)."""
        if halo:
            xg = T.meta_var(x_base + ko // taps)
            if ko % taps == 0:
                if x_base * taps + ko >= xs * taps:  # (xg >= xs, written so that it folds for x_base = 0)
                    T.cuda.mbarrier_wait(T.address_of(x_empty[xg % xs]), (xg // xs + 1) % 2)
                T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(x_full[xg % xs]), T.uint32(halo_bytes))
                T.ptx[load](T.address_of(tiles[xg % xs * x_rows * BK]), T.address_of(x_map), ko // taps * BK,
                            *tiling.tap(bi, 0), T.address_of(x_full[xg % xs]))
            T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(full[g % stages]), T.uint32(tx_bytes + more_bytes))
            T.ptx[w_load](T.address_of(tiles[w_at + g % stages * b_rows * BK]), T.address_of(w_map),
                          ko % taps * c + ko // taps * BK, bk * bn, T.address_of(full[g % stages]))
        else:
            load_tap_step(tiles, full, x_map, w_map, g, ko, bk, bi, more_bytes)

    def tile_stores(regs: int, act_of):
        """An epilogue into an output tile, as a macro for `regs` accumulators (the conv's, or the pair's second GEMM's)
        and activation act_of."""

        @T.macro
        def stores(tiles, acc, s, b, tx, at_channel, y_tile):
            """Accumulator pair p (fragment), scale, bias [, residual], act, as one half2 store into the swizzled output
            tile at y_tile (its pixels' rows: Tiling.tile_row). s and b: the conv's (at_channel: the block's first
            channel), or a persistent block's copies of the tile's (at_channel: the copy's offset)."""
            wg = T.meta_var(tx // 128)
            for p in T.unroll(regs // 2):
                row, ch = T.meta_var(fragment(tx, wg, p))
                lo = T.meta_var(acc[2 * p] * s[at_channel + ch] + b[at_channel + ch])
                hi = T.meta_var(acc[2 * p + 1] * s[at_channel + ch + 1] + b[at_channel + ch + 1])
                out_row, pixel = T.meta_var(tiling.tile_row(row))
                at = T.meta_var(y_tile + swizzled(out_row, ch, bm))
                out_lo, out_hi = T.meta_var(outputs(act_of, lo, hi, tiles, at, residual))
                if pixel:
                    T.cuda.func_call("tvm_b2b_store_half2", T.address_of(tiles[at]), out_lo, out_hi, source_code=STORE_SOURCE)

        return stores

    conv_stores, chunk_stores = tile_stores(acc_regs, act), tile_stores(acc2_regs, act2)

    @T.macro
    def store_tile(tiles, y_map, bk, bi):
        """The output tile's TMA store, in boxes of 64 channels; returns once the store has READ the tile (the block's
        shared memory stays until then, and the next tile's epilogue writes it), not once its writes are done: the
        grid's end makes them visible (CUTLASS's tma_store_wait), and the SM goes on meanwhile."""
        for box in T.serial(boxes):
            T.ptx[store](T.address_of(y_map), bk * bn + box * 64, *tiling.origin(bi),
                         T.address_of(tiles[y_at + box * bm * 64]))
        T.ptx.cp.async_.bulk.commit_group()
        T.ptx.cp.async_.bulk.wait_group.read(0)

    @T.macro
    def first_mainloop(tiles, full, empty, x_full, x_empty, acc, desc_x, desc_w, tx, base, x_base):
        """The (first) conv's reduction into acc, step ko of a tile in ring buffer (base + ko) % stages (base: the
        block's steps of earlier tiles, persist=1; x_base its channel steps, the halo form's), each step's buffer
        released once its wgmma are done (with 2+ buffers a step later: the last one's is the caller's)."""
        wg = T.meta_var(tx // 128)
        for ko in T.serial(n_steps):
            g = T.meta_var(base + ko)
            xg = T.meta_var(x_base + ko // taps)  # the halo box's: the block's channel step
            if halo and ko % taps == 0:
                T.cuda.mbarrier_wait(T.address_of(x_full[xg % xs]), (xg // xs) % 2)
            T.cuda.mbarrier_wait(T.address_of(full[g % stages]), (g // stages) % 2)
            T.ptx.wgmma.fence.sync.aligned()
            # A: x's box of the step, or the halo box from the tap's row on
            a_at = T.meta_var(xg % xs * x_rows * BK + tiling.shift(ko % taps) * BK if halo else g % stages * bm * BK)
            # the start address moves 32 B per step inside the swizzle atom; a halo tap's starts rows into it: the
            # descriptor's base offset stays 0, as wgmma swizzles the address itself (H100: a base offset of
            # (start >> 7) & 7, as the PTX ISA describes it, computed wrong results; 0 matched numpy)
            for kk in T.unroll(BK // WGMMA_K):
                if tps > 1:  # k-slice kk: in part kk * 16 // xw of the buffer (narrow_taps), rows of xw channels
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_x), T.address_of(  # noqa: F821
                        tiles[a_at + kk * WGMMA_K // xw * bm * xw + wg * 64 * xw + kk * WGMMA_K % xw]), DESC_LBO,
                        xw, SWIZZLE_OF_ROW[xw * 2])  # (8 rows of xw * 2 bytes apart: xw 16-byte units)
                else:
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_x), T.address_of(  # noqa: F821
                        tiles[a_at + wg * 64 * BK + kk * WGMMA_K]), DESC_LBO, DESC_SBO, SWIZZLE_128B)
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_w), T.address_of(  # noqa: F821
                    tiles[w_at + g % stages * b_rows * BK + kk * WGMMA_K]), DESC_LBO, DESC_SBO, SWIZZLE_128B)
                T.ptx[mma](*[acc[i] for i in range(acc_regs)], desc_x, desc_w,  # noqa: F821
                           ko * (BK // WGMMA_K) + kk > 0,
                           1, 1, 0, 0)
            T.ptx.wgmma.commit_group.sync.aligned()
            if overlap:  # this step's wgmma run on while the next step's wait and issue go on: release the last's
                T.ptx.wgmma.wait_group.sync.aligned(1)
                if ko > 0 and tx % 32 == 0:  # each warp, once its wait returned
                    T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[(g + stages - 1) % stages]))
                    if halo and ko % taps == 0:  # the last step was the last tap of its channel step
                        T.ptx.mbarrier.arrive.shared.b64(T.address_of(x_empty[(xg + xs - 1) % xs]))
            else:
                T.ptx.wgmma.wait_group.sync.aligned(0)
                if tx % 32 == 0:
                    T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[g % stages]))
                    if halo and ko % taps == taps - 1:
                        T.ptx.mbarrier.arrive.shared.b64(T.address_of(x_empty[xg % xs]))

    # nvcc's registers (an H100 or H200 SM holds 2 blocks of 384 threads at 85 or fewer): 74 for a 56x56 k1=64 pair with 2
    # chunks unrolled (100 in a loop), with 4 chunks 74 in a loop (90 unrolled)
    chunk_loop = T.unroll if chunks <= 2 else T.serial

    @T.macro
    def chunk_gemm(tiles, full, empty, acc2, mid, desc_x, desc_w, tx, jc, base):
        """Chunk jc's second GEMM: mid's registers times w2's tiles, k1_steps steps; a step's buffer released once its
        wgmma are done (with 2+ buffers a step later, as the first GEMM's steps: the last one's after the loop). base:
        the ring's steps of the block's earlier tiles (a persistent grid's; else 0).
        (Issuing the next chunk's GEMM into a second accumulator set before this chunk's epilogue measured slower: H100,
        56x56 64->64->256 +r 75.1 vs 69.6 us, 14x14 256->256->1024 +r 35.1 vs 31.3; its registers halve the blocks
        per SM at k1=64, bench/results/fused_envab_*_h100_s25.txt.)"""
        wg = T.meta_var(tx // 128)
        for kc in T.unroll(k1_steps):  # unrolled: mid's registers are named, not indexed
            g = T.meta_var(base + n_steps + jc * k1_steps + kc)
            T.cuda.mbarrier_wait(T.address_of(full[g % stages]), (g // stages) % 2)
            T.ptx.wgmma.fence.sync.aligned()
            for kk in T.unroll(BK // WGMMA_K):
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_w), T.address_of(
                    tiles[w_at + g % stages * b_rows * BK + kk * WGMMA_K]), DESC_LBO, DESC_SBO, SWIZZLE_128B)
                if cluster:  # mid from shared memory (the cluster's, gathered), as the first GEMM's x
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_x), T.address_of(
                        tiles[mid_at + kc * bm * BK + wg * 64 * BK + kk * WGMMA_K]), DESC_LBO, DESC_SBO, SWIZZLE_128B)
                    T.ptx[mma2](*[acc2[i] for i in range(acc2_regs)], desc_x, desc_w, kc * (BK // WGMMA_K) + kk > 0,
                                1, 1, 0, 0)
                else:
                    T.ptx[mma2](*[acc2[i] for i in range(acc2_regs)], *[mid[mid_register(kc, kk, i)] for i in range(4)],
                                desc_w, kc * (BK // WGMMA_K) + kk > 0, 1, 1, 0)
            T.ptx.wgmma.commit_group.sync.aligned()
            if overlap:
                T.ptx.wgmma.wait_group.sync.aligned(1)
                if kc > 0 and tx % 32 == 0:
                    T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[(g + stages - 1) % stages]))
            else:
                T.ptx.wgmma.wait_group.sync.aligned(0)
                if tx % 32 == 0:
                    T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[g % stages]))
        if overlap:  # the chunk's last step
            T.ptx.wgmma.wait_group.sync.aligned(0)
            if tx % 32 == 0:
                T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[(base + n_steps + (jc + 1) * k1_steps - 1) % stages]))

    @T.macro
    def chunk_second_epilogue(tiles, full, empty, res_full, acc2, mid, desc_x, desc_w, y_map, r_map, s2, b2, tx, bk, bi,
                              jc, it, block):
        """Chunk jc of pixel block bi: its second GEMM, its epilogue into output tile j % 2, its TMA store. j counts the
        block's chunks: in a persistent grid (block: its index) across its tiles (`it`: this one), so that the output
        tiles alternate and the residual's loads go on (the next tile's first chunk's too) from tile to tile."""
        j = T.meta_var(it * chunks + jc if persist else jc)
        y_tile = T.meta_var(out_tile(j))
        c2 = T.meta_var(out_channel(bk) + jc * bn2)  # the chunk's first output channel
        s2_at = T.meta_var(bn + jc * bn2 if sb_floats > 0 else c2)  # its scale's and bias's in s2 and b2 (s_tile's: after mid's)
        chunk_gemm(tiles, full, empty, acc2, mid, desc_x, desc_w, tx, jc, it * all_steps if persist else 0)
        for i in T.unroll(acc2_regs):
            T.cuda.func_call("tvm_b2b_fence_acc", acc2[i], source_code=FENCE_SOURCE)
        if residual:  # chunk j's residual tile (loaded once the store of chunk j - 2 had read the tile)
            T.cuda.mbarrier_wait(T.address_of(res_full[j % 2]), j // 2 % 2)
        elif j > 1:  # thread 0 has seen the store of chunk j - 2 read this tile
            T.ptx.bar.sync(T.uint32(CONSUMERS), T.uint32(consumers))
        chunk_stores(tiles, acc2, s2, b2, tx, s2_at, y_tile)
        T.ptx.fence.proxy.async_.shared__cta()
        T.ptx.bar.sync(T.uint32(CONSUMERS), T.uint32(consumers))
        if tx == 0:  # the store runs on while the next chunk is computed into the other tile
            for box in T.serial(bn2 // 64):
                T.ptx[store](T.address_of(y_map), c2 + box * 64, *tiling.origin(bi),
                             T.address_of(tiles[y_tile + box * bm * 64]))
            T.ptx.cp.async_.bulk.commit_group()
            # the block's chunks (a persistent grid's: of all its tiles), and where chunk j + 1's residual comes from
            block_chunks = T.meta_var(tiles_of(block, grid, n_tiles) * chunks if persist else chunks)
            next_i, next_c = T.meta_var(chunk_origin(block, j + 1, chunks, grid, bn2) if persist else (bi, c2 + bn2))
            if j + 1 < block_chunks:
                T.ptx.cp.async_.bulk.wait_group.read(1)  # chunk j - 1's store has read the other tile
                if residual and j > 0:  # chunk j + 1's residual (the next tile's first's, after a last chunk), into it
                    load_residual(tiles, r_map, res_full, next_i, out_tile(j + 1), next_c, (j + 1) % 2)
            else:
                T.ptx.cp.async_.bulk.wait_group.read(0)  # the block's shared memory stays until then

    @T.macro
    def load_w2_step(tiles, full, w2_map, g, j, bk):
        """The second GEMM's step j (of chunk j // k1_steps) into ring buffer g % stages: w2's tile."""
        T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(full[g % stages]), T.uint32(bn2 * BK * 2))
        T.ptx[w_load](T.address_of(tiles[w_at + g % stages * b_rows * BK]), T.address_of(w2_map), j % k1_steps * BK,
                      out_channel(bk) + j // k1_steps * bn2, T.address_of(full[g % stages]))

    @T.macro
    def first_epilogue(tiles, acc, mid, s1, b1, s1_at, tx, bk):
        """The pair's first epilogue: accumulator pair p (fragment), scale, bias, act, into one register of mid (two
        fp16), or in the cluster form into the block's slice of mid in shared memory (bk * bn channels on), swizzled
        as wgmma reads it."""
        wg = T.meta_var(tx // 128)
        for p in T.unroll(acc_regs // 2):
            row, ch = T.meta_var(fragment(tx, wg, p))
            lo = T.meta_var(acc[2 * p] * s1[s1_at + ch] + b1[s1_at + ch])
            hi = T.meta_var(acc[2 * p + 1] * s1[s1_at + ch + 1] + b1[s1_at + ch + 1])
            if cluster:
                T.cuda.func_call("tvm_b2b_store_half2", T.address_of(tiles[mid_at + bk * bn * bm + swizzled(row, ch, bm)]),
                                 act(lo), act(hi), source_code=STORE_SOURCE)
            else:
                mid[p] = T.cuda.func_call("tvm_b2b_pack_half2", act(lo), act(hi), source_code=PACK_SOURCE,
                                          return_type="uint32")

    @T.prim_func
    def func(x_ptr: T.handle, w_ptr: T.handle, s_ptr: T.handle, b_ptr: T.handle, w2_ptr: T.handle, s2_ptr: T.handle,
             b2_ptr: T.handle, r_ptr: T.handle, y_ptr: T.handle):
        x = T.match_buffer(x_ptr, (spec.n, spec.h, spec.w, c), "float16", align=16)
        w = T.match_buffer(w_ptr, (k, r_dim), "float16", align=16)
        s = T.match_buffer(s_ptr, (k,), "float32", align=16)
        b = T.match_buffer(b_ptr, (k,), "float32", align=16)
        w2 = T.match_buffer(w2_ptr, (k2, k), "float16", align=16)
        s2 = T.match_buffer(s2_ptr, (k2,), "float32", align=16)
        b2 = T.match_buffer(b2_ptr, (k2,), "float32", align=16)
        r = T.match_buffer(r_ptr, (m, k2), "float16", align=16)
        y = T.match_buffer(y_ptr, (m, k2), "float16", align=16)
        x_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", x_map, "float16", 4, x.data, *x_map_args)
        w_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", w_map, "float16", 2, w.data, *w_map_args)
        w2_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        if fused:
            T.call_packed("runtime.cuTensorMapEncodeTiled", w2_map, "float16", 2, w2.data, *w2_map_args)
        y_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", y_map, "float16", 4, y.data, *y_map_args)
        r_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        if residual:
            T.call_packed("runtime.cuTensorMapEncodeTiled", r_map, "float16", 4, r.data, *y_map_args)

        T.device_entry()
        if min_blocks > 1:  # __launch_bounds__(threads, min_blocks): nvcc keeps the registers to that many blocks an SM
            T.attr({"tirx.launch_bounds_min_blocks_per_sm": min_blocks})
        # (the pair's: bk its cluster rank, bi the cluster's pixels; a persistent grid's: bi the block, tile_at its tiles)
        bk, bi = T.cta_id([1, grid] if persist else [channel_blocks, tiling.blocks])
        if cluster:
            _rank = T.cta_id_in_cluster([cs])  # (declares the cluster: blockIdx.x's cs blocks of one pixel tile)
        tx = T.thread_id([threads])
        tiles = T.alloc_buffer((pool,), "float16", scope="shared.dyn", align=1024)
        full = T.alloc_buffer((stages,), "uint64", scope="shared", align=8)
        empty = T.alloc_buffer((stages,), "uint64", scope="shared", align=8)
        x_full = T.alloc_buffer((xs,), "uint64", scope="shared", align=8)  # the halo form's x buffers
        x_empty = T.alloc_buffer((xs,), "uint64", scope="shared", align=8)
        res_full = T.alloc_buffer((2,), "uint64", scope="shared", align=8)  # a residual tile in each output tile
        mid_full = T.alloc_buffer((1,), "uint64", scope="shared", align=8)  # the peers' slices of mid, pushed in
        # the scale and bias that the epilogues read, where in shared memory (scale_bias_bytes; a persistent block's:
        # two tiles' copies, conv_stores)
        s_tile = T.alloc_buffer((max(sb_floats, 1),), "float32", scope="shared", align=16)
        b_tile = T.alloc_buffer((max(sb_floats, 1),), "float32", scope="shared", align=16)
        # the epilogues' scale and bias (the pair's first ones), and where in them the block's channels start
        s1, b1, s1_at = T.meta_var((s_tile, b_tile, 0) if sb_floats > 0 else (s, b, bk * bn))
        s2_in, b2_in = T.meta_var((s_tile, b_tile) if sb_floats > 0 else (s2, b2))
        acc = T.alloc_buffer((acc_regs,), "float32", scope="local")
        acc2 = T.alloc_buffer((acc2_regs,), "float32", scope="local")
        # the pair's mid (mid_register; the cluster form's is in shared memory)
        mid = T.alloc_buffer((acc_regs // 2 if fused and not cluster else 1,), "uint32", scope="local")
        desc_x: T.uint64  # TIRx declares a local scalar by annotation (linters see a name without a value)
        desc_w: T.uint64
        wg = T.meta_var(tx // 128)
        if tx == 0:
            for i in T.serial(stages):
                T.ptx.mbarrier.init.shared.b64(T.address_of(full[i]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(T.address_of(empty[i]), T.uint32(4 * wgs))
            for i in T.serial(xs if halo else 0):
                T.ptx.mbarrier.init.shared.b64(T.address_of(x_full[i]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(T.address_of(x_empty[i]), T.uint32(4 * wgs))
            T.ptx.mbarrier.init.shared.b64(T.address_of(res_full[0]), T.uint32(1))
            T.ptx.mbarrier.init.shared.b64(T.address_of(res_full[1]), T.uint32(1))
            if cluster:  # its one arrival, and the bytes the cs - 1 peers' copies will complete
                T.ptx.mbarrier.init.shared.b64(T.address_of(mid_full[0]), T.uint32(1))
                T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(mid_full[0]), T.uint32((cs - 1) * slice_bytes))
        T.ptx.fence.proxy.async_.shared__cta()
        if cluster:  # every block's barriers initialized before a peer's copy completes on them
            T.cuda.func_call("tvm_b2b_fence_barrier_init", source_code=BARRIER_INIT_SOURCE)
            T.cuda.cluster_sync()
        else:
            T.cuda.cta_sync()
        if residual and tx == 0:  # the (first chunk's or tile's) residual tile, read while the mainloop runs
            first_k, first_i = T.meta_var(first_tile(bk, bi))
            load_residual(tiles, r_map, res_full, first_i, y_at, out_channel(first_k), 0)
            if persist and fused:  # and the block's second chunk's, into the other output tile (its own: y2_at)
                if tiles_of(bi, grid, n_tiles) * chunks > 1:
                    second_i, second_c = T.meta_var(chunk_origin(bi, 1, chunks, grid, bn2))
                    load_residual(tiles, r_map, res_full, second_i, y2_at, second_c, 1)
        if wg == wgs:  # the producer: one thread issues every step's copies (step ko: tap ko // c_steps)
            if persist:  # tile after tile, the ring of buffers going on across them
                if tx == wgs * 128:
                    for it in T.serial(tiles_of(bi, grid, n_tiles)):
                        tile_k, tile_i = T.meta_var(tile_at(bi, it, grid, channel_blocks))
                        for ko in T.serial(all_steps):  # (the pair's: its 3x3's steps, then its w2 tiles)
                            g = T.meta_var(it * all_steps + ko)
                            if g >= stages:
                                T.cuda.mbarrier_wait(T.address_of(empty[g % stages]), (g // stages + 1) % 2)
                            if not fused or ko < n_steps:  # the (first) conv's step
                                load_step(tiles, full, x_full, x_empty, x_map, w_map, g, it * c_steps, ko, tile_k, tile_i,
                                          first_step_bytes(g if fused else ko))
                                if fused:  # one copy of the scale and bias (if in shared memory), with the first tile's
                                    if sb_floats > 0:
                                        if g == 0:
                                            load_scale_bias(s, b, s2, b2, s_tile, b_tile, 0, 0, T.address_of(full[0]))
                                elif ko == 0:  # the tile's scale and bias, into the copies its epilogue reads (two: the
                                    # last tile's epilogue may still read the other)
                                    load_scale_bias(s, b, s2, b2, s_tile, b_tile, it % 2 * bn, tile_k,
                                                    T.address_of(full[g % stages]))
                            else:
                                load_w2_step(tiles, full, w2_map, g, ko - n_steps, 0)
            else:
                if tx == wgs * 128:
                    for ko in T.serial(all_steps):
                        if ko >= stages:  # the buffer's step `stages` earlier, released by every consumer warp
                            T.cuda.mbarrier_wait(T.address_of(empty[ko % stages]), (ko // stages + 1) % 2)
                        if ko < n_steps:
                            load_step(tiles, full, x_full, x_empty, x_map, w_map, ko, 0, ko, bk, bi, first_step_bytes(ko))
                        else:  # the second GEMM's: w2's tile of chunk (ko - n_steps) // k1_steps
                            load_w2_step(tiles, full, w2_map, ko, ko - n_steps, bk)
                        if sb_floats > 0:
                            if ko == 0:  # the block's scale and bias, with its first step
                                load_scale_bias(s, b, s2, b2, s_tile, b_tile, 0, bk, T.address_of(full[0]))
        elif persist:  # the consumers: tile after tile
            for it in T.serial(tiles_of(bi, grid, n_tiles)):
                tile_k, tile_i = T.meta_var(tile_at(bi, it, grid, channel_blocks))
                first_mainloop(tiles, full, empty, x_full, x_empty, acc, desc_x, desc_w, tx, it * all_steps,  # noqa: F821
                               it * c_steps)
                T.ptx.wgmma.wait_group.sync.aligned(0)
                if overlap and tx % 32 == 0:  # the tile's last step's buffer, for the next steps (tile's, or w2's)
                    T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[(it * all_steps + n_steps - 1) % stages]))
                    if halo:  # and its last halo box's, for the next tile's
                        T.ptx.mbarrier.arrive.shared.b64(T.address_of(x_empty[((it + 1) * c_steps - 1) % xs]))
                for i in T.unroll(acc_regs):
                    T.cuda.func_call("tvm_b2b_fence_acc", acc[i], source_code=FENCE_SOURCE)
                if fused:  # mid, then its chunks (their output tiles alternating on from the last tile's: j)
                    first_epilogue(tiles, acc, mid, s1, b1, s1_at, tx, 0)
                    for jc in chunk_loop(chunks):
                        chunk_second_epilogue(tiles, full, empty, res_full, acc2, mid, desc_x, desc_w,  # noqa: F821
                                              y_map, r_map, s2_in, b2_in, tx, 0, tile_i, jc, it, bi)
                else:
                    if residual:  # the tile's residual, loaded once the last tile's store had read the output tile
                        T.cuda.mbarrier_wait(T.address_of(res_full[0]), it % 2)
                    else:
                        if it > 0:  # thread 0 has seen the last tile's store read the output tile
                            T.ptx.bar.sync(T.uint32(CONSUMERS), T.uint32(consumers))
                    conv_stores(tiles, acc, s_tile, b_tile, tx, it % 2 * bn, y_at)
                    T.ptx.fence.proxy.async_.shared__cta()  # the tile's generic-proxy writes, visible to the TMA store
                    T.ptx.bar.sync(T.uint32(CONSUMERS), T.uint32(consumers))
                    if tx == 0:  # (the producer has gone on loading the next tile's steps meanwhile)
                        store_tile(tiles, y_map, tile_k, tile_i)
                        if residual:
                            if it + 1 < tiles_of(bi, grid, n_tiles):  # the next tile's residual, into the output tile
                                next_k, next_i = T.meta_var(tile_at(bi, it + 1, grid, channel_blocks))
                                load_residual(tiles, r_map, res_full, next_i, y_at, next_k * bn, 0)
        else:
            first_mainloop(tiles, full, empty, x_full, x_empty, acc, desc_x, desc_w, tx, 0, 0)  # noqa: F821
            T.ptx.wgmma.wait_group.sync.aligned(0)
            if fused and overlap and tx % 32 == 0:  # the last step's buffer, for the second GEMM's w2 tiles
                T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[(n_steps - 1) % stages]))
            for i in T.unroll(acc_regs):
                T.cuda.func_call("tvm_b2b_fence_acc", acc[i], source_code=FENCE_SOURCE)
            # accumulator pair p (fragment): two adjacent channels of one row, one half2 store into the swizzled tile
            # (the output tile: its pixels' rows, Tiling.tile_row), or into one register of the pair's mid
            if residual and not fused:
                T.cuda.mbarrier_wait(T.address_of(res_full[0]), 0)
            if not fused:
                conv_stores(tiles, acc, s1, b1, tx, s1_at, y_at)
            else:
                first_epilogue(tiles, acc, mid, s1, b1, s1_at, tx, bk)
            if fused:  # the second GEMM: mid (its warpgroup's rows, registers) times w2's tiles, chunk by chunk of bn2
                # every warpgroup's first GEMM done: x's buffers are free for the second output tile (y2_at)
                if cluster:  # the slice's generic stores, visible to the async proxy (the copies below, wgmma)
                    T.ptx.fence.proxy.async_.shared__cta()
                T.ptx.bar.sync(T.uint32(CONSUMERS), T.uint32(consumers))
                if cluster and tx == 0:  # the slice into each peer's mid, at the same offset, completing on its mid_full
                    for q in T.serial(cs - 1):
                        T.cuda.func_call("tvm_b2b_push_slice", T.address_of(tiles[mid_at + bk * bn * bm]),
                                         T.address_of(mid_full[0]), slice_bytes, (bk + 1 + q) % cs, source_code=PUSH_SOURCE)
                if residual and chunks > 1 and tx == 0:
                    load_residual(tiles, r_map, res_full, bi, y2_at, out_channel(bk) + bn2, 1)
                if cluster:  # the peers' slices have landed
                    T.cuda.mbarrier_wait(T.address_of(mid_full[0]), 0)
                for jc in chunk_loop(chunks):
                    chunk_second_epilogue(tiles, full, empty, res_full, acc2, mid, desc_x, desc_w,  # noqa: F821
                                          y_map, r_map, s2_in, b2_in, tx, bk, bi, jc, 0, bi)
        if not fused and not persist:
            T.ptx.fence.proxy.async_.shared__cta()  # the tile's generic-proxy writes, visible to the TMA store
            T.cuda.cta_sync()
            if tx == 0:
                store_tile(tiles, y_map, bk, bi)
        if cluster:  # no block exits (its shared memory gone) while its slice is still being copied to a peer
            T.cuda.func_call("tvm_b2b_cluster_sync", source_code=CLUSTER_SYNC_SOURCE)

    unused = {"w2", "s2", "b2"} if not fused else set()
    unused |= {"r"} if not residual else set()  # the parameters of cuda_conv's kernel (the body does not read these)
    func = tirx.PrimFunc([p for p in func.params if p.name not in unused], func.body, func.ret_type, func.attrs)
    # op_pattern 8 (opaque): Relax fuses nothing into it (its body is not a TE compute that FuseTIR could merge)
    return func.with_attr("global_symbol", name).with_attr(TIRX_ATTR, True).with_attr("op_pattern", 8)


class HopperRule:
    """What the Hopper rules share: sm_90 only; a switch (`switch`, `default` when unset): "1" on where the kernel
    measured faster than the template's (`slower` says where not), "all" on wherever it computes the spec (benchmarks,
    tests), anything else off; `optional` (for some specs only: rule_for falls back past them to the template's rule,
    and its reasons); parameters not searched by MetaSchedule (the kernel is written, not scheduled) but measured
    whole, each of `candidates` (tune.written)."""

    name = "Hopper TMA + wgmma"
    kernel, needs = "Hopper", "wgmma and TMA"  # what reasons call the kernel, and the sm_90 features it needs
    knobs: dict = {}
    optional = True
    switch, default = ENABLE_ENV, "1"
    config_type = HopperConfig

    def searched(self, spec) -> dict[str, tuple]:
        """The knobs' values that tuning measures (candidates): stages beyond 6 measured no faster (H100, pairdeep),
        and a single buffer leaves the copies unoverlapped."""
        return {"bm": (64, 128), "bn": (64, 128, 256), "stages": (2, 3, 4, 6), "halo": (0, 1), "warp": (0, 1)}

    def problem(self, spec) -> str | None:
        """Why the kernel cannot compute the spec, or None."""
        raise NotImplementedError

    def slower(self, spec) -> str | None:
        """Where the kernel measured slower than the template's (its default config), or None."""
        raise NotImplementedError

    def config_problem(self, spec, cfg: HopperConfig, arch: int) -> str | None:
        """Why the kernel cannot compute the spec with these parameters on sm_`arch`, or None."""
        raise NotImplementedError

    def built(self, spec, cfg):
        """What the kernel is built from (candidates count configs that build the same kernel once): the buffers, at
        most one a step of the mainloop's reduction (kernel_func allocates no more)."""
        return dataclasses.replace(cfg, stages=min(cfg.stages, steps(self.first_conv(spec))))

    def first_conv(self, spec) -> ConvSpec:
        """The (first) conv whose reduction the mainloop runs."""
        return spec

    def measured_slower(self, spec, info) -> str | None:
        """Why this rule, on and able to compute the spec on this target, leaves it to the template (for `report`)."""
        on = os.environ.get(self.switch, self.default) == "1" and info.arch == 90
        return self.slower(spec) if on and not self.problem(spec) else None

    def can_implement(self, spec, info) -> str | None:
        mode = os.environ.get(self.switch, self.default)
        if mode not in ("1", "all"):
            return f"the {self.kernel} kernel is off ({self.switch}={mode})"
        if info.arch != 90:
            return f"sm_{info.arch}: {self.needs} need sm_90"
        return self.problem(spec) or (self.slower(spec) if mode == "1" else None)

    def parse_config(self, config):
        return HopperConfig.parse(config) if isinstance(config, str) else config

    def candidates(self, spec, info) -> list:
        """What `tvm-b2b tune` measures for the spec (tune.written): every config of `searched` that the kernel takes on
        the target, the default first, then the fewest knobs away from it first (a run that --trials cuts short has
        measured the nearest); configs that build the same kernel count once."""
        default = self.default_config(spec, info)

        def distance(cfg):
            return sum(getattr(cfg, f.name) != getattr(default, f.name) for f in fields(cfg))

        knobs = self.searched(spec)
        seen, found = {self.built(spec, default)}, []
        for values in itertools.product(*knobs.values()):
            cfg = self.config_type(**dict(zip(knobs, values)))
            kernel = self.built(spec, cfg)
            if kernel not in seen and not self.config_problem(spec, cfg, info.arch):
                seen.add(kernel)
                found.append(cfg)
        return [default] + sorted(found, key=distance)


def input_form(spec: ConvSpec) -> InputForm:
    """How the kernel takes x and w: w as (k, kh*kw*c) (K-major, TMA's 2-d boxes); a stem (op.conv.stem) as its
    space-to-depth stride-1 conv, its cells padded to 16 channels, which narrow_taps packs 4 taps to a step (ResNet-50's
    7x7/2 stem: a 4x4 conv of 16 channels, K = 256 of which 192 real, where 64-channel boxes a tap would multiply 1024)."""
    if stem(spec) and space_to_depth(spec).c <= NARROW_CHANNELS[0]:
        return InputForm(cells=True, channels=NARROW_CHANNELS[0], weights="kc")
    return InputForm(weights="kc")


def kernel_conv(spec: ConvSpec) -> ConvSpec:
    """The conv the kernel computes for spec (input_form's)."""
    return input_form(spec).spec(spec)


class HopperConvRule(HopperRule):
    """sm_90 convs on TMA + wgmma (a stem as its space-to-depth conv: input_form)."""

    def searched(self, spec: ConvSpec) -> dict[str, tuple]:
        return {**super().searched(spec), "persist": (0, 1)}

    def first_conv(self, spec: ConvSpec) -> ConvSpec:
        return kernel_conv(spec)

    def problem(self, spec: ConvSpec) -> str | None:
        return spec_problem(kernel_conv(spec))

    def slower(self, spec: ConvSpec) -> str | None:
        conv = kernel_conv(spec)
        cfg = default_config(conv)
        return measured_slower(conv, conv.k // cfg.bn * Tiling(conv, cfg.bm).blocks)

    def config_problem(self, spec: ConvSpec, cfg: HopperConfig, arch: int) -> str | None:
        conv = kernel_conv(spec)
        return memory_problem(shared_bytes(conv, cfg), cfg, arch) or conv_config_problem(conv, cfg)

    def default_config(self, spec: ConvSpec, info) -> HopperConfig:
        return default_config(kernel_conv(spec))

    def workload(self, spec: ConvSpec):
        """The PrimFunc of the default config as an IRModule ("main"): the workload that shipping names (a written kernel's
        records key on its spec: tune.written)."""
        import tvm

        conv = kernel_conv(spec)
        return tvm.IRModule({"main": conv_func(conv, default_config(conv))})

    def plan(self, spec: ConvSpec, info, config=None, fused: bool = True, policy: bool = False, unfused: bool = True):
        from . import Plan

        conv = kernel_conv(spec)
        cfg = config or default_config(conv)
        problem = memory_problem(shared_bytes(conv, cfg), cfg, info.arch)  # (conv_func raises the others)
        if problem:
            raise ValueError(f"config: {problem}")
        return Plan([conv_func(conv, cfg)], True, cfg, input_form=input_form(spec), kernel="tensorcore")


RULE = HopperConvRule()
