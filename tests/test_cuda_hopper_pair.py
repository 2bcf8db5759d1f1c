"""schedule/cuda_hopper_pair.py: the fused 3x3 -> 1x1 pair on sm_90's TMA + wgmma (on where it measured faster).
CPU: which pairs it takes and why not, the weights it is given, its kernel's instructions and an nvcc sm_90a
compile. GPU (sm_90 only): the kernel vs numpy. What it measures: `bash bench/gpu_session.sh hopper`."""
import dataclasses
import re

import numpy as np

import pytest

from cuda_source import compiles_for_sm90a, kernels, skip_unless_sm90
from tvm_b2b import FusedConvSpec, build
from tvm_b2b.op.compute import PairForm
from tvm_b2b.op.conv import ConvSpec, conv_random_inputs, conv_reference
from tvm_b2b.op.reference import compare, random_inputs, reference
from tvm_b2b.schedule import plan, rule_for
from tvm_b2b.schedule import cuda_hopper_conv as hopper_conv
from tvm_b2b.schedule import cuda_hopper_pair as pair
from tvm_b2b.schedule.cuda_hopper_conv import PRODUCER_ENV, SB_ENV, TIRX_ATTR, HopperConfig, producer_default
from tvm_b2b.schedule.cuda_hopper_pair import PAIR_ENV
from tvm_b2b.target import parse_target, target_info

SM90 = parse_target("cuda:sm_90")
# whole output rows per block (14: 4 + 4 + 4 + 2 rows of 14 in 64-pixel tiles; 20 in 128-pixel tiles of 5 rows), a
# residual, k2 in several chunks, k1 = 256 (one wgmma n; two buffers), c not a multiple of 64, relu6 / no activation,
# a stride-2 3x3 (ResNet's first block of a stage); 4 chunks alternating between the output tile and x's buffers
# (without a residual), and between two tiles of their own (one buffer: no wgmma left in flight); the halo form (one
# box of x a channel step for all taps: Tiling): with a residual, and 3 channel steps (its two buffers wrap)
CASES = [("n=2,h=14,w=14,c=64,k1=64,k2=256,residual=1", None),
         ("n=1,h=20,w=20,c=40,k1=128,k2=128,act1=relu6,act2=none", "bm=128,bn=64,stages=3"),
         ("n=1,h=7,w=7,c=256,k1=256,k2=512,residual=1", None),
         ("n=3,h=9,w=11,c=64,k1=64,k2=64", "bm=128,bn=64,stages=4"),
         ("n=2,h=15,w=14,c=64,k1=128,k2=256,stride=2,residual=1", None),
         ("n=1,h=10,w=10,c=128,k1=64,k2=256", "bm=128,bn=64,stages=2"),
         ("n=2,h=12,w=12,c=64,k1=64,k2=512,residual=1", "bm=64,bn=128,stages=1"),
         ("n=2,h=14,w=14,c=64,k1=64,k2=256,residual=1", "bm=128,bn=64,stages=3,halo=1"),
         ("n=1,h=20,w=20,c=136,k1=128,k2=128,act1=relu6,act2=none", "bm=128,bn=128,stages=2,halo=1"),
         # dilated (DeepLabV3's bottlenecks at rates 2 and 4; the taps' form)
         ("n=4,h=28,w=28,c=64,k1=64,k2=256,residual=1,dilation=2", None),
         ("n=2,h=28,w=28,c=128,k1=128,k2=512,residual=1,dilation=4", "bm=128,bn=64,stages=3,warp=1")]
# the cluster form (cs > 1: each block of a cluster computes k1 / cs channels of mid, which the cluster's blocks push
# into each other's shared memory; each then computes k2 / cs output channels): k1 = 512 (its default, clusters of 4),
# a strided 3x3 in clusters of 2, the halo form, clusters of 8 with c not a multiple of 64, one chunk and no residual
CLUSTER_CASES = [("n=2,h=7,w=7,c=512,k1=512,k2=1024,residual=1", None),
                 ("n=3,h=14,w=14,c=128,k1=256,k2=512,stride=2,residual=1", "bm=64,bn=128,stages=3,cs=2"),
                 ("n=2,h=14,w=14,c=64,k1=128,k2=256,residual=1", "bm=128,bn=64,stages=3,halo=1,cs=2"),
                 ("n=1,h=9,w=9,c=72,k1=512,k2=512,act2=none", "bm=64,bn=64,stages=2,cs=8")]

