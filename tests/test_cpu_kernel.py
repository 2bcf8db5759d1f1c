"""The CPU (llvm) kernel, fused and unfused, against the numpy reference.

Tolerance (tvm_b2b.op.TOLERANCES): |y - ref| <= atol + rtol * |ref| with (atol, rtol) =
(1e-2, 1e-2) for float16, (6e-2, 2e-2) for bfloat16, (1e-4, 1e-4) for float32; inputs are
scaled so that outputs are O(1) (random_inputs).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_b2b import FusedConvSpec, build
from tvm_b2b.op import ACTIVATIONS, compare, random_inputs, reference

GRID = [
    FusedConvSpec(n=1, h=7, w=7, c=8, k1=16, k2=32, stride=1, act1="relu", act2="relu", dtype="float16"),
    FusedConvSpec(n=2, h=13, w=13, c=12, k1=20, k2=24, stride=2, act1="relu6", act2="none", residual=True, dtype="float16"),
    FusedConvSpec(n=1, h=15, w=15, c=3, k1=5, k2=7, stride=1, act1="none", act2="relu6", dtype="float32"),
    FusedConvSpec(n=3, h=15, w=7, c=16, k1=24, k2=40, stride=2, act1="relu", act2="relu", residual=True, dtype="float32"),
    FusedConvSpec(n=1, h=14, w=14, c=64, k1=64, k2=256, stride=1, act1="relu", act2="relu", residual=True, dtype="float16"),
    FusedConvSpec(n=2, h=9, w=11, c=10, k1=18, k2=33, stride=1, act1="relu6", act2="relu", residual=True, dtype="bfloat16"),
    FusedConvSpec(n=1, h=1, w=1, c=1, k1=1, k2=1, stride=2, act1="none", act2="none", dtype="float16"),
]


def check(spec, fused=True, seed=0):
    inputs = random_inputs(spec, seed=seed)
    kernel = build(spec, "llvm", fused=fused)
    assert kernel.fused is fused
    got = kernel(**inputs)
    assert got.shape == spec.out_shape
    err, ok = compare(spec, got, reference(spec, **inputs))
    assert ok, f"{spec.to_string()} fused={fused}: max abs error {err}"


@pytest.mark.parametrize("spec", GRID, ids=lambda s: s.to_string())
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_cpu_kernel_matches_reference(spec, fused):
    check(spec, fused)


sizes = st.integers(min_value=1, max_value=12)
channels = st.integers(min_value=1, max_value=40)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 3), h=sizes, w=sizes, c=channels, k1=channels, k2=channels, stride=st.sampled_from([1, 2]),
    act1=st.sampled_from(ACTIVATIONS), act2=st.sampled_from(ACTIVATIONS), residual=st.booleans(),
    dtype=st.sampled_from(["float16", "float32", "bfloat16"]), seed=st.integers(0, 2**16),
)
def test_cpu_kernel_random_specs(n, h, w, c, k1, k2, stride, act1, act2, residual, dtype, seed):
    spec = FusedConvSpec(n=n, h=h, w=w, c=c, k1=k1, k2=k2, stride=stride, act1=act1, act2=act2, residual=residual, dtype=dtype)
    check(spec, seed=seed)


def test_fused_kernel_is_one_function():
    spec = GRID[0]
    assert build(spec, "llvm").func_names == ["fused_conv3x3_conv1x1"]
    assert len(build(spec, "llvm", fused=False).func_names) == 2


# -- arguments checked at call time ---------------------------------------------------------------
SPEC = FusedConvSpec(n=1, h=5, w=5, c=4, k1=8, k2=8, residual=True, dtype="float16")


@pytest.fixture(scope="module")
def kernel():
    return build(SPEC, "llvm")


@pytest.mark.parametrize(
    "name, bad, message",
    [
        ("x", np.zeros((1, 5, 5, 3), np.float16), r"x: expected shape \(1, 5, 5, 4\)"),
        ("w1", np.zeros((3, 3, 4, 8), np.float32), "w1: expected dtype float16"),
        ("s2", np.zeros((7,), np.float32), r"s2: expected shape \(8,\)"),
        ("residual", np.zeros((1, 5, 5, 8), np.float32), "residual: expected dtype float16"),
        ("b1", [0.0] * 8, "b1: expected a numpy array"),
    ],
)
def test_wrong_arguments_name_the_argument(kernel, name, bad, message):
    inputs = random_inputs(SPEC)
    inputs[name] = bad
    with pytest.raises(ValueError, match=message):
        kernel(**inputs)


def test_missing_residual_is_an_error(kernel):
    inputs = random_inputs(SPEC)
    del inputs["residual"]
    with pytest.raises(ValueError, match="residual: .*required"):
        kernel(**inputs)


def test_unknown_target_is_an_error():
    with pytest.raises(ValueError, match="target:"):
        build(SPEC, "opencl-ish")
