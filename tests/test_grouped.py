"""Grouped and depthwise convolutions (groups in op.conv_spec and op.spec): the numpy reference against
PyTorch, the single grouped conv and the grouped 3x3 -> 1x1 pair on the CPU against the reference
(hypothesis shapes: depthwise and grouped, stride 2, residual, odd channel counts), their CUDA built by
nvcc for sm_80 and sm_90 (the pair as ONE kernel), and (GPU-marked) on CUDA against the reference.

Tolerances (tvm_b2b.op.TOLERANCES): float32 |y - ref| <= 1e-4 + 1e-4 |ref|, float16 1e-2 + 1e-2 |ref|.
The reference against PyTorch's conv2d (float64): 1e-4 relative to the output's largest magnitude.
"""
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuda_source import compiled_source, kernels, nvcc_arches, nvcc_compile
from tvm_b2b import ConvSpec, FusedConvSpec, build
from tvm_b2b.op import compare, random_inputs, reference
from tvm_b2b.op.conv import conv_random_inputs, conv_reference
from tvm_b2b.schedule import plan
from tvm_b2b.schedule.cuda_grouped_pair import default_config
from tvm_b2b.target import parse_target

@pytest.fixture(autouse=True)
def template_rules(monkeypatch):
    """These tests are the CUDA template's (cuda_grouped_pair, cuda_grouped_conv): sm_90's cluster kernel, which takes
    some depthwise pairs by default, off (tests/test_cuda_cluster_dw_pair.py is its)."""
    monkeypatch.setenv("TVM_B2B_DW_CLUSTER", "0")


# MobileNetV2's depthwise pairs (relu6, projection without activation, residual where shapes match) and
# ResNeXt's grouped ones (4 channels per group, residual + relu), scaled down
PAIRS = [
    dict(n=1, h=14, w=14, c=96, k1=96, k2=24, groups=96, act1="relu6", act2="none"),
    dict(n=2, h=9, w=9, c=144, k1=144, k2=24, groups=144, act1="relu6", act2="none", residual=True),
    dict(n=1, h=15, w=13, c=40, k1=40, k2=20, stride=2, groups=40, act1="relu6", act2="none"),
    dict(n=1, h=8, w=8, c=64, k1=64, k2=48, groups=16, residual=True),
    dict(n=1, h=7, w=7, c=24, k1=48, k2=16, groups=24),  # a depth multiplier of 2
    dict(n=2, h=8, w=8, c=192, k1=192, k2=32, groups=192, act1="relu6", act2="none", residual=True),  # 64-channel steps
]
PAIR_IDS = [FusedConvSpec(**p).to_string() for p in PAIRS]
CONVS = [
    dict(n=1, h=14, w=14, c=96, k=96, kh=3, kw=3, pad_h=1, pad_w=1, groups=96, act="relu6"),
    dict(n=2, h=9, w=11, c=40, k=40, kh=3, kw=3, stride=2, pad_h=1, pad_w=1, groups=40, residual=True, act="none"),
    dict(n=1, h=8, w=8, c=64, k=64, kh=3, kw=3, pad_h=1, pad_w=1, groups=16),
    dict(n=1, h=9, w=9, c=12, k=12, kh=5, kw=5, pad_h=2, pad_w=2, groups=12),
]
# grouped convs with 16+ channels a group (ResNeXt-50's 14x14 and 7x7 layers, scaled down): tensor cores on CUDA
TENSOR_CORE_CONVS = [
    dict(n=1, h=7, w=7, c=256, k=256, kh=3, kw=3, pad_h=1, pad_w=1, groups=8),
    dict(n=2, h=9, w=11, c=128, k=128, kh=3, kw=3, stride=2, pad_h=1, pad_w=1, groups=8, residual=True, act="none"),
    dict(n=1, h=5, w=6, c=64, k=128, kh=3, kw=3, pad_h=1, pad_w=1, groups=2, act="relu6"),  # 32 -> 64 channels a group
]
CONVS += TENSOR_CORE_CONVS
CONV_IDS = [ConvSpec(**c).to_string() for c in CONVS]


def torch_grouped_conv(x, w, stride, pad, groups):
    import torch

    xt = torch.from_numpy(x.astype(np.float64)).permute(0, 3, 1, 2)
    wt = torch.from_numpy(w.astype(np.float64)).permute(3, 2, 0, 1)
    return torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad, groups=groups).permute(0, 2, 3, 1).numpy()


