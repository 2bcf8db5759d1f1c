"""bench/experiments/halo_tile.py (an experiment, not the product): its padded-grid form of the op
(stage 1 alone, and the whole op with its predicated store of the real pixels) computes what numpy does
(CPU), and its halo-tile CUDA schedules build and compile for sm_90. What they measure is for the GPU
machine (`bash bench/gpu_session.sh halo`)."""
import os
import sys

import numpy as np
import pytest
import tvm

from cuda_source import nvcc_arches, nvcc_compile
from tvm_b2b import FusedConvSpec
from tvm_b2b.op.compute import round_up
from tvm_b2b.op.device import device_arguments
from tvm_b2b.op.reference import compare, random_inputs, reference
from tvm_b2b.schedule.cuda_wmma import WmmaConfig
from tvm_b2b.target import parse_target

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "experiments"))
import halo_tile as halo  # noqa: E402


@pytest.mark.parametrize("case", ["n=2,h=9,w=7,c=20,k1=24,k2=8", "n=3,h=5,w=6,c=64,k1=64,k2=8"])
def test_padded_grid_form_computes_stage1(case):
    """Valid pixels of the padded grid (channels and batch padded, junk rows between images) hold
    relu(conv3x3 * s1 + b1) within fp16 rounding (atol/rtol 2e-2)."""
    spec = FusedConvSpec.parse(case + ",dtype=float16")
    exe = tvm.compile(tvm.IRModule({"main": halo.halo_stage1(spec, 32)}), target="llvm")
    arrays = random_inputs(spec, seed=1)
    hp, wp = spec.h + 2, spec.w + 2
    mid = tvm.runtime.empty((round_up(spec.n * hp * wp, 32), round_up(spec.k1, 64)), "float16")
    exe["main"](*(tvm.runtime.tensor(np.ascontiguousarray(arrays[k])) for k in halo.STAGE1), mid)
    got = mid.numpy()[: spec.n * hp * wp].reshape(spec.n, hp, wp, -1)[:, : spec.h, : spec.w, : spec.k1]
    want = halo.reference_mid(spec, *(arrays[k] for k in halo.STAGE1))
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2)


def test_halo_schedule_reads_every_tap_from_one_tile(tmp_path):
    """One halo tile per block: no cp.async of A (only w1's), and each ldmatrix of A at a row offset
    of (tap // 3) * 58 + tap % 3 rows (W+2 = 58, 72-element rows)."""
    spec = FusedConvSpec.parse("n=2,h=56,w=56,c=64,k1=64,k2=128,dtype=float16")
    cfg = WmmaConfig.parse("m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2")
    built = halo.build_halo(spec, cfg, parse_target("cuda:sm_90"))
    source = built.mod.imports[0].inspect_source()
    assert "* 4176)" in source and "% 3) * 72)" in source  # 58 rows x 72, then 1 row x 72
    assert source.count("ptx_cp_async_legacy_cg_16_2_2(b2b_shared_pool_float16_ptr") == 2  # w1: prologue and loop
    if "sm_90" in nvcc_arches():
        nvcc_compile(source, "sm_90", tmp_path)


@pytest.mark.parametrize("case", ["n=2,h=9,w=7,c=20,k1=24,k2=40,residual=1", "n=3,h=5,w=6,c=64,k1=64,k2=72,act2=relu6"])
def test_padded_grid_form_computes_the_op(case):
    """The whole op over the padded grid: every real pixel of y written (it starts as NaN) and within
    the op's tolerance of numpy (a junk row that stored would overwrite a real pixel's row)."""
    spec = FusedConvSpec.parse(case + ",dtype=float16")
    exe = tvm.compile(tvm.IRModule({"main": halo.halo_fused(spec, 32)}), target="llvm")
    arrays = random_inputs(spec, seed=2)
    tensors, out = device_arguments(spec, arrays, tvm.cpu(0))
    out.copyfrom(np.full((spec.m, spec.k2), np.nan, dtype="float16"))
    exe["main"](*tensors.values(), out)
    err, ok = compare(spec, out.numpy().reshape(spec.out_shape), reference(spec, **arrays))
    assert ok, err


@pytest.mark.parametrize(("epilogue", "store"), [(2, "*(uint4*)(y_ptr + "), (0, "*(half4*)(y_ptr + ")])
def test_fused_halo_kernel_stores_only_real_pixels(epilogue, store, tmp_path):
    """The fused halo kernel builds with either epilogue: it stores grid row q to y's row of its real
    pixel (58 grid rows per image row, 3364 per image at 56x56) where q is one (oh < 56, ow < 56);
    epilogue=2 from its shared fp16 tile with 128-bit stores (a cache_write of y would copy an
    over-estimated region of y), epilogue=0 from the staged accumulators."""
    spec = FusedConvSpec.parse("n=2,h=56,w=56,c=64,k1=64,k2=128,residual=1,dtype=float16")
    cfg = WmmaConfig.parse(f"m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue={epilogue}")
    built = halo.build_halo(spec, cfg, parse_target("cuda:sm_90"), fused=True)
    source = built.mod.imports[0].inspect_source()
    stores = [line for line in source.splitlines() if "(y_ptr + " in line and "=" in line]
    assert stores and all(store in line and "/ 3364) * 401408)" in line and "% 58) * 128)" in line for line in stores)
    assert "% 3364) < 3248)" in source and "% 58) < 56)" in source  # the predicate: oh < 56 and ow < 56
    if "sm_90" in nvcc_arches():
        nvcc_compile(source, "sm_90", tmp_path)
