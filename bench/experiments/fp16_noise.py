"""Is a model's fp16 error vs onnxruntime (fp32) ours or fp16's? For each torchvision NAME:BATCH: onnxruntime's fp32
output against PyTorch's fp16 (channels_last, cuDNN) and tvm-b2b's fp16 and fp32 CUDA builds, bench_e2e's metric
(max |got - want| / max |want|), and tvm-b2b fp16 against PyTorch fp16.

    python3 bench/experiments/fp16_noise.py deeplabv3_resnet50:1 resnet50:1
"""
import os
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "onnx_models"))

from torchvision_models import calibrated_network, export, onnxruntime_output, random_image, relative_error  # noqa: E402
from tvm_b2b.frontend.model import compile_model, load  # noqa: E402
from tvm_b2b.target import parse_target  # noqa: E402

SIZE = 224


def torch_fp16(name, x):
    import torch

    net = calibrated_network(name, SIZE).half().cuda().to(memory_format=torch.channels_last).eval()
    with torch.no_grad():
        t = torch.from_numpy(x).half().cuda().to(memory_format=torch.channels_last)
        return net(t).float().cpu().numpy()


def main():
    work = tempfile.mkdtemp()
    for item in sys.argv[1:]:
        name, batch = item.split(":")[0], int(item.split(":")[1])
        path, x = export(name, batch, SIZE, work), random_image(batch, SIZE)
        want = onnxruntime_output(path, x)
        got = {"torch fp16": torch_fp16(name, x)}
        for dtype in ("float16", "float32"):
            lib = os.path.join(work, f"{name}_{dtype}.so")
            compile_model(path, lib, parse_target("cuda"), dtype=dtype)
            got[f"tvm-b2b {dtype}"] = load(lib)(input=x)["output"]
        print(f"{name} b{batch}: " + ", ".join(f"{k} vs ort {relative_error(v, want):.2e}" for k, v in got.items())
              + f", tvm-b2b float16 vs torch fp16 {relative_error(got['tvm-b2b float16'], got['torch fp16']):.2e}", flush=True)


if __name__ == "__main__":
    main()
