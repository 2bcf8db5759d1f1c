"""The single convolution op kind (op/conv.py): spec, numpy reference (against PyTorch), CPU kernel and
(GPU-marked) CUDA kernel against the reference, CUDA builds compiled by nvcc for sm_80 and sm_90.

Tolerances (tvm_b2b.op.TOLERANCES): float32 |y - ref| <= 1e-4 + 1e-4 |ref|, float16 1e-2 + 1e-2 |ref|.
The reference against PyTorch's conv2d (float64): 1e-4 relative to the output's largest magnitude.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuda_source import compiled_source, kernels, nvcc_arches, nvcc_compile
from tvm_b2b import ConvSpec, build
from tvm_b2b.op import compare
from tvm_b2b.op.conv import conv_random_inputs, conv_reference
from tvm_b2b.schedule import plan
from tvm_b2b.target import parse_target

# every conv kind of the issue: 1x1, 3x3 and 7x7 (3-channel stem), stride 1 and 2, with and without
# padding, residual, relu/relu6/none
KINDS = [
    dict(n=1, h=56, w=56, c=64, k=256, act="none"),  # ResNet's 1x1 expand
    dict(n=2, h=14, w=14, c=256, k=64, stride=2, act="none"),  # ResNet's stride-2 downsample
    dict(n=1, h=7, w=9, c=40, k=24, residual=True, act="relu6"),
    dict(n=2, h=28, w=28, c=64, k=64, kh=3, kw=3, pad_h=1, pad_w=1),
    dict(n=1, h=15, w=13, c=24, k=40, kh=3, kw=3, stride=2, pad_h=1, pad_w=1, residual=True),
    dict(n=1, h=64, w=64, c=3, k=64, kh=7, kw=7, stride=2, pad_h=3, pad_w=3),  # the stem
    dict(n=3, h=9, w=11, c=5, k=7, kh=3, kw=5, pad_h=0, pad_w=2, act="relu6"),
    dict(n=2, h=17, w=15, c=16, k=24, kh=3, kw=3, pad_h=2, pad_w=2, dilation=2),  # DeepLabV3's atrous 3x3
    dict(n=1, h=19, w=20, c=8, k=16, kh=3, kw=3, stride=2, pad_h=3, pad_w=1, dilation=3, act="none", residual=True),
    dict(n=1, h=13, w=12, c=24, k=24, kh=3, kw=3, pad_h=4, pad_w=4, dilation=4, groups=24, act="relu6"),  # depthwise
    # TensorFlow's "same" padding of strided convs as tf2onnx writes it: the extra row and column below and right
    dict(n=2, h=32, w=30, c=3, k=32, kh=3, kw=3, stride=2, pad_bottom=1, pad_right=1),  # EfficientNet's stem
    dict(n=1, h=14, w=14, c=32, k=64, kh=3, kw=3, stride=2, pad_bottom=1, pad_right=1, residual=True, act="none"),
    dict(n=1, h=16, w=15, c=40, k=40, kh=5, kw=5, stride=2, pad_h=1, pad_w=2, pad_bottom=2, groups=40),  # depthwise 5x5
    dict(n=1, h=9, w=8, c=16, k=24, kh=3, kw=3, pad_h=1, pad_w=1, pad_bottom=0, pad_right=2),  # less below than above
    dict(n=2, h=9, w=10, c=4, k=8, kh=3, kw=3, stride=2, pad_h=1, pad_w=1, groups=2),  # grouped, few channels: no stem
]
IDS = [ConvSpec(**k).to_string() for k in KINDS]


def torch_conv(spec, x, w, s, b, residual=None):
    import torch

    xt = torch.from_numpy(x.astype(np.float64)).permute(0, 3, 1, 2)
    wt = torch.from_numpy(w.astype(np.float64)).permute(3, 2, 0, 1)
    top, left, bottom, right = spec.pads
    xt = torch.nn.functional.pad(xt, (left, right, top, bottom))
    y = torch.nn.functional.conv2d(xt, wt, stride=spec.stride, dilation=spec.dilation,
                                   groups=spec.groups).permute(0, 2, 3, 1).numpy()
    y = y * s + b + (residual.astype(np.float64) if residual is not None else 0)
    return {"relu": np.maximum(y, 0), "relu6": np.clip(y, 0, 6), "none": y}[spec.act]


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_reference_matches_torch(kind):
    spec = ConvSpec(**kind, dtype="float32")
    inputs = conv_random_inputs(spec, seed=3)
    got, want = conv_reference(spec, **inputs), torch_conv(spec, **inputs)
    assert got.shape == spec.out_shape
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_spec_text_round_trip_and_errors():
    spec = ConvSpec(n=1, h=224, w=224, c=3, k=64, kh=7, kw=7, stride=2, pad_h=3, pad_w=3)
    assert ConvSpec.parse(spec.to_string()) == spec
    assert (spec.ho, spec.wo, spec.r) == (112, 112, 147)
    assert ConvSpec.parse("n=1,h=8,w=8,c=4,k=4") == ConvSpec(n=1, h=8, w=8, c=4, k=4)
    atrous = ConvSpec.parse("n=1,h=9,w=9,c=4,k=4,kh=3,kw=3,pad_h=4,pad_w=2,dilation=4")
    assert (atrous.span_h, atrous.ho, atrous.wo) == (9, 9, 5) and "dilation=4" in atrous.to_string()
    assert "dilation" not in spec.to_string()  # left out at 1: the text (and tuning records' specs) of before
    same = ConvSpec.parse("n=1,h=224,w=224,c=3,k=32,kh=3,kw=3,stride=2,pad_bottom=1,pad_right=1")  # TensorFlow's "same"
    assert same.pads == (0, 0, 1, 1) and (same.ho, same.wo) == (112, 112) and same.pad_bottom == 1
    assert ConvSpec.parse(same.to_string()) == same and "pad_bottom=1,pad_right=1" in same.to_string()
    assert ConvSpec(n=1, h=8, w=8, c=4, k=4, kh=3, kw=3, pad_h=1, pad_bottom=1) == ConvSpec(n=1, h=8, w=8, c=4, k=4, kh=3,
                                                                                           kw=3, pad_h=1, pad_w=0)
    assert "pad_bottom" not in ConvSpec(n=1, h=8, w=8, c=4, k=4, kh=3, kw=3, pad_h=1, pad_bottom=1).to_string()
    for text, message in [("n=1,h=8,w=8,c=4", "k: missing"), ("n=1,h=8,w=8,c=4,k=4,kh=0", "kh: expected an integer >= 1"),
                          ("n=1,h=8,w=8,c=4,k=4,pad_h=1", "pad: \\[1, 0, 1, 0\\] (top, left, bottom, right) must be smaller"),
                          ("n=1,h=2,w=2,c=4,k=4,kh=5,kw=5,pad_h=1,pad_w=1", "larger than the padded"),
                          ("n=1,h=8,w=8,c=4,k=4,act=gelu", "act: expected one of"),
                          ("n=1,h=8,w=8,c=4,k=6,groups=4", "groups: 4 must divide the input channels (4) and the output channels (6)"),
                          ("n=1,h=8,w=8,c=4,k=4,dilation=0", "dilation: expected an integer >= 1"),
                          ("n=1,h=8,w=8,c=4,k=4,kh=3,kw=3,pad_h=5,pad_w=1,dilation=2",
                           "pad: \\[5, 1, 5, 1\\] (top, left, bottom, right) must be smaller than the kernel (5, 5)"),
                          ("n=1,h=3,w=3,c=4,k=4,kh=3,kw=3,dilation=2", "kernel: 5x5 is larger than the padded 3x3 input"),
                          ("n=1,h=8,w=8,c=4,k=4,kh=3,kw=3,pad_bottom=3", "pad: \\[0, 0, 3, 0\\] (top, left, bottom, right)"),
                          ("n=1,h=8,w=8,c=4,k=4,pad_right=-1", "pad_right: expected an integer >= 0"),
                          ("n=1,h=8,w=8,c=4,k=4,rate=2", "rate: not a conv spec field")]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            ConvSpec.parse(text)


def _assert_computes_op(spec, target, seed=0):
    inputs = conv_random_inputs(spec, seed=seed)
    kernel = build(spec, target, db=None)
    assert len(kernel.func_names) == 1
    err, ok = compare(spec, kernel(**inputs), conv_reference(spec, **inputs))
    assert ok, f"{spec.to_string()} on {target}: max abs error {err}"


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_cpu_conv_matches_reference(kind):
    _assert_computes_op(ConvSpec(**kind, dtype="float32"), "llvm")


CONV_SHAPES = st.builds(
    lambda n, h, w, c, k, size, stride, pad, act, residual: ConvSpec(
        n=n, h=h, w=w, c=c, k=k, kh=size, kw=size, stride=stride, pad_h=min(pad, size - 1), pad_w=min(pad, size - 1),
        act=act, residual=residual, dtype="float32"),
    st.integers(1, 2), st.integers(5, 12), st.integers(5, 12), st.integers(1, 20), st.integers(1, 24),
    st.sampled_from([1, 3, 5]), st.sampled_from([1, 2]), st.integers(0, 2), st.sampled_from(["relu", "relu6", "none"]),
    st.booleans())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=CONV_SHAPES)
def test_cpu_conv_random_shapes(spec):
    _assert_computes_op(spec, "llvm", seed=1)


ASYMMETRIC_SHAPES = st.builds(
    lambda n, h, w, groups, per_group, size, stride, pads, act, residual: ConvSpec(
        n=n, h=h, w=w, c=groups * per_group, k=groups * 2, kh=size, kw=size, stride=stride,
        **{name: min(p, size - 1) for name, p in zip(("pad_h", "pad_w", "pad_bottom", "pad_right"), pads)},
        act=act, residual=residual, groups=groups, dtype="float32"),
    st.integers(1, 2), st.integers(5, 12), st.integers(5, 12), st.sampled_from([1, 3]), st.integers(1, 9),
    st.sampled_from([2, 3, 5]), st.sampled_from([1, 2]), st.tuples(*[st.integers(0, 3)] * 4),
    st.sampled_from(["relu", "relu6", "none"]), st.booleans())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ASYMMETRIC_SHAPES)
def test_cpu_asymmetric_conv_random_shapes(spec):
    """Convs padded differently on each side (dense and grouped, stride 1 and 2) against the reference, which
    test_reference_matches_torch checks against PyTorch's conv of the padded input."""
    _assert_computes_op(spec, "llvm", seed=5)


