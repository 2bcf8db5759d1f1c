"""3x3 -> 1x1 pairs whose 3x3 is dilated (FusedConvSpec.dilation: DeepLabV3's atrous bottlenecks, MobileNetV3's
dilated depthwise blocks) or padded as TensorFlow pads (pad_h / pad_w: 0 on top of a stride-2 3x3 of an even size, as
Keras models export it): the numpy reference against PyTorch's (dilated) conv of the padded input, the pair fused and
as two kernels on the CPU against the reference (a grid and hypothesis shapes: dense, grouped, depthwise, stride 2,
residual), the spec's text, the CUDA pair
(mma.sync template, grouped pair template) as ONE kernel built by nvcc for sm_80 and sm_90, and (GPU-marked) on CUDA
against the reference.

Tolerances (tvm_b2b.op.TOLERANCES): float32 |y - ref| <= 1e-4 + 1e-4 |ref|, float16 1e-2 + 1e-2 |ref|.
The reference against PyTorch (float64): 1e-4 relative to the output's largest magnitude.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuda_source import compiled_source, nvcc_arches, nvcc_compile
from test_conv import torch_conv
from test_grouped import assert_pair
from tvm_b2b import FusedConvSpec
from tvm_b2b.op import compare, random_inputs, reference
from tvm_b2b.op.compute import conv3x3_spec
from tvm_b2b.op.fused_pair import as_single_convs
from tvm_b2b.schedule import cuda_cluster_dw_pair, cuda_hopper_pair, plan
from tvm_b2b.target import parse_target

PAIRS = [
    dict(n=2, h=14, w=13, c=16, k1=16, k2=64, dilation=2, residual=True),  # DeepLabV3-ResNet50's layer3, scaled down
    dict(n=1, h=15, w=11, c=24, k1=32, k2=24, stride=2, dilation=3, act1="relu6", act2="none"),
    dict(n=1, h=9, w=9, c=40, k1=40, k2=16, groups=40, dilation=2, act1="relu6", act2="none"),  # depthwise
    dict(n=2, h=10, w=12, c=32, k1=32, k2=32, groups=8, dilation=4, residual=True),  # grouped, dilation beyond the image
    dict(n=1, h=7, w=8, c=12, k1=24, k2=8, groups=12, dilation=2, stride=2),  # a depth multiplier of 2
    # TensorFlow's "same": the extra row and column below and right (even sizes at stride 2)
    dict(n=2, h=16, w=14, c=16, k1=16, k2=32, stride=2, pad_h=0, pad_w=0, residual=True),
    dict(n=1, h=12, w=11, c=24, k1=24, k2=16, groups=24, stride=2, pad_h=0, act1="relu6", act2="none"),  # w odd: 1 each
    dict(n=1, h=7, w=9, c=8, k1=8, k2=8, pad_h=0, pad_w=2),  # stride 1: all below, all above
    dict(n=1, h=10, w=10, c=8, k1=8, k2=8, groups=2, dilation=2, stride=2, pad_h=1, pad_w=3),
]
PAIR_IDS = [FusedConvSpec(**p).to_string() for p in PAIRS]
ACTS = {"relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6), "none": lambda y: y}


@pytest.mark.parametrize("kind", PAIRS, ids=PAIR_IDS)
def test_pair_reference_matches_torch(kind):
    """The pair's reference against PyTorch's dilated (grouped) conv2d, padded by the dilation, then the 1x1."""
    spec = FusedConvSpec(**kind, dtype="float32")
    i = random_inputs(spec, seed=3)
    conv = conv3x3_spec(spec)
    assert (conv.pads, conv.dilation) == (spec.pads, spec.dilation) and (conv.ho, conv.wo) == (spec.ho, spec.wo)
    mid = torch_conv(conv, i["x"], i["w1"], i["s1"], i["b1"])
    want = ACTS[spec.act2](mid @ i["w2"] * i["s2"] + i["b2"] + (i["residual"] if spec.residual else 0))
    got = reference(spec, **i)
    assert got.shape == spec.out_shape and np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_dilation_is_in_the_spec_text_only_when_not_1():
    spec = FusedConvSpec.parse("n=1,h=8,w=8,c=16,k1=16,k2=8,dilation=2")
    assert spec.dilation == 2 and FusedConvSpec.parse(spec.to_string()) == spec and "dilation=2" in spec.to_string()
    assert "dilation" not in FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8).to_string()  # tuning records as before
    assert [c.dilation for c in as_single_convs(spec)] == [2, 1]
    with pytest.raises(ValueError, match="dilation: expected a positive integer, got 0"):
        FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8, dilation=0)


def test_padding_is_in_the_spec_text_only_when_not_the_dilation():
    spec = FusedConvSpec.parse("n=1,h=8,w=8,c=16,k1=16,k2=8,stride=2,pad_h=0,pad_w=0")
    assert spec.pads == (0, 0, 1, 1) and FusedConvSpec.parse(spec.to_string()) == spec
    assert spec == FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8, stride=2, pad_h=0, pad_w=0)
    same = FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8, stride=2, pad_h=1, pad_w=1)  # PyTorch's: the default
    assert same == FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8, stride=2) and "pad" not in same.to_string()
    assert FusedConvSpec(n=1, h=9, w=9, c=16, k1=16, k2=8, stride=2, dilation=2, pad_h=3).pads == (3, 2, 1, 2)
    assert (conv3x3_spec(same).pad_bottom, conv3x3_spec(same).pad_right) == (None, None)
    assert conv3x3_spec(same).pads == (1, 1, 1, 1)  # as before (the Hopper pair's)
    with pytest.raises(ValueError, match="pad_w: expected an integer from 0 to 2, got 3"):
        FusedConvSpec(n=1, h=8, w=8, c=16, k1=16, k2=8, pad_w=3)


@pytest.mark.parametrize("kind", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-kernels"])
def test_cpu_dilated_pair_matches_reference(kind, fused):
    assert_pair(FusedConvSpec(**kind, dtype="float32"), "llvm", fused)


def _padded_pair(n, h, w, per_group, groups, k2, stride, dilation, pads, residual, act1):
    c = per_group * groups
    top, left = (p if p is None else min(p, 2 * dilation) for p in pads)
    return FusedConvSpec(n=n, h=h, w=w, c=c, k1=c, k2=k2, stride=stride, dilation=dilation, residual=residual, act1=act1,
                         groups=groups, pad_h=top, pad_w=left, dtype="float32")


PADDED_PAIRS = st.builds(_padded_pair, st.integers(1, 2), st.integers(2, 12), st.integers(2, 12),
                         st.sampled_from([1, 3, 8]), st.sampled_from([1, 1, 2, 5]), st.integers(1, 24), st.sampled_from([1, 2]),
                         st.integers(1, 6), st.tuples(*[st.sampled_from([None, None, 0, 1, 2, 4, 12])] * 2), st.booleans(),
                         st.sampled_from(["relu", "relu6", "none"]))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=PADDED_PAIRS)
def test_cpu_padded_pair_random_shapes(spec):
    """Dense (groups 1), grouped and depthwise (per_group 1) pairs dilated by up to 6, often beyond the image, padded
    by the dilation or from 0 to twice it at the top and left."""
    assert_pair(spec, "llvm", seed=1)


@pytest.mark.parametrize("kind", PAIRS, ids=PAIR_IDS)
def test_gemm_definition_computes_the_pair(kind):
    """op.compute's padded GEMM form (the grouped form for groups > 1), what the CUDA templates schedule, compiled
    unscheduled for the CPU, matches the reference: its im2col's (xcol's) taps dilated."""
    import tvm

    from tvm_b2b.op.compute import fused_prim_func, padded_extents

    spec = FusedConvSpec(**kind, dtype="float32")
    ext = padded_extents(spec, 32, 1 if spec.groups > 1 else 32, 32)
    inputs = random_inputs(spec, seed=8)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(inputs[k], dev) for k in ("x", "w1", "s1", "b1", "w2", "s2", "b2")]
    if spec.residual:
        args.append(tvm.runtime.tensor(inputs["residual"].reshape(spec.m, spec.k2), dev))
    out = tvm.runtime.empty((spec.m, spec.k2), "float32", dev)
    tvm.compile(tvm.IRModule({"main": fused_prim_func(spec, ext)}), "llvm")(*args, out)
    err, ok = compare(spec, out.numpy().reshape(spec.out_shape), reference(spec, **inputs))
    assert ok, err


@pytest.mark.parametrize("index", [0, 2, 5, 6], ids=["dense", "depthwise", "dense-tf-same", "depthwise-tf-same"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_padded_pair_is_one_kernel_and_builds(index, arch, tmp_path):
    """The dilated or TensorFlow-padded pair runs fused as ONE kernel on the mma.sync templates (the dense pair's, the
    grouped pair's): sm_90's TMA + wgmma pair computes both (at these sizes its policy leaves them to mma.sync:
    test_tf_padded_pair_runs_on_hopper; a dilated one is not yet measured on it), its depthwise
    cluster kernel refuses both (its halo tile pads a row and column above and left); nvcc compiles it."""
    dense = PAIRS[index]["groups"] == 1 if "groups" in PAIRS[index] else True
    spec = FusedConvSpec(**{**PAIRS[index], "k1": 64, "k2": 64, "c": 64} if dense else PAIRS[index])
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)
    assert planned.fused and len(planned.kernels) == 1 and planned.kernel == "tensorcore"
    source = compiled_source(planned.kernels, target)
    assert "mma.sync.aligned.m16n8k16" in source and "wgmma." not in source
    if dense:
        assert cuda_hopper_pair.pair_problem(spec) is None
    else:
        assert cuda_cluster_dw_pair.spec_problem(spec) in (
            "dilation 2 (undilated pairs only)", "3x3 padding [0, 1, 1, 1] (top, left, bottom, right): 1 on each side only")
    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    nvcc_compile(source, arch, tmp_path)


HOPPER_TF_PAIR = FusedConvSpec(n=8, h=56, w=56, c=64, k1=64, k2=256, stride=2, pad_h=0, pad_w=0, residual=True)


def test_tf_padded_pair_runs_on_hopper(tmp_path):
    """A TensorFlow-padded strided pair large enough for sm_90's TMA + wgmma pair runs on it (its boxes start at the
    top and left padding; test_cuda_hopper_conv emulates its index math), and nvcc compiles it."""
    from tvm_b2b.schedule.cuda_hopper_conv import HopperConfig

    spec = HOPPER_TF_PAIR
    target = parse_target("cuda:sm_90")
    planned = plan(spec, target)
    assert planned.fused and len(planned.kernels) == 1 and isinstance(planned.config, HopperConfig)
    source = compiled_source(planned.kernels, target)
    assert "wgmma." in source
    if "sm_90" not in nvcc_arches():
        pytest.skip("nvcc here has no sm_90")
    nvcc_compile(source, "sm_90", tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "two-kernels"])
def test_cuda_padded_pair_matches_reference(kind, fused):
    assert_pair(FusedConvSpec(**kind), "cuda", fused)


@pytest.mark.gpu
def test_cuda_tf_padded_pair_on_hopper_matches_reference():
    """The TensorFlow-padded pair on sm_90's TMA + wgmma pair (where the GPU is one) against the reference."""
    assert_pair(HOPPER_TF_PAIR, "cuda")
