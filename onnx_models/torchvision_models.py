"""Real models for the tests and bench/bench_e2e.py: torchvision networks with random weights, exported to ONNX by torch
(opset 17, the TorchScript exporter, as users export them), compared with onnxruntime.

The BatchNorm statistics are calibrated on one random batch (train mode, momentum 1), so that each
BatchNorm folds a non-trivial scale and bias into its conv and the activations stay in a realistic
range through 50 layers (no float16 overflow that real weights would not have).
"""
from __future__ import annotations

import os

import numpy as np

# name -> (torchvision builder, its keyword arguments). resnet_bn: a ResNet-50-style network with
# one bottleneck per stage (every conv kind of ResNet-50: 7x7 stem, 3x3 -> 1x1 pairs, stride-2 3x3,
# 1x1 downsample, residuals, pools, FC) that compiles in seconds.
MODELS = {
    "resnet50": ("resnet50", {}),
    "resnet_bn": ("ResNet", {"layers": [1, 1, 1, 1], "num_classes": 100}),
    "mobilenet_v2": ("mobilenet_v2", {}),
    "resnext50_32x4d": ("resnext50_32x4d", {}),
    "resnet18": ("resnet18", {}),
    "shufflenet_v2_x1_0": ("shufflenet_v2_x1_0", {}),
    "deeplabv3_resnet50": ("deeplabv3_resnet50", {}),  # segmentation: dilated (atrous) 3x3s of rate 2, 4, 12, 24, 36
}


def _network(name: str):
    import torch
    import torchvision
    from torchvision.models.resnet import Bottleneck, ResNet

    builder, kwargs = MODELS[name]
    torch.manual_seed(0)
    if builder == "ResNet":
        return ResNet(Bottleneck, **kwargs)
    if hasattr(torchvision.models.segmentation, builder):  # its dict output's "out" (aux heads off)
        return _scores_only(getattr(torchvision.models.segmentation, builder)(weights=None, weights_backbone=None))
    return getattr(torchvision.models, builder)(weights=None, **kwargs)


def _scores_only(net):
    """A torchvision segmentation network's per-pixel scores (the "out" of the dict it returns) as its one output."""
    import torch

    class ScoresOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)["out"]

    return ScoresOnly()


def _calibrate(net, size: int) -> None:
    """BatchNorm running statistics from one random batch (see the module docstring)."""
    import torch

    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = 1.0
    net.train()
    with torch.no_grad():
        net(torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(1)))
    net.eval()


def calibrated_network(name: str, size: int):
    """The torchvision network NAME with seeded random weights and calibrated BatchNorm, in eval mode."""
    net = _network(name)
    _calibrate(net, size)
    return net


def export(name: str, batch: int, size: int, directory, dynamic_batch: bool = False, dynamo: bool = False) -> str:
    """DIR/NAME_bBATCH_SIZE.onnx (made once), input 'input' (batch, 3, size, size), output 'output'; dynamic_batch:
    exported with a symbolic batch (as deployments often are; traced at `batch`), NAME_dyn_SIZE.onnx; dynamo: by
    torch's default exporter since 2.9 (torch.export, opset 20, its optimizer folds BatchNorm), else the TorchScript
    one (opset 17)."""
    import torch

    tag = f"{'dyn' if dynamic_batch else f'b{batch}'}{'_dynamo' if dynamo else ''}"
    path = os.path.join(str(directory), f"{name}_{tag}_{size}.onnx")
    if not os.path.exists(path):
        net = calibrated_network(name, size)
        tmp = path + ".tmp.onnx"
        if dynamo:
            shapes = ({0: torch.export.Dim("batch")},) if dynamic_batch else None
            torch.onnx.export(net, (torch.zeros(batch, 3, size, size),), tmp, dynamo=True, dynamic_shapes=shapes,
                              input_names=["input"], output_names=["output"], verbose=False)
        else:
            axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
            torch.onnx.export(net, torch.zeros(batch, 3, size, size), tmp, opset_version=17, dynamo=False,
                              input_names=["input"], output_names=["output"], dynamic_axes=axes)
        os.replace(tmp, path)
    return path


def random_image(batch: int, size: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)


def onnxruntime_output(path: str, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: one number for a whole output (logits of random weights are
    near zero in places, where an elementwise relative error says nothing)."""
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))
