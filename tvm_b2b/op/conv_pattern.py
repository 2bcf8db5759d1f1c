"""The single convolution's graph pattern: every conv2d (dense, grouped or depthwise) of a normalized Relax function (frontend/
normalize.py) that no other op kind's planned candidate covers, with what follows it folded into its
epilogue: per-channel affine ops (bias, BatchNormalization decomposed) into s and b, then a residual
add and an activation. A conv this op kind cannot take is reported with every reason, never rewritten.
A fully connected layer (matmul of an (n, c) tensor by a constant (c, k) matrix: ONNX's Gemm, the
classifier of every CNN) is the 1x1 conv of n one-pixel images, and taken as one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from .activation import relax_const, relax_op
from .conv import OP_KIND, ConvSpec, InputForm, cell_grid, cell_padding
from .pattern import Graph, affine_forward, chain, dtype_of, epilogue, shape_of, weight_shape
from .reference import np_dtype


@dataclass
class ConvCandidate:
    """One convolution; `fused` says whether it runs as this op kind's kernel (with its epilogue
    folded in), `reason` why not."""

    conv: str
    fused: bool = False
    reason: str = ""
    spec: ConvSpec | None = None
    x: object = None  # the conv's input (Relax expression)
    residual: object = None  # the residual's Relax expression, when there is one
    last: object = None  # the Var whose binding the op replaces
    params: dict = field(default_factory=dict)  # w HWIO, s, b as float32
    plan: object = None  # the target's schedule.Plan, once planned
    kind: str = OP_KIND
    bindings: frozenset = frozenset()  # the Vars whose bindings the op replaces (conv ... last)
    out_shape: tuple = ()  # the replaced value's shape: spec.out_shape, or (n, k) for a matmul
    config: str = ""  # once planned: the parameters its kernel runs with, tuned or the rule's default ("" where none)

    @property
    def convs(self) -> tuple[str]:
        return (self.conv,)

    def to_json(self) -> dict:
        return {"conv": self.conv, "fused": self.fused, "reason": self.reason, "config": self.config}

    def arguments(self, emit, model_input) -> list:
        """(x, w, s, b[, residual]) as the kernel takes them: w a constant in the spec's dtype, x and
        the residual through `model_input`, the residual as its (m, k) GEMM view."""
        spec, p = self.spec, self.params
        x, w = model_input(self.x), p["w"]
        if tuple(int(d) for d in x.ty.shape) != (spec.n, spec.h, spec.w, spec.c):  # a matmul's (n, c)
            x = emit(relax.op.reshape(x, (spec.n, spec.h, spec.w, spec.c)))
        form = self.plan.input_form if self.plan is not None else None
        if form is not None:  # the kernel takes x and w in another form (op.conv.InputForm): op's ConvSpec stays the model's
            x, w = input_in_form(form, spec, x, emit), form.w(spec, w)
        args = [x, relax.const(w.astype(np_dtype(spec.dtype))), relax.const(p["s"]), relax.const(p["b"])]
        if self.residual is not None:
            args.append(emit(relax.op.reshape(model_input(self.residual), (spec.m, spec.k))))
        return args


def input_in_form(form: InputForm, spec: ConvSpec, x, emit):
    """The Relax x (n, h, w, c) as InputForm.x makes it in numpy: padded and cut into cells, zero channels
    appended (injective ops, which TVM fuses into one kernel with whatever makes x)."""
    channels = spec.c
    if form.cells:
        s, (_, _, rows, cols), (bottom, right) = spec.stride, cell_grid(spec), cell_padding(spec)
        x = emit(relax.op.nn.pad(x, [0, 0, spec.pad_h, max(0, bottom), spec.pad_w, max(0, right), 0, 0]))
        if min(bottom, right) < 0:  # rows or columns that no output reads
            x = emit(relax.op.strided_slice(x, axes=[1, 2], begin=[0, 0], end=[s * rows, s * cols]))
        x = emit(relax.op.reshape(x, (spec.n, rows, s, cols, s, spec.c)))
        x = emit(relax.op.permute_dims(x, [0, 1, 3, 2, 4, 5]))
        channels = s * s * spec.c
        x = emit(relax.op.reshape(x, (spec.n, rows, cols, channels)))
    extra = form.spec(spec).c - channels
    return emit(relax.op.nn.pad(x, [0, 0, 0, 0, 0, 0, 0, extra])) if extra else x


def conv_problems(call) -> list[str]:
    """Every reason this op kind cannot take the conv2d `call` (empty when it can)."""
    a = call.attrs
    problems = []
    if str(a.data_layout) != "NHWC" or str(a.kernel_layout) != "OHWI":
        problems.append("convolution not in NHWC/OHWI layout")
    dilation = [int(d) for d in a.dilation]
    if dilation[0] != dilation[1]:
        problems.append(f"dilation {dilation} differs by axis")
    if relax_const(call.args[1]) is None:
        problems.append("weight is not a constant")
    pads = [int(p) for p in a.padding]
    strides = [int(s) for s in a.strides]
    if strides[0] != strides[1]:
        problems.append(f"strides {strides} differ")
    dtype = dtype_of(call)
    if dtype not in ("float32", "float16"):
        problems.append(f"dtype {dtype}")
    if not problems:
        _, kh, kw, _ = weight_shape(call)
        span_h, span_w = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
        if max(pads[0], pads[2]) >= span_h or max(pads[1], pads[3]) >= span_w:
            problems.append(f"padding {pads} not smaller than the {span_h}x{span_w} kernel")
    return problems


def find_convs(func: relax.Function, conv_names: list[str] | None = None, claimed=frozenset()) -> list[ConvCandidate]:
    """Every conv2d of `func` not in `claimed` (bindings another kind's planned candidate covers), each
    with its epilogue folded in. conv_names: as for op.pattern.find_pairs."""
    graph = Graph(func, claimed)
    convs = [b.var for b in graph.bindings if relax_op(b.value) == "relax.nn.conv2d"]
    names = {var: (conv_names[i] if conv_names and i < len(conv_names) else f"conv2d#{i}") for i, var in enumerate(convs)}
    found = []
    for var in convs:
        if var not in graph.claimed:
            found.append(_match(graph, var, names[var]))
            graph.claimed |= found[-1].bindings  # a residual add joins two convs' chains: the first takes it
    matmuls = [b.var for b in graph.bindings if _is_fully_connected(b.value) and b.var not in graph.claimed]
    return found + [_match_fully_connected(graph, var, f"matmul#{i}") for i, var in enumerate(matmuls)]


def _is_fully_connected(call) -> bool:
    """matmul(x (n, c), constant (c, k)) in float32 or float16."""
    if relax_op(call) != "relax.matmul" or relax_const(call.args[1]) is None:
        return False
    return len(shape_of(call.args[0])) == 2 and len(shape_of(call.args[1])) == 2 and dtype_of(call) in ("float32", "float16")


def _match_fully_connected(graph: Graph, var, name: str) -> ConvCandidate:
    """The matmul at `var` as the 1x1 conv of (n, 1, 1, c) with its bias and activation folded in."""
    call = graph.value[var]
    (n, c), k = shape_of(call.args[0]), shape_of(call)[1]
    scale, bias, last = affine_forward(graph, var, k)
    _, act, last = epilogue(graph, last, None)  # no residual: the shape never matches
    weight = relax_const(call.args[1]).astype(np.float32).reshape(1, 1, c, k)
    spec = ConvSpec(n=n, h=1, w=1, c=c, k=k, act=act, dtype=dtype_of(call))
    return ConvCandidate(conv=name, fused=True, spec=spec, x=call.args[0], last=last,
                         params={"w": weight, "s": scale, "b": bias}, bindings=chain(graph, var, last), out_shape=(n, k))


def _match(graph: Graph, var, name: str) -> ConvCandidate:
    call = graph.value[var]
    candidate = ConvCandidate(conv=name)
    problems = conv_problems(call)
    if problems:
        candidate.reason = "; ".join(problems)
        return candidate
    k, kh, kw, _ = weight_shape(call)  # (its last axis: a group's input channels)
    scale, bias, last = affine_forward(graph, var, k)
    residual, act, last = epilogue(graph, last, shape_of(call))
    n, h, w, c = shape_of(call.args[0])
    top, left, bottom, right = (int(p) for p in call.attrs.padding)
    candidate.spec = ConvSpec(n=n, h=h, w=w, c=c, k=k, kh=kh, kw=kw, stride=int(call.attrs.strides[0]), pad_h=top,
                              pad_w=left, act=act, residual=residual is not None, dtype=dtype_of(call),
                              groups=int(call.attrs.groups), dilation=int(call.attrs.dilation[0]), pad_bottom=bottom,
                              pad_right=right)
    weight = relax_const(call.args[1]).astype(np.float32).transpose(1, 2, 3, 0)  # OHWI -> HWIO
    candidate.params = {"w": np.ascontiguousarray(weight), "s": scale, "b": bias}
    candidate.x, candidate.residual, candidate.last, candidate.fused = call.args[0], residual, last, True
    candidate.out_shape = candidate.spec.out_shape
    candidate.bindings = chain(graph, var, last)
    return candidate