# a persistent grid (persist=1: every block loops over pixel tiles, its output tiles and residual loads alternating on
# across them), blocks taking 1-4 tiles each: 4 chunks +residual (one producer warp: 56x56 64->64->256 +r, 896 tiles on
# 264 blocks), one chunk +residual (the two output tiles alternate from tile to tile; 960 on 396), 2 chunks without
# (512 on 264), a strided 3x3 of k1 = 128 (512 on 264)
PERSIST_CASES = [("n=32,h=56,w=56,c=64,k1=64,k2=256,residual=1", "bm=128,bn=64,stages=3,warp=1,persist=1"),
                 ("n=64,h=30,w=29,c=64,k1=64,k2=64,residual=1", "bm=64,bn=64,stages=3,persist=1"),
                 ("n=128,h=20,w=20,c=72,k1=64,k2=128,act2=none", "bm=128,bn=64,stages=2,persist=1"),
                 ("n=128,h=28,w=28,c=128,k1=128,k2=256,stride=2,residual=1", "bm=64,bn=128,stages=3,persist=1"),
                 # the halo form's: its two x buffers alternating across tiles
                 ("n=32,h=56,w=56,c=64,k1=64,k2=128", "bm=128,bn=64,stages=2,halo=1,persist=1"),
                 ("n=16,h=28,w=28,c=128,k1=64,k2=256,residual=1", "bm=128,bn=64,stages=2,halo=1,persist=1")]


def spec_of(text: str) -> FusedConvSpec:
    return FusedConvSpec.parse(text + ",dtype=float16")


@pytest.fixture
def hopper_on(monkeypatch):
    """The kernel wherever it computes the pair (these small pairs are where the template measured faster)."""
    monkeypatch.setenv(PAIR_ENV, "all")


@pytest.mark.parametrize("case,why", [("n=1,h=8,w=300,c=64,k1=64,k2=64", "300 output columns"),
                                      ("n=1,h=8,w=8,c=64,k1=512,k2=64", "k1=512"),
                                      ("n=1,h=8,w=8,c=64,k1=320,k2=640", "k1=320"),
                                      ("n=1,h=8,w=8,c=60,k1=64,k2=64", "c=60")])
def test_rule_refuses_what_it_does_not_compute(hopper_on, case, why):
    """Output rows wider than a block, k1 over one wgmma's n that no cluster splits into whole 64-channel steps of k1 and
    k2 (k2=64: no share of it for a second block; 320 = 5 steps), c not a multiple of 8: a reason, and cuda_wmma's
    rule takes the pair."""
    spec = spec_of(case)
    assert why in pair.RULE.can_implement(spec, target_info(SM90))
    assert rule_for(SM90, "conv3x3_conv1x1", spec).name != pair.RULE.name
    with pytest.raises(ValueError, match=why):
        pair.pair_func(spec, pair.default_config(spec))


def test_rule_is_on_where_it_measured_faster(monkeypatch):
    """On by default where it measured faster than the pair's other forms (ResNet-50's 56x56 and 14x14 pairs at batch
    32, 28x28 k1 = 128 with one producer warp), not where it fills fewer than half the SMs (batch 1), not for a strided
    3x3 of k1 = 256 (measured no faster than the two convs); TVM_B2B_HOPPER_PAIR=0 turns it off."""
    spec, small = spec_of("n=32,h=14,w=14,c=256,k1=256,k2=1024,residual=1"), spec_of("n=1,h=14,w=14,c=256,k1=256,k2=1024")
    monkeypatch.delenv(PAIR_ENV, raising=False)
    info = target_info(SM90)
    assert pair.RULE.can_implement(spec, info) is None
    assert pair.RULE.can_implement(spec_of("n=32,h=56,w=56,c=64,k1=64,k2=256,residual=1"), info) is None
    assert "fewer than half" in pair.RULE.can_implement(small, info)
    for taken in ("n=32,h=28,w=28,c=128,k1=128,k2=512,residual=1", "n=32,h=56,w=56,c=128,k1=128,k2=512,stride=2,residual=1"):
        assert pair.RULE.can_implement(spec_of(taken), info) is None and pair.default_config(spec_of(taken)).warp == 1
    assert "strided" in pair.RULE.can_implement(spec_of("n=32,h=28,w=28,c=256,k1=256,k2=1024,stride=2,residual=1"), info)
    assert pair.default_config(spec).warp == 0 and pair.default_config(spec_of("n=32,h=56,w=56,c=64,k1=64,k2=64")).warp == 0
    planned = plan(spec, SM90)
    assert planned.fused and planned.kernels[0].attrs[TIRX_ATTR] and planned.input_form == PairForm()
    assert len(plan(spec, SM90, fused=False).kernels) == 2  # the two-kernel form asked for: the template's
    monkeypatch.setenv(PAIR_ENV, "0")
    assert "off (TVM_B2B_HOPPER_PAIR=0)" in pair.RULE.can_implement(spec, info)
    assert plan(spec, SM90).kernels[0].attrs.get(TIRX_ATTR) is None