DILATED_SHAPES = st.builds(
    lambda n, h, w, groups, per_group, multiplier, stride, dilation, pad, act, residual: ConvSpec(
        n=n, h=h, w=w, c=groups * per_group, k=groups * multiplier, kh=3, kw=3, stride=stride, pad_h=min(pad, 2 * dilation),
        pad_w=min(pad, 2 * dilation), act=act, residual=residual, groups=groups, dilation=dilation, dtype="float32"),
    st.integers(1, 2), st.integers(9, 16), st.integers(9, 16), st.sampled_from([1, 4]), st.integers(1, 12),
    st.sampled_from([1, 8, 16]), st.sampled_from([1, 2]), st.integers(2, 4), st.integers(0, 8),
    st.sampled_from(["relu", "relu6", "none"]), st.booleans())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=DILATED_SHAPES)
def test_cpu_dilated_conv_random_shapes(spec):
    """Dilated convs (dense and grouped, stride 1 and 2, any padding up to the dilated kernel's) against the
    reference, which test_reference_matches_torch checks against PyTorch's dilated conv."""
    _assert_computes_op(spec, "llvm", seed=6)


STRIDED_FEW_CHANNELS = st.builds(
    lambda n, h, w, c, k, kh, kw, stride, pad, extra: ConvSpec(
        n=n, h=h, w=w, c=c, k=k, kh=kh, kw=kw, stride=stride, pad_h=min(pad, kh - 1), pad_w=min(pad, kw - 1),
        pad_bottom=min(pad + extra, kh - 1), pad_right=min(pad + extra, kw - 1), act="none", dtype="float32"),
    st.integers(1, 2), st.integers(7, 14), st.integers(7, 14), st.integers(1, 7), st.integers(1, 9),
    st.integers(1, 7), st.integers(1, 7), st.sampled_from([2, 3]), st.integers(0, 3), st.sampled_from([0, 0, 1]))


