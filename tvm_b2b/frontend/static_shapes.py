"""Shape arithmetic of an ONNX graph folded into constants where the model's shapes are static.

Exporters write a shape-dependent step as a small computation on `Shape`: torch's `x.chunk(2, dim=1)` (ShuffleNetV2's
channel split) becomes Shape -> Gather -> Add -> Div -> Mul -> Slice. TVM's importer turns a Slice whose bounds are
not constants into a dynamic_strided_slice of unknown shape, which the rest of the graph (every conv after it) cannot
be legalized with ("emit_te now only supports Tensor that has ShapeExpr shape"). With a static input shape those
bounds are constants: this pass evaluates them (onnx's reference evaluator, node by node) so that the importer sees a
plain Slice, as onnx-simplifier would. Only small integer-valued results are folded; the graph's tensors are never
touched, so the numerics are the model's own.
"""
from __future__ import annotations

import numpy as np

from .onnx_nodes import value_shapes

# the ops of shape arithmetic; a node of these whose inputs are all known (and small) becomes a constant
SHAPE_OPS = {"Shape", "Size", "Constant", "Gather", "Unsqueeze", "Squeeze", "Concat", "Add", "Sub", "Mul", "Div",
             "Cast", "Slice", "Range", "Equal", "Where", "ConstantOfShape", "Reshape", "Identity", "Min", "Max",
             "Floor", "Ceil", "Neg", "Abs"}
MOST_ELEMENTS = 64  # a shape or an index list, never a weight


def fold_static_shapes(model):
    """`model` with the outputs of its shape arithmetic (on static shapes) as initializers, and the nodes that
    computed them removed; the model itself where there is nothing to fold. Rounds of shape inference and folding
    until nothing more folds: a Reshape whose target shape folds has a static output only in the next round."""
    while True:
        folded = _fold_once(model)
        if folded is model:
            return model
        model = folded


def _fold_once(model):
    import onnx
    from onnx import numpy_helper

    try:
        shapes = value_shapes(onnx.shape_inference.infer_shapes(model, data_prop=True).graph)
    except Exception:  # noqa: BLE001 - a model shape inference cannot follow is imported as it is
        return model
    known = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer
             if _small(init.dims)}
    folded, kept, opset = {}, [], _opset(model)
    for node in model.graph.node:
        values = _evaluate(node, known, shapes, opset)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, values):
            known[name] = folded[name] = value
    if not folded:
        return model
    used = _inputs(kept) | {output.name for output in model.graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in folded.items()
                                 if name in used)
    return out


def _evaluate(node, known: dict, shapes: dict, opset: int):
    """The node's outputs as arrays where they are small constants of static shapes, else None."""
    if node.op_type not in SHAPE_OPS or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Shape":
        shape = shapes.get(node.input[0])
        if shape is None:
            return None
        attrs = {a.name: a.i for a in node.attribute}
        return [np.array(shape[attrs.get("start", 0):attrs.get("end", len(shape))], dtype=np.int64)]
    if node.op_type == "Size":
        shape = shapes.get(node.input[0])
        return None if shape is None else [np.array(int(np.prod(shape)), dtype=np.int64)]
    inputs = [name for name in node.input if name]
    if not all(name in known for name in inputs):
        return None
    values = _run(node, {name: known[name] for name in inputs}, opset)
    if values is None or not all(_small(v.shape) and v.dtype.kind in "iub" for v in values):
        return None
    return values


def _run(node, feeds: dict, opset: int):
    """One node through onnx's reference evaluator, or None where it cannot run it."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    try:
        graph = helper.make_graph([node], "fold", [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
            value.dtype), value.shape) for name, value in feeds.items()],
            [helper.make_empty_tensor_value_info(name) for name in node.output])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]
    except Exception:  # noqa: BLE001 - what the evaluator cannot run stays a node for the importer
        return None


def _inputs(nodes) -> set:
    """Every name the nodes read, their subgraphs' (If, Loop, Scan) reads of outer values included."""
    names = set()
    for node in nodes:
        names.update(node.input)
        for attr in node.attribute:
            for graph in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                names |= _inputs(graph.node) | {o.name for o in graph.output}
    return names


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)


def _small(shape) -> bool:
    return int(np.prod(shape)) <= MOST_ELEMENTS if len(shape) else True
