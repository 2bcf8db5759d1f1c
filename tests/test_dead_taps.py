"""frontend.dead_taps: a conv's taps that read only padding cut out of its kernel. Each case is a small ONNX model run
by onnxruntime before and after the pass: the outputs must match (the taps cut out only multiplied zeros), and the
conv left must have the kernel, pads and dilations the live taps make. Then the pass in the importer: DeepLabV3's ASPP
shape through tvm-b2b's own build, against onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tvm_b2b.frontend.onnx_nodes import attr, ints
from tvm_b2b.frontend.dead_taps import dead_taps_dropped, live_range


def _model(convs, shape, c=4, k=6, shared=False):
    """x -> each conv of `convs` (kwargs of a Conv node: pads, dilations, strides, kernel) -> summed outputs."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for i, conv in enumerate(convs):
        kernel = conv.pop("kernel", (3, 3))
        weight = "w0" if shared else f"w{i}"
        if not shared or i == 0:
            per_group = c // conv.get("group", 1)
            inits.append(numpy_helper.from_array(rng.standard_normal((k, per_group, *kernel)).astype(np.float32), weight))
        nodes.append(helper.make_node("Conv", ["x", weight], [f"y{i}"], kernel_shape=list(kernel), **conv))
    out = "y0"
    for i in range(1, len(convs)):
        nodes.append(helper.make_node("Add", [out, f"y{i}"], [f"s{i}"]))
        out = f"s{i}"
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _convs(model):
    weights = {i.name: i for i in model.graph.initializer}
    return [(list(weights[n.input[1]].dims[2:]), ints(n, "pads", [0] * 4), ints(n, "dilations", [1, 1]))
            for n in model.graph.node if n.op_type == "Conv"]


@pytest.mark.parametrize("conv, shape, want", [
    # DeepLabV3's ASPP at 224x224 (28x28, dilation 36): the centre tap alone, a 1x1 conv
    (dict(pads=[36] * 4, dilations=[36, 36]), (1, 4, 28, 28), ([1, 1], [0] * 4, [1, 1])),
    # rows too few for the dilation, columns enough: a 1x3 of dilation (1, 8)
    (dict(pads=[8] * 4, dilations=[8, 8]), (1, 4, 6, 20), ([1, 3], [0, 8, 0, 8], [1, 8])),
    # padded on one side only: the first row of taps reads nothing
    (dict(pads=[11, 0, 0, 0], dilations=[5, 1]), (1, 4, 6, 7), ([2, 3], [6, 0, 0, 0], [5, 1])),
    # strided: the last row of taps never reaches the input (rows 0, 3, 6 read by the first tap, 8, 11, 14 by the last)
    (dict(pads=[0, 1, 8, 1], dilations=[4, 1], strides=[3, 1]), (1, 4, 8, 5), ([2, 3], [0, 1, 4, 1], [4, 1])),
    # a 5x5 whose outer ring of taps reads nothing
    (dict(pads=[12] * 4, dilations=[6, 6], kernel=(5, 5)), (1, 4, 8, 8), ([3, 3], [6] * 4, [6, 6])),
    # depthwise-grouped (a segmentation head's dilated depthwise 3x3)
    (dict(pads=[16] * 4, dilations=[16, 16], group=2), (1, 4, 10, 10), ([1, 1], [0] * 4, [1, 1])),
])
def test_dead_taps_cut(conv, shape, want):
    model = _model([conv], shape)
    out = dead_taps_dropped(model)
    assert _convs(out) == [want]
    np.testing.assert_allclose(_run(out, shape), _run(model, shape), rtol=1e-5, atol=1e-5)
    node = next(n for n in out.graph.node if n.op_type == "Conv")
    assert ints(node, "kernel_shape", None) == want[0]


def test_live_taps_kept():
    """Every tap reads the input somewhere (DeepLabV3's dilation 12 and 24 at 28x28; an undilated conv): the model
    itself comes back."""
    for conv, shape in [(dict(pads=[12] * 4, dilations=[12, 12]), (1, 4, 28, 28)),
                        (dict(pads=[24] * 4, dilations=[24, 24]), (1, 4, 28, 28)),
                        (dict(pads=[1] * 4), (1, 4, 5, 5))]:
        model = _model([conv], shape)
        assert dead_taps_dropped(model) is model


