"""Tensor-expression definition of the fused op, written as two implicit GEMMs.

Both convolutions index their rows by m = (n * ho + oh) * wo + ow, the output pixel. Every
schedule tiles m, so writing the op in that form keeps each block's iteration space a plain
rectangle (an NHWC-indexed epilogue inside an m tile is not). The output and the residual are
therefore (m, k2) buffers: the same memory as NHWC (n, ho, wo, k2), reshaped for free by the caller.

Block names are the schedules' contract: pad, conv1, mid, conv2, out; the padded GEMM form for
tensor cores adds im2col, w1_gemm, w2_gemm and out_pad (and has no pad); its grouped form xcol instead of im2col.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

from .activation import activation as act
from .conv import dilated, direct_conv, group_channel, guard, kc_weights, pixel, vector_lanes
from .conv_spec import ConvSpec
from .spec import FusedConvSpec

def activation(value, name: str):
    """act(value) on a float32 expression (op.activation's table)."""
    return act(name).te(value)


def _placeholders(spec: FusedConvSpec, *names: str) -> list:
    """The op's inputs by name (spec.arg_shapes), the residual as its (m, k2) GEMM view."""
    shapes = spec.arg_shapes()
    shapes["residual"] = ((spec.m, spec.k2), spec.dtype)
    return [te.placeholder(shapes[name][0], shapes[name][1], name) for name in names]


def _matmul(a, b, rows: int, cols: int, depth: int, name: str):
    """a (rows, depth) @ b (depth, cols), accumulated in float32."""
    r = te.reduce_axis((0, depth), "r")
    return te.compute(
        (rows, cols), lambda m, k: te.sum(a[m, r].astype("float32") * b[r, k].astype("float32"), axis=[r]), name=name
    )


def _output(spec: FusedConvSpec, pre):
    """y (m, k2) = act2(pre(m, k) [+ residual]) in spec.dtype, pre being float32: the one place
    that reads the residual and trims to the real extents. Returns (its extra inputs, y)."""
    extra = _placeholders(spec, "residual") if spec.residual else []
    if extra:
        body = lambda m, k: pre(m, k) + extra[0][m, k].astype("float32")  # noqa: E731
    else:
        body = pre
    out = te.compute((spec.m, spec.k2), lambda m, k: activation(body(m, k), spec.act2).astype(spec.dtype), name="out")
    return extra, out


@dataclass(frozen=True)
class PairForm:
    """How a pair's kernel takes its weights when not as given (the Hopper kernel's: `weights` "kc", w1 as
    (k1, 9*c) and w2 as (k2, k1), each output channel's weights in one row, K-major as wgmma reads them;
    constants in a model, so free at run time). x and the spec stay the op's."""

    weights: str = "kc"

    def spec(self, spec: FusedConvSpec) -> FusedConvSpec:
        return spec

    def arrays(self, spec: FusedConvSpec, arrays: dict) -> dict:
        return {**arrays, "w1": kc_weights(arrays["w1"]), "w2": kc_weights(arrays["w2"])}


def conv3x3_spec(spec: FusedConvSpec) -> ConvSpec:
    """The pair's 3x3 as a single conv (op kind conv2d) with s1/b1/act1, padded as the pair pads it."""
    top, left, bottom, right = spec.pads
    return ConvSpec(n=spec.n, h=spec.h, w=spec.w, c=spec.c, k=spec.k1, kh=3, kw=3, stride=spec.stride, pad_h=top,
                    pad_w=left, act=spec.act1, dtype=spec.dtype, groups=spec.groups, dilation=spec.dilation,
                    pad_bottom=bottom, pad_right=right)


def stage1_tensors(spec: FusedConvSpec, ext: dict[str, int] | None = None):
    """x -> mid: the 3x3 conv with s1/b1/act1 in spec.dtype, (m, k1), or in padded GEMM form
    (ext m, ext k1) when `ext` is given (see padded_extents)."""
    x, w1, s1, b1 = inputs = _placeholders(spec, "x", "w1", "s1", "b1")
    if ext is not None:
        form = _grouped_stage1 if spec.groups > 1 else _gemm_stage1
        return inputs, form(spec, ext, x, w1, s1, b1)
    conv1 = direct_conv(conv3x3_spec(spec), x, w1, "conv1")
    mid = te.compute(
        (spec.m, spec.k1),
        lambda m, k: activation(conv1[m, k] * s1[k] + b1[k], spec.act1).astype(spec.dtype),
        name="mid",
    )
    return inputs, mid


def stage2_tensors(spec: FusedConvSpec, mid, ext: dict[str, int] | None = None):
    """mid -> y (m, k2): the 1x1 conv with s2/b2/[+residual]/act2; padded GEMM form with `ext`."""
    w2, s2, b2 = inputs = _placeholders(spec, "w2", "s2", "b2")
    if ext is None:
        conv2 = _matmul(mid, w2, spec.m, spec.k2, spec.k1, "conv2")
        extra, out = _output(spec, lambda m, k: conv2[m, k] * s2[k] + b2[k])
    else:
        extra, out = _gemm_stage2(spec, ext, mid, w2, s2, b2)
    return inputs + extra, out


def _prim_func(tensors, name: str):
    return te.create_prim_func(tensors).with_attr("global_symbol", name)


def fused_prim_func(spec: FusedConvSpec, ext: dict[str, int] | None = None, name: str = "fused_conv3x3_conv1x1"):
    """The whole op as one PrimFunc: (x, w1, s1, b1, w2, s2, b2, [residual], y); in padded GEMM
    form when `ext` is given."""
    in1, mid = stage1_tensors(spec, ext)
    in2, out = stage2_tensors(spec, mid, ext)
    return _prim_func(in1 + in2 + [out], name)


def unfused_prim_funcs(spec: FusedConvSpec, ext: dict[str, int] | None = None, name: str = "conv"):
    """The same op as two PrimFuncs whose intermediate goes through global memory:
    (x, w1, s1, b1, mid) and (mid, w2, s2, b2, [residual], y). The unfused baseline."""
    in1, mid = stage1_tensors(spec, ext)
    mid_in = te.placeholder(mid.shape, spec.dtype, "mid")
    in2, out = stage2_tensors(spec, mid_in, ext)
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


def _gemm_stage1(spec: FusedConvSpec, ext: dict[str, int], x, w1, s1, b1):
    """mid (ext m, ext k1) = act1(im2col(x) (m, r) @ w1 as (r, k1) * s1 + b1), zero-padded."""
    dt, s, c = spec.dtype, spec.stride, spec.c

    def im2col_at(m, r):
        n, oh, ow = pixel(spec, m)
        top, left = spec.pads[:2]
        ih = oh * s + dilated(spec, r // (3 * c)) - top  # tap row r // 3c, dilated, less the top padding
        iw = ow * s + dilated(spec, r // c % 3) - left
        inside = tirx.all(m < spec.m, r < 9 * c, ih >= 0, ih < spec.h, iw >= 0, iw < spec.w)
        return guard(inside, x[n, ih, iw, r % c], dt)

    a1 = te.compute((ext["m"], ext["r"]), im2col_at, name="im2col")
    b1g = te.compute(
        (ext["r"], ext["k1"]),
        lambda r, k: guard(tirx.all(r < 9 * c, k < spec.k1), w1[r // (3 * c), r // c % 3, r % c, k], dt),
        name="w1_gemm",
    )
    conv1 = _matmul(a1, b1g, ext["m"], ext["k1"], ext["r"], "conv1")
    return te.compute(
        (ext["m"], ext["k1"]),
        lambda m, k: guard(k < spec.k1, activation(conv1[m, k] * s1[k] + b1[k], spec.act1).astype(dt), dt),
        name="mid",
    )


def channel_lanes(spec: FusedConvSpec) -> int:
    """Channels a thread computes at once in a grouped 3x3 (8 where k1 allows: two 8-byte vectors of fp16)."""
    return vector_lanes(spec.k1, 8)


def _grouped_stage1(spec: FusedConvSpec, ext: dict[str, int], x, w1, s1, b1):
    """mid (ext m, ext k1) = act1(grouped 3x3 conv(x) * s1 + b1), zero-padded: a direct convolution
    (no GEMM: each output channel reads its group's c / groups input channels) of `xcol`, the input
    each output channel reads at each tap (m, 3, 3, c / groups, ext k1; zero where the window leaves
    the image): a schedule inlines it (x read directly) or stages its tile in shared memory. Guards test
    whole vectors of channel_lanes channels (k // lanes), so that a thread's vector of channels loads as one."""
    dt, s, lanes, per_group = spec.dtype, spec.stride, channel_lanes(spec), spec.c // spec.groups
    real = lambda m, k: tirx.all(m < spec.m, k // lanes < spec.k1 // lanes)  # noqa: E731

    def xcol_at(m, th, tw, rc, k):
        n, oh, ow = pixel(spec, m)
        top, left = spec.pads[:2]
        ih, iw = oh * s + dilated(spec, th) - top, ow * s + dilated(spec, tw) - left
        inside = tirx.all(real(m, k), ih >= 0, ih < spec.h, iw >= 0, iw < spec.w)
        return guard(inside, x[n, ih, iw, group_channel(k, rc, spec.groups, spec.c, spec.k1)], dt)

    xcol = te.compute((ext["m"], 3, 3, per_group, ext["k1"]), xcol_at, name="xcol")
    rh, rw = te.reduce_axis((0, 3), "rh"), te.reduce_axis((0, 3), "rw")
    rc = te.reduce_axis((0, per_group), "rc")

    def conv1_at(m, k):
        b = guard(real(m, k), w1[rh, rw, rc, k], dt)
        return te.sum(xcol[m, rh, rw, rc, k].astype("float32") * b.astype("float32"), axis=[rh, rw, rc])

    conv1 = te.compute((ext["m"], ext["k1"]), conv1_at, name="conv1")
    return te.compute(
        (ext["m"], ext["k1"]),
        lambda m, k: guard(k // lanes < spec.k1 // lanes, activation(conv1[m, k] * s1[k] + b1[k], spec.act1).astype(dt), dt),
        name="mid",
    )


def _gemm_stage2(spec: FusedConvSpec, ext: dict[str, int], mid, w2, s2, b2):
    """y from mid (ext m, ext k1) @ w2 zero-padded to (ext k1, ext k2)."""
    b2g = te.compute(
        (ext["k1"], ext["k2"]),
        lambda r, k: guard(tirx.all(r < spec.k1, k < spec.k2), w2[r, k], spec.dtype),
        name="w2_gemm",
    )
    conv2 = _matmul(mid, b2g, ext["m"], ext["k2"], ext["k1"], "conv2")
    # Tiles cover the padded extents (out_pad, no bounds checks); the store to y trims.
    out_pad = te.compute(
        (ext["m"], ext["k2"]),
        lambda m, k: guard(k < spec.k2, conv2[m, k] * s2[k] + b2[k], "float32"),
        name="out_pad",
    )
    return _output(spec, lambda m, k: out_pad[m, k])
