"""Single convolutions (op kind conv2d) on the GPU, each with several configs: µs, TFLOP/s, % of the roofline
(peaks measured in the same run), the config each spec runs fastest with, and torch's conv (cuDNN, channels_last
fp16, its epilogue, in a CUDA graph) as a user would run it; every result checked against the numpy reference first.

    python3 bench/bench_convs.py [--spec SPEC ...] [--config CFG ...] [--json OUT.json]

Defaults: ResNet-50's convs at batch 32 and at batch 1; configs: the rule's default ("default") and a
few wider tiles. What the default config of schedule/cuda_conv.py is chosen from.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tvm_b2b import ConvSpec, build  # noqa: E402
from tvm_b2b.op import compare  # noqa: E402
from tvm_b2b.op.conv import conv_random_inputs, conv_reference  # noqa: E402
from bench_fused import _torch_time, measure_peaks  # noqa: E402

RESNET50 = [  # (n is set per batch) the stem, then per stage: 1x1 reduce, 3x3, 1x1 expand, stride-2 downsample
    "h=224,w=224,c=3,k=64,kh=7,kw=7,stride=2,pad_h=3,pad_w=3",
    "h=56,w=56,c=64,k=256,act=none", "h=56,w=56,c=256,k=64",
    "h=28,w=28,c=128,k=128,kh=3,kw=3,pad_h=1,pad_w=1", "h=28,w=28,c=512,k=128", "h=56,w=56,c=256,k=512,stride=2,act=none",
    "h=14,w=14,c=256,k=256,kh=3,kw=3,pad_h=1,pad_w=1", "h=14,w=14,c=256,k=1024,residual=1", "h=14,w=14,c=1024,k=256",
    "h=7,w=7,c=512,k=512,kh=3,kw=3,pad_h=1,pad_w=1", "h=7,w=7,c=512,k=2048,residual=1", "h=7,w=7,c=2048,k=512",
]
CONFIGS = ["default", "n1_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2,m_tile=128",
           "m_tile=128,warps_m=4,warps_n=2,n1_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2",
           "m_tile=64,n1_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2",
           "m_tile=128,k_tile=64,pipeline=2,mma=1,epilogue=2"]


def roofline_us(spec: ConvSpec, peaks) -> float | None:
    """The conv's time at the measured fp16 tensor-core peak or at the copy bandwidth, whichever is longer
    (x, w, y and the residual read or written once)."""
    flops, bandwidth = peaks
    if not flops:
        return None
    elements = spec.n * spec.h * spec.w * spec.c + spec.kh * spec.kw * spec.c // spec.groups * spec.k + spec.m * spec.k * (
        2 if spec.residual else 1)
    return max(spec.flops / flops, 2 * elements / bandwidth) * 1e6


def torch_conv_us(spec: ConvSpec, inputs) -> float | None:
    """The conv with its epilogue in torch (cuDNN, channels_last fp16), captured in a CUDA graph."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    t = lambda a: torch.from_numpy(a).cuda()  # noqa: E731
    x = t(inputs["x"]).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    w = t(inputs["w"]).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    s, b = (t(inputs[k]).half().reshape(1, -1, 1, 1) for k in ("s", "b"))
    r = t(inputs["residual"]).reshape(spec.n, spec.ho, spec.wo, spec.k).permute(0, 3, 1, 2) if spec.residual else None
    act = {"relu": torch.relu, "relu6": lambda v: torch.clamp(v, 0, 6), "none": lambda v: v}[spec.act]

    def run():
        y = F.conv2d(x, w, stride=spec.stride, padding=(spec.pad_h, spec.pad_w), dilation=spec.dilation,
                     groups=spec.groups) * s + b
        return act(y + r if r is not None else y)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return _torch_time(graph.replay) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", action="append", help="a conv spec (default: ResNet-50's at batch 32 and 1)")
    parser.add_argument("--config", action="append", help="a config, or 'default' (default: a few)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--batch", type=int, action="append", help="ResNet-50's convs at this batch only (repeatable)")
    args = parser.parse_args()
    specs = [ConvSpec.parse(s) for s in args.spec] if args.spec else \
        [ConvSpec.parse(f"n={n},{s}") for n in (args.batch or (32, 1)) for s in RESNET50]
    results, peaks = [], measure_peaks()
    for spec in specs:
        inputs = conv_random_inputs(spec, seed=0)
        row = {"spec": spec.to_string(), "us": {}, "torch_cudnn_us": torch_conv_us(spec, inputs),
               "roofline_us": roofline_us(spec, peaks)}
        want = conv_reference(spec, **inputs)
        for config in args.config or CONFIGS:
            try:
                kernel = build(spec, "cuda", config=None if config == "default" else config, db=None)
            except ValueError as err:
                row["us"][config] = None
                print(f"  {config}: {err}")
                continue
            err, ok = compare(spec, kernel(**inputs), want)
            us = kernel.time_us(inputs) if ok else None
            row["us"][config] = us
            print(f"{spec.to_string()} {config}: " + (f"{us:.1f} us {spec.flops / us / 1e6:.0f} TFLOP/s"
                                                     f" ({len(kernel.func_names)} kernel(s))" if ok else f"WRONG {err}"), flush=True)
        valid = {c: us for c, us in row["us"].items() if us}
        if valid:
            best = min(valid, key=valid.get)
            roof, torch_us = row["roofline_us"], row["torch_cudnn_us"]
            print(f"  best {best}: {valid[best]:.1f} us, default {valid.get('default', float('nan')):.1f} us"
                  + (f", {100 * roof / valid[best]:.0f}% of the roofline ({roof:.1f} us)" if roof else "")
                  + (f", torch (cuDNN, CUDA graph) {torch_us:.1f} us" if torch_us else ""), flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
