"""Zero padding written apart from the convolution that reads it, moved into that convolution's own pads.

Keras pads before a strided conv with a ZeroPadding2D layer (EfficientNet, MobileNetV2: TensorFlow's "same" for an
even size, one more row and column below and right than above), which ONNX exporters write as Pad -> Conv (pads 0);
PyTorch's nn.ZeroPad2d is the same; a Conv with auto_pad SAME_UPPER or SAME_LOWER leaves its padding to the importer,
which TVM's writes as a separate pad. Either way an extra pass over the input runs before the conv, while our conv
kernels pad for free (a padded read is a predicated zero). This pass writes that padding into the Conv's pads where
the conv stays one our kernels take: constant mode, a zero value, the spatial axes only, every reader of the padded
tensor a Conv, each side's total smaller than the kernel's span. Zeros stay zeros: the numerics are the model's.
"""
from __future__ import annotations

import numpy as np

from .onnx_nodes import attr, ints, set_attr, value_shapes


def conv_pads_inlined(model):
    """`model` with its Convs' auto_pad SAME_* written as pads (where the input's shape is static) and each zero Pad
    whose readers are all Convs moved into their pads; the model itself where there is nothing to move."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    changed = _explicit_same_pads(out)
    changed = _fold_zero_pads(out) or changed
    return out if changed else model


# -- auto_pad SAME_UPPER / SAME_LOWER -> pads -------------------------------------------------------------------
def _explicit_same_pads(model) -> bool:
    import onnx

    convs = [n for n in model.graph.node if n.op_type == "Conv" and attr(n, "auto_pad", b"NOTSET") in (b"SAME_UPPER",
                                                                                                        b"SAME_LOWER")]
    if not convs:
        return False

    try:
        shapes = value_shapes(onnx.shape_inference.infer_shapes(model).graph)
    except Exception:  # noqa: BLE001 - without shapes the importer pads as it does
        return False
    changed = False
    for conv in convs:
        shape, kernel = shapes.get(conv.input[0]), _kernel(model, conv)
        if shape is None or len(shape) != 4 or kernel is None or ints(conv, "dilations", [1, 1]) != [1, 1]:
            continue  # (a dilated one: onnxruntime, the reference, runs none)
        pads = same_pads(shape[2:], kernel, ints(conv, "strides", [1, 1]), upper=attr(conv, "auto_pad") == b"SAME_UPPER")
        set_attr(conv, "auto_pad", None)
        set_attr(conv, "pads", pads)
        changed = True
    return changed


def same_pads(size, kernel, strides, upper: bool) -> list[int]:
    """ONNX's SAME_UPPER / SAME_LOWER pads (begins, then ends) of an undilated conv on `size`: the output
    ceil(size / stride), the total padding split in half, its odd one at the end (upper) or at the beginning."""
    begins, ends = [], []
    for n, k, s in zip(size, kernel, strides):
        total = max((-(-n // s) - 1) * s + k - n, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


# -- Pad -> Conv -------------------------------------------------------------------------------------------------
def _fold_zero_pads(model) -> bool:
    from .static_shapes import _inputs

    constants = _constants(model)
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    # a graph output, or a value a subgraph (If, Loop) reads, is kept as it is
    outputs = {o.name for o in model.graph.output} | _inputs([n for n in model.graph.node if _has_subgraph(n)])
    folded = []
    for pad in (n for n in model.graph.node if n.op_type == "Pad"):
        spatial = _zero_spatial_pads(pad, constants)
        convs = readers.get(pad.output[0], [])
        if spatial is None or pad.output[0] in outputs or not convs:
            continue
        merged = [_merged_pads(model, conv, spatial) if conv.op_type == "Conv" and conv.input[0] == pad.output[0]
                  and conv.input[1:].count(pad.output[0]) == 0 else None for conv in convs]
        if any(m is None for m in merged):
            continue
        for conv, pads in zip(convs, merged):
            set_attr(conv, "pads", pads)
            conv.input[0] = pad.input[0]
        folded.append(pad)
    for pad in folded:
        model.graph.node.remove(pad)
    read = {name for node in model.graph.node for name in node.input}
    unread = [init for init in model.graph.initializer if init.name not in read and any(init.name in p.input for p in folded)]
    for init in unread:  # the folded Pads' pads and values
        model.graph.initializer.remove(init)
    return bool(folded)


def _zero_spatial_pads(pad, constants: dict) -> list[int] | None:
    """The (top, left, bottom, right) of a 4-D Pad of zeros in constant mode on the spatial axes only, else None."""
    if attr(pad, "mode", b"constant") != b"constant":
        return None
    if len(pad.input) > 1:  # opset 11+: pads, [constant_value], [axes] as inputs
        pads = constants.get(pad.input[1])
        value = constants.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
        axes = constants.get(pad.input[3]) if len(pad.input) > 3 and pad.input[3] else None
        if pads is None or value is None or (len(pad.input) > 3 and pad.input[3] and axes is None):
            return None
    else:
        pads, value, axes = np.array(ints(pad, "pads", [])), np.array(attr(pad, "value", 0.0)), None
    pads = [int(p) for p in np.asarray(pads).ravel()]
    if axes is not None:
        full = [0] * 8
        for i, axis in enumerate(int(a) % 4 for a in np.asarray(axes).ravel()):
            full[axis], full[axis + 4] = pads[i], pads[i + len(pads) // 2]
        pads = full
    if len(pads) != 8 or np.any(np.asarray(value) != 0) or min(pads) < 0 or any(pads[i] for i in (0, 1, 4, 5)):
        return None
    return [pads[2], pads[3], pads[6], pads[7]]


def _merged_pads(model, conv, spatial: list[int]) -> list[int] | None:
    """The conv's pads plus `spatial`, where it has no auto_pad and each side stays smaller than the kernel's span."""
    kernel = _kernel(model, conv)
    if kernel is None or len(kernel) != 2 or attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", b""):
        return None
    dilations = ints(conv, "dilations", [1, 1])
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)] * 2
    pads = [a + b for a, b in zip(ints(conv, "pads", [0] * 4), spatial)]
    return pads if all(p < span for p, span in zip(pads, spans)) else None


# -- ONNX helpers -------------------------------------------------------------------------------------------------
def _has_subgraph(node) -> bool:
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def _constants(model) -> dict:
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _kernel(model, conv) -> list[int] | None:
    shape = ints(conv, "kernel_shape", None)
    if shape is not None:
        return shape
    weight = next((init for init in model.graph.initializer if init.name == conv.input[1]), None)
    return list(weight.dims[2:]) if weight is not None else None