def test_pair_weights_are_each_output_channels_row():
    """PairForm: w1 (3, 3, c, k1) as (k1, 9*c), taps then channels; w2 (k1, k2) as (k2, k1)."""
    spec = spec_of("n=1,h=4,w=4,c=16,k1=64,k2=128")
    arrays = random_inputs(spec)
    given = PairForm().arrays(spec, arrays)
    assert given["w1"].shape == (64, 144) and given["w2"].shape == (128, 64) and given["w1"].flags.c_contiguous
    np.testing.assert_array_equal(given["w1"][5, 16 * 7: 16 * 8], arrays["w1"][2, 1, :, 5])
    np.testing.assert_array_equal(given["w2"][9], arrays["w2"][:, 9])


def test_default_config_fits_shared_memory():
    """The most buffers that fit 227 KiB, up to 3 in 128-pixel tiles (bn=64) and 4 in 64-pixel tiles (bn=128): 4 for a
    7x7 k1=256 pair, 3 for a 56x56 k1=64 pair and for k1=256 in rows of 100 pixels (mid in registers leaves room)."""
    small, wide = spec_of("n=1,h=7,w=7,c=256,k1=256,k2=512"), spec_of("n=1,h=100,w=100,c=64,k1=256,k2=256")
    assert pair.default_config(small) == pair.HopperConfig(bm=64, bn=128, stages=4)
    assert pair.default_config(wide) == pair.HopperConfig(bm=128, bn=64, stages=3)
    assert pair.default_config(spec_of("n=32,h=56,w=56,c=64,k1=64,k2=256")) == pair.HopperConfig(bm=128, bn=64, stages=3, warp=1)
    for case in ("n=1,h=7,w=7,c=256,k1=256,k2=512", "n=1,h=100,w=100,c=64,k1=256,k2=256", "n=32,h=14,w=14,c=256,k1=256,"
                 "k2=1024,residual=1", "n=1,h=64,w=128,c=256,k1=256,k2=256", "n=32,h=56,w=56,c=64,k1=64,k2=64"):
        spec = spec_of(case)
        cfg = pair.default_config(spec)
        most = 3 if cfg.bm == 128 else 4
        assert pair.shared_bytes(spec, cfg) <= 227 * 1024, case
        assert cfg.stages == most or pair.shared_bytes(spec, dataclasses.replace(cfg, stages=cfg.stages + 1)) > 227 * 1024


def test_second_output_tile_goes_into_x_buffers_where_they_hold_it():
    """Chunks alternate between two output tiles; the second takes x's buffers (free after the first GEMM) where they
    hold bn channels, else shared memory of its own; one chunk needs one tile."""
    spec = spec_of("n=2,h=12,w=12,c=64,k1=64,k2=512")
    one_tile = pair.shared_bytes(spec_of("n=2,h=12,w=12,c=64,k1=64,k2=128"), pair.HopperConfig(bm=64, bn=128, stages=1))
    assert pair.shared_bytes(spec, pair.HopperConfig(bm=64, bn=128, stages=1)) == one_tile + 64 * 128 * 2
    assert pair.shared_bytes(spec, pair.HopperConfig(bm=64, bn=128, stages=2)) == one_tile + 64 * 64 * 2 * 2 + 64 * 64 * 2


