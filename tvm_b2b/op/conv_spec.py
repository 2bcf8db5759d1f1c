"""ConvSpec: one convolution with its epilogue, the op kind every conv that is not in a fused pair
runs as (op kind "conv2d"):

y = act( conv(x, w, kh x kw, stride, pad, dilation) * s + b [+ r] )

Layouts: x NHWC (n, h, w, c); w HWIO (kh, kw, c / groups, k); s, b (k,) float32; r and y NHWC (n, ho, wo, k).
With groups g, output channel j reads the c / g input channels of its group j // (k / g) (depthwise: g = c).
With dilation d, tap (i, j) reads input pixel (oh * stride + i * d - pad_h, ow * stride + j * d - pad_w)
(DeepLabV3's and FCN's atrous convs): the kernel spans d * (kh - 1) + 1 rows. pad_h and pad_w pad the top and
left; pad_bottom and pad_right, where given, the bottom and right (TensorFlow's "same" padding of a strided conv,
as tf2onnx exports it: one more row below than above, or none above); None: as the top and left.
Accumulation is float32.
The op's TE definition and numpy reference are in op/conv.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from .spec import check_groups, check_options, parse_fields, spec_text

OP_KIND = "conv2d"
SIZE_FIELDS = ("n", "h", "w", "c", "k")
SHAPE_FIELDS = ("kh", "kw", "stride", "pad_h", "pad_w", "groups", "dilation")  # defaulted: a dense 1x1 stride-1 conv
SIDE_PADS = ("pad_bottom", "pad_right")  # None: as pad_h and pad_w


@dataclass(frozen=True)
class ConvSpec:
    n: int
    h: int
    w: int
    c: int
    k: int
    kh: int = 1
    kw: int = 1
    stride: int = 1
    pad_h: int = 0
    pad_w: int = 0
    act: str = "relu"
    residual: bool = False
    dtype: str = "float16"
    groups: int = 1
    dilation: int = 1
    pad_bottom: int | None = None
    pad_right: int | None = None

    def __post_init__(self):
        for name in SIZE_FIELDS + SHAPE_FIELDS + SIDE_PADS:
            value = getattr(self, name)
            least = 0 if name.startswith("pad") else 1
            if value is None and name in SIDE_PADS:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")
        for side, same in zip(SIDE_PADS, ("pad_h", "pad_w")):
            if getattr(self, side) == getattr(self, same):  # one spelling of a symmetric conv (its text, its records)
                object.__setattr__(self, side, None)
        if max(self.pad_h, self.bottom_pad) >= self.span_h or max(self.pad_w, self.right_pad) >= self.span_w:
            raise ValueError(f"pad: {list(self.pads)} (top, left, bottom, right) must be smaller than the kernel "
                             f"({self.span_h}, {self.span_w})")
        if self.ho < 1 or self.wo < 1:
            raise ValueError(f"kernel: {self.span_h}x{self.span_w} is larger than the padded {self.h}x{self.w} input")
        check_groups(self, self.k)
        check_options(self, ("act",))

    @property
    def span_h(self) -> int:
        """Input rows one output pixel reads: the kernel's rows, dilated."""
        return self.dilation * (self.kh - 1) + 1

    @property
    def span_w(self) -> int:
        return self.dilation * (self.kw - 1) + 1

    @property
    def bottom_pad(self) -> int:
        return self.pad_h if self.pad_bottom is None else self.pad_bottom

    @property
    def right_pad(self) -> int:
        return self.pad_w if self.pad_right is None else self.pad_right

    @property
    def pads(self) -> tuple[int, int, int, int]:
        """(top, left, bottom, right), as ONNX and Relax order them."""
        return self.pad_h, self.pad_w, self.bottom_pad, self.right_pad

    @property
    def ho(self) -> int:
        return (self.h + self.pad_h + self.bottom_pad - self.span_h) // self.stride + 1

    @property
    def wo(self) -> int:
        return (self.w + self.pad_w + self.right_pad - self.span_w) // self.stride + 1

    @property
    def m(self) -> int:
        """Rows of the implicit GEMM: one per output pixel."""
        return self.n * self.ho * self.wo

    @property
    def r(self) -> int:
        """Depth of the implicit GEMM: the kh x kw taps of every input channel of a group."""
        return self.kh * self.kw * self.c // self.groups

    @property
    def flops(self) -> int:
        return 2 * self.m * self.r * self.k

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.ho, self.wo, self.k)

    def arg_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Name -> (shape, dtype) of every input, in call order (residual last, when present)."""
        shapes = {
            "x": ((self.n, self.h, self.w, self.c), self.dtype),
            "w": ((self.kh, self.kw, self.c // self.groups, self.k), self.dtype),
            "s": ((self.k,), "float32"),
            "b": ((self.k,), "float32"),
        }
        if self.residual:
            shapes["residual"] = (self.out_shape, self.dtype)
        return shapes

    def to_string(self) -> str:
        return spec_text(self)

    @classmethod
    def parse(cls, text: str) -> "ConvSpec":
        """'n=1,h=56,w=56,c=64,k=256,kh=3,kw=3,pad_h=1,pad_w=1,...' (sizes required, the rest defaulted)."""
        return parse_fields(cls, text, SIZE_FIELDS + SHAPE_FIELDS + SIDE_PADS, SIZE_FIELDS, "a conv spec field")


