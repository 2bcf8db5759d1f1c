"""FusedConvSpec: the shape and options of one fused 3x3 -> 1x1 convolution pair.

y = act2( conv1x1( act1( conv3x3(x, w1, pad d, stride, groups, dilation d) * s1 + b1 ), w2 ) * s2 + b2 [+ r] )

Layouts: x NHWC (n, h, w, c); w1 HWIO (3, 3, c / groups, k1); w2 (k1, k2); s1, b1 (k1,) and s2, b2 (k2,)
float32; r and y NHWC (n, ho, wo, k2). groups > 1 makes the 3x3 grouped (MobileNet's depthwise:
groups = c = k1; ResNeXt's: c / groups channels per group), as op.conv_spec defines it. dilation d > 1 spaces
the 3x3's taps d pixels apart (DeepLabV3's atrous bottlenecks), padded by d so that the output keeps the
3x3's size: tap (i, j) reads input pixel (oh * stride + (i - 1) * d, ow * stride + (j - 1) * d). pad_h and pad_w,
where given, pad the top and left instead of d, the output's size the same (ceil(h / stride)): TensorFlow's "same"
padding of a stride-2 3x3 on an even size pads 0 on top and 1 below, as Keras models export it. Accumulation
is float32; the intermediate is stored in `dtype`, as the fused GPU kernel keeps it in shared memory.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .activation import ACTIVATIONS as _TABLE

ACTIVATIONS = tuple(_TABLE)  # the names of op.activation's table
DTYPES = ("float16", "bfloat16", "float32")
STRIDES = (1, 2)
SIZE_FIELDS = ("n", "h", "w", "c", "k1", "k2")
OP_KIND = "conv3x3_conv1x1"  # the fused pair's name among the op kinds (op.kind)


@dataclass(frozen=True)
class FusedConvSpec:
    n: int
    h: int
    w: int
    c: int
    k1: int
    k2: int
    stride: int = 1
    act1: str = "relu"
    act2: str = "relu"
    residual: bool = False
    dtype: str = "float16"
    groups: int = 1
    dilation: int = 1
    pad_h: int | None = None  # the 3x3's top padding; None: its dilation
    pad_w: int | None = None  # its left padding

    def __post_init__(self):
        for name in SIZE_FIELDS + ("stride", "groups", "dilation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.stride not in STRIDES:
            raise ValueError(f"stride: expected one of {STRIDES}, got {self.stride!r}")
        for name in ("pad_h", "pad_w"):
            self._check_pad(name)
        check_groups(self, self.k1)
        check_options(self, ("act1", "act2"))

    def _check_pad(self, name: str) -> None:
        """ValueError unless the 3x3's `name` padding (top or left) is within its span; normalized to None where it
        is the dilation (one spelling: one text, one record)."""
        value = getattr(self, name)
        if value is None or value == self.dilation:
            object.__setattr__(self, name, None)
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2 * self.dilation:
            raise ValueError(f"{name}: expected an integer from 0 to {2 * self.dilation}, got {value!r}")

    @property
    def pads(self) -> tuple[int, int, int, int]:
        """The 3x3's (top, left, bottom, right): the dilation on each side, or the given top / left and the padding
        the other end then needs for the output's ceil(size / stride)."""
        d = self.dilation
        top, bottom = (d, d) if self.pad_h is None else (self.pad_h, far_pad(self.h, self.ho, self.stride, d, self.pad_h))
        left, right = (d, d) if self.pad_w is None else (self.pad_w, far_pad(self.w, self.wo, self.stride, d, self.pad_w))
        return top, left, bottom, right

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def ho(self) -> int:
        return (self.h - 1) // self.stride + 1

    @property
    def wo(self) -> int:
        return (self.w - 1) // self.stride + 1

    @property
    def m(self) -> int:
        """Rows of both implicit GEMMs: one per output pixel."""
        return self.n * self.ho * self.wo

    @property
    def flops(self) -> int:
        """Multiply-adds of both convolutions, counted as 2 FLOPs each (epilogues not counted)."""
        return 2 * self.m * (9 * self.c // self.groups * self.k1 + self.k1 * self.k2)

    def arg_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Name -> (shape, dtype) of every input, in call order (residual last, when present)."""
        shapes = {
            "x": ((self.n, self.h, self.w, self.c), self.dtype),
            "w1": ((3, 3, self.c // self.groups, self.k1), self.dtype),
            "s1": ((self.k1,), "float32"),
            "b1": ((self.k1,), "float32"),
            "w2": ((self.k1, self.k2), self.dtype),
            "s2": ((self.k2,), "float32"),
            "b2": ((self.k2,), "float32"),
        }
        if self.residual:
            shapes["residual"] = (self.out_shape, self.dtype)
        return shapes

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.ho, self.wo, self.k2)

    # -- text form, as the CLI takes it ----------------------------------------------------------
    def to_string(self) -> str:
        return spec_text(self)

    @classmethod
    def parse(cls, text: str) -> "FusedConvSpec":
        """Parse 'n=1,h=56,w=56,c=64,k1=64,k2=64,stride=1,act1=relu,...' (fields not given keep
        their defaults; sizes are required)."""
        return parse_fields(cls, text, SIZE_FIELDS + ("stride", "groups", "dilation", "pad_h", "pad_w"), SIZE_FIELDS,
                            "a spec field")


def far_pad(size: int, out: int, stride: int, dilation: int, near: int) -> int:
    """The padding at the far end (bottom or right) a 3x3 dilated by `dilation` padded `near` at the near end needs for
    `out` outputs of `size` input pixels at `stride`: what the last output's last tap reads past the input (none where
    it stops short of the input's end: at most stride - 1 pixels then, and the conv's output size is the same)."""
    return max(0, (out - 1) * stride + 2 * dilation - near - (size - 1))


# fields added later, left out of a spec's text while at these defaults
UNWRITTEN_DEFAULTS = {"groups": 1, "dilation": 1, "pad_bottom": None, "pad_right": None, "pad_h": None, "pad_w": None}


def spec_text(spec) -> str:
    """'field=value,...' of a spec dataclass, the fields added later left out at their defaults (a dense undilated
    conv's text, and so its tuning-database spec lists, read as they did before any existed)."""
    parts = []
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if field.name not in UNWRITTEN_DEFAULTS or value != UNWRITTEN_DEFAULTS[field.name]:
            parts.append(f"{field.name}={int(value) if isinstance(value, bool) else value}")
    return ",".join(parts)


def check_groups(spec, out_channels: int) -> None:
    """ValueError unless spec.groups divides both the input channels and `out_channels`."""
    if spec.c % spec.groups or out_channels % spec.groups:
        raise ValueError(f"groups: {spec.groups} must divide the input channels ({spec.c}) and the output channels "
                         f"({out_channels})")


def parse_fields(cls, text: str, int_fields: tuple[str, ...], required: tuple[str, ...], what: str):
    """cls (a spec dataclass) from 'key=value,...': `int_fields` as integers, residual as a flag, the
    rest as text; ValueError naming an unknown field (`what` it is not) or the first missing `required` one."""
    known = [f.name for f in dataclasses.fields(cls)]  # in declaration order, for the message
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = (p.strip() for p in item.partition("="))
        if not sep or key not in known:
            raise ValueError(f"{key or item}: not {what} (expected one of {', '.join(known)})")
        values[key] = parse_value(key, raw, int_fields)
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(f"{missing[0]}: missing from the spec")
    return cls(**values)


def check_options(spec, activations: tuple[str, ...]) -> None:
    """ValueError naming the first of a spec's activations (fields `activations`), dtype or residual
    flag that is not one it can take (every op kind's spec has them)."""
    for name in activations:
        if getattr(spec, name) not in ACTIVATIONS:
            raise ValueError(f"{name}: expected one of {ACTIVATIONS}, got {getattr(spec, name)!r}")
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {spec.dtype!r}")
    if not isinstance(spec.residual, bool):
        raise ValueError(f"residual: expected a bool, got {spec.residual!r}")


def parse_value(key: str, raw: str, int_fields: tuple[str, ...]) -> object:
    if key == "residual":
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"residual: expected 0 or 1, got {raw!r}")
    if key in int_fields:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{key}: expected an integer, got {raw!r}") from None
    return raw
