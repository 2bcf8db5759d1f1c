"""Hopper rule of the fused pair (op kind fused_conv3x3_conv1x1) on sm_90: cuda_hopper_conv's kernel with a second
GEMM. The 3x3 conv's TMA + wgmma mainloop computes all k1 channels of a block's pixels (whole output rows);
its epilogue packs them as fp16 pairs into registers (`mid`), which are wgmma's A operand in its register form
(the accumulator layout is the A fragment's: cuda_hopper_conv.mid_register); then, per chunk of bn2 output
channels, wgmma multiplies mid by w2's tiles (TMA, through the same buffers), and the
second epilogue (scale, bias, [residual], act) goes out by TMA. No intermediate in global memory, no im2col copy
per tap (each tap is one TMA box of x, or one box for all taps in the halo form: Tiling). The chunks alternate
between two output tiles, so that a chunk's store and the next chunk's residual read run while the next chunk is
computed. No public library has this kernel on Hopper (CUTLASS's fused example stops at sm_80).

The persistent form (config persist=1, or TVM_B2B_HOPPER_PERSIST=1 for the default configs outside the cluster form),
as the conv's (cuda_hopper_conv.persistent_grid): as many blocks as the SMs hold (resident_blocks at pair_registers)
loop over the pixel tiles, the producer's ring going on from a tile's 3x3 steps and w2 tiles to the next tile's (in
the halo form its two x buffers alternating across the tiles), so that the next tile's loads run while the consumers
do the last tile's chunks. The chunks' output tiles (two, the second in shared memory of its own: the producer
refills x's buffers meanwhile) and residual loads alternate on across the tiles (chunk_origin: where the block's j-th
chunk's residual comes from). Correct (its index math emulated, bench/experiments/hopper_emulation.py; GPU tests
test_cuda_hopper_pair.PERSIST_CASES pass on the H100), but slower on every pair measured, so no default takes it and
tuning does not search it: H100, N=32, same run (`bash bench/gpu_session.sh pairpersist`,
bench/results/fused_pairpersist_h100_s33.txt), the default configs one tile a block against TVM_B2B_HOPPER_PERSIST=1:
56x56 64->64->64 25.7 against 33.9 us, 64->64->128 35.9 / 43.7, 64->64->256 +r 66.6 / 89.9, 28x28 128->128->512 +r
41.8 / 64.1, 14x14 256->256->1024 +r 31.0 / 46.2. Its loop over tiles costs registers that the one-tile block does not
spend (ptxas: 129-168 a thread at one block an SM, or 80 with 372 bytes spilled under __launch_bounds__ for two),
and a pair's block is bound by its consumers' chunks, not by the loads that a persistent grid overlaps.

The cluster form (config cs=2, 4 or 8; the default where k1 > 256, as ResNet-50's last stage, k1 = 512): a cluster
of cs blocks owns a pixel tile; block rank r computes k1 / cs channels of mid (its slice) with the same mainloop, its
epilogue writes them into its shared memory (mid whole, bm x k1, in x's swizzled 64-channel boxes), one thread bulk-
copies the slice into each peer's shared memory at the same offset (cp.async.bulk shared::cluster, completing on the
peer's mbarrier: distributed shared memory, no global round trip, no recompute), and once its peers' slices have
landed the block computes k2 / cs output channels with mid from shared memory (wgmma's SS form). It makes blocks of the
cs ranks where a layer has few pixel tiles (7x7 at batch 32: 32 tiles, 128 blocks in clusters of 4). Correct on the H100
but slower than the two convs: off by default (pair_measured_slower says by how much), TVM_B2B_HOPPER_PAIR=all or a
config with cs runs it; the numpy emulation (bench/experiments/hopper_emulation.py) checks its index math.

Groups 1, fp16, k1 up to 256 (one wgmma's n: a block computes every channel of mid) or up to 2048 in a cluster, any
stride of the 3x3. Mid in registers rather than shared memory measured no faster (H100,
bench/results/fused_envab_*_h100_s25.txt: 56x56 64->64->64 25.6 vs 26.1 us, 64->64->256 +r 69.6 vs 67.5) but frees
bm x k1 x 2 bytes of shared memory (32 KiB at k1=128) for buffers.
ON by default on sm_90 (`TVM_B2B_HOPPER_PAIR=0` turns it off, `all` puts every pair it computes on it) where it measured
faster than the pair's other forms: H100, batch 32 (bench/results/fused_hopper_pairs_h100_s23.txt, against the two convs
as a model runs them unfused): 56x56 64->64->256 +r 67.4 us vs 84.7 (and vs cuda_wmma's fused kernel in ResNet-50, 64-67
vs 71-74: e2e_hopperpair_*_h100_s23_breakdown.txt), 14x14 256->256->1024 +r 30.6 vs 37.3, and with one producer warp
the k1 = 128 pairs (bench/results/fused_hoppertune_singles_h100_s26.txt); `slower` names where not. Its configs are
tuned per GPU (tune.written; H100 records in schedules/).
"""
from __future__ import annotations

