"""Op kinds, registered by name: each in one place with its spec type, TE definition, numpy reference
and the graph pattern the frontend matches (`find(relax function, conv names) -> candidates`, each
candidate with `spec`, `convs`, `fused`, `reason`, `plan`, `last` and `arguments(emit, model_input)`).
The frontend asks every registered kind for its candidates; the schedules register their rules per
kind (schedule.RULES)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpKind:
    name: str
    spec: type  # a frozen dataclass: parse(text), to_string(), arg_shapes(), out_shape
    prim_func: Callable  # spec -> the op as one PrimFunc (TE)
    reference: Callable  # (spec, **inputs) -> the output, numpy
    random_inputs: Callable  # (spec, seed) -> {name: array}
    find: Callable  # (relax function, conv names) -> candidates


OP_KINDS: dict[str, OpKind] = {}
# the modules that register a kind when imported (imported on first use: TVM's import is slow)
KIND_MODULES = ("tvm_b2b.op.fused_pair", "tvm_b2b.op.conv2d")  # in planning order: a pair claims its convs first


def op_kinds() -> dict[str, OpKind]:
    """Every registered op kind by name."""
    import importlib

    for module in KIND_MODULES:
        importlib.import_module(module)
    return OP_KINDS


def register(kind: OpKind) -> OpKind:
    if kind.name in OP_KINDS:
        raise ValueError(f"op kind {kind.name!r} is registered already")
    OP_KINDS[kind.name] = kind
    return kind


def parse_spec(text: str):
    """A spec of any op kind from its text: a fused pair's (it has k1=) or a single conv's (k=)."""
    from .conv_spec import ConvSpec
    from .spec import FusedConvSpec

    fields = {item.partition("=")[0].strip() for item in text.split(",")}
    return (FusedConvSpec if "k1" in fields else ConvSpec).parse(text)