@settings(max_examples=25, deadline=None)
@given(spec=STRIDED_FEW_CHANNELS, extra=st.sampled_from([0, 5]))
def test_space_to_depth_form_computes_the_same_conv(spec, extra):
    """InputForm(cells=True): the stride-1 conv of the cells (op.conv.space_to_depth) on x and w as the
    form makes them equals the strided conv (numpy reference, float32: |diff| <= 1e-5 relative to the
    output's largest magnitude), rows or columns that no output reads cut off, zero channels appended."""
    from tvm_b2b.op.conv import InputForm, space_to_depth

    channels = space_to_depth(spec).c + extra
    form = InputForm(cells=True, channels=channels if extra else None)
    cells = form.spec(spec)
    assert cells.stride == 1 and (cells.pad_h, cells.pad_w) == (0, 0) and cells.out_shape == spec.out_shape
    assert cells.c == channels == spec.c * spec.stride ** 2 + extra
    inputs = conv_random_inputs(spec, seed=4)
    want = conv_reference(spec, **inputs)
    got = conv_reference(cells, form.x(spec, inputs["x"]), form.w(spec, inputs["w"]), inputs["s"], inputs["b"])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("shape", [dict(h=64, w=64, c=3, kh=7, kw=7, stride=2, pad_h=3, pad_w=3),
                                   dict(h=10, w=11, c=2, kh=2, kw=4, stride=3, pad_h=0, pad_w=1),
                                   dict(h=32, w=30, c=3, kh=3, kw=3, stride=2, pad_bottom=1, pad_right=1)],
                         ids=["stem", "cut", "tf-same"])