import dataclasses

from ..op.compute import PairForm, conv3x3_spec
from ..op.spec import FusedConvSpec
from ..target import max_shared_bytes
from .cuda_hopper_conv import (BK, CLUSTER_SIZES, SM90_SMS, HopperConfig, HopperRule, Second, Tiling, halo_problem, halo_wins,
                               kernel_func, measured_slower, memory_problem, persist_forced, scale_bias_bytes, second_tile_apart,
                               spec_problem, steps, x_buffers)
from .cuda_hopper_conv import default_config as conv_default

PAIR_ENV = "TVM_B2B_HOPPER_PAIR"  # "1" or "all" (HopperRule): the fused pair on TMA + wgmma (off by default: see above)


MAX_SLICE = 256  # mid's channels a block computes: one wgmma's n


def pair_problem(spec: FusedConvSpec) -> str | None:
    """Why the kernel cannot compute this pair, or None."""
    if not cluster_sizes(spec):
        return (f"k1={spec.k1}, k2={spec.k2}: multiples of 64, k1 up to {MAX_SLICE} (one wgmma's n) or split over a "
                f"cluster of up to {CLUSTER_SIZES[-1]} blocks into slices of at most {MAX_SLICE}, whole 64-channel steps of k1 "
                "and k2 each")
    return spec_problem(conv3x3_spec(spec))


