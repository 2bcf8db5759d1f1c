"""The fused pair's graph pattern: find the 3x3 (dense, grouped or depthwise) -> 1x1 convolution pairs
of a normalized Relax function (frontend/normalize.py), and give a pair's arguments as the op's kernels take them.

A pair is conv3x3 -> [per-channel affine ops] -> [act1] -> conv1x1 -> [per-channel affine ops]
-> [+ residual] -> [act2], every intermediate used once. The affine ops (bias, BatchNormalization
decomposed, Mul/Add by constants) fold into the op's scale and bias. A chain that reaches a 1x1
conv from a 3x3 conv but breaks a condition is reported with the reason, never fused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from .activation import match_activation, relax_const, relax_op
from .reference import np_dtype
from .spec import OP_KIND, FusedConvSpec

AFFINE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide"}
# elementwise ops a chain may pass through on the way back from a 1x1 conv: reported, not fused
UNARY = {"relax.nn.relu", "relax.maximum", "relax.minimum", "relax.sigmoid", "relax.tanh", "relax.nn.gelu",
         "relax.nn.silu", "relax.nn.leakyrelu", "relax.clip", "relax.astype"}


@dataclass
class Pair:
    """One 3x3 -> 1x1 candidate; `fused` says whether it will be fused, `reason` why not."""

    conv3x3: str
    conv1x1: str
    fused: bool = False
    reason: str = ""
    spec: FusedConvSpec | None = None
    x: object = None  # the 3x3 conv's input (Relax expression)
    residual: object = None  # the residual's Relax expression, when there is one
    last: object = None  # the Var whose binding the fused op replaces
    params: dict = field(default_factory=dict)  # w1 HWIO, s1, b1, w2 (k1, k2), s2, b2 as float32
    plan: object = None  # the target's schedule.Plan (its kernels, fused or two), once planned
    fusable: bool = False  # the target's rule can fuse it (where `fused` is False, its policy or a measurement chose not to)
    kind: str = OP_KIND  # the op kind (op.kind) whose pattern found it
    bindings: frozenset = frozenset()  # the Vars whose bindings the op replaces (conv3x3 ... last)
    config: str = ""  # once planned: the parameters its kernel runs with, tuned or the rule's default ("" where none)

    @property
    def out_shape(self) -> tuple:
        """The shape of the value the op replaces."""
        return self.spec.out_shape

    @property
    def convs(self) -> tuple[str, str]:
        """The model's convs this candidate covers, in order."""
        return self.conv3x3, self.conv1x1

    def to_json(self) -> dict:
        return {"conv3x3": self.conv3x3, "conv1x1": self.conv1x1, "fused": self.fused, "reason": self.reason,
                "config": self.config}

    def arguments(self, emit, model_input) -> list:
        """The op's inputs in its kernels' order (x, w1, s1, b1, w2, s2, b2[, residual]) as Relax
        expressions: the weights as constants in the spec's dtype, x and the residual through
        `model_input(expr)` (the caller's rewrite of an expression of the graph, cast to the spec's
        dtype), the residual as its (m, k2) GEMM view (`emit` binds a value)."""
        spec, p, dt = self.spec, self.params, np_dtype(self.spec.dtype)
        form = self.plan.input_form if self.plan is not None else None
        p = form.arrays(spec, p) if form is not None else p  # the weights as the kernel takes them (constants)
        args = [model_input(self.x), relax.const(p["w1"].astype(dt)), relax.const(p["s1"]), relax.const(p["b1"]),
                relax.const(p["w2"].astype(dt)), relax.const(p["s2"]), relax.const(p["b2"])]
        if self.residual is not None:
            args.append(emit(relax.op.reshape(model_input(self.residual), (spec.m, spec.k2))))
        return args


def _per_channel(value: np.ndarray, channels: int):
    """A constant broadcast over NHWC's channel axis as a (channels,) vector, else None."""
    if value is None or value.size not in (1, channels) or (value.ndim and any(d != 1 for d in value.shape[:-1])):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float32), (channels,)).copy()


class Graph:
    """Bindings and use counts of the function's dataflow block; `claimed`: bindings that another
    op kind's planned candidate covers already (a chain stops before them)."""

    def __init__(self, func: relax.Function, claimed=frozenset()):
        self.claimed = set(claimed)
        self.bindings = [b for block in func.body.blocks for b in block.bindings]
        self.value = {b.var: b.value for b in self.bindings}
        self.uses: dict = {}
        for b in self.bindings:
            for arg in _args(b.value):
                if isinstance(arg, relax.Var):
                    self.uses.setdefault(arg, []).append(b.var)
        for out in _args(func.body.body) if isinstance(func.body.body, relax.Tuple) else [func.body.body]:
            if isinstance(out, relax.Var):
                self.uses.setdefault(out, []).append(None)

    def single_use(self, var) -> bool:
        return len(self.uses.get(var, [])) == 1