@pytest.mark.parametrize("case,config", CASES[:3])
def test_kernel_has_the_hopper_instructions_and_compiles(hopper_on, tmp_path, case, config):
    """One kernel taking four tensor maps (x, w1, w2, y; and r with a residual, read chunk by chunk into the output
    tile); the 3x3's taps and w1 by TMA, w2 by TMA through the same buffers; wgmma of n=k1 then n=bn; the consumer warpgroups sync by named barriers (bar.sync 8); nvcc
    compiles it for sm_90a."""
    spec = spec_of(case)
    kernel = build(spec, "cuda:sm_90", config=config, db=None)
    cfg = pair.RULE.parse_config(config) or pair.default_config(spec)
    source = kernel.source()
    (params,) = kernels(source).values()
    assert kernel.func_names == ["fused_conv3x3_conv1x1_wgmma"] and params.count("__grid_constant__ CUtensorMap") == 4 + bool(spec.residual)
    for instruction in (f"wgmma.mma_async.sync.aligned.m64n{spec.k1}k16", f"wgmma.mma_async.sync.aligned.m64n{cfg.bn}k16",
                        "cp.async.bulk.tensor.4d.shared::cluster", "cp.async.bulk.tensor.4d.global.shared::cta",
                        "bar_sync_count_sync((uint)8", "cp.async.bulk.wait_group.read 1"):
        assert instruction in source, instruction
    compiles_for_sm90a(source, tmp_path)


def test_cluster_form_takes_k1_over_one_wgmma():
    """k1 = 512 (ResNet-50's last stage) in clusters of 4 by default, mid whole in each block's shared memory; a cluster
    size takes a share of k1 and k2 of whole 64-channel steps, k1's of at most 256; the rule counts a cluster's blocks
    (batch 32: 32 pixel tiles x 4 fill the SMs, batch 1 not)."""
    spec = spec_of("n=32,h=7,w=7,c=512,k1=512,k2=2048,residual=1")
    cfg = pair.default_config(spec)
    assert cfg.cs == 4 and pair.cluster_sizes(spec) == [2, 4, 8]
    assert pair.cluster_sizes(spec_of("n=1,h=7,w=7,c=64,k1=128,k2=192")) == [1]
    slice_pair = spec_of("n=32,h=7,w=7,c=512,k1=128,k2=512,residual=1")  # what one block computes, mid aside
    assert pair.shared_bytes(spec, cfg) == pair.shared_bytes(slice_pair, dataclasses.replace(cfg, cs=1)) + 64 * 512 * 2
    assert "cs=4" in pair.pair_config_problem(spec_of("n=1,h=7,w=7,c=64,k1=256,k2=192"), cfg)
    with pytest.raises(ValueError, match="cs one of"):
        pair.HopperConfig.parse("bm=64,cs=3")
    info = target_info(SM90)
    assert pair.RULE.problem(spec) is None and "fewer than half" in pair.RULE.slower(spec_of("n=1,h=7,w=7,c=512,k1=512,k2=2048"))
    assert "measured slower than the two convs" in pair.RULE.slower(spec)  # (off by default: TVM_B2B_HOPPER_PAIR=all)
    assert set(pair.RULE.searched(spec)["cs"]) == {2, 4, 8} and all(c.cs > 1 for c in pair.RULE.candidates(spec, info))


@pytest.mark.parametrize("case,config", CLUSTER_CASES[:2])
def test_cluster_form_has_its_instructions_and_compiles(hopper_on, tmp_path, case, config):
    """The cluster form: blockIdx.x is the rank in a cluster of cs blocks (the launch's cluster dimension), the slice of
    mid pushed to each peer by a bulk copy into distributed shared memory (mapa) completing on the peer's mbarrier,
    whose init is fenced for the cluster before a cluster barrier; the second GEMM reads mid from shared memory (wgmma's
    SS form: two descriptors); nvcc compiles it for sm_90a."""
    spec = spec_of(case)
    cfg = pair.RULE.parse_config(config) or pair.default_config(spec)
    source = build(spec, "cuda:sm_90", config=config, db=None).source()
    for instruction in ("%cluster_ctarank", "mapa.shared::cluster.u32", "fence.mbarrier_init.release.cluster",
                        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes", "barrier.cluster.arrive",
                        f"wgmma.mma_async.sync.aligned.m64n{spec.k1 // cfg.cs}k16"):
        assert instruction in source, instruction
    assert f"wgmma_f16_ss_mma_async_sync_aligned_m64n{cfg.bn}k16" in source and "wgmma_f16_rs" not in source
    assert source.count("tvm_b2b_push_slice(") == 2 and "tvm_b2b_pack_half2(" not in source.split("extern \"C\"")[-1]
    compiles_for_sm90a(source, tmp_path)


