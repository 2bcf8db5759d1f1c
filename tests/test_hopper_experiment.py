"""bench/experiments/hopper_conv1x1.py (an experiment, not the product): the 1x1 conv on TMA + wgmma builds with
TVM's TIRx pipeline, its CUDA has the Hopper instructions and compiles for sm_90a (CPU); on an sm_90 GPU it
computes what numpy does. What it measures is for the GPU machine (`bash bench/gpu_session.sh hopper`)."""
import os
import sys

import numpy as np
import pytest

from cuda_source import kernels, nvcc_arches
from tvm_b2b import ConvSpec
from tvm_b2b.op import compare
from tvm_b2b.op.conv import conv_random_inputs, conv_reference

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "experiments"))
import hopper_conv1x1 as hopper  # noqa: E402

# rows past m (126 and 441 pixels: not multiples of the tiles), a residual, reductions of 1, 4 and 5 steps (5 > 3
# buffers: the ring wraps), several channel blocks, relu6 and no activation
CASES = [("n=2,h=7,w=9,c=64,k=128", (128, 128, 4)), ("n=1,h=21,w=21,c=256,k=256,residual=1,act=relu6", (128, 128, 3)),
         ("n=3,h=5,w=6,c=320,k=512,act=none", (64, 256, 3)), ("n=2,h=14,w=14,c=72,k=64", (128, 64, 2))]


@pytest.mark.parametrize("case,config", CASES[:2])
def test_kernel_has_the_hopper_instructions_and_compiles(case, config):
    """One kernel of 128 * (BM / 64 + 1) threads taking three tensor maps; its CUDA issues TMA loads and a TMA
    store, waits on mbarriers and multiplies with wgmma m64nBNk16; nvcc compiles it for sm_90a."""
    bm, bn, stages = config
    source = hopper.build(ConvSpec.parse(case + ",dtype=float16"), bm, bn, stages).mod.imports[0].inspect_source()
    (params,) = kernels(source).values()
    assert params.count("__grid_constant__ CUtensorMap") == 3
    assert f"__launch_bounds__({128 * (bm // 64 + 1)})" in source
    for instruction in (f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.f16.f16", "cp.async.bulk.tensor.2d.shared::cluster",
                        "cp.async.bulk.tensor.2d.global.shared::cta", "mbarrier.try_wait.parity", "wgmma.wait_group"):
        assert instruction in source, instruction
    if "sm_90" not in nvcc_arches():
        pytest.skip("the local nvcc has no sm_90")
    compiled, info = hopper.nvcc_compile(source)
    assert compiled, info


@pytest.mark.parametrize("case", ["n=1,h=8,w=8,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "n=1,h=8,w=8,c=64,k=64,stride=2",
                                  "n=1,h=8,w=8,c=60,k=64", "n=1,h=8,w=8,c=64,k=96"])
def test_kernel_refuses_what_it_does_not_compute(case):
    """A 3x3 conv, a strided 1x1, c not a multiple of 8, k not a multiple of BN: a ValueError naming the spec."""
    with pytest.raises(ValueError, match="n=1,h=8,w=8"):
        hopper.conv1x1_func(ConvSpec.parse(case + ",dtype=float16"), 128, 128, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("case,config", CASES)
def test_kernel_matches_numpy_on_hopper(case, config):
    """On an sm_90 GPU: every pixel written (y starts as NaN) and within the conv's float16 tolerance of numpy
    (op.reference.TOLERANCES)."""
    import tvm

    if tvm.cuda(0).compute_version != "9.0":
        pytest.skip("needs an sm_90 GPU (wgmma and TMA)")
    spec = ConvSpec.parse(case + ",dtype=float16")
    arrays = conv_random_inputs(spec, seed=4)
    dev = tvm.cuda(0)
    residual = arrays.get("residual", np.zeros(spec.out_shape, np.float16)).reshape(spec.m, spec.k)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in (
        arrays["x"].reshape(spec.m, spec.c), arrays["w"].reshape(spec.c, spec.k).T, arrays["s"], arrays["b"], residual)]
    y = tvm.runtime.tensor(np.full((spec.m, spec.k), np.nan, np.float16), dev)
    hopper.build(spec, *config)["main"](*args, y)
    err, ok = compare(spec, y.numpy().reshape(spec.out_shape), conv_reference(spec, **arrays))
    assert ok, f"max abs error {err}"