def cluster_sizes(spec: FusedConvSpec) -> list[int]:
    """The cluster sizes (cs) that split k1 and k2 into whole 64-channel steps, k1's into slices of at most MAX_SLICE."""
    return [cs for cs in CLUSTER_SIZES if spec.k1 % (64 * cs) == 0 and spec.k2 % (64 * cs) == 0 and spec.k1 // cs <= MAX_SLICE]


def shared_bytes(spec: FusedConvSpec, cfg: HopperConfig) -> int:
    """The operand buffers (x's tile and the larger of w1's slice and w2's tile) and the output tile (and the other one
    where x's buffers cannot hold it); mid stays in registers, or with a cluster (cs > 1) in shared memory, whole; the
    scale and bias where in shared memory (scale_bias_bytes)."""
    xs, x_rows = x_buffers(conv3x3_spec(spec), cfg)
    tiles = 1 + second_tile_apart(xs * x_rows * BK, cfg.bm, cfg.bn, spec.k2 // cfg.cs // cfg.bn, bool(cfg.persist))
    stages = min(cfg.stages, steps(conv3x3_spec(spec)))
    mid = cfg.bm * spec.k1 if cfg.cs > 1 else 0
    sb = scale_bias_bytes(spec.k1 // cfg.cs, spec.k2 // cfg.cs, False)
    return ((xs * x_rows + stages * max(spec.k1 // cfg.cs, cfg.bn)) * BK + tiles * cfg.bm * cfg.bn + mid) * 2 + sb


def default_config(spec: FusedConvSpec, arch: int = 90) -> HopperConfig:
    """128-pixel tiles where they still give a block per SM (else bm as the 3x3 conv's default), there with bn (the
    second GEMM's chunk) 64 and up to 3 buffers; otherwise bn 128 where it divides k2 and up to 4 buffers; the most
    that fit. H200 (bench/results/fused_hopper_sweep_h200_s16.txt, N=32): 128-pixel tiles with bn=64 and 3 buffers
    beat the 3x3's default (64-pixel tiles, bn=128, 4 buffers) on every 56x56 and 28x28 pair (56x56 64->64->256 +r
    64.6 vs 100.4 us; 64->64->128 36.8 vs 57.6; 28x28 128->128->512 +r 54.9 vs 65.4); at 14x14 (49 blocks of 128
    pixels) 64-pixel tiles and bn=128 win (38.2 vs 54.8). The halo form where the 3x3 has one 64-channel step and the
    second GEMM is small (k2 <= 2 k1): H100, bench/results/fused_hopperab_h100_s23.txt, 56x56 64->64->64 26.6 vs 32.1
    us, 64->64->128 36.2 vs 38.7; 64->64->256 51.5 either way, +r 70.9 vs 67.2. One producer warp (warp=1) outside the
    halo form for k1 <= 128 (producer_threads' measurements). `tvm-b2b tune` measures the configs around this one
    (candidates; bench/results/hoppertune_h100_s26.log: 64-pixel tiles 3-5% faster on the 56x56 halo pairs there)."""
    first = conv3x3_spec(spec)
    fits_rows = first.wo <= 128  # (rows wider than a tile: refused by spec_problem, asked after this)
    bm = 128 if fits_rows and Tiling(first, 128).blocks >= SM90_SMS else conv_default(first).bm
    narrow = bm == 128 or spec.k2 % 128
    halo = bm == 128 and spec.k2 <= 2 * spec.k1 and halo_wins(first)
    cs = default_cluster(spec)
    warp = int(not halo and spec.k1 // cs <= 128)  # one producer warp where it measured faster (producer_threads)
    persist = int(persist_forced() == 1 and cs == 1)  # (TVM_B2B_HOPPER_PERSIST=1: measured slower, module docstring)
    cfg = HopperConfig.default(warp, bm=bm, bn=64 if narrow else 128, stages=3 if narrow else 4, halo=int(halo), cs=cs,
                               persist=persist)
    while cfg.stages > 1 and shared_bytes(spec, cfg) > max_shared_bytes(arch):
        cfg = dataclasses.replace(cfg, stages=cfg.stages - 1)
    return cfg


def default_cluster(spec: FusedConvSpec) -> int:
    """No cluster where one block computes k1 (mid in registers); else the smallest whose slices of k1 are 128 channels
    or fewer (ResNet-50's k1 = 512: clusters of 4), or the largest there is."""
    sizes = cluster_sizes(spec) or [1]
    if sizes[0] == 1:
        return 1
    return next((cs for cs in sizes if spec.k1 // cs <= 128), sizes[-1])


def pair_config_problem(spec: FusedConvSpec, cfg: HopperConfig) -> str | None:
    """Why the kernel cannot compute this pair with these parameters (shared memory aside), or None."""
    return pair_problem(spec) or (
        cfg.cs not in cluster_sizes(spec) and f"cs={cfg.cs}: the cluster sizes that split k1={spec.k1} and k2={spec.k2} "
        f"into whole 64-channel steps, k1's into slices of at most {MAX_SLICE}, are {cluster_sizes(spec)}") or (
        spec.k2 // cfg.cs % cfg.bn and f"k2 / cs is not a multiple of bn={cfg.bn}") or (
        spec.wo > cfg.bm and f"{spec.wo} output columns do not fit bm={cfg.bm} pixels") or (
        cfg.halo and halo_problem(conv3x3_spec(spec), cfg.bm)) or (
        cfg.persist and cfg.cs > 1 and f"persist=1: not in the cluster form (cs={cfg.cs})") or None


def pair_func(spec: FusedConvSpec, cfg: HopperConfig, name: str = "fused_conv3x3_conv1x1_wgmma"):
    """The kernel as a TIRx PrimFunc (x, w1 (k1, 9*c), s1, b1, w2 (k2, k1), s2, b2, [residual (m, k2)], y (m, k2)):
    the parameters of cuda_wmma's fused kernel, with the weights as PairForm makes them."""
    problem = pair_config_problem(spec, cfg)
    if problem:
        raise ValueError(f"{spec.to_string()}: {problem}")
    conv1 = conv3x3_spec(spec)
    first = dataclasses.replace(cfg, bn=spec.k1 // cfg.cs, cs=1)  # all of k1 in one block, or its slice of the cluster's
    return kernel_func(conv1, first, Second(spec.k2, cfg.bn, spec.act2, bool(spec.residual)), name)


class WrittenPairRule(HopperRule):
    """A pair rule of sm_90 whose fused kernel is written in TIRx script (`func`, parameters given, not searched) and
    whose two-kernel form, where asked for, is `template()`'s rule's."""

    input_form = None  # how the kernel takes the op's arrays where not as given

    def template(self):
        raise NotImplementedError

    def func(self, spec: FusedConvSpec, cfg):
        raise NotImplementedError

    def config_problem(self, spec: FusedConvSpec, cfg, arch: int) -> str | None:
        raise NotImplementedError

    def workload(self, spec: FusedConvSpec):
        """The PrimFunc of the default config as an IRModule ("main"): the workload that shipping names (a written kernel's
        records key on its spec: tune.written)."""
        import tvm

        from ..target import parse_target, target_info

        return tvm.IRModule({"main": self.func(spec, self.default_config(spec, target_info(parse_target("cuda:sm_90"))))})

    def plan(self, spec: FusedConvSpec, info, config=None, fused: bool = True, policy: bool = False, unfused: bool = True):
        """One kernel; the two-kernel form, where asked (fused=False), is the template's."""
        from . import Plan

        if not fused:
            return self.template().plan(spec, info, None, False, policy, unfused)
        cfg = config or self.default_config(spec, info)
        problem = self.config_problem(spec, cfg, info.arch)
        if problem:
            raise ValueError(f"config: {problem}")
        return Plan([self.func(spec, cfg)], True, cfg, input_form=self.input_form)


def pair_measured_slower(spec: FusedConvSpec) -> str | None:
    """Where the pair measured no faster than its two convs as a model runs them (H100, batch 32), or None: a strided 3x3
    of k1 >= 256 (28x28/2 256->256->1024 +r 36.5-38.7 vs 37.5 us, bench/results/fused_hoppertune_singles_h100_s26.txt);
    the cluster form (k1 = 512: 14x14/2 and 7x7 512->512->2048 +r 61.0-76.4 us in clusters of 2-8 against 35.2-35.5 for
    the two convs, bench/results/fused_cluster_h100_s28.txt; its mid, 1.6 MB at batch 32, is little for fusion to save,
    while each block's 49 pixels reread w2's share from L2).
    With one producer warp (producer_threads) every other ResNet-50 pair it computes wins at batch 32: 28x28
    128->128->512 +r 41.3 vs 51.2 us, 56x56/2 128->128->512 +r 44.6 vs 51.5 (before it, 61.0 and 64.8: they ran as two
    convs)."""
    if default_cluster(spec) > 1:
        return (f"k1={spec.k1} takes the cluster form, which measured slower than the two convs (H100, batch 32: 7x7 "
                f"512->512->2048 +r 61-65 us against 35.5; {PAIR_ENV}=all runs it)")
    if spec.stride > 1 and spec.k1 >= 256:
        return f"a strided 3x3 of k1={spec.k1} (stride {spec.stride}): the pair measured no faster than its two convs"
    return None


class HopperPairRule(WrittenPairRule):
    """sm_90 fused pairs on TMA + wgmma; runs every pair it takes fused."""

    switch, default = PAIR_ENV, "1"
    input_form = PairForm()

    def problem(self, spec: FusedConvSpec) -> str | None:
        return pair_problem(spec)

    def slower(self, spec: FusedConvSpec) -> str | None:
        cfg = default_config(spec)
        return measured_slower(conv3x3_spec(spec), cfg.cs * Tiling(conv3x3_spec(spec), cfg.bm).blocks) or (
            pair_measured_slower(spec))

    def default_config(self, spec: FusedConvSpec, info) -> HopperConfig:
        return default_config(spec, info.arch)

    def template(self):
        from .cuda_wmma import RULE as TEMPLATE

        return TEMPLATE

    def func(self, spec: FusedConvSpec, cfg: HopperConfig):
        return pair_func(spec, cfg)

    def config_problem(self, spec: FusedConvSpec, cfg: HopperConfig, arch: int) -> str | None:
        return memory_problem(shared_bytes(spec, cfg), cfg, arch) or pair_config_problem(spec, cfg)

    def first_conv(self, spec: FusedConvSpec):
        return conv3x3_spec(spec)

    def searched(self, spec: FusedConvSpec) -> dict[str, tuple]:
        """bn, the second GEMM's chunk, 64 or 128: 256 would hold 128 accumulator registers beside mid's; the cluster
        sizes that split k1. Not a persistent grid (persist=1): slower on every pair measured (module docstring)."""
        return {**super().searched(spec), "bn": (64, 128), "cs": tuple(cluster_sizes(spec))}


RULE = HopperPairRule()