ACTS = {"relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6), "none": lambda y: y}


@pytest.mark.parametrize("kind", CONVS, ids=CONV_IDS)
def test_conv_reference_matches_torch(kind):
    spec = ConvSpec(**kind, dtype="float32")
    i = conv_random_inputs(spec, seed=3)
    want = torch_grouped_conv(i["x"], i["w"], spec.stride, (spec.pad_h, spec.pad_w), spec.groups) * i["s"] + i["b"]
    want = ACTS[spec.act](want + (i["residual"] if spec.residual else 0))
    got = conv_reference(spec, **i)
    assert got.shape == spec.out_shape and np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("kind", PAIRS, ids=PAIR_IDS)
def test_pair_reference_matches_torch(kind):
    spec = FusedConvSpec(**kind, dtype="float32")
    i = random_inputs(spec, seed=3)
    mid = ACTS[spec.act1](torch_grouped_conv(i["x"], i["w1"], spec.stride, 1, spec.groups) * i["s1"] + i["b1"])
    want = ACTS[spec.act2](mid @ i["w2"] * i["s2"] + i["b2"] + (i["residual"] if spec.residual else 0))
    got = reference(spec, **i)
    assert got.shape == spec.out_shape and np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_groups_must_divide_the_channels():
    with pytest.raises(ValueError, match=r"groups: 3 must divide the input channels \(16\)"):
        FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8, groups=3)
    spec = FusedConvSpec.parse("n=1,h=8,w=8,c=16,k1=16,k2=8,groups=16")
    assert spec.groups == 16 and FusedConvSpec.parse(spec.to_string()) == spec
    assert "groups" not in FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8).to_string()  # dense texts as before


def assert_pair(spec, target, fused=True, seed=0):
    inputs = random_inputs(spec, seed=seed)
    kernel = build(spec, target, fused=fused, db=None)
    assert len(kernel.func_names) == (1 if fused else 2)
    err, ok = compare(spec, kernel(**inputs), reference(spec, **inputs))
    assert ok, f"{spec.to_string()} on {target}: max abs error {err}"


def _assert_conv(spec, target, seed=0):
    inputs = conv_random_inputs(spec, seed=seed)
    kernel = build(spec, target, db=None)
    err, ok = compare(spec, kernel(**inputs), conv_reference(spec, **inputs))
    assert ok, f"{spec.to_string()} on {target}: max abs error {err}"


@pytest.mark.parametrize("kind", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-kernels"])
def test_cpu_pair_matches_reference(kind, fused):
    assert_pair(FusedConvSpec(**kind, dtype="float32"), "llvm", fused)


@pytest.mark.parametrize("kind", CONVS, ids=CONV_IDS)
def test_cpu_conv_matches_reference(kind):
    _assert_conv(ConvSpec(**kind, dtype="float32"), "llvm")


def _grouped_pair(n, h, w, per_group, groups, multiplier, k2, stride, act1, act2, residual):
    c = per_group * groups
    return FusedConvSpec(n=n, h=h, w=w, c=c, k1=c * multiplier, k2=k2, stride=stride, act1=act1, act2=act2,
                         residual=residual, groups=groups, dtype="float32")


ACT = st.sampled_from(["relu", "relu6", "none"])
PAIR_SHAPES = st.builds(_grouped_pair, st.integers(1, 2), st.integers(3, 12), st.integers(3, 12),
                        st.sampled_from([1, 1, 2, 3]), st.integers(1, 40), st.sampled_from([1, 1, 2]), st.integers(1, 40),
                        st.sampled_from([1, 2]), ACT, ACT, st.booleans())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=PAIR_SHAPES)
