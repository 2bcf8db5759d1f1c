"""The ops TVM legalizes in a model's CUDA build, with our rules (schedule.LEGALIZED_RULES): max pools in
NHWC float16 with 16-byte (8-channel) loads and register accumulators (cuda_pool); the NCHW float32
input made into the stem's float16 cells, a row per block through shared memory (cuda_layout).
Build-only with nvcc here, against numpy on a GPU (exact: a max of float16 values is one of them; a cast
is the same rounding)."""
import numpy as np
import pytest
from tvm import relax

from cuda_source import kernels, nvcc_arches, nvcc_compile
from tvm_b2b.codegen import compile_module, generated_source
from tvm_b2b.op.conv import ConvSpec, InputForm
from tvm_b2b.op.conv_pattern import input_in_form
from tvm_b2b.schedule import cuda_layout, legalized_rules
from tvm_b2b.schedule.cuda_pool import RULE
from tvm_b2b.target import parse_target

CASES = [((2, 112, 112, 64), 3, 2, 1), ((1, 15, 13, 24), 3, 2, 1), ((1, 9, 9, 12), 2, 1, 0), ((1, 8, 8, 3), 3, 1, 1)]


def max_pool_module(shape, size, stride, pad):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.max_pool2d(x, size, stride, pad, layout="NHWC"))
        bb.emit_func_output(y)
    return bb.get()


def numpy_max_pool(x, size, stride, pad):
    n, h, w, c = x.shape
    padded = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0)], constant_values=-np.inf)
    ho, wo = (h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1
    taps = [padded[:, i:i + stride * ho:stride, j:j + stride * wo:stride] for i in range(size) for j in range(size)]
    return np.max(taps, axis=0)


def test_max_pool_loads_8_channels_per_tap_and_compiles(tmp_path):
    """64 channels: one 16-byte load per window tap and thread, the accumulators in registers (no global
    store inside the window loops); 3 channels: not taken (TVM's own schedule). nvcc sm_90 compiles both."""
    target = parse_target("cuda:sm_90")
    source = generated_source(compile_module(max_pool_module(*CASES[0]), target, rules=[RULE]), target)
    body = source[source.index("max_pool2d_kernel(half"):]
    assert "*(uint4*)(x_ptr" in body and "pool_max_local_ptr" in body
    odd = max_pool_module(*CASES[-1])
    legalized = relax.transform.LegalizeOps()(odd)
    assert RULE.apply(legalized["max_pool2d"], target, False) is None
    assert RULE.apply(relax.transform.LegalizeOps()(max_pool_module(*CASES[0]))["max_pool2d"], target, False) is not None
    assert RULE in legalized_rules(target) and not legalized_rules(parse_target("llvm"))
    if "sm_90" in nvcc_arches():
        nvcc_compile(source, "sm_90", tmp_path)
        nvcc_compile(generated_source(compile_module(odd, target, rules=[RULE]), target), "sm_90", tmp_path)
    assert len(kernels(source)) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[f"{s[1]}x{s[2]}x{s[3]}-k{k}s{st}p{p}" for s, k, st, p in CASES])
def test_max_pool_matches_numpy(case):
    import tvm

    target = parse_target("cuda")
    vm = relax.VirtualMachine(compile_module(max_pool_module(*case), target, rules=[RULE]), tvm.cuda(0))
    x = np.random.default_rng(0).standard_normal(case[0]).astype("float16")
    got = vm["main"](tvm.runtime.tensor(x, tvm.cuda(0))).numpy()
    np.testing.assert_array_equal(got, numpy_max_pool(x, *case[1:]))


STEMS = [ConvSpec(n=2, h=224, w=224, c=3, k=64, kh=7, kw=7, stride=2, pad_h=3, pad_w=3),  # ResNet's
         ConvSpec(n=1, h=33, w=31, c=3, k=32, kh=3, kw=3, stride=2, pad_h=1, pad_w=1)]  # MobileNetV2's, odd sizes


def stem_input_module(spec):
    """NCHW float32 -> NHWC float16 -> the stem's cells (InputForm(cells=True)), as a model's build has it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((spec.n, spec.c, spec.h, spec.w), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.astype(bb.emit(relax.op.permute_dims(x, [0, 2, 3, 1])), "float16"))
            y = bb.emit_output(input_in_form(InputForm(cells=True), spec, y, bb.emit))
        bb.emit_func_output(y)
    return bb.get()


def test_stem_input_goes_through_a_shared_row_and_compiles(tmp_path):
    """The stem's input cells: one output row per block, written to shared memory a pixel per thread (its
    12 channels), then stored as contiguous 8-byte vectors; nvcc sm_90 compiles it. The rule leaves pools
    (3 and 64 channels) to others."""
    target = parse_target("cuda:sm_90")
    source = generated_source(compile_module(stem_input_module(STEMS[0]), target, rules=legalized_rules(target)), target)
    assert len(kernels(source)) == 1
    body = source[source.index("__global__"):]
    assert "__shared__" in body and "__syncthreads()" in body and "*(half4*)(" in body
    assert cuda_layout.RULE in legalized_rules(target)
    for module in (max_pool_module(*CASES[-1]), max_pool_module(*CASES[0])):
        legalized = relax.transform.LegalizeOps()(module)
        assert cuda_layout.RULE.apply(legalized["max_pool2d"], target, False) is None
    if "sm_90" in nvcc_arches():
        nvcc_compile(source, "sm_90", tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", STEMS, ids=["resnet", "mobilenet-odd"])
def test_stem_input_matches_numpy(spec):
    import tvm

    target = parse_target("cuda")
    vm = relax.VirtualMachine(compile_module(stem_input_module(spec), target, rules=legalized_rules(target)), tvm.cuda(0))
    x = np.random.default_rng(0).standard_normal((spec.n, spec.c, spec.h, spec.w)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x, tvm.cuda(0))).numpy()
    want = InputForm(cells=True).x(spec, x.transpose(0, 2, 3, 1).astype("float16"))
    np.testing.assert_array_equal(got, want)
