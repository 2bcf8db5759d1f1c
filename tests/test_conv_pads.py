"""frontend.conv_pads: zero padding moved into the Convs that read it, and auto_pad SAME_* written as pads. Each case
is a small ONNX model run by onnxruntime before and after the pass: the outputs must be equal (exactly: zeros are
zeros), and the Pads left must be the ones the pass may not move."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tvm_b2b.frontend.conv_pads import conv_pads_inlined, same_pads


def _model(nodes, inits, shape=(1, 4, 9, 8), opset=17):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weight(k=3, c=4, out=4):
    return np.random.default_rng(0).standard_normal((out, c, k, k)).astype(np.float32)


def _run(model, shape=(1, 4, 9, 8)):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _check(model, pads_left: int, shape=(1, 4, 9, 8)) -> onnx.ModelProto:
    out = conv_pads_inlined(model)
    assert [n.op_type for n in out.graph.node].count("Pad") == pads_left
    np.testing.assert_array_equal(_run(out, shape), _run(model, shape))
    return out


def _pad_conv(pads, conv_pads=(0, 0, 0, 0), value=None, mode="constant", axes=None, k=3):
    inputs = ["x", "pads"] + (["value"] if value is not None or axes is not None else [])
    inits = {"pads": np.asarray(pads, np.int64), "w": _weight(k)}
    if value is not None or axes is not None:
        inputs[-1] = "value" if value is not None else ""
        if value is not None:
            inits["value"] = np.asarray(value, np.float32)
    if axes is not None:
        inputs.append("axes")
        inits["axes"] = np.asarray(axes, np.int64)
    nodes = [helper.make_node("Pad", inputs, ["p"], mode=mode),
             helper.make_node("Conv", ["p", "w"], ["y"], pads=list(conv_pads), strides=[2, 2])]
    return _model(nodes, inits, opset=18)


@pytest.mark.parametrize("case, left", [
    (dict(pads=[0, 0, 0, 0, 0, 0, 1, 1]), 0),  # Keras' ZeroPadding2D before a stride-2 conv
    (dict(pads=[0, 0, 1, 0, 0, 0, 0, 1], conv_pads=(1, 0, 0, 1)), 0),  # added to the conv's own
    (dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], value=0.0), 0),
    (dict(pads=[1, 1, 0, 1], axes=[2, 3]), 0),  # opset 18's axes: (top, left, bottom, right) of axes 2 and 3
    (dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], value=0.5), 1),  # not zeros
    (dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="edge"), 1),
    (dict(pads=[1, 0, 0, 0, 0, 0, 0, 0]), 1),  # an image more: not the conv's padding
    (dict(pads=[0, 0, 2, 2, 0, 0, 2, 2], conv_pads=(1, 1, 1, 1)), 1),  # 3 a side: as wide as the 3x3, no conv of ours
    (dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], k=1), 1),  # a 1x1 takes no padding
], ids=["keras", "added", "value-0", "axes", "value-0.5", "edge", "batch", "too-wide", "1x1"])
def test_zero_pad_moves_into_the_conv(case, left):
    model = _pad_conv(**case)
    out = _check(model, left)
    if not left:
        assert not {i.name for i in out.graph.initializer} & {"pads", "value", "axes"}  # nothing left unread


def test_pad_read_by_another_op_stays():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "w"], ["c"], strides=[2, 2]),
             helper.make_node("ReduceMean", ["p"], ["m"], axes=[2, 3], keepdims=1),
             helper.make_node("Add", ["c", "m"], ["y"])]
    _check(_model(nodes, {"pads": np.asarray([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "w": _weight()}), 1)


def test_pad_of_two_convs_moves_into_both():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "w"], ["a"], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w"], ["b"], strides=[2, 2], pads=[1, 1, 0, 0]),
             helper.make_node("ReduceMean", ["a"], ["ma"], axes=[2, 3], keepdims=1),
             helper.make_node("ReduceMean", ["b"], ["mb"], axes=[2, 3], keepdims=1),
             helper.make_node("Add", ["ma", "mb"], ["y"])]
    out = _check(_model(nodes, {"pads": np.asarray([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "w": _weight()}), 0)
    assert [list(n.attribute[-1].ints) for n in out.graph.node if n.op_type == "Conv"] == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_pad_attribute_of_old_opsets_moves():
    nodes = [helper.make_node("Pad", ["x"], ["p"], pads=[0, 0, 0, 0, 0, 0, 1, 1]),
             helper.make_node("Conv", ["p", "w"], ["y"], strides=[2, 2])]
    _check(_model(nodes, {"w": _weight()}, opset=10), 0)


@settings(max_examples=25, deadline=None)
@given(h=st.integers(3, 12), w=st.integers(3, 12), k=st.sampled_from([1, 2, 3, 5]), stride=st.integers(1, 3),
       upper=st.booleans())
def test_auto_pad_same_becomes_pads(h, w, k, stride, upper):
    """auto_pad SAME_UPPER / SAME_LOWER written as explicit pads (same_pads): onnxruntime's output is unchanged, on
    every size, kernel and stride."""
    mode = "SAME_UPPER" if upper else "SAME_LOWER"
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=[stride] * 2)]
    shape = (1, 4, h, w)
    out = _check(_model(nodes, {"w": _weight(k)}, shape), 0, shape)
    attrs = {a.name: a for a in out.graph.node[0].attribute}
    assert "auto_pad" not in attrs
    assert list(attrs["pads"].ints) == same_pads((h, w), (k, k), (stride,) * 2, upper)


def test_dilated_auto_pad_is_left_to_the_importer():
    """onnxruntime, the reference, runs no dilated SAME conv: such a conv stays as the model wrote it."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", dilations=[2, 2])]
    model = _model(nodes, {"w": _weight()})
    assert conv_pads_inlined(model) is model


def test_pad_a_subgraph_reads_stays():
    """An If's branch reading the padded tensor from the outer graph keeps its Pad (removing it would break the model)."""
    branch = helper.make_graph([helper.make_node("Identity", ["p"], ["b"])], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "w"], ["c"], strides=[2, 2]),
             helper.make_node("If", ["cond"], ["i"], then_branch=branch, else_branch=branch),
             helper.make_node("ReduceMean", ["i"], ["m"], axes=[2, 3], keepdims=1),
             helper.make_node("Add", ["c", "m"], ["y"])]
    inits = {"pads": np.asarray([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "w": _weight(), "cond": np.asarray(True)}
    _check(_model(nodes, inits), 1)
