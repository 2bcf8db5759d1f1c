"""Robustness sweep: torchvision CNNs (random weights) exported as users export them, compiled by tvm-b2b on the CPU
and compared with onnxruntime; one line per model (pairs found and fused, max relative error, or the one-line error).
--dtype float16 compiles the whole graph in float16 (the GPU's path, fp32 accumulation) and compares its error with
PyTorch's own float16 run of the network (OK: at most 1.5x that, or 2e-2).

    python bench/sweep_models.py [--dynamo] [--dtype float16] [--size 64] [NAME[:SIZE] ...]   (default: SWEEP below)

--kernels TARGET (e.g. cuda:sm_90) runs nothing: it plans each model for that target in float16, as `tvm-b2b report`
does, and prints which kernels its convs get (fused pairs, our tensor-core or CUDA-core kernels, TVM's own schedule
"default") with the reasons of the default ones: what a user without that GPU here can check before compiling.
--build cuda:sm_XX compiles each model for that GPU in float16, as `tvm-b2b compile` does, and compiles the whole
model's CUDA with nvcc (sm_90a where it holds wgmma): whether it builds, without the GPU. --batch N (default 1)
exports each model at batch N, for --kernels and --build.
"""
from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "onnx_models"))

import torchvision_models as tm  # noqa: E402

# every torchvision classification family; the size where a model needs more than 64 pixels
SWEEP = ["resnet18", "resnet34", "resnet_bn", "resnext50_32x4d", "wide_resnet50_2", "mobilenet_v2", "mobilenet_v3_small",
         "mobilenet_v3_large", "shufflenet_v2_x1_0", "mnasnet0_5", "mnasnet1_0", "efficientnet_b0", "efficientnet_v2_s",
         "regnet_x_400mf", "regnet_y_400mf", "densenet121", "squeezenet1_1", "googlenet", "convnext_tiny",
         "inception_v3:299", "vgg11_bn:224", "alexnet:224",
         # segmentation (per-pixel scores: Resize, dilated convs)
         "lraspp_mobilenet_v3_large:128", "deeplabv3_mobilenet_v3_large:128", "fcn_resnet50"]


def failed_line(name: str, size: int, err: Exception) -> str:
    """A model's one line when anything about it failed: the error's type and first line."""
    return f"{name:28s} {size:4d}  FAILED: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"


def check(name: str, size: int, directory: str, dynamo: bool, dtype: str) -> str:
    import tvm_b2b
    from tvm_b2b.frontend.model import compile_model
    from tvm_b2b.frontend.rewrite import pairs_of
    from tvm_b2b.target import parse_target

    tm.MODELS.setdefault(name, (name, {}))
    start = time.perf_counter()
    try:
        path = tm.export(name, 1, size, directory, dynamo=dynamo)
        lib = os.path.join(directory, f"{name}.so")
        pairs = pairs_of(compile_model(path, lib, parse_target("llvm"), dtype=None if dtype == "float32" else dtype))
        x = tm.random_image(1, size)
        want = tm.onnxruntime_output(path, x)
        error = tm.relative_error(tvm_b2b.load(lib)(input=x)["output"], want)
        bound, torch_note = 1e-4, ""
        if dtype == "float16":
            torch_error = _torch_float16_error(name, size, x, want)
            bound, torch_note = max(2e-2, 1.5 * torch_error), f" (torch float16 {torch_error:.1e})"
    except Exception as err:  # noqa: BLE001 - one line per model, whatever failed
        return failed_line(name, size, err)
    return (f"{name:28s} {size:4d}  {len(pairs):3d} pairs {sum(p.fused for p in pairs):3d} fused  error {error:.1e}"
            f"{torch_note}  {'OK' if error <= bound else 'MISMATCH'}  {time.perf_counter() - start:5.1f} s")


