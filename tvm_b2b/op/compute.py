"""Tensor-expression definition of the fused op, written as two implicit GEMMs.

Both convolutions index their rows by m = (n * ho + oh) * wo + ow, the output pixel. Every
schedule tiles m, so writing the op in that form keeps each block's iteration space a plain
rectangle (an NHWC-indexed epilogue inside an m tile is not). The output and the residual are
therefore (m, k2) buffers: the same memory as NHWC (n, ho, wo, k2), reshaped for free by the caller.

Block names are the schedules' contract: pad, conv1, mid, conv2, out.
"""
from __future__ import annotations

from tvm import te, tirx

from .spec import FusedConvSpec

BLOCKS = ("pad", "conv1", "mid", "conv2", "out")


def activation(value, name: str):
    """act(value) on a float32 expression."""
    zero = tirx.const(0.0, "float32")
    if name == "relu":
        return te.max(value, zero)
    if name == "relu6":
        return te.min(te.max(value, zero), tirx.const(6.0, "float32"))
    if name == "none":
        return value
    raise ValueError(f"activation: unknown {name!r}")


def pixel(spec: FusedConvSpec, m):
    """(n, oh, ow) of GEMM row m."""
    return m // (spec.ho * spec.wo), m // spec.wo % spec.ho, m % spec.wo


def stage1_tensors(spec: FusedConvSpec, x=None):
    """x -> mid: the 3x3 conv with s1/b1/act1, as an (m, k1) tensor in `spec.dtype`."""
    dt, s = spec.dtype, spec.stride
    if x is None:
        x = te.placeholder((spec.n, spec.h, spec.w, spec.c), dt, "x")
    w1 = te.placeholder((3, 3, spec.c, spec.k1), dt, "w1")
    s1 = te.placeholder((spec.k1,), "float32", "s1")
    b1 = te.placeholder((spec.k1,), "float32", "b1")
    pad = te.compute(
        (spec.n, spec.h + 2, spec.w + 2, spec.c),
        lambda n, h, w, c: tirx.if_then_else(
            tirx.all(h >= 1, h <= spec.h, w >= 1, w <= spec.w), x[n, h - 1, w - 1, c], tirx.const(0, dt)
        ),
        name="pad",
    )
    rh = te.reduce_axis((0, 3), "rh")
    rw = te.reduce_axis((0, 3), "rw")
    rc = te.reduce_axis((0, spec.c), "rc")

    def conv1_at(m, k):
        n, oh, ow = pixel(spec, m)
        a = pad[n, oh * s + rh, ow * s + rw, rc].astype("float32")
        return te.sum(a * w1[rh, rw, rc, k].astype("float32"), axis=[rh, rw, rc])

    conv1 = te.compute((spec.m, spec.k1), conv1_at, name="conv1")
    mid = te.compute(
        (spec.m, spec.k1),
        lambda m, k: activation(conv1[m, k] * s1[k] + b1[k], spec.act1).astype(dt),
        name="mid",
    )
    return [x, w1, s1, b1], mid


def stage2_tensors(spec: FusedConvSpec, mid=None):
    """mid -> y: the 1x1 conv with s2/b2/[+residual]/act2, as an (m, k2) tensor."""
    dt = spec.dtype
    if mid is None:
        mid = te.placeholder((spec.m, spec.k1), dt, "mid")
    w2 = te.placeholder((spec.k1, spec.k2), dt, "w2")
    s2 = te.placeholder((spec.k2,), "float32", "s2")
    b2 = te.placeholder((spec.k2,), "float32", "b2")
    rk = te.reduce_axis((0, spec.k1), "rk")
    conv2 = te.compute(
        (spec.m, spec.k2),
        lambda m, k: te.sum(mid[m, rk].astype("float32") * w2[rk, k].astype("float32"), axis=[rk]),
        name="conv2",
    )
    inputs = [w2, s2, b2]
    if spec.residual:
        r = te.placeholder((spec.m, spec.k2), dt, "residual")
        inputs.append(r)
        body = lambda m, k: conv2[m, k] * s2[k] + b2[k] + r[m, k].astype("float32")  # noqa: E731
    else:
        body = lambda m, k: conv2[m, k] * s2[k] + b2[k]  # noqa: E731
    out = te.compute((spec.m, spec.k2), lambda m, k: activation(body(m, k), spec.act2).astype(dt), name="out")
    return inputs, out


def _prim_func(tensors, name: str):
    return te.create_prim_func(tensors).with_attr("global_symbol", name)


def fused_prim_func(spec: FusedConvSpec, name: str = "fused_conv3x3_conv1x1"):
    """The whole op as one PrimFunc: (x, w1, s1, b1, w2, s2, b2, [residual], y)."""
    in1, mid = stage1_tensors(spec)
    in2, out = stage2_tensors(spec, mid)
    return _prim_func(in1 + in2 + [out], name)


def unfused_prim_funcs(spec: FusedConvSpec, name: str = "conv"):
    """The same op as two PrimFuncs whose intermediate goes through global memory:
    (x, w1, s1, b1, mid) and (mid, w2, s2, b2, [residual], y). The unfused baseline."""
    in1, mid = stage1_tensors(spec)
    mid_in = te.placeholder((spec.m, spec.k1), spec.dtype, "mid")
    in2, out = stage2_tensors(spec, mid_in)
    return _prim_func(in1 + [mid], f"{name}_stage1"), _prim_func([mid_in] + in2 + [out], f"{name}_stage2")
