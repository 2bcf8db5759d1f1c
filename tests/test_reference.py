"""The reference itself, against a direct loop-by-loop convolution written independently."""
import numpy as np
import pytest

from tvm_b2b import FusedConvSpec
from tvm_b2b.op import compare, np_dtype, random_inputs, reference


def direct(spec, x, w1, s1, b1, w2, s2, b2, residual=None):
    act = {"relu": lambda v: max(v, 0.0), "relu6": lambda v: min(max(v, 0.0), 6.0), "none": lambda v: v}
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    x, w1, w2 = f(x), f(w1), f(w2)
    y = np.zeros(spec.out_shape)
    for n in range(spec.n):
        for oh in range(spec.ho):
            for ow in range(spec.wo):
                mid = np.zeros(spec.k1)
                for rh in range(3):
                    for rw in range(3):
                        ih, iw = oh * spec.stride + rh - 1, ow * spec.stride + rw - 1
                        if 0 <= ih < spec.h and 0 <= iw < spec.w:
                            mid += x[n, ih, iw] @ w1[rh, rw]
                mid = np.array([act[spec.act1](v) for v in mid * s1 + b1])
                mid = mid.astype(np_dtype(spec.dtype)).astype(np.float64)
                out = mid @ w2 * s2 + b2
                if spec.residual:
                    out += f(residual[n, oh, ow])
                y[n, oh, ow] = [act[spec.act2](v) for v in out]
    return y


@pytest.mark.parametrize(
    "spec",
    [
        FusedConvSpec(n=2, h=5, w=4, c=3, k1=4, k2=5, stride=1, act1="relu", act2="relu6", residual=True, dtype="float32"),
        FusedConvSpec(n=1, h=7, w=6, c=2, k1=3, k2=2, stride=2, act1="relu6", act2="none", dtype="float16"),
        FusedConvSpec(n=1, h=3, w=5, c=4, k1=2, k2=3, stride=2, act1="none", act2="relu", residual=True, dtype="bfloat16"),
    ],
    ids=lambda s: s.to_string(),
)
def test_reference_matches_direct_convolution(spec):
    inputs = random_inputs(spec, seed=1)
    err, ok = compare(spec, reference(spec, **inputs), direct(spec, **inputs).astype(np_dtype(spec.dtype)))
    assert ok, err


def test_compare_catches_a_wrong_output():
    spec = FusedConvSpec(n=1, h=4, w=4, c=2, k1=2, k2=2, dtype="float16")
    want = reference(spec, **random_inputs(spec))
    wrong = want.copy()
    wrong[0, 1, 2, 1] += np.float16(0.25)
    assert compare(spec, want, want)[1]
    assert not compare(spec, wrong, want)[1]
