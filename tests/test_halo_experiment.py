"""bench/experiments/halo_stage1.py (an experiment, not the product): its padded-grid form of the 3x3
conv computes the op's stage 1 exactly (CPU, against numpy), and its halo-tile CUDA schedule builds
and compiles for sm_90. What it measures is for the GPU machine (`bash bench/gpu_session.sh halo`)."""
import os
import sys

import numpy as np
import pytest
import tvm

from cuda_source import nvcc_arches, nvcc_compile
from tvm_b2b import FusedConvSpec
from tvm_b2b.op.compute import round_up
from tvm_b2b.op.reference import random_inputs
from tvm_b2b.schedule.cuda_wmma import WmmaConfig
from tvm_b2b.target import parse_target

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "experiments"))
import halo_stage1 as halo  # noqa: E402


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
    built, _ = halo.build_both(spec, cfg, parse_target("cuda:sm_90"))
    source = built.mod.imports[0].inspect_source()
    assert "* 4176)" in source and "% 3) * 72)" in source  # 58 rows x 72, then 1 row x 72
    assert source.count("ptx_cp_async_legacy_cg_16_2_2(b2b_shared_pool_ptr") == 2  # w1: prologue and loop
    if "sm_90" in nvcc_arches():
        nvcc_compile(source, "sm_90", tmp_path)