def test_space_to_depth_in_relax_matches_numpy(shape):
    """The Relax ops a model gets for the form (op.conv_pattern.input_in_form; the second case cuts
    rows and columns no output reads) give InputForm.x's array, built and run for the CPU."""
    import tvm
    from tvm import relax

    from tvm_b2b.op.conv import InputForm
    from tvm_b2b.op.conv_pattern import input_in_form

    spec, form = ConvSpec(n=2, k=8, **shape, dtype="float32"), InputForm(cells=True, channels=24)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((spec.n, spec.h, spec.w, spec.c), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(input_in_form(form, spec, x, bb.emit))
        bb.emit_func_output(y)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    value = np.random.default_rng(0).standard_normal((spec.n, spec.h, spec.w, spec.c)).astype("float32")
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(value)).numpy(), form.x(spec, value))


def test_cuda_stem_runs_as_its_space_to_depth_conv():
    """A strided conv of few channels (ResNet's stem) runs on CUDA as the stride-1 conv of 2x2 cells
    (4x4 of 12 channels, no padding: reduction 192); a strided conv of 8 or more channels as itself."""
    from tvm_b2b.op.conv import InputForm
    from tvm_b2b.schedule.cuda_conv import kernel_spec

    target = parse_target("cuda:sm_90")
    stem = ConvSpec(**KINDS[5], dtype="float16")
    assert plan(stem, target).input_form == InputForm(cells=True)
    assert (kernel_spec(stem).kh, kernel_spec(stem).c, kernel_spec(stem).r, kernel_spec(stem).stride) == (4, 12, 192, 1)
    assert plan(ConvSpec(**KINDS[4], dtype="float16"), target).input_form is None
    assert plan(ConvSpec(n=1, h=8, w=8, c=3, k=8, dtype="float16"), target).input_form == InputForm(channels=4)
    stride3 = ConvSpec(n=1, h=30, w=30, c=3, k=8, kh=5, kw=5, stride=3, pad_h=2, pad_w=2, dtype="float16")
    assert plan(stride3, target).input_form == InputForm(cells=True, channels=28)  # 27 channels: 8-byte vectors


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kind", [KINDS[1], KINDS[4], KINDS[5]], ids=["1x1-stride2", "3x3-stride2-residual", "7x7-stem"])
def test_cuda_conv_builds(kind, arch, tmp_path):
    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    spec = ConvSpec(**kind, dtype="float16")
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)
    source = compiled_source(planned.kernels, target)
    found = kernels(source)
    assert len(found) == 1
    params = {p.split()[-1].removesuffix("_ptr") for p in next(iter(found.values())).split(",")}
    assert params == {"x", "w", "s", "b", "out"} | ({"residual"} if spec.residual else set())
    assert "mma.sync.aligned.m16n8k16" in source and "cp.async" in source
    nvcc_compile(source, arch, tmp_path)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_dilated_conv_runs_on_the_tensor_core_template(arch, tmp_path):
    """A dilated 3x3 (DeepLabV3's, 28x28 at batch 2) runs on the mma.sync template, its taps dilated in the im2col
    tiles' indices; sm_90's TMA + wgmma kernel computes it (its taps' boxes dilated) but leaves it to the template, with
    its reason (few blocks here; dilated convs not yet measured on it)."""
    from tvm_b2b.schedule import cuda_hopper_conv
    from tvm_b2b.schedule.cuda_wmma import WmmaConfig

    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    spec = ConvSpec(n=2, h=28, w=28, c=256, k=256, kh=3, kw=3, pad_h=2, pad_w=2, dilation=2)
    assert cuda_hopper_conv.spec_problem(spec) is None
    assert "fewer than half" in cuda_hopper_conv.RULE.slower(spec)
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)
    assert isinstance(planned.config, WmmaConfig) and planned.input_form is None
    source = compiled_source(planned.kernels, target)
    assert len(kernels(source)) == len(planned.kernels) and "mma.sync.aligned.m16n8k16" in source
    nvcc_compile(source, arch, tmp_path)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kind", KINDS[10:12], ids=["stem", "3x3-stride2"])
