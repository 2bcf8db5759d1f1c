"""Numpy reference of the fused op: the semantics every kernel is checked against."""
from __future__ import annotations

import numpy as np

from .activation import activation
from .spec import FusedConvSpec


def np_dtype(name: str) -> np.dtype:
    """numpy dtype for a spec dtype name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _act(v: np.ndarray, name: str) -> np.ndarray:
    return activation(name).numpy(v)


def conv_nhwc(x, w, stride: int, pad: tuple[int, int, int, int], groups: int = 1, dilation: int = 1) -> np.ndarray:
    """The convolution of x NHWC by w HWIO (kh, kw, c / groups, k) in float32, without epilogue: per
    tap, each group's window times its weights (depthwise: groups = c); tap (i, j) offset by (i, j) * dilation.
    pad: (top, left, bottom, right), as a spec's `pads`."""
    f32 = np.float32
    kh, kw, per_group, k = w.shape
    d = dilation
    top, left, bottom, right = pad
    xp = np.pad(x.astype(f32), ((0, 0), (top, bottom), (left, right), (0, 0)))
    ho, wo = (xp.shape[1] - d * (kh - 1) - 1) // stride + 1, (xp.shape[2] - d * (kw - 1) - 1) // stride + 1
    acc = np.zeros((x.shape[0], ho, wo, groups, k // groups), f32)
    for i in range(kh):
        for j in range(kw):
            window = xp[:, d * i: d * i + stride * (ho - 1) + 1: stride, d * j: d * j + stride * (wo - 1) + 1: stride, :]
            window = window.reshape(*window.shape[:3], groups, per_group)
            taps = w[i, j].astype(f32).reshape(per_group, groups, k // groups)
            acc += np.einsum("nhwgc,cgk->nhwgk", window, taps, optimize=True)
    return acc.reshape(x.shape[0], ho, wo, k)


def reference(spec: FusedConvSpec, x, w1, s1, b1, w2, s2, b2, residual=None) -> np.ndarray:
    """y (n, ho, wo, k2) in spec.dtype. Float32 math; the intermediate is rounded to spec.dtype,
    as the kernels store it."""
    f32 = np.float32
    acc1 = conv_nhwc(x, w1, spec.stride, spec.pads, spec.groups, spec.dilation)
    mid = _act(acc1 * s1.astype(f32) + b1.astype(f32), spec.act1).astype(np_dtype(spec.dtype))
    acc2 = mid.astype(f32) @ w2.astype(f32)
    pre = acc2 * s2.astype(f32) + b2.astype(f32)
    if spec.residual:
        pre = pre + residual.astype(f32)
    return _act(pre, spec.act2).astype(np_dtype(spec.dtype))


def random_inputs(spec: FusedConvSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs scaled so that activations stay O(1) at any channel count (weights ~ 1/sqrt(fan_in)),
    keeping fp16/bf16 errors comparable across shapes."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, (shape, dtype) in spec.arg_shapes().items():
        if name == "w1":
            scale = (9 * spec.c // spec.groups) ** -0.5
        elif name == "w2":
            scale = spec.k1**-0.5
        elif name in ("s1", "s2"):
            arrays[name] = rng.uniform(0.5, 1.5, shape).astype(dtype)
            continue
        elif name in ("b1", "b2"):
            scale = 0.1
        else:
            scale = 1.0
        arrays[name] = (rng.standard_normal(shape) * scale).astype(np_dtype(dtype))
    return arrays


# Allowed |kernel - reference| <= atol + rtol * |reference|, by dtype. The reference rounds the
# intermediate to dtype as the kernels do, but a different float32 summation order can flip that
# rounding by one ulp of dtype; each output then moves by about one ulp of its own.
TOLERANCES = {"float16": (1e-2, 1e-2), "bfloat16": (6e-2, 2e-2), "float32": (1e-4, 1e-4)}


def compare(spec: FusedConvSpec, got: np.ndarray, want: np.ndarray) -> tuple[float, bool]:
    """(max abs error, within tolerance) of a kernel's output against the reference."""
    atol, rtol = TOLERANCES[spec.dtype]
    got32, want32 = got.astype(np.float32), want.astype(np.float32)
    err = np.abs(got32 - want32)
    ok = bool(np.all(err <= atol + rtol * np.abs(want32))) and got.shape == want.shape
    return float(err.max(initial=0.0)), ok
