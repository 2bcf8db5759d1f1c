"""Benchmark the fused kernel against the same template unfused, torch/cuDNN and a roofline.

Run on the GPU machine:  python3 bench/bench_fused.py [--target cuda] [--quick] [--grouped] [--json FILE]
                            [--config default|tuned|'m_tile=128,warps_m=4' ...] [--db DIR] [--case SPEC ...]
--grouped: MobileNetV2's depthwise and ResNeXt-50's grouped pairs (N=1 and 32) instead of the dense
ones; their rows add our two single convs (the form a model runs where a pair does not fuse).
Prints a table (us, TFLOP/s, % of roofline) and writes JSON to bench/results/. By default each case
runs with the default parameters and with the tuned ones (the GPU's database in schedules/, or
--db). The unfused baseline uses the default parameters. The roofline uses
peaks measured in the same run (torch fp16 GEMM and device-to-device copy), and counts the bytes
an ideal fused kernel must move: x, w1, w2, residual and y once each.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm_b2b import FusedConvSpec, build  # noqa: E402
from tvm_b2b.op import compare, random_inputs, reference  # noqa: E402


def cases(quick: bool) -> list[FusedConvSpec]:
    sweep = [FusedConvSpec(n=n, h=56, w=56, c=64, k1=64, k2=k2) for n in (1, 8, 32, 128) for k2 in (64, 128, 256)]
    resnet = [
        FusedConvSpec(n=n, h=hw, w=hw, c=c, k1=c, k2=4 * c, residual=True)
        for n in (1, 32)
        for hw, c in ((56, 64), (28, 128), (14, 256), (7, 512))
    ]
    all_cases = sweep + resnet
    return [s for s in all_cases if s.n == 32 and s.h == 56][:2] if quick else all_cases


# (input size, channels of the 3x3 (= k1), k2, stride, residual) of every distinct depthwise pair of
# torchvision's MobileNetV2 at 224x224 (relu6, then the projection without activation)
MOBILENET_V2 = [(112, 32, 16, 1, False), (112, 96, 24, 2, False), (56, 144, 24, 1, True), (56, 144, 32, 2, False),
                (28, 192, 32, 1, True), (28, 192, 64, 2, False), (14, 384, 64, 1, True), (14, 384, 96, 1, False),
                (14, 576, 96, 1, True), (14, 576, 160, 2, False), (7, 960, 160, 1, True), (7, 960, 320, 1, False)]
# ResNeXt-50 32x4d: (input size, width (32 groups), k2, stride) of its distinct grouped pairs (+ residual, relu)
RESNEXT50 = [(56, 128, 256, 1), (56, 256, 512, 2), (28, 256, 512, 1), (28, 512, 1024, 2), (14, 512, 1024, 1),
             (14, 1024, 2048, 2), (7, 1024, 2048, 1)]


def grouped_cases(quick: bool) -> list[FusedConvSpec]:
    specs = [FusedConvSpec(n=n, h=hw, w=hw, c=c, k1=c, k2=k2, stride=s, act1="relu6", act2="none", residual=r, groups=c)
             for n in (1, 32) for hw, c, k2, s, r in MOBILENET_V2]
    specs += [FusedConvSpec(n=n, h=hw, w=hw, c=c, k1=c, k2=k2, stride=s, residual=True, groups=32)
              for n in (1, 32) for hw, c, k2, s in RESNEXT50]
    return specs[:2] if quick else specs


def min_bytes(spec: FusedConvSpec) -> int:
    e = 2
    x = spec.n * spec.h * spec.w * spec.c
    w = 9 * spec.c // spec.groups * spec.k1 + spec.k1 * spec.k2
    y = spec.m * spec.k2 * (2 if spec.residual else 1)
    return e * (x + w + y)


def measure_peaks():
    """(fp16 tensor-core FLOP/s, copy bytes/s) measured with torch, or (None, None) without it."""
    try:
        import torch
    except ImportError:
        return None, None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    flops = 2 * 8192**3 / _torch_time(lambda: a @ a)
    buf = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(buf)
    bandwidth = 2 * buf.numel() / _torch_time(lambda: dst.copy_(buf))
    return flops, bandwidth


def _torch_time(fn, iters: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def torch_unfused_us(spec: FusedConvSpec, inputs) -> float | None:
    """The same op in torch (cuDNN convolutions, channels_last fp16), captured in a CUDA graph."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    dev = "cuda"
    t = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    x = t(inputs["x"]).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
    w1 = t(inputs["w1"]).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
    w2 = t(inputs["w2"]).t().reshape(spec.k2, spec.k1, 1, 1).contiguous(memory_format=torch.channels_last)
    s1, b1, s2, b2 = (t(inputs[k]).half().reshape(1, -1, 1, 1) for k in ("s1", "b1", "s2", "b2"))
    r = t(inputs["residual"]).permute(0, 3, 1, 2) if spec.residual else None

    acts = {"relu": torch.relu, "relu6": lambda v: torch.clamp(v, 0, 6), "none": lambda v: v}

    def run():
        d, (top, left, bottom, right) = spec.dilation, spec.pads  # PyTorch's padding: d on each side
        xp, pad = (x, d) if spec.pads == (d,) * 4 else (F.pad(x, (left, right, top, bottom)), 0)
        mid = acts[spec.act1](F.conv2d(xp, w1, padding=pad, stride=spec.stride, groups=spec.groups, dilation=d) * s1 + b1)
        out = F.conv2d(mid, w2) * s2 + b2
        return acts[spec.act2](out + r if r is not None else out)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return _torch_time(graph.replay) * 1e6


