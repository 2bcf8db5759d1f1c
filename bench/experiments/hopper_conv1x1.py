"""Bench of schedule/cuda_hopper_conv.py (sm_90's 1x1 conv on TMA + wgmma; off by default in the product until
this has measured it): each config checked against numpy and timed, beside cuda_conv's kernel (ldmatrix +
mma.sync, its default config) and cuDNN (torch, channels_last fp16, a CUDA graph), in the same run.

Why: the mma.sync template stops near 250 TFLOP/s on ResNet-50's batch-32 convs, its 1x1 convs at 110-190
(bench/results/convs_h200_s12_configs.txt), which puts the batch-32 target (1200 us) out of reach.

    python3 bench/experiments/hopper_conv1x1.py [--spec SPEC ...] [--config BM,BN,STAGES ...] [--nvcc] [--source F]
Default: ResNet-50's stride-1 1x1 convs at batch 32. Without a GPU: builds each (--nvcc: compiles it for sm_90a).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tvm_b2b import ConvSpec  # noqa: E402
from tvm_b2b.op.conv import InputForm  # noqa: E402
from tvm_b2b.schedule import cuda_hopper_conv as hopper  # noqa: E402

DEFAULT_CONFIGS = ("128,128,4", "128,64,4", "128,256,3", "64,128,4")
RESNET50_1X1 = ["n=32,h=56,w=56,c=64,k=256,act=none", "n=32,h=56,w=56,c=256,k=64", "n=32,h=56,w=56,c=64,k=256,residual=1",
                "n=32,h=28,w=28,c=512,k=128", "n=32,h=28,w=28,c=128,k=512,residual=1",
                "n=32,h=14,w=14,c=1024,k=256", "n=32,h=14,w=14,c=256,k=1024,residual=1",
                "n=32,h=7,w=7,c=2048,k=512", "n=32,h=7,w=7,c=512,k=2048,residual=1"]


def build(spec: ConvSpec, bm: int, bn: int, stages: int, arch: str = "sm_90"):
    """The kernel alone, as the product builds it (codegen.compile_module: sm_90a, TVM's TIRx lowering)."""
    import tvm

    from tvm_b2b.codegen import compile_module
    from tvm_b2b.target import parse_target

    func = hopper.conv_func(spec, hopper.HopperConfig(bm, bn, stages), name="main")
    return compile_module(tvm.IRModule({"main": func}), parse_target(f"cuda:{arch}"))


def fitting(spec: ConvSpec, configs):
    """The configs whose channel tile divides the spec's output channels."""
    return [(bm, bn, stages) for bm, bn, stages in configs if spec.k % bn == 0]


def nvcc_compile(source: str, arch: str = "sm_90a") -> tuple[bool, str]:
    """(compiled, ptxas's resource line or the error) for the CUDA source, with the local nvcc."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cu")
        open(path, "w").write(source)
        run = subprocess.run(["nvcc", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-cubin", "-O3", "-Xptxas", "-v",
                              "-o", path + ".cubin", path], capture_output=True, text=True)
    lines = [ln for ln in run.stderr.splitlines() if "registers" in ln or "error" in ln]
    return run.returncode == 0, " | ".join(lines[-3:])


def run_gpu(spec: ConvSpec, configs) -> list[str]:
    """Each config checked against numpy and timed, beside the product's kernel and torch's."""
    import tvm

    from tvm_b2b import build as product_build
    from tvm_b2b.op import compare
    from tvm_b2b.op.conv import conv_random_inputs, conv_reference

    arrays = conv_random_inputs(spec, seed=0)
    want = conv_reference(spec, **arrays)
    dev = tvm.cuda(0)
    w_kc = InputForm(weights="kc").w(spec, arrays["w"])
    given = [arrays["x"], w_kc, arrays["s"], arrays["b"]] + ([arrays["residual"].reshape(spec.m, spec.k)] if spec.residual else [])
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in given]
    lines = []
    for bm, bn, stages in fitting(spec, configs):
        name = f"wgmma bm={bm},bn={bn},stages={stages}"
        try:
            lib = build(spec, bm, bn, stages).jit()  # an Executable runs; only its module times
        except Exception as err:  # noqa: BLE001 - an experiment reports every build failure and goes on
            lines.append(f"{spec.to_string()} {name}: build failed: {str(err).strip().splitlines()[-1][:200]}")
            continue
        y = tvm.runtime.tensor(np.full((spec.m, spec.k), np.nan, np.float16), dev)
        lib["main"](*args, y)
        err, ok = compare(spec, y.numpy().reshape(spec.out_shape), want)
        us = float(np.median(lib.time_evaluator("main", dev, number=20, repeat=5)(*args, y).results)) * 1e6
        lines.append(f"{spec.to_string()} {name}: {us:.1f} us {spec.flops / us / 1e6:.0f} TFLOP/s, "
                     f"max abs error {err:.3g}: {'OK' if ok else 'WRONG'}")
    os.environ[hopper.ENABLE_ENV] = "0"  # the mma.sync kernel (cuda_conv), the Hopper kernel off
    kernel = product_build(spec, "cuda", db=None)
    us = kernel.time_us(arrays)
    lines.append(f"{spec.to_string()} mma.sync (cuda_conv default): {us:.1f} us {spec.flops / us / 1e6:.0f} TFLOP/s")
    lines.append(f"{spec.to_string()} torch (cuDNN, CUDA graph): {torch_us(spec, arrays):.1f} us")
    return lines


def torch_us(spec: ConvSpec, arrays) -> float:
    """cuDNN's conv + scale/bias/[residual]/act, fp16 channels_last, replayed as a CUDA graph (as bench_convs' users would)."""
    import torch

    dev = torch.device("cuda")
    x = torch.from_numpy(arrays["x"]).to(dev).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    w = torch.from_numpy(arrays["w"]).to(dev).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    s = torch.from_numpy(arrays["s"]).to(dev).half().view(1, -1, 1, 1)
    b = torch.from_numpy(arrays["b"]).to(dev).half().view(1, -1, 1, 1)
    r = (torch.from_numpy(arrays["residual"]).to(dev).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
         if spec.residual else None)

    def step():
        out = torch.nn.functional.conv2d(x, w) * s + b
        out = out + r if r is not None else out
        return torch.relu(out) if spec.act == "relu" else out

    for _ in range(3):
        step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 20)
    return float(np.median(times))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", action="append", help="a 1x1 conv spec (default: ResNet-50's at batch 32)")
    parser.add_argument("--config", action="append", help="BM,BN,STAGES (default: a few)")
    parser.add_argument("--nvcc", action="store_true", help="compile each build's CUDA for sm_90a with the local nvcc")
    parser.add_argument("--source", help="write the first build's CUDA here")
    args = parser.parse_args()
    import tvm

    specs = [ConvSpec.parse(s) for s in args.spec or RESNET50_1X1]
    configs = [tuple(int(v) for v in cfg.split(",")) for cfg in args.config or DEFAULT_CONFIGS]
    gpu = tvm.cuda(0).exist
    ok = True
    for spec in specs:
        if gpu:
            for line in run_gpu(spec, configs):
                print(line, flush=True)
                ok = ok and "WRONG" not in line
            continue
        for bm, bn, stages in fitting(spec, configs):
            source = build(spec, bm, bn, stages).mod.imports[0].inspect_source()
            if args.source:
                open(args.source, "w").write(source)
                args.source = None
            line = f"{spec.to_string()} bm={bm},bn={bn},stages={stages}: built, {hopper.shared_bytes(spec, hopper.HopperConfig(bm, bn, stages)) // 1024} KiB shared"
            if args.nvcc:
                compiled, info = nvcc_compile(source)
                ok = ok and compiled
                line += f"; nvcc sm_90a: {'OK' if compiled else 'FAILED'} {info}"
            print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
