"""Convolution taps that read only padding, cut out of the kernel.

A dilated conv's outer taps reach dilation * (k - 1) / 2 pixels away. Where the input is smaller than that reach, a
row or column of taps reads padding for every output pixel, so it only ever adds zeros. DeepLabV3 at 224x224 is the
case: its ASPP's 3x3 of dilation 36 runs on a 28x28 map, and only its centre tap reads the input.

This pass slices those taps out of the weight and their reach out of the pads. An axis left with one tap loses its
dilation too, so the ASPP branch above becomes a plain 1x1 conv of 2048 channels: 9 times fewer multiply-adds, and a
kernel our fast 1x1 paths take. The result is the same conv, exactly: the taps cut out only multiplied zeros.
"""
from __future__ import annotations

import numpy as np

from .onnx_nodes import attr, ints, set_attr, value_shapes


def dead_taps_dropped(model):
    """`model` with each 2-D Conv's taps that read only padding cut out (where its input's shape is static and its
    weight a constant); the model itself where no conv has such taps."""
    import onnx

    # (undilated taps reach at most k - 1 - pad < k pixels out: one of them always reads the input)
    if not any(n.op_type == "Conv" and any(d > 1 for d in ints(n, "dilations", [1, 1])) for n in model.graph.node):
        return model
    try:
        shapes = value_shapes(onnx.shape_inference.infer_shapes(model).graph)
    except Exception:  # noqa: BLE001 - without shapes every tap stays
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = {init.name: init for init in out.graph.initializer}
    changed = False
    for conv in (n for n in out.graph.node if n.op_type == "Conv"):
        shape, weight = shapes.get(conv.input[0]), weights.get(conv.input[1])
        if shape is None or len(shape) != 4 or weight is None or len(weight.dims) != 4:
            continue
        if attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", b""):
            continue
        cut = _live_taps(conv, shape[2:], list(weight.dims[2:]))
        if cut is not None:
            _cut(out, conv, weight, *cut)
            changed = True
    return out if changed else model


def live_range(size: int, k: int, stride: int, dilation: int, begin: int, end: int) -> tuple[int, int] | None:
    """(first, last) of the taps along one axis that read the input for some output pixel (input `size`, kernel `k`,
    pads `begin` and `end`), or None where the live ones are all k or do not make a contiguous run."""
    out = (size + begin + end - dilation * (k - 1) - 1) // stride + 1
    if out <= 0:
        return None
    reads = np.arange(out)[:, None] * stride + np.arange(k)[None, :] * dilation - begin  # (output, tap) -> input row
    live = np.flatnonzero(((reads >= 0) & (reads < size)).any(axis=0))
    if len(live) in (0, k) or live[-1] - live[0] + 1 != len(live):
        return None
    return int(live[0]), int(live[-1])


def _live_taps(conv, size, kernel) -> tuple[list, list, list, list] | None:
    """The conv's live taps along each spatial axis ((first, last) each), its new pads, dilations and kernel shape; None
    where every tap lives, or where cutting would make a pad negative."""
    strides, dilations = ints(conv, "strides", [1, 1]), ints(conv, "dilations", [1, 1])
    pads = ints(conv, "pads", [0, 0, 0, 0])
    ranges = [live_range(n, k, s, d, pads[i], pads[i + 2]) or (0, k - 1)
              for i, (n, k, s, d) in enumerate(zip(size, kernel, strides, dilations))]
    if all(r == (0, k - 1) for r, k in zip(ranges, kernel)):
        return None
    new_kernel = [last - first + 1 for first, last in ranges]
    begins = [pads[i] - first * dilations[i] for i, (first, _) in enumerate(ranges)]
    ends = [pads[i + 2] - (kernel[i] - 1 - last) * dilations[i] for i, (_, last) in enumerate(ranges)]
    if min(begins + ends) < 0:
        return None
    new_dilations = [d if k > 1 else 1 for d, k in zip(dilations, new_kernel)]  # one tap: no dilation to speak of
    return ranges, begins + ends, new_dilations, new_kernel


def _cut(model, conv, weight, ranges, pads, dilations, kernel) -> None:
    """Slice the conv's weight to `ranges` (a copy of its own where another node reads it too) and set its
    attributes. The weight's declaration as a graph input (older exporters list initializers there) goes with it:
    its shape would contradict the slice."""
    from onnx import numpy_helper

    (h0, h1), (w0, w1) = ranges
    sliced = np.ascontiguousarray(numpy_helper.to_array(weight)[:, :, h0:h1 + 1, w0:w1 + 1])
    readers = sum(name == weight.name for node in model.graph.node for name in node.input)
    name = weight.name if readers == 1 else f"{weight.name}_taps_{conv.output[0]}"
    if readers == 1:
        model.graph.initializer.remove(weight)
        for declared in [i for i in model.graph.input if i.name == weight.name]:
            model.graph.input.remove(declared)
    model.graph.initializer.append(numpy_helper.from_array(sliced, name))
    conv.input[1] = name
    set_attr(conv, "pads", pads)
    set_attr(conv, "dilations", dilations)
    if attr(conv, "kernel_shape") is not None:
        set_attr(conv, "kernel_shape", kernel)
