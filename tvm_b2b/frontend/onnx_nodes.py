"""Small readers and writers of ONNX graphs that the frontend's passes share (static_shapes, conv_pads, dead_taps)."""
from __future__ import annotations


def value_shapes(graph) -> dict:
    """name -> tuple of ints, for every value whose shape inference found every dimension."""
    shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = tensor.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def attr(node, name: str, default=None):
    from onnx import helper

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def ints(node, name: str, default):
    value = attr(node, name)
    return default if value is None else [int(v) for v in value]


def set_attr(node, name: str, value) -> None:
    """Set (or, with None, remove) one attribute of a node."""
    from onnx import helper

    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + ([helper.make_attribute(name, value)] if value is not None else []))
