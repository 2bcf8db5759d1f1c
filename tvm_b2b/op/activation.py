"""The activations an op kind may apply, in one table: each with its TE form (kernels), its numpy
form (references) and how the frontend recognizes it in a Relax graph. A new activation is one entry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Activation:
    te: Callable  # float32 TE expression -> expression
    numpy: Callable  # float32 array -> array
    # match(call, value_of, single_use) -> the activation's input when the Relax call computes this
    # activation (value_of: a Var's bound value; single_use: whether a Var has one user), else None
    match: Callable


def relax_op(expr) -> str:
    """The op name of a Relax call ("relax.nn.relu"), "" for anything else."""
    from tvm import relax

    return getattr(getattr(expr, "op", None), "name", "") if isinstance(expr, relax.Call) else ""


def relax_const(expr):
    """The numpy value of a Relax constant, else None."""
    from tvm import relax

    value = None if isinstance(expr, (relax.Var, relax.Call)) else getattr(expr, "value", None)
    return value.numpy() if value is not None and hasattr(value, "numpy") else None


def _scalar(expr):
    """The float value of a one-element Relax constant, else None."""
    value = relax_const(expr)
    return float(value) if value is not None and value.size == 1 else None


def _te_max0(v):
    from tvm import te, tirx

    return te.max(v, tirx.const(0.0, "float32"))


def _te_relu6(v):
    from tvm import te, tirx

    return te.min(_te_max0(v), tirx.const(6.0, "float32"))


def _match_relu(call, value_of, single_use):
    op = relax_op(call)
    if op == "relax.nn.relu" or (op == "relax.maximum" and _scalar(call.args[1]) == 0.0):
        return call.args[0]
    return None


def _match_relu6(call, value_of, single_use):
    op = relax_op(call)
    if op == "relax.clip" and float(call.args[1].value) == 0.0 and float(call.args[2].value) == 6.0:
        return call.args[0]
    if op == "relax.minimum" and _scalar(call.args[1]) == 6.0:  # min(max(x, 0), 6)
        inner = value_of(call.args[0])
        if relax_op(inner) == "relax.maximum" and _scalar(inner.args[1]) == 0.0 and single_use(call.args[0]):
            return inner.args[0]
    return None


ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(te=_te_max0, numpy=lambda v: np.maximum(v, 0.0), match=_match_relu),
    "relu6": Activation(te=_te_relu6, numpy=lambda v: np.clip(v, 0.0, 6.0), match=_match_relu6),
    "none": Activation(te=lambda v: v, numpy=lambda v: v, match=lambda call, value_of, single_use: None),
}


def activation(name: str) -> Activation:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation: unknown {name!r} (expected one of {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def match_activation(call, value_of, single_use):
    """(name, input) of the activation a Relax call computes, else (None, None). relu6 is tried first:
    its min(max(x, 0), 6) form contains relu's max(x, 0)."""
    for name in ("relu6", *(n for n in ACTIVATIONS if n != "relu6")):
        source = ACTIVATIONS[name].match(call, value_of, single_use)
        if source is not None:
            return name, source
    return None, None
