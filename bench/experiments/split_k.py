"""How many ways a single conv's default kernel (schedule/cuda_conv.py, mma.sync) should split its reduction: each spec
built with its default config and each split-K factor the kernel takes (op.conv.split_prim_funcs: whole taps per
slice for a conv of several taps, a power of two of the steps for a 1x1), checked against numpy and timed, beside
torch's conv (cuDNN, channels_last fp16, dilation included, in a CUDA graph). What split_factor is chosen from.

    python3 bench/experiments/split_k.py [--spec SPEC ...] [--json OUT.json]

Default specs: DeepLabV3-ResNet50's convs at batch 1 (224x224: output stride 8, its layer3 and layer4 at 28x28,
dilated, and the ASPP's dilated 3x3s of 2048 channels), and ResNet-50's deep 14x14 and 7x7 convs at batch 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))

from bench_convs import roofline_us, torch_conv_us  # noqa: E402
from bench_fused import measure_peaks  # noqa: E402
from tvm_b2b import ConvSpec, build  # noqa: E402
from tvm_b2b import kernel as kernel_module  # noqa: E402
from tvm_b2b.op import compare  # noqa: E402
from tvm_b2b.op.conv import conv_random_inputs, conv_reference  # noqa: E402
from tvm_b2b.schedule import cuda_conv  # noqa: E402

SPECS = [
    "n=1,h=28,w=28,c=256,k=256,kh=3,kw=3,pad_h=2,pad_w=2,dilation=2",  # DeepLabV3's layer3 (x5)
    "n=1,h=28,w=28,c=512,k=512,kh=3,kw=3,pad_h=4,pad_w=4,dilation=4",  # layer4 (x2; the first has dilation 2)
    "n=1,h=28,w=28,c=2048,k=256,kh=3,kw=3,pad_h=12,pad_w=12,dilation=12",  # the ASPP's three
    "n=1,h=28,w=28,c=2048,k=256,kh=3,kw=3,pad_h=24,pad_w=24,dilation=24",
    "n=1,h=28,w=28,c=2048,k=256,kh=3,kw=3,pad_h=36,pad_w=36,dilation=36",
    "n=1,h=28,w=28,c=1024,k=256",  # its 1x1s at 28x28
    "n=1,h=28,w=28,c=2048,k=512",
    "n=1,h=28,w=28,c=512,k=2048,residual=1",
    "n=1,h=14,w=14,c=256,k=256,kh=3,kw=3,pad_h=1,pad_w=1",  # ResNet-50 at batch 1
    "n=1,h=7,w=7,c=512,k=512,kh=3,kw=3,pad_h=1,pad_w=1",
    "n=1,h=14,w=14,c=1024,k=256",
]


def splits_taken(spec: ConvSpec) -> list[int]:
    """The split factors the kernel takes for the spec's default config (cuda_conv.split_candidates, and 1), each
    slice 2 steps or more."""
    cfg = cuda_conv.default_config(spec, 90)
    steps = cuda_conv.extents(spec)["r"] // cfg.k_tile
    return [1] + [t for t in cuda_conv.split_candidates(spec, cfg) if steps // t >= 2]


def measure(spec: ConvSpec, split: int, inputs, want) -> float | None:
    """The default config with the reduction split `split` ways: µs, or None where wrong (said)."""
    saved = cuda_conv.split_factor
    cuda_conv.split_factor = lambda s, c: split  # (plan asks it for the default config's split)
    kernel_module._BUILT.clear()
    try:
        kernel = build(spec, "cuda", db=None)
    finally:
        cuda_conv.split_factor = saved
    err, ok = compare(spec, kernel(**inputs), want)
    if not ok:
        print(f"  split {split}: WRONG {err}")
        return None
    return kernel.time_us(inputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", action="append", help="a conv spec (default: SPECS)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    peaks, results = measure_peaks(), []
    for text in args.spec or SPECS:
        spec = ConvSpec.parse(text + ",dtype=float16")
        inputs = conv_random_inputs(spec, seed=0)
        want = conv_reference(spec, **inputs)
        cfg = cuda_conv.default_config(spec, 90)
        row = {"spec": spec.to_string(), "config": cfg.to_string(), "default_split": cuda_conv.split_factor(spec, cfg),
               "us": {t: measure(spec, t, inputs, want) for t in splits_taken(spec)},
               "torch_cudnn_us": torch_conv_us(spec, inputs), "roofline_us": roofline_us(spec, peaks)}
        shown = "  ".join(f"{t}: {us:.1f}" for t, us in row["us"].items() if us)
        cudnn, roof = (f"{row[key]:.1f}" if row[key] else "-" for key in ("torch_cudnn_us", "roofline_us"))
        print(f"{text:70} split now {row['default_split']}; us by split  {shown};  cuDNN {cudnn}, roofline {roof}", flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
