"""Build-only tests of the CUDA kernel (no GPU needed): TVM generates the source, nvcc compiles it.

The fused op must be exactly one __global__ kernel using tensor-core MMAs, with no global buffer
for the intermediate (its parameters are the op's inputs and output only).
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuda_source import compiled_source, kernels, nvcc_arches, nvcc_compile
from tvm_b2b import ConvSpec, FusedConvSpec, build
from tvm_b2b.schedule import plan
from tvm_b2b.schedule.cuda_wmma import WmmaConfig
from tvm_b2b.target import parse_target

pytestmark = pytest.mark.usefixtures("template_pairs")  # the mma.sync template's pair builds (sm_90 included)

ARCHES = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90"]
SPECS = [
    FusedConvSpec(n=2, h=56, w=56, c=64, k1=64, k2=128, dtype="float16"),
    FusedConvSpec(n=1, h=13, w=7, c=20, k1=24, k2=40, stride=2, act1="relu6", act2="none", residual=True, dtype="float16"),
]
INPUTS = {"x", "w1", "s1", "b1", "w2", "s2", "b2", "out"}


@pytest.fixture(scope="module")
def local_arches():
    return nvcc_arches()


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("spec", SPECS, ids=["resnet-like", "odd-shapes"])
def test_fused_cuda_kernel_builds(spec, arch, local_arches, tmp_path):
    source = build(spec, f"cuda:{arch}").source()
    found = kernels(source)
    assert len(found) == 1, f"expected one kernel, got {list(found)}"
    params = {p.split()[-1].removesuffix("_ptr") for p in next(iter(found.values())).split(",")}
    assert params == INPUTS | ({"residual"} if spec.residual else set())
    if int(arch[3:]) >= 80:  # default from sm_80 on: ldmatrix + mma.sync
        assert "mma.sync.aligned.m16n8k16" in source and "ldmatrix.sync" in source
    else:
        assert "wmma::mma_sync" in source and "wmma::load_matrix_sync" in source
    if arch not in local_arches:
        pytest.skip(f"the local nvcc cannot compile for {arch} (source checked, not compiled)")
    nvcc_compile(source, arch, tmp_path)


def test_unfused_baseline_is_two_kernels(tmp_path):
    kernel = build(SPECS[0], "cuda:sm_80", fused=False)
    found = kernels(kernel.source())
    assert len(found) == 2
    assert all("mid" in params for params in found.values())
    nvcc_compile(kernel.source(), "sm_80", tmp_path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_unsupported_dtype_is_a_clear_error(dtype):
    spec = FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=16, dtype=dtype)
    with pytest.raises(ValueError, match=f"float16 only, got {dtype}"):
        build(spec, "cuda:sm_90")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 4), hw=st.integers(1, 20), c=st.integers(1, 80), k1=st.integers(1, 160),
    k2=st.integers(1, 300), stride=st.sampled_from([1, 2]), residual=st.booleans(),
)
def test_random_specs_build_one_kernel(n, hw, c, k1, k2, stride, residual):
    spec = FusedConvSpec(n=n, h=hw, w=hw + 1, c=c, k1=k1, k2=k2, stride=stride, residual=residual, dtype="float16")
    assert len(kernels(build(spec, "cuda:sm_80").source())) == 1


@pytest.mark.parametrize(("spec", "arch", "expected"), [
    ("n=32,h=56,w=56,c=64,k1=64,k2=128", 90, "m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2"),  # 784 blocks of 128
    ("n=8,h=56,w=56,c=64,k1=64,k2=128", 80, "m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2"),  # 196
    ("n=32,h=56,w=56,c=64,k1=64,k2=256,residual=1", 90, "m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2"),  # residual tile
    ("n=4,h=56,w=56,c=64,k1=64,k2=128", 90, "m_tile=64,k_tile=64,pipeline=1,mma=1,epilogue=2"),  # 196 of 64 (98 of 128)
    ("n=1,h=56,w=56,c=64,k1=64,k2=128", 90, "m_tile=32,k_tile=64,pipeline=1,mma=1"),  # 100 of 32: fewest blocks; staged
    ("n=1,h=28,w=28,c=128,k1=128,k2=512", 90, "m_tile=32,k_tile=64,pipeline=1,mma=1"),  # 25 of 32
    ("n=1,h=56,w=56,c=64,k1=64,k2=256,residual=1", 90, "m_tile=32,k_tile=64,pipeline=1,mma=1"),
    ("n=32,h=56,w=56,c=64,k1=64,k2=128", 75, "m_tile=64"),  # no mma.sync nor cp.async before sm_80
    ("n=1,h=5,w=5,c=64,k1=64,k2=128", 70, "m_tile=32"),  # 25 rows, padded to 32
])
def test_default_config(spec, arch, expected):
    """sm_80+: mma.sync, one step ahead, the largest pixel tile still giving MIN_BLOCKS blocks, register
    epilogues with 128-bit stores from 64-pixel tiles up (the staged epilogue on 32-pixel tiles)."""
    from tvm_b2b.schedule.cuda_wmma import default_config

    assert default_config(FusedConvSpec.parse(spec), arch) == WmmaConfig.parse(expected)


@pytest.mark.parametrize("spec", ["n=1,h=15,w=15,c=16,k1=24,k2=16,stride=2", "n=1,h=15,w=15,c=16,k1=16,k2=32"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_register_epilogue_falls_back_where_tvm_cannot_lower_it(spec, fused, caplog, tmp_path):
    """TVM 0.27 cannot schedule or lower the register epilogue for some shapes (these two: LowerWarpMemory,
    and compute-at when fused with k1=16): the build takes the staged epilogue (GPU-verified on every
    shape) with a logged reason, instead of failing."""
    target = parse_target("cuda:sm_90")
    spec = FusedConvSpec.parse(spec + ",dtype=float16")
    with caplog.at_level("WARNING"):
        funcs = plan(spec, target, fused, WmmaConfig.parse("m_tile=32,k_tile=64,pipeline=1,mma=1,epilogue=2")).kernels
    assert "epilogue=2 does not build for this shape" in caplog.text
    source = compiled_source(funcs, target)
    assert "mma.sync" in source and "*(uint4*)(out_ptr + " not in source  # staged: no fp16 output tile
    if "sm_90" in nvcc_arches():
        nvcc_compile(source, "sm_90", tmp_path)


def test_default_configs_fallback_is_no_warning(caplog):
    """A default config whose register epilogue TVM cannot lower (MobileNetV3's 16-channel 1x1 at batch 32) builds with
    the staged one as its default does, said at INFO: a model's compile printed a TVM check failure per such conv."""
    spec = ConvSpec.parse("n=32,h=56,w=56,c=16,k=16,dtype=float16")
    with caplog.at_level("INFO"):
        planned = plan(spec, parse_target("cuda:sm_90"))
    fallback = [r for r in caplog.records if "epilogue=2 does not build" in r.getMessage()]
    assert planned.config.epilogue == 0 and fallback and all(r.levelname == "INFO" for r in fallback), caplog.text


def test_staged_fallback_that_outgrows_shared_memory_runs_as_two_kernels(monkeypatch, caplog):
    """The staged epilogue needs more shared memory than the register one (fp32 accumulator tiles): where
    the fallback no longer fits the GPU (here a GPU with just enough for the register epilogue), the
    pair runs as two kernels instead of a fused kernel that could not launch."""
    from tvm_b2b.schedule import cuda_wmma

    spec = FusedConvSpec.parse("n=1,h=15,w=15,c=16,k1=24,k2=16,stride=2,dtype=float16")
    cfg = WmmaConfig.parse("m_tile=32,k_tile=64,pipeline=1,mma=1,epilogue=2")
    just_enough = cuda_wmma.shared_bytes(spec, cfg)
    assert cuda_wmma.shared_bytes(spec, WmmaConfig.parse("m_tile=32,k_tile=64,pipeline=1,mma=1")) > just_enough
    monkeypatch.setattr(cuda_wmma, "max_shared_bytes", lambda arch: just_enough)
    with caplog.at_level("WARNING"):
        planned = plan(spec, parse_target("cuda:sm_90"), True, cfg)
    assert not planned.fused and len(planned.kernels) == 2 and planned.mid_shape is not None
    assert planned.reason.startswith("too large for shared memory")
    assert "epilogue=2 does not build" in caplog.text and "not fused" in caplog.text


def test_config_reaches_the_schedule():
    """Default: 2x2 warps (128 threads); warps_m=4 gives 8 warps (256 threads)."""
    assert '__global__ void __launch_bounds__(128)' in build(SPECS[0], "cuda:sm_80").source()
    wide = build(SPECS[0], "cuda:sm_80", config="m_tile=128,warps_m=4").source()
    assert '__global__ void __launch_bounds__(256)' in wide and "__launch_bounds__(128)" not in wide


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_pipelined_config_builds(arch, local_arches, tmp_path):
    """pipeline=1 double-buffers the operand tiles; from sm_80 on the loads are cp.async."""
    source = build(SPECS[1], f"cuda:{arch}", config="pipeline=1,m_tile=32", db=None).source()
    assert len(kernels(source)) == 1
    assert ("cp.async" in source) == (arch != "sm_75")
    if arch in local_arches:
        nvcc_compile(source, arch, tmp_path)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mma_config_builds(arch, local_arches, tmp_path):
    """mma=1: ldmatrix + mma.sync m16n8k16 (fragments in registers) for both GEMMs, fused or not."""
    for fused, count in ((True, 1), (False, 2)):
        source = build(SPECS[0], f"cuda:{arch}", fused=fused, config="mma=1", db=None).source()
        assert len(kernels(source)) == count
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source and "ldmatrix.sync" in source
        assert "wmma::" not in source
        if arch in local_arches:
            nvcc_compile(source, arch, tmp_path)


WIDE = FusedConvSpec(n=2, h=14, w=14, c=256, k1=256, k2=1024, residual=True, dtype="float16")


def test_mma_needs_sm80():
    with pytest.raises(ValueError, match="mma=1 needs sm_80 or newer"):
        build(SPECS[0], "cuda:sm_75", config="mma=1", db=None)


# TVM 0.27 alone failed on each of these ("tvm_access_ptr element type must match", "Cannot find warp
# index"); with our shared-memory planning (tvm_b2b.lower) they build, without the workaround
@pytest.mark.parametrize(("spec", "config"), [
    (SPECS[0], "m_tile=128,warps_n=4,n1_tile=64,n2_tile=128"), (SPECS[0], "pipeline=1"),
    (SPECS[0], "mma=1,pipeline=1,m_tile=128,warps_m=4,k_tile=64"), (SPECS[0], "mma=1,warps_n=4,n2_tile=128"),
    (WIDE, "mma=1,n1_tile=128,n2_tile=256"),
], ids=lambda v: v if isinstance(v, str) else v.to_string())
def test_formerly_unbuildable_configs_build(spec, config, local_arches, tmp_path):
    target = parse_target("cuda:sm_90")
    cfg = WmmaConfig.parse(config)
    funcs = plan(spec, target, True, cfg).kernels
    source = compiled_source(funcs, target)
    assert len(kernels(source)) == len(funcs) and source.count("extern __shared__") == len(funcs)
    if "sm_90" in local_arches:
        nvcc_compile(source, "sm_90", tmp_path)


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="bogus: not a WmmaConfig field"):
        build(SPECS[0], "cuda:sm_90", config="m_tile=64,bogus=1")


def test_cpu_takes_no_config():
    with pytest.raises(ValueError, match="config: the CPU schedule takes no parameters"):
        build(SPECS[1], "llvm", config="m_tile=64")


def test_cuda_source_hook_chains_to_a_users_hook():
    """Our CUDA source rewrite (cp.async through L1) runs after a hook the user registered, which is
    back in place after the build."""
    import tvm_ffi

    hook = "tvm_callback_cuda_postproc"
    assert tvm_ffi.get_global_func(hook, allow_missing=True) is None
    tvm_ffi.register_global_func(hook, lambda code, _target: code + "\n// the user's hook ran\n")
    try:
        target = parse_target("cuda:sm_90")
        source = compiled_source(plan(SPECS[0], target, True).kernels, target)
        assert "// the user's hook ran" in source and "cp.async.ca.shared.global" in source
        assert tvm_ffi.get_global_func(hook)("x", None) == "x\n// the user's hook ran\n"
    finally:
        tvm_ffi.remove_global_func(hook)
    assert tvm_ffi.get_global_func(hook, allow_missing=True) is None
