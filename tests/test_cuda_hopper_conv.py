"""schedule/cuda_hopper_conv.py: sm_90's 1x1 conv on TMA + wgmma, written in TIRx script (off unless TVM_B2B_HOPPER=1).
CPU: which convs it takes and why not, the (k, c) weights it is given, its kernel's Hopper instructions and an
nvcc sm_90a compile of it alone and inside a whole model. GPU (sm_90 only): the kernel vs numpy, a model vs
onnxruntime. What it measures: `bash bench/gpu_session.sh hopper`."""
import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cuda_source import compiles_for_sm90a, kernels, skip_unless_sm90
from tvm_b2b import ConvSpec, build
from tvm_b2b import kernel as kernel_module
from tvm_b2b.op import compare
from tvm_b2b.op.conv import InputForm, conv_random_inputs, conv_reference
from tvm_b2b.schedule import plan, rule_for
from tvm_b2b.schedule import cuda_hopper_conv as hopper
from tvm_b2b.target import parse_target, target_info

SM90 = parse_target("cuda:sm_90")
# 1x1 stride 1: rows past m (126 and 441 pixels: not multiples of the tiles), a residual, reductions of 1, 4 and 5
# steps (5 > 3 buffers: the ring wraps), several channel blocks, relu6 and no activation; whole output rows: 3x3
# stride 1 (9 taps read as boxes at their offsets, the padding read outside x), c not a multiple of 64, a block of
# rows that overhangs the image (14 rows in blocks of 9), a 1x1 and a 3x3 of stride 2 (TMA's box traverses every
# other pixel; odd sizes), one output row per block
# (the first and last rows' outer taps read boxes wholly outside x), a 7x7 conv; the halo form (one box of x a channel
# step for all taps): 2 channel steps and a residual, 4 channel steps (its two buffers wrap; c not a multiple of 64),
# a 7x7 conv (49 taps of one box), rows of 62 columns in 64-pixel tiles
CASES = [("n=2,h=7,w=9,c=64,k=128", "bm=128,bn=128,stages=4"),
         ("n=1,h=21,w=21,c=256,k=256,residual=1,act=relu6", "bm=128,bn=128,stages=3"),
         ("n=3,h=5,w=6,c=320,k=512,act=none", "bm=64,bn=256,stages=3"), ("n=2,h=14,w=14,c=72,k=64", "bm=128,bn=64,stages=2"),
         ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", "bm=128,bn=128,stages=4"),
         ("n=1,h=10,w=13,c=40,k=64,kh=3,kw=3,pad_h=1,pad_w=1,act=none", "bm=64,bn=64,stages=3"),
         ("n=2,h=15,w=15,c=128,k=256,stride=2,act=none", "bm=128,bn=256,stages=2"),
         ("n=2,h=14,w=13,c=64,k=128,kh=3,kw=3,stride=2,pad_h=1,pad_w=1,residual=1", "bm=64,bn=128,stages=3"),
         ("n=1,h=40,w=40,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "bm=64,bn=64,stages=4"),
         ("n=1,h=12,w=12,c=16,k=64,kh=7,kw=7,pad_h=3,pad_w=3", "bm=128,bn=64,stages=4"),
         ("n=2,h=14,w=14,c=128,k=128,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", "bm=128,bn=128,stages=4,halo=1"),
         ("n=1,h=10,w=13,c=200,k=64,kh=3,kw=3,pad_h=1,pad_w=1,act=none", "bm=64,bn=64,stages=3,halo=1"),
         ("n=1,h=12,w=12,c=16,k=64,kh=7,kw=7,pad_h=3,pad_w=3", "bm=128,bn=64,stages=4,halo=1"),
         ("n=1,h=9,w=60,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "bm=64,bn=64,stages=2,halo=1"),
         # persistent grids, blocks taking 2-3 tiles each: 196 tiles on 132 blocks (one an SM at 160 KiB); 392 (+residual,
         # 8 channel blocks) on 132; a strided 3x3's 512 (+residual, ragged last rows) on 396 (three an SM)
         ("n=32,h=28,w=28,c=512,k=128", "bm=128,bn=128,stages=4,persist=1"),
         ("n=32,h=14,w=14,c=256,k=1024,residual=1", "bm=128,bn=128,stages=4,persist=1"),
         ("n=32,h=27,w=28,c=128,k=256,kh=3,kw=3,stride=2,pad_h=1,pad_w=1,residual=1", "bm=64,bn=64,stages=3,persist=1"),
         # a subsampled 1x1 of 4 blocks an image (+residual), and of stride 3 in a persistent grid (384 tiles on 264)
         ("n=3,h=30,w=29,c=64,k=64,stride=2,residual=1", "bm=64,bn=64,stages=2"),
         ("n=64,h=34,w=33,c=72,k=256,stride=3,act=none", "bm=64,bn=128,stages=3,persist=1"),
         # narrow_taps: a 7x7/2 stem of 3 channels as its space-to-depth 4x4 conv of 16 (4 taps a step; default config,
         # and in a persistent grid: 896 tiles on 264 blocks), a 2x2 conv of 32 channels (2 taps a step) +residual
         ("n=2,h=35,w=30,c=3,k=64,kh=7,kw=7,stride=2,pad_h=3,pad_w=3", None),
         ("n=8,h=224,w=224,c=3,k=64,kh=7,kw=7,stride=2,pad_h=3,pad_w=3,act=none", "bm=128,bn=64,stages=2,persist=1"),
         ("n=2,h=9,w=12,c=32,k=128,kh=2,kw=2,pad_h=1,pad_w=1,residual=1", "bm=64,bn=64,stages=3"),
         # the default configs' persistent grids (persist_default): a 1-step 1x1 (784 tiles on 132 blocks), a strided one
         ("n=32,h=56,w=56,c=64,k=256,act=none", None), ("n=32,h=28,w=28,c=512,k=1024,stride=2,act=none", None),
         # the halo form in a persistent grid, its two x buffers alternating across a block's tiles: 896 tiles on 264
         # blocks (+residual), 4 channel steps a tile
         ("n=32,h=56,w=56,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", "bm=128,bn=64,stages=4,halo=1,persist=1"),
         ("n=4,h=20,w=21,c=200,k=64,kh=3,kw=3,pad_h=1,pad_w=1,act=none", "bm=64,bn=64,stages=3,halo=1,persist=1"),
         # dilated (the taps' form, each tap's box `dilation` pixels from the last): DeepLabV3's rate 2 at batch 8 and
         # its rate 4 (+residual, persistent), a strided rate 3
         ("n=8,h=28,w=28,c=256,k=256,kh=3,kw=3,pad_h=2,pad_w=2,dilation=2", None),
         ("n=4,h=28,w=28,c=128,k=128,kh=3,kw=3,pad_h=4,pad_w=4,dilation=4,residual=1", "bm=128,bn=128,stages=4,persist=1"),
         ("n=2,h=19,w=21,c=64,k=64,kh=3,kw=3,stride=2,pad_h=3,pad_w=3,dilation=3", "bm=64,bn=64,stages=3")]


def spec_of(text: str) -> ConvSpec:
    return ConvSpec.parse(text + ",dtype=float16")


@pytest.fixture
def hopper_on(monkeypatch):
    """The kernels wherever they compute the spec (these small specs are where the template measured faster); the
    pair's too (the model tests' pair)."""
    monkeypatch.setenv(hopper.ENABLE_ENV, "all")
    monkeypatch.setenv("TVM_B2B_HOPPER_PAIR", "all")


@pytest.mark.parametrize("case,why", [
    ("n=1,h=40,w=40,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1,stride=9", "stride 9"), ("n=1,h=8,w=8,c=64,k=64,groups=2", "groups=2"),
    ("n=1,h=8,w=8,c=60,k=64", "c=60, k=64"), ("n=1,h=8,w=8,c=64,k=96", "c=64, k=96"),
    ("n=1,h=8,w=200,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "200 output columns"),
    ("n=64,h=512,w=512,c=64,k=64", "pixel blocks")])
def test_rule_refuses_what_it_does_not_compute(hopper_on, case, why):
    """A stride over TMA's 8, a grouped conv, c not a multiple of 8, k not of 64, output rows wider than a block,
    more pixel blocks than the grid's y: a reason, and cuda_conv's rule takes the conv."""
    spec = spec_of(case)
    assert why in hopper.RULE.can_implement(spec, target_info(SM90))
    assert rule_for(SM90, "conv2d", spec).name != hopper.RULE.name
    with pytest.raises(ValueError, match=why):
        hopper.conv_func(spec, hopper.HopperConfig())


@pytest.mark.parametrize("case,why,persist", [
    ("n=1,h=14,w=14,c=1024,k=256", "fewer than half of sm_90's 132 SMs", None),  # batch 1: 4 blocks
    ("n=32,h=56,w=56,c=64,k=256,act=none", "1 reduction step(s) of 64 channels without a persistent grid", "0"),
    ("n=32,h=224,w=224,c=3,k=64,kh=7,kw=7,stride=2,pad_h=3,pad_w=3", "a stem's cells", None),
    ("n=32,h=28,w=28,c=256,k=256,kh=3,kw=3,pad_h=2,pad_w=2,dilation=2", "dilation 2: the taps' form computes it", None)])
def test_rule_leaves_to_the_template_where_it_measured_slower(monkeypatch, case, why, persist):
    """By default (TVM_B2B_HOPPER unset or 1): where cuda_conv's kernel measured faster, its rule takes the conv, and its
    plan says why not this kernel (`report` shows it); TVM_B2B_HOPPER=all takes it anyway. A 1-step conv only without
    its persistent grid (TVM_B2B_HOPPER_PERSIST=0)."""
    spec, info = spec_of(case), target_info(SM90)
    monkeypatch.delenv(hopper.ENABLE_ENV, raising=False)
    if persist is not None:
        monkeypatch.setenv(hopper.PERSIST_ENV, persist)
    assert why in hopper.RULE.can_implement(spec, info)
    assert rule_for(SM90, "conv2d", spec).name != hopper.RULE.name
    assert plan(spec, SM90).passed_over.startswith("Hopper TMA + wgmma: ") and why in plan(spec, SM90).passed_over
    monkeypatch.setenv(hopper.ENABLE_ENV, "all")
    assert rule_for(SM90, "conv2d", spec) is hopper.RULE


def test_rule_is_on_by_default_on_sm90_only(monkeypatch):
    """ResNet-50's batch-32 convs other than the stem (3x3s, 1x1s, strided 1x1s) run on the Hopper kernel by default;
    TVM_B2B_HOPPER=0 turns it off, and sm_80 has no wgmma: cuda_conv's kernel, with the reason."""
    info = target_info(SM90)
    monkeypatch.delenv(hopper.ENABLE_ENV, raising=False)
    monkeypatch.delenv(hopper.PERSIST_ENV, raising=False)
    for case in ("n=32,h=14,w=14,c=256,k=256,kh=3,kw=3,pad_h=1,pad_w=1", "n=32,h=28,w=28,c=128,k=512,residual=1",
                 "n=32,h=7,w=7,c=2048,k=512", "n=32,h=56,w=56,c=128,k=128,kh=3,kw=3,stride=2,pad_h=1,pad_w=1",
                 # measured faster persistent: a 1-step 1x1 and the strided 1x1s (subsampled map) of batch 32
                 "n=32,h=56,w=56,c=64,k=256,act=none", "n=32,h=56,w=56,c=256,k=512,stride=2,act=none",
                 "n=32,h=14,w=14,c=1024,k=2048,stride=2,act=none"):
        assert hopper.RULE.can_implement(spec_of(case), info) is None, case
    spec = spec_of("n=32,h=14,w=14,c=1024,k=256")
    planned = plan(spec, SM90)
    assert planned.kernels[0].attrs[hopper.TIRX_ATTR] and planned.input_form == InputForm(weights="kc")
    assert "need sm_90" in hopper.RULE.can_implement(spec, target_info(parse_target("cuda:sm_80")))
    monkeypatch.setenv(hopper.ENABLE_ENV, "0")
    assert "off (TVM_B2B_HOPPER=0)" in hopper.RULE.can_implement(spec, info)
    assert plan(spec, SM90).kernels[0].attrs.get(hopper.TIRX_ATTR) is None


@pytest.mark.parametrize("case,config", [
    ("n=32,h=28,w=28,c=128,k=512,residual=1", "bm=128,bn=256,stages=4,persist=1"),  # 2 steps: 256 channels a block
    ("n=32,h=7,w=7,c=2048,k=512", "bm=64,bn=128,stages=4"),  # 52 blocks of 128 pixels: 64-pixel ones
    ("n=32,h=14,w=14,c=256,k=1024,residual=1", "bm=128,bn=128,stages=4,persist=1"),
    ("n=32,h=28,w=28,c=512,k=1024,stride=2,act=none", "bm=64,bn=128,stages=4,persist=1"),  # 8 steps: the most persistent
    ("n=32,h=14,w=14,c=1024,k=256", "bm=64,bn=128,stages=4"),  # 16 steps
    ("n=32,h=14,w=14,c=256,k=256,kh=3,kw=3,pad_h=1,pad_w=1", "bm=64,bn=128,stages=4")])  # 4 rows of 14 fill 64
def test_default_config(monkeypatch, case, config):
    """The configs measured fastest on the H200 (bench/results/convs_h200_s15_hopper_configs.txt): 256 channels for a
    reduction of 1-2 steps, 64 pixels where 128 leave SMs idle or whole rows fit 64 as well; a persistent grid for a
    reduction of up to 8 steps (H100, bench/results/convs_persist{0,1}_h100_s32.txt). TVM_B2B_HOPPER_PERSIST=0 or 1
    sets persist for every conv."""
    monkeypatch.delenv(hopper.PERSIST_ENV, raising=False)
    want = hopper.HopperConfig.parse(config)
    assert hopper.default_config(spec_of(case)) == want
    for forced in (0, 1):
        monkeypatch.setenv(hopper.PERSIST_ENV, str(forced))
        assert hopper.default_config(spec_of(case)) == dataclasses.replace(want, persist=forced)
    monkeypatch.setenv(hopper.PERSIST_ENV, "yes")
    with pytest.raises(ValueError, match="TVM_B2B_HOPPER_PERSIST=yes: 0 or 1"):
        hopper.default_config(spec_of(case))


def test_kc_weights_are_each_output_channels_row():
    """InputForm(weights="kc") of (kh, kw, c, k) weights: (k, kh*kw*c), row k the weights of output channel k, taps
    then channels."""
    spec = spec_of("n=1,h=4,w=4,c=16,k=64,kh=3,kw=3,pad_h=1,pad_w=1")
    w = conv_random_inputs(spec)["w"]
    kc = InputForm(weights="kc").w(spec, w)
    assert kc.shape == (64, 9 * 16) and kc.flags.c_contiguous
    np.testing.assert_array_equal(kc[5, 16 * 4: 16 * 5], w[1, 1, :, 5])


@pytest.mark.parametrize("case,bm,rows,blocks", [("n=2,h=56,w=56,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 128, 2, 56),
                                                 ("n=1,h=14,w=14,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 128, 7, 2),
                                                 ("n=3,h=7,w=7,c=64,k=64,stride=2", 64, 4, 3),
                                                 ("n=1,h=7,w=9,c=64,k=64", 128, 1, 1)])
def test_tiling_takes_whole_rows_spread_evenly(case, bm, rows, blocks):
    """Whole output rows per block, as many as bm holds, spread evenly over each image's blocks (14 rows: 7 + 7,
    not 9 + 5); a stride-1 1x1 conv: any bm consecutive pixels."""
    tiling = hopper.Tiling(spec_of(case), bm)
    assert (tiling.rows if not hopper.flat(tiling.spec) else 1, tiling.blocks) == (rows, blocks)


def test_subsampled_tiling_maps_every_stride_th_pixel():
    """A strided 1x1 conv without padding (ResNet-50's downsampling, 56x56 256->512 stride 2): x's tensor map is its
    every 2nd pixel, a tensor of the output's shape (28 x 28) with twice x's column and row strides, read in boxes of
    the output's (no element strides: TMA's strided traversal is for the padded and larger kernels), at output
    coordinates."""
    spec = spec_of("n=32,h=56,w=56,c=256,k=512,stride=2,act=none")
    tiling = hopper.Tiling(spec, 128)
    assert hopper.subsampled(spec) and not hopper.subsampled(spec_of("n=1,h=7,w=7,c=64,k=64,kh=3,kw=3,stride=2"))
    assert tiling.x_map() == [256, 28, 28, 32, 2 * 512, 2 * 56 * 512, 56 * 56 * 512, 64, 28, tiling.rows, 1]
    assert tiling.element_strides() == [1, 1, 1, 1] and tiling.rows == 4 and tiling.tap(8, 0) == (0, 4, 1)


def test_halo_tiling_reads_one_box_for_every_tap():
    """The halo form at 56x56 in 128-pixel tiles: 2 output rows a block (GEMM rows of 58 columns: 116 of 128), one
    box of 58 x 4 pixels; tap (rh, rw) starts rh * 58 + rw rows in, the last at 118 (a buffer of 118 + 128 rows, 248
    as a multiple of 8); GEMM row 58 is output pixel 56 (row 1, column 0), rows 56, 57, 114, 115 and 116 on none."""
    spec = spec_of("n=2,h=56,w=56,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1")
    tiling = hopper.Tiling(spec, 128, True)
    assert (tiling.rows, tiling.width, tiling.blocks, tiling.pixels) == (2, 58, 56, 112)
    assert tiling.x_map()[7:] == [64, 58, 4, 1] and tiling.tap(3, 0) == (-1, 5, 0)
    assert [tiling.shift(t) for t in (0, 1, 3, 8)] == [0, 1, 58, 118] and tiling.halo_rows == 248
    assert [bool(tiling.tile_row(m)[1]) for m in (0, 55, 56, 57, 58, 113, 114, 115, 116)] == [True] * 2 + [False] * 2 + [
        True] * 2 + [False] * 3
    assert int(tiling.tile_row(58)[0]) == 56 and int(tiling.tile_row(113)[0]) == 111


@pytest.mark.parametrize("case,bm,why", [("n=1,h=8,w=8,c=64,k=64,kh=3,kw=3,stride=2,pad_h=1,pad_w=1", 64, "stride 2"),
                                         ("n=1,h=8,w=8,c=64,k=64", 64, "1x1"),
                                         ("n=1,h=8,w=63,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 64, "65 input columns")])
def test_halo_form_refuses_what_its_taps_cannot_shift(case, bm, why):
    spec = spec_of(case)
    assert why in hopper.halo_problem(spec, bm)
    with pytest.raises(ValueError, match="halo=1"):
        hopper.conv_func(spec, hopper.HopperConfig(bm=bm, bn=64, stages=2, halo=1))


def test_halo_form_shared_memory():
    """Two halo buffers (two channel steps) beside the ring of w's tiles and the output tile."""
    spec = spec_of("n=2,h=56,w=56,c=128,k=64,kh=3,kw=3,pad_h=1,pad_w=1")
    cfg = hopper.HopperConfig(bm=128, bn=64, stages=4, halo=1)
    assert hopper.x_buffers(spec, cfg) == (2, 248)
    assert hopper.shared_bytes(spec, cfg) == (2 * 248 * 64 + 4 * 64 * 64 + 128 * 64) * 2


@given(tiles=st.integers(1, 3000), blocks=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_persistent_grid_takes_each_tile_once(tiles, blocks):
    """persist=1: the grid's blocks take every tile exactly once, at most one more than any other block, and at each
    step the resident blocks take consecutive tiles (which share pixel blocks: channel blocks run fastest)."""
    grid = hopper.persistent_grid(tiles, blocks)
    taken = [(b, it, b + it * grid) for b in range(grid) for it in range(hopper.tiles_of(b, grid, tiles))]
    assert sorted(t for _, _, t in taken) == list(range(tiles))
    counts = [hopper.tiles_of(b, grid, tiles) for b in range(grid)]
    assert max(counts) - min(counts) <= 1 and grid == min(tiles, hopper.SM90_SMS * blocks)
    assert all(hopper.tile_at(b, it, grid, 4) == (t % 4, t // 4) for b, it, t in taken)


def test_dilated_conv_takes_the_taps_form_and_compiles(hopper_on, tmp_path):
    """A dilated conv (DeepLabV3's rate 2): each tap one box of x, `dilation` pixels from the last (tap (2, 2) 4 rows
    and columns below tap (0, 0)), in the taps' form (the halo form's taps are shifts of one box: refused); not on by
    default (not yet measured: measured_slower says so), TVM_B2B_HOPPER=all builds it and nvcc compiles it for sm_90a."""
    spec = spec_of("n=8,h=28,w=28,c=256,k=256,kh=3,kw=3,pad_h=2,pad_w=2,dilation=2")
    assert hopper.spec_problem(spec) is None and "undilated" in hopper.halo_problem(spec, 128)
    tiling = hopper.Tiling(spec, 128)
    assert [tiling.tap(1, t)[:2] for t in (0, 4, 8)] == [(-2, tiling.rows - 2), (0, tiling.rows), (2, tiling.rows + 2)]
    assert not hopper.default_config(spec).halo
    source = build(spec, "cuda:sm_90", db=None).source()
    assert "wgmma.mma_async" in source
    compiles_for_sm90a(source, tmp_path)


def test_persistent_grid_is_sized_for_the_gpu_here(hopper_on, monkeypatch):
    """A build on an sm_90 GPU of fewer SMs (an H100 PCIe: 114) launches as many persistent blocks as its SMs hold, not
    132 an SM's worth (those beyond would run after the others, doubling the time); without one, 132 (sm90_count)."""
    spec, cfg = spec_of("n=32,h=56,w=56,c=256,k=128,residual=1"), "bm=128,bn=128,stages=4,persist=1"
    monkeypatch.setattr(hopper, "sm90_count", lambda: 114)
    monkeypatch.setattr(kernel_module, "_BUILT", {})  # (builds are reused within a process: not this one)
    source = build(spec, "cuda:sm_90", config=cfg, db=None).source()
    assert "(897 - ((int)blockIdx.y)) / 114" in source  # the block's tiles: (784 - b + 113) // 114


def test_persistent_kernel_loops_over_its_tiles_and_compiles(hopper_on, tmp_path):
    """persist=1: one block an SM (160 KiB of shared memory) loops over tiles b, b + 132, ... (784 of them), its
    producer's ring of buffers going on from tile to tile, the next tile's residual loaded once the store has read the
    output tile, each tile's scale and bias read from shared memory; __launch_bounds__ without a minimum (one block
    an SM); nvcc compiles it for sm_90a."""
    spec, cfg = spec_of("n=32,h=56,w=56,c=256,k=128,residual=1"), "bm=128,bn=128,stages=4,persist=1"
    source = build(spec, "cuda:sm_90", config=cfg, db=None).source()
    assert hopper.resident_of(spec, hopper.HopperConfig.parse(cfg)) == 1 and hopper.block_threads(hopper.HopperConfig()) == 384
    assert "(915 - ((int)blockIdx.y)) / 132" in source  # the block's tiles: (784 - b + 131) // 132
    assert source.count("cp.async.bulk.wait_group.read 0") == 1 and "__launch_bounds__(384)" in source
    assert source.count("bar_sync_count_sync((uint)8, (uint)256)") == 1  # the consumers' barrier before each store
    # each tile's scale and bias copied into shared memory on its first step's mbarrier, the epilogue reading them there
    assert source.count("tvm_b2b_bulk_load((&(") == 2 and "cp.async.bulk.shared::cluster.global.mbarrier" in source
    assert not re.search(r"\bs_ptr\[", source.split("tvm_b2b_store_half2(")[-1])
    compiles_for_sm90a(source, tmp_path)


def test_stem_packs_four_taps_a_step_and_compiles(hopper_on, monkeypatch, tmp_path):
    """narrow_taps: ResNet-50's 7x7/2 stem (3 channels) runs as its space-to-depth 4x4 conv of 16-channel cells, w as
    (64, 256): each step 4 boxes of x (a kernel row's 4 taps) into the 4 parts of its buffer, wgmma reading them through
    32-byte-swizzle descriptors (8 rows 256 bytes apart: SBO 16) and w's through the 128-byte one (SBO 64); nvcc
    compiles it. The default policy (TVM_B2B_HOPPER=1) leaves it to the mma.sync kernel, measured faster there."""
    spec = spec_of("n=32,h=224,w=224,c=3,k=64,kh=7,kw=7,stride=2,pad_h=3,pad_w=3")
    kernel = build(spec, "cuda:sm_90", db=None)
    assert kernel.func_names == ["conv2d_wgmma"] and kernel.input_form == InputForm(cells=True, channels=16, weights="kc")
    source = kernel.source()
    for tap in range(4):  # step ko: kernel row ko, columns 0-3, each a box into its 128 x 16 part (2048 elements)
        part = f"((ko * 8192) + {2048 * tap})" if tap else "(ko * 8192)"
        assert f"tiles_ptr[{part}]))), ((void*)((unsigned long long)(&(x_map)))), 0, {tap}, (ko + " in source, tap
    assert source.count(", 1, 16, 1);") == 4 and source.count(", 1, 64, 3);") == 4  # x's 4 k-slices, w's
    compiles_for_sm90a(source, tmp_path)
    monkeypatch.setenv(hopper.ENABLE_ENV, "1")
    assert "the mma.sync kernel measured faster" in hopper.RULE.can_implement(spec, target_info(SM90))


def test_flat_1x1_of_rows_wider_than_its_tile_compiles(monkeypatch, tmp_path):
    """MobileNetV3-Large's first 1x1 at batch 1 (112-pixel rows, 64-pixel tiles by default: 196 blocks): the flat form
    (bm consecutive pixels) has no rows a block, and its build failed on the halo box's bytes, which only the halo form
    uses (the whole model failed to compile at batch 1: ZeroDivisionError). As a model builds it, default switches."""
    monkeypatch.delenv(hopper.ENABLE_ENV, raising=False)
    spec = spec_of("n=1,h=112,w=112,c=16,k=64")
    planned = plan(spec, SM90)
    assert planned.config.bm < spec.wo and not planned.config.halo and planned.kernels[0].attrs[hopper.TIRX_ATTR]
    compiles_for_sm90a(build(spec, "cuda:sm_90", db=None).source(), tmp_path)


@pytest.mark.parametrize("case,config", CASES[1:2] + CASES[4:5] + CASES[6:7] + CASES[10:11])
def test_kernel_has_the_hopper_instructions_and_compiles(hopper_on, tmp_path, case, config):
    """One kernel of 128 * (bm / 64 + 1) threads taking three tensor maps (four with a residual, which TMA reads
    into the output tile); its CUDA issues TMA loads (x's 4-d boxes, w's 2-d ones) and a TMA store, waits on
    mbarriers, multiplies with wgmma m64n{bn}k16 and writes the output tile two channels a store; nvcc compiles it
    for sm_90a. A 1x1, a 3x3 and a strided 1x1 conv."""
    cfg, spec = hopper.HopperConfig.parse(config), spec_of(case)
    source = build(spec, "cuda:sm_90", config=config, db=None).source()
    (params,) = kernels(source).values()
    assert params.count("__grid_constant__ CUtensorMap") == 3 + bool(spec.residual)
    assert ("CUtensorMap r_map" in params) == bool(spec.residual) and "tvm_b2b_store_half2(" in source
    assert f"__launch_bounds__({128 * (cfg.bm // 64 + 1)})" in source
    for instruction in (f"wgmma.mma_async.sync.aligned.m64n{cfg.bn}k16.f32.f16.f16", "cp.async.bulk.tensor.2d.shared::cluster",
                        "cp.async.bulk.tensor.4d.shared::cluster", "cp.async.bulk.tensor.4d.global.shared::cta",
                        "mbarrier.try_wait.parity", "wgmma.wait_group"):
        assert instruction in source, instruction
    assert "wait_group_sync_aligned_1" in source  # one step's wgmma in flight while the next is issued (2+ buffers)
    # the block exits once its store has read the output tile, not once the store's writes are done
    assert "cp.async.bulk.wait_group.read 0" in source and "cp.async.bulk.wait_group 0" not in source
    compiles_for_sm90a(source, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("case,config", CASES)
def test_kernel_matches_numpy_on_hopper(hopper_on, case, config):
    """On an sm_90 GPU: within the conv's float16 tolerance of numpy (op.reference.TOLERANCES), every pixel written."""
    skip_unless_sm90()
    spec = spec_of(case)
    kernel = build(spec, "cuda", config=config, db=None)
    assert kernel.func_names == ["conv2d_wgmma"]
    arrays = conv_random_inputs(spec, seed=4)
    err, ok = compare(spec, kernel(**arrays), conv_reference(spec, **arrays))
    assert ok, f"max abs error {err}"


def made_model(tmp_path_factory, name: str) -> str:
    """make_models' model `name`, saved: its path."""
    import os
    import sys

    import onnx

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "onnx_models"))
    import make_models

    path = tmp_path_factory.mktemp("hopper") / f"{name}.onnx"
    onnx.save(make_models.make(name), str(path))
    return str(path)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """make_models' wide_1x1: a projection block of 64 and 128 channels (two single 1x1 convs, one pair)."""
    return made_model(tmp_path_factory, "wide_1x1")


def test_model_runs_its_1x1_convs_on_wgmma_and_compiles(hopper_on, wide_model, tmp_path):
    """Build-only: the model's two single 1x1 convs get the Hopper kernel (the report says so) and its pair the
    Hopper pair kernel, lowered with TVM's TIRx pipeline beside TVM's kernels; the model's CUDA compiles for sm_90a."""
    from tvm_b2b.codegen import compile_module, generated_source
    from tvm_b2b.frontend.model import analyze, conv_names
    from tvm_b2b.frontend.rewrite import conv_kernels, fuse_pairs

    mod, candidates, model = analyze(wide_model, SM90, dtype="float16", db=None)
    convs = conv_kernels(conv_names(model), candidates)
    assert [c["kernel"] for c in convs] == ["tensorcore", "fused-pair", "fused-pair", "tensorcore"], convs
    assert sum("(sm_90's TMA + wgmma kernel)" in c["reason"] for c in convs) == 2, convs
    # the parameters each kernel runs with (no database: the rules' defaults), as `report` shows them
    assert all("[default: bm=" in c["reason"] for c in convs), convs
    source = generated_source(compile_module(fuse_pairs(mod, SM90, candidates)[0], SM90), SM90)
    on_tma = [name for name, params in kernels(source).items() if "CUtensorMap" in params]
    assert len(on_tma) == 3, kernels(source)  # the two single convs and the pair (cuda_hopper_pair)
    compiles_for_sm90a(source, tmp_path)


@pytest.fixture(scope="module")
def stem_model(tmp_path_factory):
    """make_models' stem: ResNet's 7x7/2 conv of 3 channels, relu."""
    return made_model(tmp_path_factory, "stem")


def test_model_runs_its_stem_on_narrow_taps_and_compiles(hopper_on, stem_model, tmp_path):
    """Build-only: with the kernel everywhere (TVM_B2B_HOPPER=all) a model's stem gets it as its space-to-depth conv
    of 16-channel cells (the report says so), the cells made by our layout kernel; the model's CUDA compiles for
    sm_90a."""
    from tvm_b2b.codegen import compile_module, generated_source
    from tvm_b2b.frontend.model import analyze, conv_names
    from tvm_b2b.frontend.rewrite import conv_kernels, fuse_pairs

    mod, candidates, model = analyze(stem_model, SM90, dtype="float16", db=None)
    (conv,) = conv_kernels(conv_names(model), candidates)
    assert conv["kernel"] == "tensorcore" and "(sm_90's TMA + wgmma kernel)" in conv["reason"], conv
    assert "space-to-depth stride-1 conv: n=2,h=19,w=18,c=16,k=64,kh=4,kw=4" in conv["reason"], conv
    source = generated_source(compile_module(fuse_pairs(mod, SM90, candidates)[0], SM90), SM90)
    assert len([name for name, params in kernels(source).items() if "CUtensorMap" in params]) == 1, kernels(source)
    compiles_for_sm90a(source, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("model,shape", [("wide_model", (2, 64, 10, 9)), ("stem_model", (2, 3, 32, 30))])
def test_model_with_wgmma_convs_matches_onnxruntime(hopper_on, request, tmp_path, model, shape):
    """On an sm_90 GPU: a model with its convs on the Hopper kernel (the wide model's 1x1s; the stem: narrow_taps)
    within 2e-2 of onnxruntime."""
    import onnxruntime as ort
    import tvm_b2b
    from tvm_b2b.frontend.model import compile_model

    skip_unless_sm90()
    path, lib = request.getfixturevalue(model), str(tmp_path / "m.so")
    compile_model(path, lib, parse_target("cuda"), dtype="float16")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    (want,) = ort.InferenceSession(path).run(None, {"x": x})
    (got,) = tvm_b2b.load(lib)(x=x).values()
    np.testing.assert_allclose(got.astype(np.float32), want, atol=2e-2, rtol=2e-2)


def test_tune_measures_a_written_kernel_on_a_local_gpu_only(hopper_on):
    """tune --spec of a conv that gets the Hopper kernel: its configs are measured (tune.written), on a local GPU; through
    --rpc, a one-line reason."""
    import argparse

    from tvm_b2b.cli import UserError, _specs_to_tune

    spec = ["n=32,h=14,w=14,c=1024,k=256"]
    assert _specs_to_tune(argparse.Namespace(model=None, spec=spec, only=None, batch=None, rpc=None), SM90) == [spec_of(spec[0])]
    with pytest.raises(UserError, match="written, not scheduled.*local GPU only"):
        _specs_to_tune(argparse.Namespace(model=None, spec=spec, only=None, batch=None, rpc="127.0.0.1:9190"), SM90)


def test_fusion_of_hopper_pairs_is_decided_by_measurement(hopper_on, wide_model, tmp_path):
    """Where the database holds the written kernels' records of a pair (the Hopper pair kernel) and of its two convs
    (the Hopper conv kernel), the faster form runs: fused at 5 us against 3 + 4, as two convs at 9; tune --model tunes
    the pair (its convs: tune --spec)."""
    import argparse

    from tvm_b2b.cli import _specs_to_tune
    from tvm_b2b.frontend.model import analyze
    from tvm_b2b.frontend.rewrite import pairs_of
    from tvm_b2b.op.fused_pair import as_single_convs
    from tvm_b2b.schedule import kind_of, rule_for
    from tvm_b2b.target import target_info
    from tvm_b2b.tune.database import TuningDatabase, WrittenRecord

    (pair,) = pairs_of(analyze(wide_model, SM90, dtype="float16", db=None)[1])
    halves = as_single_convs(pair.spec)
    specs = _specs_to_tune(argparse.Namespace(model=wide_model, spec=None, only=None, batch=None, rpc=None), SM90)
    assert pair.fused and pair.spec in specs, specs
    config_of = {}
    for fused_us, fuses in ((5.0, True), (9.0, False)):
        db = TuningDatabase(tmp_path / str(fused_us), lock=True)
        for spec, us in zip((pair.spec, *halves), (fused_us, 3.0, 4.0)):
            rule = rule_for(SM90, kind_of(spec), spec)
            config = config_of[spec] = rule.default_config(spec, target_info(SM90)).to_string()
            db.commit_written(WrittenRecord(spec.to_string(), "sm_90", rule.kernel, config, us))
        (measured,) = pairs_of(analyze(wide_model, SM90, dtype="float16", db=str(tmp_path / str(fused_us)))[1])
        assert measured.fused == fuses and (fuses or "measured faster as two single convs" in measured.reason), measured.reason
        assert not fuses or measured.config == f"tuned: {config_of[pair.spec]}", measured.config  # (what report shows)


@pytest.mark.parametrize("case,config", [(0, None), (2, None), (3, None), (7, None), (10, None), (0, "pair"), (3, "pair"),
                                         (12, None), (13, None), (4, "pair"), (5, "pair"), (6, "pair"), (7, "pair"),
                                         (15, None), (16, None), (17, None), (18, None), (19, None), (20, None), (21, None),
                                         (22, None), (23, None), (24, None), (25, None), (8, "pair"), (9, "pair"),
                                         (10, "pair"), (11, "pair"), (12, "pair"), (26, None), (27, None),
                                         (13, "pair"), (14, "pair"), (28, None), (29, None), (30, None), (15, "pair"),
                                         (16, "pair")])
def test_index_math_emulated(case, config):
    """bench/experiments/hopper_emulation.py: the kernel's data path in numpy (TMA boxes with zero fill, 128B
    swizzle, wgmma's descriptor reads and accumulator layout from CUTLASS, the epilogue, TMA stores), with Tiling's
    own maps and coordinates, computes the conv (and a pair, in its cluster form too: each rank's slice of mid pushed
    into its peers', each rank's share of k2; a persistent grid's blocks, several tiles each, their shared memory kept
    from tile to tile, a persistent pair's chunks alternating output tiles across its tiles and each residual read
    where chunk_origin says; a narrow conv's taps packed into a step, rows of 32 or 64 bytes) within fp16 rounding,
    and writes every output."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "experiments"))
    import hopper_emulation as emu

    if config == "pair":
        text, bm, stages, k2, bn2, res, *form = emu.PAIRS[case]
        spec = spec_of(text)
        y, want = emu.emulate(spec, emu.pair_config(spec, bm, stages, *form), hopper.Second(k2, bn2, "relu", res))
    else:
        text, cfg = emu.CONVS[case]
        y, want = emu.emulate(spec_of(text), hopper.HopperConfig.parse(cfg))
    assert not np.isnan(y).any(), "an output pixel was never stored"
    np.testing.assert_allclose(y, want, atol=1e-2, rtol=1e-2)


@st.composite
def emulated_convs(draw):
    """A small conv the kernel takes (1x1 to 5x5; strides 1-3, padded or not, subsampled 1x1s and narrow convs among
    them) and a config it takes for it (the halo form and a persistent grid among them)."""
    kh = draw(st.sampled_from([1, 2, 3, 4, 5]))  # (2 and 4 with 16 or 32 channels: narrow_taps)
    stride, pad = draw(st.integers(1, 3)), draw(st.integers(0, kh // 2))
    bottom, right = (min(pad + draw(st.sampled_from([0, 0, 1])), kh - 1) for _ in range(2))  # TensorFlow's "same"
    h, w = draw(st.integers(kh, 14)), draw(st.integers(kh, 14))
    n, c, k = draw(st.integers(1, 2)), 8 * draw(st.integers(1, 12)), draw(st.sampled_from([64, 128]))
    spec = spec_of(f"n={n},h={h},w={w},c={c},k={k},kh={kh},kw={kh},stride={stride},pad_h={pad},pad_w={pad},"
                   f"pad_bottom={bottom},pad_right={right},residual={draw(st.integers(0, 1))}")
    cfg = hopper.HopperConfig(bm=draw(st.sampled_from([64, 128])), bn=draw(st.sampled_from([64, 128])),
                              stages=draw(st.integers(1, 4)), halo=draw(st.integers(0, 1)), persist=draw(st.integers(0, 1)))
    assume(not hopper.spec_problem(spec) and not hopper.conv_config_problem(spec, cfg))
    return spec, cfg


@given(case=emulated_convs())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_index_math_emulated_on_random_convs(case):
    """The emulation (test_index_math_emulated) on random small convs and configs: every output written, within fp16
    rounding of the reference."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "experiments"))
    import hopper_emulation as emu

    spec, cfg = case
    y, want = emu.emulate(spec, cfg)
    assert not np.isnan(y).any(), "an output pixel was never stored"
    np.testing.assert_allclose(y, want, atol=1e-2, rtol=1e-2)
