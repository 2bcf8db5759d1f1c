"""The single convolution's TE definition (plain, and the padded GEMM form tensor cores take) and
numpy reference; its spec is op/conv_spec.py."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from .activation import activation
from .conv_spec import OP_KIND, ConvSpec
from .reference import conv_nhwc, np_dtype

__all__ = ["OP_KIND", "ConvSpec", "InputForm", "conv_prim_func", "conv_reference", "conv_random_inputs",
           "padded_conv_extents", "space_to_depth", "split_prim_funcs"]


# -- TE definition ----------------------------------------------------------------------------------
def vector_lanes(extent: int, widest: int = 16) -> int:
    """The widest power-of-two vector <= `widest` that divides `extent` (1 when it is odd): the
    vectorized loop then needs no tail predicate."""
    lanes = widest
    while lanes > 1 and extent % lanes:
        lanes //= 2
    return lanes


def pad_channels(array: np.ndarray, extra: int, axis: int) -> np.ndarray:
    """`array` with `extra` zero channels appended on `axis`: what a kernel that takes more input
    channels than the spec (a 3-channel stem as 4, for 8-byte loads) is given for x (axis 3, NHWC) and
    w (axis 2, HWIO); zeros add nothing to the conv."""
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, extra)
    return np.pad(array, widths)


# -- the input as a kernel takes it ------------------------------------------------------------------
def cell_grid(spec: ConvSpec) -> tuple[int, int, int, int]:
    """(kernel rows, kernel columns, cell rows, cell columns) of space_to_depth(spec): the kernel in
    whole stride x stride cells, and the cells the output reads (ho + kernel rows - 1, ...)."""
    s = spec.stride
    kh, kw = -(-spec.kh // s), -(-spec.kw // s)
    return kh, kw, spec.ho + kh - 1, spec.wo + kw - 1


def cell_padding(spec: ConvSpec) -> tuple[int, int]:
    """(rows, columns) of zeros to add below and right of the input, after its own padding, so that
    it is whole cells (space_to_depth); negative: that many rows or columns no output reads, to cut."""
    _, _, rows, cols = cell_grid(spec)
    return spec.stride * rows - spec.h - spec.pad_h, spec.stride * cols - spec.w - spec.pad_w


def stem(spec: ConvSpec) -> bool:
    """A dense strided conv of fewer than 8 channels (a network's stem): the kernels take it as its space-to-depth
    conv (space_to_depth), whose cells have stride x stride times the channels. (A dilated one's taps are not
    whole cells, nor is a grouped one's cell a group: they run as they are.)"""
    return spec.stride > 1 and spec.c < 8 and spec.dilation == 1 and spec.groups == 1


def space_to_depth(spec: ConvSpec) -> ConvSpec:
    """The stride-1 conv that computes the strided conv `spec` on its zero-padded input cut into
    stride x stride pixel cells, each cell's pixels as channels (space-to-depth, as MLPerf's ResNet
    stems): a 7x7 stride-2 conv of 3 channels is a 4x4 conv of 12, its reduction 192 deep instead of
    147 gathered pixel by pixel (InputForm makes x and w)."""
    kh, kw, rows, cols = cell_grid(spec)
    s = spec.stride
    return dataclasses.replace(spec, h=rows, w=cols, c=spec.c * s * s, kh=kh, kw=kw, stride=1, pad_h=0, pad_w=0,
                               pad_bottom=None, pad_right=None)


@dataclass(frozen=True)
class InputForm:
    """How a kernel takes a conv's x and w when not as the spec gives them: with `cells`, as
    space_to_depth(spec)'s; then with `channels` more channels than that, zeros appended (wider
    vector loads). The transforms of x are injective (a model fuses them into the op that makes x).
    `weights` "kc": w as (k, kh*kw*c), each output channel's weights contiguous (the Hopper kernel's K-major
    operand; a model's weights are constants, so this costs nothing at run time)."""

    cells: bool = False
    channels: int | None = None
    weights: str = "hwio"
    groups: int | None = None  # a grouped conv's groups as the kernel takes them: every groups_merged consecutive ones as one

    def spec(self, spec: ConvSpec) -> ConvSpec:
        """The conv the kernel computes."""
        spec = space_to_depth(spec) if self.cells else spec
        spec = dataclasses.replace(spec, groups=self.groups) if self.groups else spec
        return dataclasses.replace(spec, c=self.channels) if self.channels else spec

    def arrays(self, spec: ConvSpec, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The op's numpy inputs as the kernel takes them."""
        return {**arrays, "x": self.x(spec, arrays["x"]), "w": self.w(spec, arrays["w"])}

    def x(self, spec: ConvSpec, x: np.ndarray) -> np.ndarray:
        """x (n, h, w, c) as the kernel takes it."""
        if self.cells:
            s, (_, _, rows, cols), (bottom, right) = spec.stride, cell_grid(spec), cell_padding(spec)
            x = np.pad(x, [(0, 0), (spec.pad_h, max(0, bottom)), (spec.pad_w, max(0, right)), (0, 0)])[:, :s * rows, :s * cols]
            x = x.reshape(spec.n, rows, s, cols, s, spec.c).transpose(0, 1, 3, 2, 4, 5).reshape(spec.n, rows, cols, -1)
        return pad_channels(x, self.spec(spec).c - x.shape[3], 3)

    def w(self, spec: ConvSpec, w: np.ndarray) -> np.ndarray:
        """w (kh, kw, c, k) as the kernel takes it (zero taps fill the last cells; (k, kh*kw*c) with weights="kc")."""
        if self.cells:
            s, (kh, kw, _, _) = spec.stride, cell_grid(spec)
            w = np.pad(w, [(0, s * kh - spec.kh), (0, s * kw - spec.kw), (0, 0), (0, 0)])
            w = w.reshape(kh, s, kw, s, spec.c, spec.k).transpose(0, 2, 1, 3, 4, 5).reshape(kh, kw, -1, spec.k)
        if self.groups:
            w = merged_group_weights(w, spec.groups, spec.groups // self.groups)
        if self.channels:
            w = pad_channels(w, self.channels - w.shape[2], 2)
        return kc_weights(w) if self.weights == "kc" else w


def merged_group_weights(w: np.ndarray, groups: int, merged: int) -> np.ndarray:
    """A grouped conv's w (kh, kw, c / groups, k) as that of `merged` times fewer groups (kh, kw, merged c / groups, k):
    each merged group's weights block-diagonal, zero where an output channel would read another group's inputs (the
    same conv, `merged` times the multiply-adds: tensor cores take a group of 4 or 8 channels as one of 16)."""
    kh, kw, per_group, k = w.shape
    out_per_group = k // groups
    out = np.zeros((kh, kw, per_group * merged, k), w.dtype)
    for g in range(groups):
        rows, cols = slice(g % merged * per_group, (g % merged + 1) * per_group), slice(g * out_per_group, (g + 1) * out_per_group)
        out[:, :, rows, cols] = w[:, :, :, cols]
    return out


def kc_weights(w: np.ndarray) -> np.ndarray:
    """Weights (..., k) as (k, the rest): each output channel's weights in one contiguous row (HWIO's taps then
    channels), a K-major GEMM operand."""
    return np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T)


def pixel(spec, m):
    """(n, oh, ow) of GEMM row m (any op kind's spec: n, ho, wo)."""
    return m // (spec.ho * spec.wo), m // spec.wo % spec.ho, m % spec.wo


def _tap(spec: ConvSpec, r):
    """(row tap, column tap, channel) of reduction index r (HWIO order: channels fastest)."""
    return r // (spec.kw * spec.c), r // spec.c % spec.kw, r % spec.c


def dilated(spec: ConvSpec, tap):
    """The input offset of kernel tap `tap`: tap * dilation, the expression itself while the dilation is 1 (so that
    an undilated conv's PrimFunc, and with it its tuning records' workload, is what it was before dilation)."""
    return tap * spec.dilation if spec.dilation > 1 else tap


def guard(cond, value, dtype):
    """value where cond holds, else zero of dtype."""
    return tirx.if_then_else(cond, value, tirx.const(0, dtype))


def group_channel(k, rc, groups: int, in_channels: int, out_channels: int):
    """The input channel that reduction index rc (< c / groups) of output channel k reads: rc itself in
    a dense conv (the expression unchanged, and with it the workloads of existing tuning records)."""
    if groups == 1:
        return rc
    return k // (out_channels // groups) * (in_channels // groups) + rc


def _inputs(spec: ConvSpec):
    shapes = spec.arg_shapes()
    inputs = [te.placeholder(shapes[name][0], shapes[name][1], name) for name in ("x", "w", "s", "b")]
    if spec.residual:  # as its (m, k) GEMM view, like the output
        inputs.append(te.placeholder((spec.m, spec.k), spec.dtype, "residual"))
    return inputs


def _output(spec: ConvSpec, inputs, pre):
    """y (m, k) = act(pre(m, k) [+ residual]) in spec.dtype, pre being float32; inputs: the op's, the
    residual last when the spec has one."""
    if spec.residual:
        res = inputs[-1]
        body = lambda m, k: pre(m, k) + res[m, k].astype("float32")  # noqa: E731
    else:
        body = pre
    return te.compute((spec.m, spec.k), lambda m, k: activation(spec.act).te(body(m, k)).astype(spec.dtype), name="out")


def conv_prim_func(spec: ConvSpec, ext: dict[str, int] | None = None, name: str = "conv2d"):
    """The op as one PrimFunc (x, w, s, b, [residual (m, k)], y (m, k)): a direct convolution over a
    padded input (blocks pad, conv, out), or with `ext` the padded GEMM form tensor cores take (blocks
    im2col, w_gemm, conv, out_pad, out; see padded_conv_extents), a grouped conv's with a leading group axis."""
    inputs = _inputs(spec)
    if ext is None:
        out = _direct_form(spec, inputs)
    else:
        out = (_grouped_gemm_form if spec.groups > 1 else _gemm_form)(spec, ext, inputs)
    return te.create_prim_func(inputs + [out]).with_attr("global_symbol", name)


def _direct_form(spec: ConvSpec, inputs):
    x, w, s, b = inputs[:4]
    conv = direct_conv(spec, x, w)
    return _output(spec, inputs, lambda m, k: conv[m, k] * s[k] + b[k])


def direct_conv(spec: ConvSpec, x, w, name: str = "conv"):
    """conv(x, w) (m, k) in float32, no epilogue, over a zero-padded copy of x (blocks pad and `name`):
    the direct form (the CPU schedules', the grouped convs' on CUDA cores; the fused pair's 3x3 too)."""
    ph, pw, st = spec.pad_h, spec.pad_w, spec.stride
    pad = te.compute(
        (spec.n, spec.h + ph + spec.bottom_pad, spec.w + pw + spec.right_pad, spec.c),
        lambda n, h, w_, c: guard(tirx.all(h >= ph, h < spec.h + ph, w_ >= pw, w_ < spec.w + pw),
                                   x[n, h - ph, w_ - pw, c], spec.dtype),
        name="pad",
    )
    rh, rw = te.reduce_axis((0, spec.kh), "rh"), te.reduce_axis((0, spec.kw), "rw")
    rc = te.reduce_axis((0, spec.c // spec.groups), "rc")

    def conv_at(m, k):
        n, oh, ow = pixel(spec, m)
        i, j = dilated(spec, rh), dilated(spec, rw)
        a = pad[n, oh * st + i, ow * st + j, group_channel(k, rc, spec.groups, spec.c, spec.k)].astype("float32")
        return te.sum(a * w[rh, rw, rc, k].astype("float32"), axis=[rh, rw, rc])

    return te.compute((spec.m, spec.k), conv_at, name=name)


def _grouped_gemm_form(spec: ConvSpec, ext: dict[str, int], inputs):
    """A grouped conv as one GEMM per group (tensor cores): im2col (groups, ext m, ext r) of each group's
    c / groups input channels @ w (groups, ext r, ext k) of its k / groups output channels, zero-padded;
    the epilogue per (group, pixel, channel) (out_pad); y (m, k) reads group k // (k / groups). ext r and
    ext k are one group's (kh*kw*c/groups and k/groups, padded)."""
    x, w, s, b = inputs[:4]
    cg, kg, st = spec.c // spec.groups, spec.k // spec.groups, spec.stride

    def im2col_at(g, m, r):
        n, oh, ow = pixel(spec, m)
        i, j, c = r // (spec.kw * cg), r // cg % spec.kw, r % cg
        ih, iw = oh * st + dilated(spec, i) - spec.pad_h, ow * st + dilated(spec, j) - spec.pad_w
        inside = tirx.all(m < spec.m, r < spec.r, ih >= 0, ih < spec.h, iw >= 0, iw < spec.w)
        return guard(inside, x[n, ih, iw, g * cg + c], spec.dtype)

    def weight_at(g, r, k):
        tap = (r // (spec.kw * cg), r // cg % spec.kw, r % cg)
        return guard(tirx.all(r < spec.r, k < kg), w[(*tap, g * kg + k)], spec.dtype)

    shape = (spec.groups, ext["m"], ext["k"])
    a = te.compute((spec.groups, ext["m"], ext["r"]), im2col_at, name="im2col")
    wg = te.compute((spec.groups, ext["r"], ext["k"]), weight_at, name="w_gemm")
    rr = te.reduce_axis((0, ext["r"]), "r")
    conv = te.compute(shape, lambda g, m, k: te.sum(a[g, m, rr].astype("float32") * wg[g, rr, k].astype("float32"),
                                                     axis=[rr]), name="conv")
    out_pad = te.compute(shape, lambda g, m, k: guard(k < kg, conv[g, m, k] * s[g * kg + k] + b[g * kg + k], "float32"),
                         name="out_pad")
    return _output(spec, inputs, lambda m, k: out_pad[k // kg, m, k % kg])


def _im2col(spec: ConvSpec, ext: dict[str, int], x):
    """im2col(x) (ext m, ext r), zero outside the image and the real extents."""
    st = spec.stride

    def im2col_at(m, r):
        n, oh, ow = pixel(spec, m)
        i, j, c = _tap(spec, r)
        ih, iw = oh * st + dilated(spec, i) - spec.pad_h, ow * st + dilated(spec, j) - spec.pad_w
        inside = tirx.all(m < spec.m, r < spec.r, ih >= 0, ih < spec.h, iw >= 0, iw < spec.w)
        return guard(inside, x[n, ih, iw, c], spec.dtype)

    return te.compute((ext["m"], ext["r"]), im2col_at, name="im2col")


def _weights(spec: ConvSpec, ext: dict[str, int], w):
    """w as the (ext r, ext k) GEMM operand, zero-padded."""
    return te.compute((ext["r"], ext["k"]),
                      lambda r, k: guard(tirx.all(r < spec.r, k < spec.k), w[(*_tap(spec, r), k)], spec.dtype),
                      name="w_gemm")


def _gemm_form(spec: ConvSpec, ext: dict[str, int], inputs):
    """im2col(x) (ext m, ext r) @ w as (ext r, ext k), zero-padded, then the epilogue; the tiles
    cover the padded extents (out_pad) and the store to y trims."""
    x, w, s, b = inputs[:4]
    a, wg = _im2col(spec, ext, x), _weights(spec, ext, w)
    rr = te.reduce_axis((0, ext["r"]), "r")
    conv = te.compute((ext["m"], ext["k"]),
                      lambda m, k: te.sum(a[m, rr].astype("float32") * wg[rr, k].astype("float32"), axis=[rr]), name="conv")
    out_pad = te.compute((ext["m"], ext["k"]), lambda m, k: guard(k < spec.k, conv[m, k] * s[k] + b[k], "float32"),
                         name="out_pad")
    return _output(spec, inputs, lambda m, k: out_pad[m, k])


def split_prim_funcs(spec: ConvSpec, ext: dict[str, int], splits: int, name: str = "conv2d"):
    """The op as two PrimFuncs with its reduction split `splits` ways (split-K: more blocks where few
    pixels and channels give few): (x, w, partial) computes each slice's partial sums, float32
    (splits, ext m, ext k) (blocks im2col, w_gemm, conv, out); (partial, s, b, [residual], y) sums
    them and applies the epilogue (block out)."""
    x, w = inputs = _inputs(spec)[:2]
    depth = ext["r"] // splits
    a, wg = _im2col(spec, ext, x), _weights(spec, ext, w)
    rr = te.reduce_axis((0, depth), "r")
    conv = te.compute(
        (splits, ext["m"], ext["k"]),
        lambda z, m, k: te.sum(a[m, z * depth + rr].astype("float32") * wg[z * depth + rr, k].astype("float32"), axis=[rr]),
        name="conv")
    partial = te.compute((splits, ext["m"], ext["k"]), lambda z, m, k: conv[z, m, k], name="out")
    first = te.create_prim_func(inputs + [partial]).with_attr("global_symbol", f"{name}_split")
    given = te.placeholder((splits, ext["m"], ext["k"]), "float32", "partial")
    rest = _inputs(spec)[2:]
    z = te.reduce_axis((0, splits), "z")
    total = te.compute((spec.m, spec.k), lambda m, k: te.sum(given[z, m, k], axis=[z]), name="sum")
    out = _output(spec, rest, lambda m, k: total[m, k] * rest[0][k] + rest[1][k])
    second = te.create_prim_func([given] + rest + [out]).with_attr("global_symbol", f"{name}_split_sum")
    return first, second


def padded_conv_extents(spec: ConvSpec, m_unit: int, r_unit: int, k_unit: int) -> dict[str, int]:
    """The implicit GEMM's extents rounded up to whole tiles. The reduction is kh*kw*c padded once
    (not each tap's channels): a 3-channel 7x7 stem does 192 steps for its 147, not 49 x 16. A grouped
    conv's reduction and channels are one group's (each group its own GEMM: _grouped_gemm_form)."""
    up = lambda v, u: -(-v // u) * u  # noqa: E731
    return {"m": up(spec.m, m_unit), "r": up(spec.r, r_unit), "k": up(spec.k // spec.groups, k_unit)}


# -- numpy reference --------------------------------------------------------------------------------
def conv_reference(spec: ConvSpec, x, w, s, b, residual=None) -> np.ndarray:
    """y (n, ho, wo, k) in spec.dtype; float32 math."""
    f32 = np.float32
    acc = conv_nhwc(x, w, spec.stride, spec.pads, spec.groups, spec.dilation)
    pre = acc * s.astype(f32) + b.astype(f32)
    if spec.residual:
        pre = pre + residual.astype(f32)
    return activation(spec.act).numpy(pre).astype(np_dtype(spec.dtype))


def conv_random_inputs(spec: ConvSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs that keep outputs O(1) at any size (weights ~ 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    scales = {"w": spec.r ** -0.5, "b": 0.1}
    arrays = {}
    for name, (shape, dtype) in spec.arg_shapes().items():
        if name == "s":
            arrays[name] = rng.uniform(0.5, 1.5, shape).astype(dtype)
        else:
            arrays[name] = (rng.standard_normal(shape) * scales.get(name, 1.0)).astype(np_dtype(dtype))
    return arrays