def test_dilated_pair_builds_in_the_taps_form(monkeypatch, tmp_path):
    """A dilated pair (DeepLabV3's bottleneck at rate 2): not the halo form (its taps are shifts of one box), not on by
    default (the rule names the dilation: not yet measured), TVM_B2B_HOPPER_PAIR=all builds it in one kernel and nvcc
    compiles it for sm_90a."""
    spec = spec_of("n=8,h=28,w=28,c=64,k1=64,k2=256,residual=1,dilation=2")
    monkeypatch.delenv(PAIR_ENV, raising=False)
    assert not pair.default_config(spec).halo and "dilation 2" in pair.RULE.slower(spec)
    monkeypatch.setenv(PAIR_ENV, "all")
    kernel = build(spec, "cuda:sm_90", db=None)
    assert kernel.func_names == ["fused_conv3x3_conv1x1_wgmma"]
    compiles_for_sm90a(kernel.source(), tmp_path)


def test_persistent_pair_configs(monkeypatch):
    """persist=1 outside the cluster form (its second output tile in shared memory of its own: the producer refills x's
    buffers meanwhile; in the halo form two x buffers, one x box of a channel step); not a default (measured slower),
    but where TVM_B2B_HOPPER_PERSIST=1; tuning does not search it."""
    spec = spec_of("n=32,h=56,w=56,c=64,k1=64,k2=256,residual=1")
    halo_form = spec_of("n=32,h=56,w=56,c=64,k1=64,k2=128")
    monkeypatch.delenv(hopper_conv.PERSIST_ENV, raising=False)
    assert not pair.default_config(spec).persist and not pair.default_config(halo_form).persist
    monkeypatch.setenv(hopper_conv.PERSIST_ENV, "1")
    assert pair.default_config(spec).persist and pair.default_config(halo_form).persist
    assert pair.default_config(halo_form).halo
    cfg = pair.HopperConfig(bm=128, bn=64, stages=3, warp=1)
    persistent = dataclasses.replace(cfg, persist=1)
    assert pair.pair_config_problem(spec, persistent) is None
    assert pair.shared_bytes(spec, persistent) == pair.shared_bytes(spec, cfg) + 128 * 64 * 2
    halo_persistent = dataclasses.replace(persistent, halo=1)
    assert pair.pair_config_problem(spec, halo_persistent) is None
    assert hopper_conv.x_buffers(pair.conv3x3_spec(spec), halo_persistent)[0] == 2  # (1 one tile a block: one channel step)
    assert hopper_conv.x_buffers(pair.conv3x3_spec(spec), dataclasses.replace(halo_persistent, persist=0))[0] == 1
    wide = spec_of("n=2,h=7,w=7,c=512,k1=512,k2=1024,residual=1")
    assert "cluster form" in pair.pair_config_problem(wide, pair.HopperConfig(bm=64, bn=128, stages=3, cs=4, persist=1))
    assert "persist" not in pair.RULE.searched(spec)


def test_a_switch_set_between_builds_builds_anew(hopper_on, monkeypatch):
    """A build is reused within a process only under the same TVM_B2B_* switches: the default config built, then again
    under TVM_B2B_HOPPER_PERSIST=1, gives the persistent kernel (a list of switches by name once left this one out, so
    an A/B of it in one process timed the first kernel twice)."""
    spec = spec_of("n=32,h=56,w=56,c=64,k1=64,k2=256,residual=1")
    monkeypatch.delenv(hopper_conv.PERSIST_ENV, raising=False)
    one_tile_a_block = build(spec, "cuda:sm_90", db=None).source()
    monkeypatch.setenv(hopper_conv.PERSIST_ENV, "1")
    persistent = build(spec, "cuda:sm_90", db=None).source()
    loop = re.compile(r"for \(int it\w* = 0;")
    assert not loop.search(one_tile_a_block) and loop.search(persistent)