def test_cpu_pair_random_shapes(spec):
    assert_pair(spec, "llvm", seed=1)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_depthwise_pair_is_one_kernel_and_builds(arch, tmp_path):
    """The depthwise pair is ONE kernel: the 3x3 on CUDA cores in 8-byte vectors along the channels, its
    accumulators in registers (not a local-memory array indexed at run time), mid in shared memory, the
    1x1 on mma.sync; nvcc compiles it."""
    spec = FusedConvSpec(**PAIRS[1])
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)  # fused when asked (the policy would run this width as two single convs)
    assert planned.fused and len(planned.kernels) == 1
    source = compiled_source(planned.kernels, target)
    params = {p.split()[-1].removesuffix("_ptr") for p in next(iter(kernels(source).values())).split(",")}
    assert params == {"x", "w1", "s1", "b1", "w2", "s2", "b2", "residual", "out"}
    assert "mma.sync.aligned.m16n8k16" in source and "half4 condval" in source  # x loaded 4 channels at a time
    assert "conv1_local_ptr[0]" in source and "conv1_local_ptr + max" not in source
    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    nvcc_compile(source, arch, tmp_path)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_wide_depthwise_pair_builds(arch, tmp_path):
    """From k1 = 192 the default steps are 64 channels, two ahead: one kernel, three stages of mid and w2 in
    shared memory (the pipeline's buffers), which nvcc compiles."""
    spec = FusedConvSpec(**PAIRS[-1])
    assert (default_config(spec, 90).k_tile, default_config(spec, 90).pipeline) == (64, 2)
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)
    assert planned.fused and len(planned.kernels) == 1
    source = compiled_source(planned.kernels, target)
    assert "mma.sync.aligned.m16n8k16" in source and "cp.async.wait_group 2" in source  # two steps in flight
    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    nvcc_compile(source, arch, tmp_path)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_grouped_conv_builds(arch, tmp_path):
    spec = ConvSpec(**CONVS[1])
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)
    assert planned.kernel == "cuda-core" and len(planned.kernels) == 1
    source = compiled_source(planned.kernels, target)
    assert len(kernels(source)) == 1 and "mma" not in source
    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    nvcc_compile(source, arch, tmp_path)


def test_fusion_policy_fuses_only_where_it_measured_faster():
    """With the policy (a model's pairs): a grouped 3x3 with several channels per group does not fuse (each
    k2 chunk would recompute it), nor a wide depthwise one on few pixels (measured slower); MobileNetV2's first pair
    does, and its large pairs at batch 32."""
    target = parse_target("cuda:sm_90")
    resnext = FusedConvSpec(n=1, h=14, w=14, c=512, k1=512, k2=1024, groups=32, residual=True)
    planned = plan(resnext, target, policy=True, unfused=False)
    assert not planned.fused and planned.kernels == [] and "channels per group" in planned.reason
    assert "k1=96 > 32" in plan(FusedConvSpec(**PAIRS[0]), target, policy=True, unfused=False).reason
    first = FusedConvSpec(n=1, h=112, w=112, c=32, k1=32, k2=16, groups=32, act1="relu6", act2="none")
    assert plan(first, target, policy=True, unfused=False).fused
    # batch 32: the large layers up to k1 = 192 fuse (the wide ones with 64-channel steps), the 14x14 ones do not
    large = FusedConvSpec(n=32, h=56, w=56, c=144, k1=144, k2=24, groups=144, act1="relu6", act2="none", residual=True)
    assert plan(large, target, policy=True, unfused=False).fused
    wide = FusedConvSpec(n=32, h=28, w=28, c=192, k1=192, k2=32, groups=192, act1="relu6", act2="none", residual=True)
    assert plan(wide, target, policy=True, unfused=False).fused
    cfg = default_config(wide, 90)
    assert (cfg.m_tile, cfg.k_tile, cfg.n2_tile, cfg.pipeline) == (32, 64, 32, 2)
    small = FusedConvSpec(n=32, h=14, w=14, c=384, k1=384, k2=64, groups=384, act1="relu6", act2="none", residual=True)
    assert "k1=384 > 32 on 6272 input pixels" in plan(small, target, policy=True, unfused=False).reason


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_grouped_conv_of_wide_groups_is_a_gemm_per_group(arch, tmp_path):
    """16+ channels a group: the tensor-core rule, each group a GEMM of its own (blockIdx.z), its operands loaded
    as 16-byte cp.async vectors; nvcc compiles it."""
    spec = ConvSpec(**TENSOR_CORE_CONVS[1])
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)
    assert planned.kernel == "tensorcore" and len(planned.kernels) == 1
    source = compiled_source(planned.kernels, target)
    assert "mma.sync.aligned.m16n8k16" in source and "blockIdx.z" in source and "cp.async.ca.shared.global" in source
    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    nvcc_compile(source, arch, tmp_path)


