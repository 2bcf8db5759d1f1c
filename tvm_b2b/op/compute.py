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


# -- GEMM form with padded extents, for tensor-core schedules ---------------------------------------
def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded_extents(spec: FusedConvSpec, m_tile: int, k_tile: int = 16, n_tile: int = 16) -> dict[str, int]:
    """GEMM extents rounded up to whole tiles: rows to the M tile, channels and the reduction to
    the MMA shape. The padding is zeros, so the padded GEMMs hold the real ones exactly."""
    return {
        "m": round_up(spec.m, m_tile),
        "r": round_up(9 * spec.c, k_tile),
        "k1": round_up(spec.k1, n_tile),
        "k2": round_up(spec.k2, n_tile),
    }


def _guard(cond, value, dtype):
    return tirx.if_then_else(cond, value, tirx.const(0, dtype))


def gemm_stage1_tensors(spec: FusedConvSpec, ext: dict[str, int]):
    """x -> mid (ext m, ext k1) in GEMM form: im2col (m, r) @ w1 as (r, k1), zero-padded."""
    dt, s, c = spec.dtype, spec.stride, spec.c
    x = te.placeholder((spec.n, spec.h, spec.w, c), dt, "x")
    w1 = te.placeholder((3, 3, c, spec.k1), dt, "w1")
    s1 = te.placeholder((spec.k1,), "float32", "s1")
    b1 = te.placeholder((spec.k1,), "float32", "b1")

    def im2col_at(m, r):
        n, oh, ow = pixel(spec, m)
        ih, iw = oh * s + r // (3 * c) - 1, ow * s + r // c % 3 - 1
        inside = tirx.all(m < spec.m, r < 9 * c, ih >= 0, ih < spec.h, iw >= 0, iw < spec.w)
        return _guard(inside, x[n, ih, iw, r % c], dt)

    a1 = te.compute((ext["m"], ext["r"]), im2col_at, name="im2col")
    b1g = te.compute(
        (ext["r"], ext["k1"]),
        lambda r, k: _guard(tirx.all(r < 9 * c, k < spec.k1), w1[r // (3 * c), r // c % 3, r % c, k], dt),
        name="w1_gemm",
    )
    rr = te.reduce_axis((0, ext["r"]), "r")
    conv1 = te.compute(
        (ext["m"], ext["k1"]),
        lambda m, k: te.sum(a1[m, rr].astype("float32") * b1g[rr, k].astype("float32"), axis=[rr]),
        name="conv1",
    )
    mid = te.compute(
        (ext["m"], ext["k1"]),
        lambda m, k: _guard(k < spec.k1, activation(conv1[m, k] * s1[k] + b1[k], spec.act1).astype(dt), dt),
        name="mid",
    )
    return [x, w1, s1, b1], mid


def gemm_stage2_tensors(spec: FusedConvSpec, ext: dict[str, int], mid):
    """mid (ext m, ext k1) -> y (m, k2): mid @ w2, zero-padded."""
    dt = spec.dtype
    w2 = te.placeholder((spec.k1, spec.k2), dt, "w2")
    s2 = te.placeholder((spec.k2,), "float32", "s2")
    b2 = te.placeholder((spec.k2,), "float32", "b2")
    b2g = te.compute(
        (ext["k1"], ext["k2"]),
        lambda r, k: _guard(tirx.all(r < spec.k1, k < spec.k2), w2[r, k], dt),
        name="w2_gemm",
    )
    rk = te.reduce_axis((0, ext["k1"]), "rk")
    conv2 = te.compute(
        (ext["m"], ext["k2"]),
        lambda m, k: te.sum(mid[m, rk].astype("float32") * b2g[rk, k].astype("float32"), axis=[rk]),
        name="conv2",
    )
    # Tiles cover the padded extents (out_pad, no bounds checks); the store to y is the one step
    # that trims to the real extents, and the residual is read there, inside the bounds.
    out_pad = te.compute(
        (ext["m"], ext["k2"]),
        lambda m, k: _guard(k < spec.k2, conv2[m, k] * s2[k] + b2[k], "float32"),
        name="out_pad",
    )
    inputs = [w2, s2, b2]
    if spec.residual:
        r = te.placeholder((spec.m, spec.k2), dt, "residual")
        inputs.append(r)
        body = lambda m, k: out_pad[m, k] + r[m, k].astype("float32")  # noqa: E731
    else:
        body = lambda m, k: out_pad[m, k]  # noqa: E731
    out = te.compute((spec.m, spec.k2), lambda m, k: activation(body(m, k), spec.act2).astype(dt), name="out")
    return inputs, out


def gemm_fused_prim_func(spec: FusedConvSpec, ext: dict[str, int], name: str = "fused_conv3x3_conv1x1"):
    """The fused op in padded GEMM form; same signature as fused_prim_func."""
    in1, mid = gemm_stage1_tensors(spec, ext)
    in2, out = gemm_stage2_tensors(spec, ext, mid)
    return _prim_func(in1 + in2 + [out], name)


def gemm_unfused_prim_funcs(spec: FusedConvSpec, ext: dict[str, int], name: str = "conv"):
    """The unfused baseline in padded GEMM form: the intermediate (ext m, ext k1) goes through
    global memory between the two kernels."""
    in1, mid = gemm_stage1_tensors(spec, ext)
    mid_in = te.placeholder((ext["m"], ext["k1"]), spec.dtype, "mid")
    in2, out = gemm_stage2_tensors(spec, ext, mid_in)
    return _prim_func(in1 + [mid], f"{name}_stage1"), _prim_func([mid_in] + in2 + [out], f"{name}_stage2")