def test_cuda_asymmetric_padding_builds(kind, arch, tmp_path):
    """TensorFlow's "same" padding (one more row and column below and right): the stem as its space-to-depth conv, the
    small 3x3 on the mma.sync template (few blocks); nvcc compiles both. (test_cuda_hopper_conv emulates the TMA +
    wgmma kernel's index math on such padding.)"""
    spec = ConvSpec(**kind, dtype="float16")
    target = parse_target(f"cuda:{arch}")
    planned = plan(spec, target)
    assert (planned.input_form is not None and planned.input_form.cells) == (spec.c < 8)
    source = compiled_source(planned.kernels, target)
    assert len(kernels(source)) == len(planned.kernels) and "mma.sync.aligned.m16n8k16" in source
    if arch not in nvcc_arches():
        pytest.skip(f"nvcc here has no {arch}")
    nvcc_compile(source, arch, tmp_path)


HOPPER_TF_CONV = ConvSpec(n=8, h=56, w=56, c=64, k=128, kh=3, kw=3, stride=2, pad_bottom=1, pad_right=1, residual=True)


def test_cuda_asymmetric_padding_on_hopper_builds(tmp_path):
    """A TensorFlow-padded strided 3x3 large enough for sm_90's TMA + wgmma kernel runs on it (its boxes start at the
    top and left padding, TMA fills what lies past the input with zeros), and nvcc compiles it."""
    from tvm_b2b.schedule.cuda_hopper_conv import HopperConfig

    spec = HOPPER_TF_CONV
    target = parse_target("cuda:sm_90")
    planned = plan(spec, target)
    assert isinstance(planned.config, HopperConfig)
    source = compiled_source(planned.kernels, target)
    assert "wgmma." in source
    if "sm_90" not in nvcc_arches():
        pytest.skip("nvcc here has no sm_90")
    nvcc_compile(source, "sm_90", tmp_path)


def test_cuda_grouped_conv_of_few_channels_is_no_stem(tmp_path):
    """A grouped strided conv of fewer than 8 channels is no stem (its cells would mix groups): it runs as it is, on
    CUDA cores (planning it for CUDA raised a ValueError before), and nvcc compiles it."""
    spec = ConvSpec(**KINDS[-1], dtype="float16")
    target = parse_target("cuda:sm_90")
    planned = plan(spec, target)
    assert planned.input_form is None and planned.kernel == "cuda-core"
    if "sm_90" not in nvcc_arches():
        pytest.skip("nvcc here has no sm_90")
    nvcc_compile(compiled_source(planned.kernels, target), "sm_90", tmp_path)


@pytest.mark.gpu
def test_cuda_asymmetric_padding_on_hopper_matches_reference():
    _assert_computes_op(HOPPER_TF_CONV, "cuda", seed=9)


@pytest.mark.gpu
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ASYMMETRIC_SHAPES)
def test_cuda_asymmetric_conv_random_shapes(spec):
    import dataclasses

    _assert_computes_op(dataclasses.replace(spec, dtype="float16"), "cuda", seed=8)


def test_cuda_conv_takes_float16_only():
    with pytest.raises(ValueError, match="float16 only"):
        plan(ConvSpec(n=1, h=8, w=8, c=8, k=8, dtype="float32"), parse_target("cuda:sm_90"))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_cuda_conv_matches_reference(kind):
    _assert_computes_op(ConvSpec(**kind, dtype="float16"), "cuda")


@pytest.mark.gpu
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=DILATED_SHAPES)
def test_cuda_dilated_conv_random_shapes(spec):
    import dataclasses

    _assert_computes_op(dataclasses.replace(spec, dtype="float16"), "cuda", seed=7)