def test_grouped_conv_rule_by_channels_a_group(monkeypatch):
    """Tensor cores where a group's channels are multiples of 16, or 8 (merged); fewer, or depthwise: CUDA cores, with
    the reason; TVM_B2B_GROUPED_TC=all from 4, =0 never."""
    from tvm_b2b.schedule import rule_for
    from tvm_b2b.schedule.cuda_conv import GROUPED_ENV
    from tvm_b2b.op.conv_spec import OP_KIND

    target = parse_target("cuda:sm_90")
    eight = ConvSpec(n=1, h=28, w=28, c=256, k=256, kh=3, kw=3, pad_h=1, pad_w=1, groups=32)
    wide = dataclasses.replace(eight, c=512, k=512)
    kernel = lambda spec: plan(spec, target).kernel  # noqa: E731
    four = dataclasses.replace(eight, c=128, k=128)
    assert kernel(wide) == kernel(eight) == "tensorcore"  # 8 channels a group as 16 (two groups merged)
    assert kernel(four) == kernel(ConvSpec(**CONVS[0])) == kernel(dataclasses.replace(wide, c=768)) == "cuda-core"
    assert "4 input and 4 output channels a group" in rule_for(target, OP_KIND).can_implement(four, None)
    monkeypatch.setenv(GROUPED_ENV, "all")
    assert kernel(four) == "tensorcore" and kernel(ConvSpec(**CONVS[0])) == "cuda-core"
    monkeypatch.setenv(GROUPED_ENV, "0")
    assert kernel(wide) == kernel(eight) == "cuda-core"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-kernels"])
def test_cuda_pair_matches_reference(kind, fused):
    assert_pair(FusedConvSpec(**kind), "cuda", fused)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", CONVS, ids=CONV_IDS)
def test_cuda_conv_matches_reference(kind):
    _assert_conv(ConvSpec(**kind), "cuda")


# 4 and 8 channels a group (ResNeXt-50's 56x56 and 28x28 layers): tensor cores as merged groups (4: with TVM_B2B_GROUPED_TC=all)
MERGED_CONVS = [dict(n=1, h=28, w=28, c=128, k=128, kh=3, kw=3, pad_h=1, pad_w=1, groups=32),
                dict(n=2, h=15, w=15, c=256, k=256, kh=3, kw=3, stride=2, pad_h=1, pad_w=1, groups=32, residual=True)]


@pytest.mark.parametrize("kind", MERGED_CONVS, ids=lambda kind: ConvSpec(**kind).to_string())
def test_merged_groups_compute_the_same_conv(kind, monkeypatch):
    """2 or 4 groups of 8 or 4 channels as one of 16 (block-diagonal weights): the reference of the conv the
    kernel computes, on the inputs as it takes them, is the conv's."""
    from tvm_b2b.schedule.cuda_conv import GROUPED_ENV, input_form

    monkeypatch.setenv(GROUPED_ENV, "all")
    spec = ConvSpec(**kind, dtype="float32")
    form = input_form(spec)
    assert form.spec(spec).groups * 16 == spec.c and form.spec(spec).c == spec.c
    i = conv_random_inputs(spec, seed=5)
    got = conv_reference(form.spec(spec), **form.arrays(spec, i))
    assert np.abs(got - conv_reference(spec, **i)).max() <= 1e-5 * np.abs(got).max()
    assert plan(dataclasses.replace(spec, dtype="float16"), parse_target("cuda:sm_90")).kernel == "tensorcore"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", TENSOR_CORE_CONVS + MERGED_CONVS, ids=lambda kind: ConvSpec(**kind).to_string())
def test_cuda_grouped_conv_on_tensor_cores_matches_reference(kind, monkeypatch):
    from tvm_b2b.schedule.cuda_conv import GROUPED_ENV

    monkeypatch.setenv(GROUPED_ENV, "all")  # (merged groups where the tensor cores need them)
    spec = ConvSpec(**kind)
    assert plan(spec, parse_target("cuda")).kernel == "tensorcore"
    _assert_conv(spec, "cuda")


def _grouped_conv(n, h, w, per_group, groups, multiplier, stride, act, residual):
    return ConvSpec(n=n, h=h, w=w, c=per_group * groups, k=per_group * groups * multiplier, kh=3, kw=3, stride=stride,
                    pad_h=1, pad_w=1, act=act, residual=residual, groups=groups)


@pytest.mark.gpu
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.builds(_grouped_conv, st.integers(1, 3), st.integers(3, 16), st.integers(3, 16), st.sampled_from([16, 32, 48]),
                      st.integers(2, 8), st.sampled_from([1, 2]), st.sampled_from([1, 2]), ACT, st.booleans()))
def test_cuda_grouped_conv_random_shapes(spec):
    _assert_conv(spec, "cuda", seed=4)


@pytest.mark.gpu
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=PAIR_SHAPES)
def test_cuda_pair_random_shapes(spec):
    assert_pair(dataclasses.replace(spec, dtype="float16"), "cuda", seed=2)