def test_a_shared_weight_is_copied():
    """Two convs read one weight, one of them with dead taps: it gets a sliced copy, the other keeps the weight."""
    shape = (1, 4, 6, 6)
    model = _model([dict(pads=[1] * 4), dict(pads=[8] * 4, dilations=[8, 8])], shape, shared=True)
    out = dead_taps_dropped(model)
    assert _convs(out) == [([3, 3], [1] * 4, [1, 1]), ([1, 1], [0] * 4, [1, 1])]
    assert len(out.graph.initializer) == 2 and attr(out.graph.node[0], "kernel_shape") == [3, 3]
    np.testing.assert_allclose(_run(out, shape), _run(model, shape), rtol=1e-5, atol=1e-5)


def test_a_weight_declared_as_an_input_too():
    """An older exporter's model lists its initializers among the graph's inputs: the cut weight's declaration goes
    (its shape would contradict the slice), and onnxruntime runs the result to the same output."""
    shape = (1, 4, 28, 28)
    model = _model([dict(pads=[36] * 4, dilations=[36, 36])], shape)
    model.graph.input.append(helper.make_tensor_value_info("w0", TensorProto.FLOAT, (6, 4, 3, 3)))
    out = dead_taps_dropped(model)
    assert [i.name for i in out.graph.input] == ["x"] and _convs(out) == [([1, 1], [0] * 4, [1, 1])]
    np.testing.assert_allclose(_run(out, shape), _run(model, shape), rtol=1e-5, atol=1e-5)


@given(size=st.integers(1, 12), k=st.integers(1, 5), stride=st.integers(1, 3), dilation=st.integers(1, 9),
       begin=st.integers(0, 20), end=st.integers(0, 20))
@settings(max_examples=200, deadline=None)
def test_live_range_is_the_taps_that_read_the_input(size, k, stride, dilation, begin, end):
    """live_range against a loop over every output pixel and tap (None: all live, none, or not one run)."""
    out = (size + begin + end - dilation * (k - 1) - 1) // stride + 1
    live = [t for t in range(k) if out > 0 and any(0 <= o * stride + t * dilation - begin < size for o in range(out))]
    got = live_range(size, k, stride, dilation, begin, end)
    if not live or len(live) == k or live != list(range(live[0], live[-1] + 1)):
        assert got is None
    else:
        assert got == (live[0], live[-1])


def test_aspp_branch_compiles_as_a_1x1_and_matches_onnxruntime(tmp_path):
    """DeepLabV3's ASPP shape (28x28, a 3x3 of dilation 36 beside one of dilation 12, few channels) through
    compile_model on llvm: the third branch's conv spec is a 1x1, and the module matches onnxruntime on the original
    model (float32, 1e-4)."""
    import tvm_b2b
    from tvm_b2b.frontend.model import compile_model
    from tvm_b2b.target import parse_target

    shape = (1, 8, 28, 28)
    model = _model([dict(pads=[12] * 4, dilations=[12, 12]), dict(pads=[36] * 4, dilations=[36, 36])], shape, c=8, k=16)
    model.graph.input[0].name = model.graph.node[0].input[0] = model.graph.node[1].input[0] = "x"
    path, lib = tmp_path / "aspp.onnx", tmp_path / "aspp.so"
    path.write_bytes(model.SerializeToString())
    candidates = compile_model(str(path), str(lib), parse_target("llvm"))
    specs = sorted((c.spec.kh, c.spec.pads, c.spec.dilation) for c in candidates)
    assert specs == [(1, (0, 0, 0, 0), 1), (3, (12, 12, 12, 12), 12)], specs
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = tvm_b2b.load(str(lib))(x=x)
    np.testing.assert_allclose(next(iter(got.values())), _run(model, shape), rtol=1e-4, atol=1e-4)