def _args(expr):
    if isinstance(expr, relax.Call):
        return list(expr.args)
    if isinstance(expr, relax.Tuple):
        return list(expr.fields)
    return []


def weight_shape(call) -> tuple:
    return tuple(int(d) for d in call.args[1].ty.shape)


def _conv_problem(call, kernel: int) -> str | None:
    """Why this conv2d cannot be the pair's `kernel`x`kernel` conv (None when it can)."""
    a = call.attrs
    if str(a.data_layout) != "NHWC" or str(a.kernel_layout) != "OHWI":
        return "convolution not in NHWC/OHWI layout"
    if int(a.groups) != 1 and kernel == 1:
        return f"grouped 1x1 conv (groups={int(a.groups)})"
    dilation = [int(d) for d in a.dilation]
    if kernel == 1 and dilation != [1, 1]:
        return "dilated 1x1 conv"
    if relax_const(call.args[1]) is None:
        return f"{kernel}x{kernel} conv weight is not a constant"
    pad, strides = [int(p) for p in a.padding], [int(s) for s in a.strides]
    if kernel == 3:
        if dilation[0] != dilation[1]:
            return f"3x3 conv dilation {dilation} differs by axis"
        if strides[0] != strides[1] or strides[0] not in (1, 2):
            return f"3x3 conv stride {strides} (needs 1 or 2)"
        _, h, w, _ = shape_of(call.args[0])
        if shape_of(call)[1:3] != (-(-h // strides[0]), -(-w // strides[0])) or max(pad) > 2 * dilation[0]:
            # the pair's 3x3 keeps its input's size (strided: ceil(h / stride)), as "same" padding does
            return f"3x3 conv padding {pad}: not the same size (strided: ceil(size / stride)) as the pair's"
    elif pad != [0, 0, 0, 0] or strides != [1, 1]:
        return "1x1 conv with padding or stride"
    return None


def _activation(graph: Graph, var):
    """(act name, input var) when var is an activation (op.activation's table) of its input, else (None, var)."""
    name, source = match_activation(graph.value.get(var), graph.value.get, graph.single_use)
    return (name, source) if name else (None, var)


def _affine_step(call, var, channels: int):
    """(scale, bias) of `call` as a function of its operand `var`, if it is per-channel affine."""
    op = relax_op(call)
    if op not in AFFINE:
        return None
    lhs, rhs = call.args
    if rhs.same_as(var):
        if op not in ("relax.add", "relax.multiply"):
            return None
        lhs, rhs = rhs, lhs
    if not lhs.same_as(var):
        return None
    c = _per_channel(relax_const(rhs), channels)
    if c is None:
        return None
    one, zero = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    steps = {"relax.add": lambda: (one, c), "relax.subtract": lambda: (one, -c), "relax.multiply": lambda: (c, zero),
             "relax.divide": lambda: (1 / c, zero)}  # lazily: 1 / c of a zero bias is no error of the model
    return steps[op]()


def _affine_back(graph: Graph, var, channels: int):
    """Walk back from var through single-use affine ops: (scale, bias, source var)."""
    scale, bias = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    while True:
        call = graph.value.get(var)
        source = next((a for a in _args(call) if isinstance(a, relax.Var)), None)
        step = _affine_step(call, source, channels) if source is not None else None
        if step is None or not graph.single_use(source):
            return scale, bias, var
        # var = source * s + b, and the part already collected applies after it
        scale, bias = scale * step[0], bias + scale * step[1]
        var = source


def affine_forward(graph: Graph, var, channels: int):
    """Walk forward from var through single-use affine ops: (scale, bias, last var)."""
    scale, bias = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    while sole_user(graph, var) is not None:
        user = sole_user(graph, var)
        step = _affine_step(graph.value[user], var, channels)
        if step is None:
            break
        scale, bias = scale * step[0], bias * step[0] + step[1]
        var = user
    return scale, bias, var


def sole_user(graph: Graph, var):
    """The one binding that uses var (None if it has several, is the function's output, or is claimed)."""
    user = graph.uses[var][0] if graph.single_use(var) else None
    return None if user in graph.claimed else user


def chain(graph: Graph, start, last) -> frozenset:
    """The bindings from `start` to `last`, following sole users: what a candidate covers."""
    covered = [start]
    while not covered[-1].same_as(last) and graph.single_use(covered[-1]) and graph.uses[covered[-1]][0] is not None:
        covered.append(graph.uses[covered[-1]][0])
    return frozenset(covered)


def epilogue(graph: Graph, var, shape):
    """Residual add and act2 after var: (residual expr or None, act2, last var)."""
    residual = None
    user = sole_user(graph, var)
    if user is not None and relax_op(graph.value[user]) == "relax.add":
        other = [a for a in graph.value[user].args if not a.same_as(var)]
        if len(other) == 1 and relax_const(other[0]) is None and shape_of(other[0]) == shape:
            residual, var = other[0], user
    act2 = "none"
    user = sole_user(graph, var)
    after = sole_user(graph, user) if user is not None else None
    act, source = _activation(graph, after) if after is not None else (None, None)
    if act == "relu6" and source.same_as(var):  # min(max(var, 0), 6)
        act2, var = "relu6", after
    elif user is not None:
        act, source = _activation(graph, user)
        if act and source.same_as(var):
            act2, var = act, user
    return residual, act2, var


def shape_of(expr) -> tuple:
    return tuple(int(d) for d in expr.ty.shape)


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


def find_pairs(func: relax.Function, conv_names: list[str] | None = None, claimed=frozenset()) -> list[Pair]:
    """Every 3x3 -> 1x1 candidate of `func`, with the fused ones' parameters folded.
    conv_names: a name for each conv2d in binding order (the ONNX Conv nodes, which the importer
    emits in graph order); default 'conv2d#i'."""
    graph = Graph(func, claimed)
    convs = [b.var for b in graph.bindings if relax_op(b.value) == "relax.nn.conv2d"]
    names = {var: (conv_names[i] if conv_names and i < len(conv_names) else f"conv2d#{i}") for i, var in enumerate(convs)}
    pairs = []
    for var in convs:
        if weight_shape(graph.value[var])[1:3] == (1, 1):
            pair = _match(graph, var, graph.value[var], names)
            if pair is not None:
                pairs.append(pair)
    return pairs


def _match(graph: Graph, var2, conv2, names: dict) -> Pair | None:
    k2, _, _, k1 = weight_shape(conv2)
    src = conv2.args[0]
    unsupported = None
    act1, src_act = _activation(graph, src)
    used_twice = act1 is not None and not graph.single_use(src)
    src = src_act
    s1, b1, src = _affine_back(graph, src, k1)
    # walk on through other elementwise ops to find whether a 3x3 conv feeds this 1x1 at all
    while relax_op(graph.value.get(src)) in UNARY | AFFINE and relax_op(graph.value.get(src)) != "relax.nn.conv2d":
        call = graph.value[src]
        if sum(isinstance(a, relax.Var) for a in call.args) > 1:
            return None  # a join (a residual add): the chain crosses blocks, it is no pair
        unsupported = unsupported or relax_op(call).removeprefix("relax.").removeprefix("nn.")
        used_twice = used_twice or not graph.single_use(src)
        src = next((a for a in call.args if isinstance(a, relax.Var)), None)
        if src is None:
            return None
    conv1 = graph.value.get(src)
    if relax_op(conv1) != "relax.nn.conv2d" or weight_shape(conv1)[1:3] != (3, 3):
        return None
    pair = Pair(conv3x3=names[src], conv1x1=names[var2])
    used_twice = used_twice or not graph.single_use(src) or not graph.single_use(conv2.args[0])
    dtype = dtype_of(conv2)
    reasons = [_conv_problem(conv1, 3), _conv_problem(conv2, 1),
               unsupported and f"unsupported op between the convolutions: {unsupported}",
               used_twice and "the intermediate has another consumer",
               dtype not in ("float32", "float16") and f"dtype {dtype}"]
    if any(reasons):
        pair.reason = "; ".join(r for r in reasons if r)  # every reason, not only the first
        return pair
    s2, b2, last = affine_forward(graph, var2, k2)
    residual, act2, last = epilogue(graph, last, shape_of(conv2))
    n, h, w, c = shape_of(conv1.args[0])
    pair.spec = FusedConvSpec(n=n, h=h, w=w, c=c, k1=k1, k2=k2, stride=int(conv1.attrs.strides[0]), act1=act1 or "none",
                              act2=act2, residual=residual is not None, dtype=dtype, groups=int(conv1.attrs.groups),
                              dilation=int(conv1.attrs.dilation[0]), pad_h=int(conv1.attrs.padding[0]),
                              pad_w=int(conv1.attrs.padding[1]))
    pair.params = dict(
        w1=relax_const(conv1.args[1]).astype(np.float32).transpose(1, 2, 3, 0),  # OHWI -> HWIO
        s1=s1, b1=b1,
        w2=relax_const(conv2.args[1]).astype(np.float32).reshape(k2, k1).T.copy(),
        s2=s2, b2=b2,
    )
    pair.x, pair.residual, pair.last, pair.fused = conv1.args[0], residual, last, True
    pair.bindings = chain(graph, src, last)
    return pair