@pytest.mark.gpu
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=CONV_SHAPES)
def test_cuda_conv_random_shapes(spec):
    import dataclasses

    _assert_computes_op(dataclasses.replace(spec, dtype="float16"), "cuda", seed=2)


@pytest.mark.parametrize("dilation,splits", [(1, 4), (3, 3)], ids=["plain", "dilated"])
def test_split_k_definition_computes_the_op(dilation, splits):
    """op.conv.split_prim_funcs (the reduction split over two kernels), compiled unscheduled for the
    CPU, matches the reference: the definition CUDA's split-K plan schedules (a dilated conv's between taps, as
    TVM_B2B_SPLIT_DEEP splits DeepLabV3's)."""
    import tvm

    from tvm_b2b.op.conv import padded_conv_extents, split_prim_funcs

    spec = ConvSpec(n=1, h=7, w=6, c=24, k=20, kh=3, kw=3, pad_h=dilation, pad_w=dilation, dilation=dilation,
                    residual=True, act="relu6", dtype="float32")
    ext = padded_conv_extents(spec, 32, 64, 64)
    inputs = conv_random_inputs(spec, seed=4)
    first, second = (tvm.compile(tvm.IRModule({"main": f}), "llvm") for f in split_prim_funcs(spec, ext, splits=splits))
    dev = tvm.cpu()
    partial = tvm.runtime.empty((splits, ext["m"], ext["k"]), "float32", dev)
    first(*(tvm.runtime.tensor(inputs[k], dev) for k in ("x", "w")), partial)
    out = tvm.runtime.empty((spec.m, spec.k), "float32", dev)
    second(partial, *(tvm.runtime.tensor(inputs[k], dev) for k in ("s", "b")),
           tvm.runtime.tensor(inputs["residual"].reshape(spec.m, spec.k), dev), out)
    err, ok = compare(spec, out.numpy().reshape(spec.out_shape), conv_reference(spec, **inputs))
    assert ok, err


@pytest.mark.parametrize("kind", [KINDS[4]] + KINDS[7:], ids=IDS[4:5] + IDS[7:])
def test_gemm_definition_computes_the_op(kind):
    """op.conv_prim_func's padded GEMM form (a grouped conv's: one GEMM per group), compiled unscheduled for the
    CPU, matches the reference: the definition the tensor-core templates schedule, its im2col's taps dilated."""
    import tvm

    from tvm_b2b.op.conv import conv_prim_func, padded_conv_extents

    spec = ConvSpec(**kind, dtype="float32")
    unit = 16 if spec.groups > 1 else 32
    func = conv_prim_func(spec, padded_conv_extents(spec, 32, unit, unit))
    inputs = conv_random_inputs(spec, seed=8)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(inputs[k], dev) for k in ("x", "w", "s", "b")]
    if spec.residual:
        args.append(tvm.runtime.tensor(inputs["residual"].reshape(spec.m, spec.k), dev))
    out = tvm.runtime.empty((spec.m, spec.k), "float32", dev)
    tvm.compile(tvm.IRModule({"main": func}), "llvm")(*args, out)
    err, ok = compare(spec, out.numpy().reshape(spec.out_shape), conv_reference(spec, **inputs))
    assert ok, err


def test_cuda_plan_splits_the_reduction_where_blocks_are_few(tmp_path):
    """ResNet-50's 7x7 layers at batch 1 make 16 blocks: the default plan splits their reduction 9 ways
    (two kernels: float32 partial sums, then their sum with the epilogue), and nvcc compiles both; a
    large layer stays one kernel."""
    from tvm_b2b.schedule.cuda_conv import split_factor

    target = parse_target("cuda:sm_90")
    small = ConvSpec(n=1, h=7, w=7, c=512, k=512, kh=3, kw=3, pad_h=1, pad_w=1)
    planned = plan(small, target)
    assert len(planned.kernels) == 2 and planned.mid_shape == (9, 64, 512) and planned.mid_dtype == "float32"
    assert split_factor(small, planned.config) == 9  # between taps: each slice a whole 3x3 tap
    assert split_factor(ConvSpec(n=1, h=7, w=7, c=2048, k=512), planned.config) == 8
    # the im2col tiles load with cp.async: no guarded element-by-element loads (`condval = x_ptr[...]`, what a
    # slice starting inside a tap's channels made)
    assert "condval" not in compiled_source(planned.kernels[:1], target)
    assert len(plan(ConvSpec(n=32, h=56, w=56, c=64, k=256), target).kernels) == 1
    if "sm_90" in nvcc_arches():
        nvcc_compile(compiled_source(planned.kernels, target), "sm_90", tmp_path)