@pytest.mark.parametrize("case,config", PERSIST_CASES[:2])
def test_persistent_pair_loops_over_its_tiles_and_compiles(hopper_on, tmp_path, case, config):
    """A grid of as many blocks as the SMs hold (resident_blocks at pair_registers, 2 or 3 an SM; __launch_bounds__
    holds nvcc to them), each looping over its tiles (896 on 264 blocks, 960 on 396); nvcc compiles it for sm_90a."""
    spec = spec_of(case)
    source = build(spec, "cuda:sm_90", config=config, db=None).source()
    cfg = pair.RULE.parse_config(config)
    threads, tiles = hopper_conv.block_threads(cfg), pair.Tiling(pair.conv3x3_spec(spec), cfg.bm).blocks
    registers = hopper_conv.pair_registers(spec.k1 // 2, cfg.bn // 2)
    resident = hopper_conv.resident_blocks(pair.shared_bytes(spec, cfg), threads, registers)
    grid = 132 * resident
    assert resident in (2, 3) and tiles > grid and f"__launch_bounds__({threads}, {resident})" in source
    # the producer's loop and the consumers' over the block's tiles: (tiles - b + grid - 1) // grid
    assert len(re.findall(r"for \(int it\w* = 0; it\w* < \(\(" + f"{tiles + grid - 1} - \\(\\(int\\)blockIdx.y\\)\\) / {grid}\\)",
                          source)) == 2
    assert source.count("cp.async.bulk.wait_group.read 0") == 1  # the block's last chunk's store
    compiles_for_sm90a(source, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("case,config", CASES + CLUSTER_CASES + PERSIST_CASES)
def test_kernel_matches_numpy_on_hopper(hopper_on, case, config):
    """On an sm_90 GPU: within the op's float16 tolerance of numpy (op.reference.TOLERANCES), every pixel written."""
    skip_unless_sm90()
    spec = spec_of(case)
    kernel = build(spec, "cuda", config=config, db=None)
    arrays = random_inputs(spec, seed=5)
    err, ok = compare(spec, kernel(**arrays), reference(spec, **arrays))
    assert ok, f"max abs error {err}"


# one producer warp (producer_threads): the pair in the halo form with a residual (a config with warp=1), and a single
# 3x3 conv (its default config, with TVM_B2B_HOPPER_PRODUCER=warp)
PRODUCER_WARP_CASES = [(CASES[7][0], CASES[7][1] + ",warp=1"), ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", None)]


def any_spec(text: str):
    from tvm_b2b.op.kind import parse_spec

    return parse_spec(text + ",dtype=float16")


@pytest.mark.parametrize("case,config", PRODUCER_WARP_CASES)
def test_one_producer_warp_compiles(hopper_on, monkeypatch, tmp_path, case, config):
    """warp=1 (TVM_B2B_HOPPER_PRODUCER=warp: the default configs'): blocks of 128 threads a consumer warpgroup plus 32 (the
    producer warp), nvcc asked for as many blocks per SM as shared memory holds, and compiles them; anything but warp or
    warpgroup is refused."""
    monkeypatch.setenv("TVM_B2B_HOPPER", "all")
    monkeypatch.setenv(PRODUCER_ENV, "warp")
    spec = any_spec(case)
    kernel = build(spec, "cuda:sm_90", config=config, db=None)
    source = kernel.source()
    ((threads, min_blocks),) = {(int(t), int(b)) for t, b in re.findall(r"__launch_bounds__\((\d+), (\d+)\)", source)}
    assert threads % 128 == 32 and threads > 128 and min_blocks in (2, 3)  # as many as shared memory holds
    compiles_for_sm90a(source, tmp_path)
    monkeypatch.setenv(PRODUCER_ENV, "warps")
    with pytest.raises(ValueError, match="warpgroup or warp"):
        producer_default()


def assert_matches_numpy(spec, config, seed: int):
    """The kernel of a conv or pair spec (on the local GPU) within the op's float16 tolerance of numpy."""
    kernel = build(spec, "cuda", config=config, db=None)
    conv = isinstance(spec, ConvSpec)  # (the op kinds' inputs and references differ)
    arrays = (conv_random_inputs if conv else random_inputs)(spec, seed=seed)
    err, ok = compare(spec, kernel(**arrays), (conv_reference if conv else reference)(spec, **arrays))
    assert ok, f"max abs error {err}"


def test_a_config_picks_the_kernel_it_was_made_for(monkeypatch):
    """Where the Hopper pair runs the pair by default, the template's parameters (text or WmmaConfig) build the
    template's kernel and the Hopper kernel's its own; parameters of neither are a one-line error."""
    from tvm_b2b.schedule.cuda_wmma import WmmaConfig

    monkeypatch.delenv(PAIR_ENV, raising=False)
    spec = spec_of("n=32,h=56,w=56,c=64,k1=64,k2=128")
    assert plan(spec, SM90).kernels[0].attrs[TIRX_ATTR]
    for template in ("m_tile=128,warps_m=4,k_tile=64", WmmaConfig(m_tile=128)):
        assert plan(spec, SM90, config=template).kernels[0].attrs.get(TIRX_ATTR) is None
    assert plan(spec, SM90, config="bm=128,bn=64,stages=2").config == pair.HopperConfig(bm=128, bn=64, stages=2)
    with pytest.raises(ValueError, match="bogus"):
        plan(spec, SM90, config="bogus=1")


# TVM_B2B_HOPPER_SB=shared (scale_bias_bytes): a 3x3 conv with a residual, a conv in the halo form, the pair with a
# residual in 4 chunks, in the halo form, in a cluster of 2 (its rank's slice of s and share of s2)
SB_CASES = [("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", None),
            ("n=2,h=14,w=14,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "bm=128,bn=64,stages=3,halo=1"),
            CASES[0], CASES[7], CLUSTER_CASES[1], PERSIST_CASES[1]]


@pytest.mark.parametrize("case,config", SB_CASES)
def test_scale_and_bias_from_shared_memory_compile(hopper_on, monkeypatch, tmp_path, case, config):
    """TVM_B2B_HOPPER_SB=shared: the block's scale and bias (the pair's s2 and b2 of its output channels too) are bulk-
    copied into shared memory on the first step's mbarrier, which expects their bytes; no epilogue reads them from
    global memory; the config's shared memory counts them; nvcc compiles it. Anything but global or shared is refused."""
    monkeypatch.setenv("TVM_B2B_HOPPER", "all")
    monkeypatch.setenv(SB_ENV, "shared")
    spec = any_spec(case)
    conv = isinstance(spec, ConvSpec)
    source = build(spec, "cuda:sm_90", config=config, db=None).source()
    assert source.count("tvm_b2b_bulk_load((&(") == (2 if conv else 4)
    # (the bulk copies take their addresses, &(s_ptr[...]); nothing else reads them)
    assert not re.search(r"(?<!&\()\b[sb]2?_ptr\[", source), "an epilogue reads scale or bias from global memory"
    cfg = HopperConfig.parse(config) if config else (hopper_conv if conv else pair).default_config(spec)
    k1, k2s = (spec.k, 0) if conv else (spec.k1 // cfg.cs, spec.k2 // cfg.cs)
    assert {int(n) for n in re.findall(r"float [sb]_tile_ptr\[(\d+)\]", source)} == {k1 + k2s}
    monkeypatch.setenv(SB_ENV, "global")
    without = (hopper_conv.shared_bytes(spec, cfg) if conv else pair.shared_bytes(spec, cfg))
    monkeypatch.setenv(SB_ENV, "shared")
    assert (hopper_conv.shared_bytes(spec, cfg) if conv else pair.shared_bytes(spec, cfg)) == without + 8 * (k1 + k2s)
    compiles_for_sm90a(source, tmp_path)
    monkeypatch.setenv(SB_ENV, "smem")
    with pytest.raises(ValueError, match="global or shared"):
        hopper_conv.scale_bias_bytes(64, 0, False)


@pytest.mark.gpu
@pytest.mark.parametrize("switch,case,config", [(f"{PRODUCER_ENV}=warp", *case) for case in PRODUCER_WARP_CASES] +
                         [(f"{SB_ENV}=shared", *case) for case in SB_CASES])
def test_switches_match_numpy_on_hopper(hopper_on, monkeypatch, switch, case, config):
    """On an sm_90 GPU, with a switch of the kernels (one producer warp; scale and bias from shared memory): within the
    op's float16 tolerance of numpy."""
    skip_unless_sm90()
    monkeypatch.setenv("TVM_B2B_HOPPER", "all")
    monkeypatch.setenv(*switch.split("="))
    assert_matches_numpy(any_spec(case), config, seed=7)
