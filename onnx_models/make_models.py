"""Small ONNX models covering what the frontend must fuse, or refuse, as torch exports them.

    python onnx_models/make_models.py [OUT_DIR]      (default: onnx_models/)

writes one .onnx per entry of MODELS (generated, not committed: they are rebuilt in seconds).
Real CNNs: export them with torch (a dev tool only, never a runtime dependency), e.g.
    import torch, torchvision
    m = torchvision.models.resnet50().eval()
    torch.onnx.export(m, torch.randn(1, 3, 224, 224), "resnet50.onnx", opset_version=17, dynamo=False)
or with onnx_models/torchvision_models.py (random weights, BatchNorm calibrated; what the tests use):
    python -c "import sys; sys.path.insert(0, 'onnx_models'); import torchvision_models as t; print(t.export('resnet50', 1, 224, '.'))"
"""
from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Graph:
    """A tiny NCHW graph builder: each method adds a node and returns its output name."""

    def __init__(self, name: str, n: int, c: int, h: int, w: int, seed: int = 0):
        self.name, self.nodes, self.inits = name, [], []
        self.rng = np.random.default_rng(seed)
        self.input = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])
        self.count = 0

    def _const(self, value) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def _ints(self, value) -> str:
        self.count += 1
        name = f"i{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
        return name

    def _node(self, op: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, bias: bool = True, groups: int = 1, pad=None,
             dilation: int = 1) -> str:
        w = self._const(self.rng.standard_normal((cout, cin // groups, k, k)) * (cin / groups * k * k) ** -0.5)
        inputs = [x, w] + ([self._const(self.rng.standard_normal(cout) * 0.1)] if bias else [])
        p = dilation * (k // 2) if pad is None else pad
        return self._node("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[p] * 4, group=groups,
                          dilations=[dilation, dilation])

    def pad(self, x: str, top: int, left: int, bottom: int, right: int, mode: str = "constant") -> str:
        """ONNX Pad (opset 11+: pads as an input) of the spatial axes, as Keras' ZeroPadding2D exports."""
        return self._node("Pad", [x, self._ints([0, 0, top, left, 0, 0, bottom, right])], mode=mode)

    def conv_auto_pad(self, x: str, cin: int, cout: int, k: int, stride: int, auto_pad: str) -> str:
        """A Conv whose padding is auto_pad (SAME_UPPER: TensorFlow's "same", the odd row below), no pads given."""
        w = self._const(self.rng.standard_normal((cout, cin, k, k)) * (cin * k * k) ** -0.5)
        return self._node("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], auto_pad=auto_pad)

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        args = [r.uniform(0.5, 1.5, c), r.standard_normal(c) * 0.1, r.standard_normal(c) * 0.1, r.uniform(0.5, 1.5, c)]
        return self._node("BatchNormalization", [x, *map(self._const, args)], epsilon=1e-5)

    def mul_add(self, x: str, c: int) -> str:
        m = self._node("Mul", [x, self._const(self.rng.uniform(0.5, 1.5, (1, c, 1, 1)))])
        return self._node("Add", [m, self._const(self.rng.standard_normal((1, c, 1, 1)) * 0.1)])

    def relu(self, x: str) -> str:
        return self._node("Relu", [x])

    def relu6(self, x: str) -> str:
        return self._node("Clip", [x, self._const(0.0), self._const(6.0)])

    def add(self, a: str, b: str) -> str:
        return self._node("Add", [a, b])

    def sigmoid(self, x: str) -> str:
        return self._node("Sigmoid", [x])

    def halves(self, x: str) -> tuple[str, str]:
        """torch's x.chunk(2, dim=1) as its exporter writes it: the split point computed from Shape at run time, on
        1-element vectors (TVM imports a Slice with such bounds as a dynamic_strided_slice of unknown shape)."""
        channels = self._node("Gather", [self._node("Shape", [x]), self._ints([1])], axis=0)
        half = self._node("Div", [self._node("Add", [channels, self._ints([1])]), self._ints([2])])
        first, end = self._node("Mul", [half, self._ints([1])]), self._node("Mul", [half, self._ints([2])])
        axes = self._ints([1])
        return self._node("Slice", [x, self._ints([0]), first, axes]), self._node("Slice", [x, first, end, axes])

    def shuffle(self, x: str, shape: list[int]) -> str:
        """ShuffleNet's channel shuffle of 2 groups: reshape, swap the groups axis, reshape back."""
        n, c, h, w = shape
        grouped = self._node("Reshape", [x, self._ints([n, 2, c // 2, h, w])])
        return self._node("Reshape", [self._node("Transpose", [grouped], perm=[0, 2, 1, 3, 4]), self._ints(shape)])

    def model(self, *outputs: str) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, self.name, [self.input], outs, self.inits)
        # IR version 8 (ONNX 1.10+): older onnxruntime builds reject the newest IR versions
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
        return model


def torch_bottleneck(g: Graph, x: str, c: int, mid: int, stride: int = 1) -> str:
    """ResNet-style 3x3 -> 1x1 tail as torch exports it: BN folded into conv biases, identity
    residual when shapes allow."""
    y = g.relu(g.conv(x, c, mid, 3, stride))
    y = g.conv(y, mid, c, 1)
    return g.relu(g.add(y, x) if stride == 1 else y)


def bn_kept(g: Graph):  # BatchNormalization nodes left in the graph
    y = g.relu(g.bn(g.conv("x", 16, 32, 3, bias=False), 32))
    return g.relu(g.bn(g.conv(y, 32, 24, 1, bias=False), 24))


def mul_add(g: Graph):  # scale and bias as Mul/Add by per-channel constants
    y = g.relu(g.mul_add(g.conv("x", 16, 32, 3, bias=False), 32))
    return g.mul_add(g.conv(y, 32, 24, 1, bias=False), 24)


def residual(g: Graph):  # torch export: bias folded, Relu, Conv, Add, Relu
    return torch_bottleneck(g, "x", 16, 32)


def stride2(g: Graph):
    return torch_bottleneck(g, "x", 16, 24, stride=2)


def relu6(g: Graph):
    return g.relu6(g.conv(g.relu6(g.conv("x", 16, 32, 3)), 32, 48, 1))


def no_act(g: Graph):
    return g.conv(g.conv("x", 16, 20, 3), 20, 12, 1)


def conv3x3_conv3x3(g: Graph):  # negative: the second conv is 3x3
    return g.relu(g.conv(g.relu(g.conv("x", 16, 32, 3)), 32, 16, 3))


def two_consumers(g: Graph):  # negative: the intermediate feeds the 1x1 conv and another branch
    mid = g.relu(g.conv("x", 16, 16, 3))
    return g.add(g.conv(mid, 16, 16, 1), mid)


def grouped(g: Graph):  # ResNeXt's: a grouped 3x3 (4 channels per group) -> 1x1
    return g.relu(g.conv(g.relu(g.conv("x", 16, 32, 3, groups=4)), 32, 16, 1))


def inverted_residual(g: Graph, x: str, c: int, out: int, stride: int = 1, expand: int = 6) -> str:
    """MobileNetV2's block: expand 1x1 -> depthwise 3x3 -> project 1x1 (no activation), + x where shapes match."""
    wide = c * expand
    y = g.relu6(g.bn(g.conv(x, c, wide, 1, bias=False), wide))
    y = g.relu6(g.bn(g.conv(y, wide, wide, 3, stride, bias=False, groups=wide), wide))
    y = g.bn(g.conv(y, wide, out, 1, bias=False), out)
    return g.add(y, x) if stride == 1 and c == out else y


def depthwise(g: Graph):  # MobileNetV2's blocks: with the residual, then stride 2 with odd channel counts
    return inverted_residual(g, inverted_residual(g, "x", 16, 16), 16, 12, stride=2, expand=5)


def channel_split(g: Graph):
    """ShuffleNetV2's unit after the previous unit's shuffle: half the channels pass, the other half run 1x1 ->
    depthwise 3x3 -> 1x1 (a pair), then concat and shuffle. The split's bounds are shape arithmetic on the shuffle's
    output (TVM imports that as a slice of unknown shape: folded to constants before the import)."""
    kept, branch = g.halves(g.shuffle("x", [2, 16, 9, 7]))
    y = g.relu(g.bn(g.conv(branch, 8, 8, 1, bias=False), 8))
    y = g.relu(g.bn(g.conv(g.bn(g.conv(y, 8, 8, 3, bias=False, groups=8), 8), 8, 8, 1, bias=False), 8))
    return g.shuffle(g._node("Concat", [kept, y], axis=1), [2, 16, 9, 7])


def grouped_1x1(g: Graph):  # negative: the 1x1 is grouped
    return g.conv(g.relu(g.conv("x", 16, 32, 3)), 32, 16, 1, groups=2)


def dilated(g: Graph):  # negative: a 3x3 dilated by 2 but padded by 1 (it shrinks the image) -> 1x1, two single convs
    return g.conv(g.relu(g.conv("x", 16, 16, 3, dilation=2, pad=1)), 16, 8, 1)


def atrous_pairs(g: Graph):  # DeepLabV3-ResNet50's dilated bottleneck, then a dilated depthwise pair (MobileNetV3's)
    y = g.relu(g.conv(g.relu(g.conv("x", 16, 8, 1)), 8, 8, 3, dilation=2))
    x = g.relu(g.add(g.conv(y, 8, 16, 1), "x"))
    return g.conv(g.relu6(g.conv(x, 16, 16, 3, groups=16, dilation=4)), 16, 8, 1)


def atrous(g: Graph):  # DeepLabV3's atrous backbone and ASPP head: dilated dense, depthwise and strided convs
    x = g.relu(g.conv(g.relu(g.conv("x", 16, 32, 3, dilation=2)), 32, 32, 3, groups=32, dilation=2))
    branches = [g.relu(g.conv(x, 32, 16, 1))] + [g.relu(g.conv(x, 32, 16, 3, dilation=d)) for d in (3, 6)]
    y = g.relu(g.conv(g._node("Concat", branches, axis=1), 48, 16, 1))
    return g.conv(y, 16, 8, 3, stride=2, dilation=2)


def tf_same(g: Graph):  # a Keras model as tf2onnx exports it: NHWC in and out, TensorFlow's "same" padding of strided
    # convs (ZeroPadding2D -> Conv, or auto_pad): each conv pads itself
    x = g._node("Transpose", ["x"], perm=[0, 3, 1, 2])
    x = g.relu(g.conv(g.pad(x, 0, 0, 1, 1), 3, 16, 3, stride=2, pad=0))  # ZeroPadding2D -> a stem of 3 channels
    x = g.relu6(g.conv(g.pad(x, 0, 0, 1, 1), 16, 16, 3, stride=2, groups=16, pad=0))  # a depthwise pair padded so
    x = g.conv(x, 16, 24, 1)
    x = g.relu(g.conv_auto_pad(x, 24, 24, 3, 2, "SAME_UPPER"))  # 8x8: pads [0, 0, 1, 1]
    x = g.conv_auto_pad(x, 24, 16, 3, 1, "SAME_LOWER")
    x = g.conv(g.pad(x, 1, 1, 1, 1, mode="reflect"), 16, 16, 3, pad=0)  # not zeros: stays a Pad
    x = g.conv(g.pad(x, 2, 2, 2, 2), 16, 8, 3)  # with the conv's own 1, wider than the kernel: stays a Pad
    return g._node("Transpose", [x], perm=[0, 2, 3, 1])


def sigmoid_between(g: Graph):  # negative: an activation the kernel does not have
    return g.conv(g.sigmoid(g.conv("x", 16, 32, 3)), 32, 16, 1)


def grouped_sigmoid(g: Graph):  # negative: a sigmoid between a grouped 3x3 and the 1x1
    return g.conv(g.sigmoid(g.conv("x", 16, 32, 3, groups=4)), 32, 16, 1)


def across_blocks(g: Graph):  # no pair: 3x3 -> residual add -> relu -> 1x1 spans two blocks (ResNet-18's downsample)
    y = g.relu(g.add(g.conv("x", 16, 16, 3), "x"))
    return g.add(g.conv(y, 16, 16, 1), g.conv(y, 16, 16, 3))


def projection(g: Graph):  # ResNet's downsample block: the shortcut conv's output is the pair's residual
    y = g.relu(g.conv("x", 16, 16, 1))
    y = g.conv(g.relu(g.conv(y, 16, 16, 3, 2)), 16, 32, 1)
    return g.relu(g.add(y, g.conv("x", 16, 32, 1, 2, pad=0)))


def wide_1x1(g: Graph):  # a projection block of 64+ channels: its single 1x1 convs are wide enough for sm_90's TMA + wgmma
    y = g.relu(g.conv("x", 64, 64, 1))
    y = g.conv(g.relu(g.conv(y, 64, 64, 3)), 64, 128, 1)
    return g.relu(g.add(y, g.conv("x", 64, 128, 1, pad=0)))


def mini_resnet(g: Graph):  # three bottleneck tails, one with stride 2, plus a stem and a head
    x = g.relu(g.conv("x", 16, 32, 1))
    x = torch_bottleneck(g, x, 32, 32)
    x = torch_bottleneck(g, x, 32, 48, stride=2)
    x = torch_bottleneck(g, x, 32, 32)
    return g.conv(x, 32, 8, 1)


def stem(g: Graph):  # ResNet's 7x7/2 stem of 3 channels (no pair: its space-to-depth conv)
    return g.relu(g.conv("x", 3, 64, 7, stride=2))


def resnet50_body(g: Graph):
    """ResNet-50's 16 bottlenecks (stem and head left out) as torch exports them, BN folded:
    1x1 -> 3x3 (stride 2 in each stage's first block) -> 1x1 (+ identity or projection) -> relu."""
    x, c_in = "x", 64
    for mid, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for i in range(blocks):
            stride = 2 if i == 0 and mid != 64 else 1
            y = g.relu(g.conv(x, c_in, mid, 1))
            y = g.relu(g.conv(y, mid, mid, 3, stride))
            y = g.conv(y, mid, 4 * mid, 1)
            shortcut = x if i else g.conv(x, c_in, 4 * mid, 1, stride, pad=0)
            x, c_in = g.relu(g.add(y, shortcut)), 4 * mid
    return x


# name -> (builder, input shape (n, c, h, w; tf_same's NHWC), pairs expected, pairs fused on CPU)
MODELS = {
    "bn_kept": (bn_kept, (2, 16, 13, 11), 1, 1),
    "mul_add": (mul_add, (1, 16, 12, 12), 1, 1),
    "residual": (residual, (2, 16, 14, 14), 1, 1),
    "stride2": (stride2, (1, 16, 15, 15), 1, 1),
    "relu6": (relu6, (1, 16, 9, 9), 1, 1),
    "no_act": (no_act, (1, 16, 8, 8), 1, 1),
    "conv3x3_conv3x3": (conv3x3_conv3x3, (1, 16, 8, 8), 0, 0),
    "two_consumers": (two_consumers, (1, 16, 8, 8), 1, 0),
    "grouped": (grouped, (1, 16, 8, 8), 1, 1),
    "depthwise": (depthwise, (2, 16, 9, 9), 2, 2),
    "channel_split": (channel_split, (2, 16, 9, 7), 1, 1),
    "grouped_1x1": (grouped_1x1, (1, 16, 8, 8), 1, 0),
    "dilated": (dilated, (1, 16, 8, 8), 1, 0),
    "atrous": (atrous, (1, 16, 13, 12), 1, 0),
    "atrous_pairs": (atrous_pairs, (2, 16, 13, 12), 2, 2),
    "tf_same": (tf_same, (2, 32, 32, 3), 1, 1),  # NHWC
    "sigmoid_between": (sigmoid_between, (1, 16, 8, 8), 1, 0),
    "grouped_sigmoid": (grouped_sigmoid, (1, 16, 8, 8), 1, 0),
    "across_blocks": (across_blocks, (1, 16, 8, 8), 0, 0),
    "mini_resnet": (mini_resnet, (2, 16, 16, 16), 3, 3),
    "projection": (projection, (1, 16, 8, 8), 1, 1),
    "wide_1x1": (wide_1x1, (2, 64, 10, 9), 1, 1),
    "stem": (stem, (2, 3, 32, 30), 0, 0),
}


# built on demand (bench/bench_model.py), not by main(): ~100 MB of weights
LARGE = {"resnet50_body": (resnet50_body, (1, 64, 56, 56), 16, 16)}


def make(name: str, batch: int | None = None) -> onnx.ModelProto:
    build, shape, _, _ = {**MODELS, **LARGE}[name]
    g = Graph(name, *((batch,) + shape[1:] if batch else shape))
    return g.model(build(g))


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for name in MODELS:
        onnx.save(make(name), os.path.join(out_dir, f"{name}.onnx"))
    print(f"wrote {len(MODELS)} models to {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