def test_deep_split_switch_splits_only_deep_reductions_of_many_blocks(monkeypatch):
    """TVM_B2B_SPLIT_DEEP=W (an experiment until measured): DeepLabV3's ASPP 3x3 at batch 1 (104 blocks of 288 steps)
    splits between taps, as many as keep W * MIN_BLOCKS blocks of 8 steps or more; a shallow reduction (8 steps) of
    as many blocks, and every conv without the switch, stays whole; a value that is not a whole number fails naming
    the switch."""
    from tvm_b2b.schedule.cuda_conv import DEEP_SPLIT_ENV, default_config, split_factor

    aspp = ConvSpec(n=1, h=28, w=28, c=2048, k=256, kh=3, kw=3, pad_h=12, pad_w=12, dilation=12, dtype="float16")
    shallow = ConvSpec(n=1, h=28, w=28, c=512, k=2048, residual=True, dtype="float16")
    factors = {}
    for waves in ("0", "4", "8"):
        monkeypatch.setenv(DEEP_SPLIT_ENV, waves)
        factors[waves] = [split_factor(s, default_config(s, 90)) for s in (aspp, shallow)]
    assert factors == {"0": [1, 1], "4": [3, 1], "8": [9, 1]}
    monkeypatch.setenv(DEEP_SPLIT_ENV, "many")
    with pytest.raises(ValueError, match=DEEP_SPLIT_ENV):
        split_factor(aspp, default_config(aspp, 90))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [dict(n=1, h=7, w=7, c=512, k=512, kh=3, kw=3, pad_h=1, pad_w=1),
                                  dict(n=1, h=7, w=7, c=2048, k=512, residual=True, act="relu6"),
                                  dict(n=1, h=14, w=14, c=256, k=256, kh=3, kw=3, pad_h=1, pad_w=1, residual=True)],
                         ids=["7x7-3x3", "7x7-1x1-residual", "14x14-3x3-residual"])
def test_cuda_split_k_matches_reference(kind):
    spec = ConvSpec(**kind, dtype="float16")
    inputs = conv_random_inputs(spec, seed=5)
    kernel = build(spec, "cuda", db=None)
    assert len(kernel.func_names) == 2  # split-K: the partial sums, then their sum and the epilogue
    err, ok = compare(spec, kernel(**inputs), conv_reference(spec, **inputs))
    assert ok, f"max abs error {err}"


# deep reductions of large layers: the default's 128-channel tiles, two steps ahead (cuda_conv.wide_config),
# on 128- and (7x7: 1600 padded rows) 64-pixel tiles
WIDE = [dict(n=32, h=14, w=14, c=1024, k=256), dict(n=32, h=7, w=7, c=512, k=512, kh=3, kw=3, pad_h=1, pad_w=1, residual=True)]


@pytest.mark.parametrize("kind", WIDE, ids=["14x14-1x1", "7x7-3x3-residual"])
def test_cuda_wide_default_builds(mma_sync, kind, tmp_path):
    """A deep reduction of a large layer gets the wide tiles by default; a shallow one, or a small layer
    (batch 1), keeps the 64-channel tiles; nvcc compiles the wide kernel for sm_90."""
    spec, target = ConvSpec(**kind, dtype="float16"), parse_target("cuda:sm_90")
    planned = plan(spec, target)
    assert (planned.config.n1_tile, planned.config.pipeline, len(planned.kernels)) == (128, 2, 1)
    assert plan(ConvSpec(n=32, h=56, w=56, c=64, k=256, dtype="float16"), target).config.n1_tile == 64
    assert plan(ConvSpec(**{**kind, "n": 1}, dtype="float16"), target).config.n1_tile == 64
    if "sm_90" in nvcc_arches():
        nvcc_compile(compiled_source(planned.kernels, target), "sm_90", tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", WIDE, ids=["14x14-1x1", "7x7-3x3-residual"])
def test_cuda_wide_default_matches_reference(mma_sync, kind):
    _assert_computes_op(ConvSpec(**kind, dtype="float16"), "cuda")