def build(name: str, size: int, directory: str, dynamo: bool, target_name: str, batch: int) -> str:
    """One line: the model compiled for `target_name` (float16) and its whole CUDA compiled by nvcc, or what failed."""
    from tvm_b2b.frontend.model import compile_model
    from tvm_b2b.frontend.rewrite import pairs_of
    from tvm_b2b.target import parse_target

    tm.MODELS.setdefault(name, (name, {}))
    start = time.perf_counter()
    try:
        path = tm.export(name, batch, size, directory, dynamo=dynamo)
        source = os.path.join(directory, f"{name}.cu")
        pairs = pairs_of(compile_model(path, os.path.join(directory, f"{name}.so"), parse_target(target_name),
                                       dtype="float16", emit_source=source))
        compiled = time.perf_counter() - start
        arch = parse_target(target_name).attrs["arch"]
        with open(source) as f:
            arch += "a" if arch == "sm_90" and "wgmma." in f.read() else ""
        nvcc = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-o", os.devnull, source], capture_output=True, text=True)
        if nvcc.returncode:
            raise RuntimeError(f"nvcc -arch={arch}: " + (nvcc.stderr.strip().splitlines() or ["failed"])[0])
    except Exception as err:  # noqa: BLE001 - one line per model, whatever failed
        return failed_line(name, size, err)
    return (f"{name:28s} {size:4d}  {len(pairs):3d} pairs {sum(p.fused for p in pairs):3d} fused  compiled in {compiled:5.1f} s, "
            f"nvcc -arch={arch} in {time.perf_counter() - start - compiled:5.1f} s  OK")


def kernels(name: str, size: int, directory: str, dynamo: bool, target_name: str, batch: int = 1) -> str:
    """One line: the model's convs by kernel for `target_name` (float16), then each distinct reason for TVM's own
    schedule with how many convs it holds."""
    from collections import Counter

    from tvm_b2b.frontend.model import analyze, conv_names
    from tvm_b2b.frontend.rewrite import conv_kernels, pairs_of
    from tvm_b2b.target import parse_target

    tm.MODELS.setdefault(name, (name, {}))
    start = time.perf_counter()
    try:
        path = tm.export(name, batch, size, directory, dynamo=dynamo)
        _, candidates, model = analyze(path, parse_target(target_name), dtype="float16")
    except Exception as err:  # noqa: BLE001 - one line per model, whatever failed
        return failed_line(name, size, err)
    convs = conv_kernels(conv_names(model), candidates)
    counts = Counter(c["kernel"] for c in convs)
    pairs = pairs_of(candidates)
    line = (f"{name:28s} {size:4d}  {len(convs):3d} convs: " + ", ".join(f"{n} {k}" for k, n in counts.most_common())
            + f"; {sum(p.fused for p in pairs)}/{len(pairs)} pairs fused  {time.perf_counter() - start:5.1f} s")
    reasons = Counter(c["reason"] for c in convs if c["kernel"] == "default")
    return line + "".join(f"\n{'':34s}default x{n}: {reason}" for reason, n in reasons.most_common())


def _torch_float16_error(name: str, size: int, x, want) -> float:
    """PyTorch's own float16 run of the network (CPU) against onnxruntime's float32 one."""
    import torch

    net = tm.calibrated_network(name, size).half()
    with torch.no_grad():
        return tm.relative_error(net(torch.from_numpy(x).half()).float().numpy(), want)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=SWEEP)
    parser.add_argument("--size", type=int, default=64, help="input size of models given without one (default 64)")
    parser.add_argument("--dynamo", action="store_true", help="torch's default exporter (torch.export) instead of TorchScript's")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="as for tvm-b2b compile")
    parser.add_argument("--kernels", metavar="TARGET", help="plan only, for TARGET (e.g. cuda:sm_90): each model's kernels")
    parser.add_argument("--build", metavar="TARGET", help="compile for TARGET (cuda:sm_XX) and nvcc the model's CUDA")
    parser.add_argument("--batch", type=int, default=1, help="the batch of --kernels and --build (default 1)")
    args = parser.parse_args()
    exporter = "torch.export" if args.dynamo else "TorchScript"
    if args.build:
        header = f"{args.build}, float16, batch {args.batch}, {exporter} exporter: compiled, then its CUDA by nvcc"
        line = functools.partial(build, target_name=args.build, batch=args.batch)
    elif args.kernels:
        header = f"{args.kernels}, float16, batch {args.batch}, {exporter} exporter: the kernels each model's convs get"
        line = functools.partial(kernels, target_name=args.kernels, batch=args.batch)
    else:
        header = f"llvm, {args.dtype}, batch 1, {exporter} exporter, against onnxruntime; error: max |d| / max |onnxruntime|"
        line = functools.partial(check, dtype=args.dtype)
    print(f"{'model':28s} size  ({header})")
    with tempfile.TemporaryDirectory() as directory:
        for entry in args.models:
            name, _, size = entry.partition(":")
            print(line(name, int(size or args.size), directory, args.dynamo), flush=True)

if __name__ == "__main__":
    main()