def single_convs_us(spec: FusedConvSpec, inputs, target) -> float:
    """The pair as our two single convs (op.fused_pair.as_single_convs), each timed alone: what a model
    runs where the pair does not fuse."""
    from tvm_b2b.op.conv import conv_random_inputs
    from tvm_b2b.op.fused_pair import as_single_convs

    return sum(build(s, target, db=None).time_us(conv_random_inputs(s)) for s in as_single_convs(spec))



@contextlib.contextmanager
def config_env(label: str):
    """A config label "VAR=VALUE:config" (e.g. TVM_B2B_DW_CLUSTER=0:default, the template's kernel beside the cluster
    kernel's in one run) sets VAR for that config's build and runs; yields the label's config part."""
    env, _, plain = label.rpartition(":")
    var, _, value = env.partition("=")
    saved = os.environ.get(var) if var else None
    if var:
        os.environ[var] = value
    try:
        yield plain
    finally:
        if var and saved is None:
            os.environ.pop(var, None)
        elif var:
            os.environ[var] = saved


def measure_config(args, spec, inputs, want, plain: str, label: str, name: str) -> dict | None:
    """The fused kernel of one config: built, checked against numpy, timed; None (said) where it does not tile spec."""
    config = None if plain in ("default", "tuned") else plain
    db = args.db if plain == "tuned" else None
    try:
        fused = build(spec, args.target, config=config, db=db)
    except ValueError as err:  # a config that does not tile this case: said, and the next one
        print(f"{name:40} {label[:60]:60} {str(err).splitlines()[0][:120]}", flush=True)
        return None
    shown = label if plain != "tuned" else f"tuned: {fused.config.to_string() if fused.config else 'no record, defaults'}"
    err, ok = compare(spec, fused(**inputs), want)
    fused_us = fused.time_us(inputs)
    return dict(spec=spec.to_string(), config=shown, fused_us=fused_us, tflops=spec.flops / fused_us / 1e6,
                max_abs_err=err, correct=ok, fused_kernels=len(fused.func_names), target=str(fused.target))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--quick", action="store_true", help="two cases only")
    parser.add_argument("--json", default=None, help="output file (default bench/results/fused_<date>.json)")
    parser.add_argument("--config", action="append", default=None,
                        help="schedule parameters to compare: 'default', 'tuned' or e.g. 'm_tile=128,warps_m=4' (repeat; default: default and tuned)")
    parser.add_argument("--db", default="auto", help="tuning database for 'tuned' (default: the GPU's in schedules/)")
    parser.add_argument("--case", action="append", default=None, help="only this spec (repeatable)")
    parser.add_argument("--grouped", action="store_true", help="MobileNetV2's and ResNeXt-50's grouped pairs")
    parser.add_argument("--singles", action="store_true",
                        help="time dense pairs' two single convs too (grouped pairs' always): what a model runs unfused")
    parser.add_argument("--list", action="store_true", help="print the cases' specs, N=32 first (for tvm-b2b tune), and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(s.to_string() for s in sorted(cases(args.quick), key=lambda s: s.n != 32)))
        return 0

    peak_flops, peak_bw = measure_peaks()
    if peak_flops:
        print(f"peaks measured: {peak_flops / 1e12:.0f} TFLOP/s fp16 GEMM, {peak_bw / 1e9:.0f} GB/s copy")
    configs = args.config or ["default", "tuned"]
    header = (f"{'case':40} {'config':60} {'fused us':>9} {'unfused us':>10} {'singles us':>10} {'torch us':>9} "
              f"{'vs best':>7} {'TFLOP/s':>8} {'roof us':>8} {'% roof':>6}  check")
    print(header)
    rows = []
    specs = [FusedConvSpec.parse(c) for c in args.case] if args.case else (grouped_cases if args.grouped else cases)(args.quick)
    for spec in specs:
        inputs = random_inputs(spec)
        want = reference(spec, **inputs)
        unfused_us = build(spec, args.target, fused=False, db=None).time_us(inputs)
        singles_us = single_convs_us(spec, inputs, args.target) if spec.groups > 1 or args.singles else None
        torch_us = torch_unfused_us(spec, inputs)
        roof_us = max(spec.flops / peak_flops, min_bytes(spec) / peak_bw) * 1e6 if peak_flops else None
        groups = ((f" g={spec.groups}" if spec.groups > 1 else "") + (f" d={spec.dilation}" if spec.dilation > 1 else "")
                  + (f" pads={list(spec.pads)}" if spec.pads != (spec.dilation,) * 4 else ""))
        name = f"n={spec.n} {spec.h}x{spec.w}/{spec.stride} {spec.c}->{spec.k1}->{spec.k2}{groups}{' +r' if spec.residual else ''}"
        for label in configs:
            with config_env(label) as plain:  # "VAR=VALUE:config": this config built and run with VAR=VALUE
                row = measure_config(args, spec, inputs, want, plain, label, name)
            if row is None:
                continue
            row.update(unfused_us=unfused_us, single_convs_us=singles_us, torch_cudnn_us=torch_us, roofline_us=roof_us)
            rows.append(row)
            best_other = min(v for v in (unfused_us, singles_us, torch_us) if v)
            fused_us = row["fused_us"]
            print(f"{name:40} {row['config'][:60]:60} {fused_us:9.1f} {unfused_us:10.1f} {singles_us or float('nan'):10.1f} "
                  f"{torch_us or float('nan'):9.1f} {best_other / fused_us:6.2f}x {row['tflops']:8.1f} "
                  f"{roof_us or float('nan'):8.1f} {100 * roof_us / fused_us if roof_us else float('nan'):5.1f}%  "
                  f"{'OK' if row['correct'] else 'MISMATCH'}", flush=True)
    target = rows[-1]["target"] if rows else args.target
    result = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), target=target,
                  peak_fp16_tflops=peak_flops and peak_flops / 1e12, peak_copy_gbs=peak_bw and peak_bw / 1e9,
                  command=" ".join(sys.argv), rows=rows)
    path = args.json or os.path.join(os.path.dirname(__file__), "results", f"fused_{time.strftime('%Y%m%d_%H%M')}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"written: {path}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
