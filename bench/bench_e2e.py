"""End to end on a GPU: torchvision models compiled by tvm-b2b against what a user would run instead.

    python3 bench/bench_e2e.py [--models resnet50:1,resnet50:32,mobilenet_v2:1] [--torch-compile max-autotune]
                               [--no-graph-too] [--breakdown] [--out bench/results/e2e_h200]

Each model is torchvision's, with random weights (BatchNorm calibrated: onnx_models/torchvision_models.py),
exported to ONNX (opset 17) and compiled with `tvm-b2b compile --target cuda --dtype float16` (CUDA graph
on, the default; --no-graph-too also times batch-1 models without it). Its output is checked against onnxruntime (CPU).
In the same run: PyTorch fp16 channels_last eager, the same replayed as a CUDA graph, and
torch.compile (--torch-compile MODE; none to skip: max-autotune compiles for minutes per model).
Prints a table of median µs (with each model's convs by kernel and its compile time) and writes OUT.json and
OUT.txt; --breakdown also profiles each tvm-b2b model's kernels (OUT_breakdown.txt: µs per inference per kernel).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "onnx_models"))

from torchvision_models import calibrated_network, export, onnxruntime_output, random_image, relative_error  # noqa: E402
from tvm_b2b.frontend.model import compile_model, load  # noqa: E402
from tvm_b2b.frontend.rewrite import pairs_of  # noqa: E402
from tvm_b2b.target import parse_target  # noqa: E402

SIZE = 224


def torch_times(name: str, batch: int, compile_mode: str) -> dict[str, float | None]:
    """Median µs of the fp16 channels_last model: eager, CUDA graph replay, torch.compile."""
    import torch

    net = calibrated_network(name, SIZE).half().cuda().to(memory_format=torch.channels_last).eval()
    x = torch.from_numpy(random_image(batch, SIZE)).half().cuda().to(memory_format=torch.channels_last)
    times = {}
    with torch.no_grad():
        times["torch eager"] = _cuda_us(lambda: net(x))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                net(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            net(x)
        times["torch CUDA graph"] = _cuda_us(graph.replay)
        times["torch.compile"] = None
        if compile_mode != "none":
            compiled = torch.compile(net, mode=compile_mode)
            start = time.perf_counter()
            for _ in range(3):
                compiled(x)
            torch.cuda.synchronize()
            print(f"  torch.compile({compile_mode}) warm-up {time.perf_counter() - start:.0f} s", flush=True)
            times["torch.compile"] = _cuda_us(lambda: compiled(x))
    return times


def _cuda_us(fn, iters: int = 50, repeat: int = 5) -> float:
    import torch

    for _ in range(5):
        fn()
    results = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        results.append(start.elapsed_time(end) * 1000 / iters)
    return float(np.median(results))


def tvm_b2b_row(path: str, batch: int, work: str, cuda_graph: bool) -> dict:
    """Compile, check against onnxruntime and time one build."""
    lib = os.path.join(work, f"{os.path.basename(path)}.{int(cuda_graph)}.so")
    start = time.perf_counter()
    candidates = compile_model(path, lib, parse_target("cuda"), dtype="float16", cuda_graph=cuda_graph)
    seconds = time.perf_counter() - start
    model = load(lib)
    x = random_image(batch, SIZE)
    err = relative_error(model(input=x)["output"], onnxruntime_output(path, x))
    pairs = pairs_of(candidates)
    kernels = [c["kernel"] for c in model.meta["convs"]]
    return dict(us=model.time_us({"input": x}, number=20, repeat=10), compile_s=seconds, rel_err=err,
                pairs=len(pairs), fused=sum(p.fused for p in pairs),
                convs={k: kernels.count(k) for k in dict.fromkeys(kernels)})


def breakdown(lib: str, batch: int, runs: int = 10, top: int = 40) -> list[str]:
    """Where the time goes: the compiled model run `runs` times under PyTorch's profiler (CUPTI sees
    every kernel of the process, TVM's too, also inside a CUDA graph); µs per inference summed per
    kernel, the `top` ones and the total (copies of the input and output included as memcpy)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model, x = load(lib), random_image(batch, SIZE)
    model(input=x)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            model(input=x)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if us:
            rows.append((us / runs, event.count // runs, event.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    lines = [f"{'us/inference':>12} {'%':>6} {'calls':>5}  kernel"]
    lines += [f"{us:12.1f} {100 * us / total:6.1f} {calls:5d}  {name[:110]}" for us, calls, name in rows[:top]]
    lines.append(f"{total:12.1f} {100.0:6.1f} {sum(r[1] for r in rows):5d}  total ({len(rows)} distinct kernels)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50:1,resnet50:32,mobilenet_v2:1", help="NAME:BATCH,...")
    parser.add_argument("--torch-compile", default="max-autotune", help="torch.compile mode, or none")
    parser.add_argument("--no-graph-too", action="store_true", help="also time tvm-b2b without its CUDA graph (batch 1)")
    parser.add_argument("--breakdown", action="store_true", help="also profile each model's kernels (OUT_breakdown.txt)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "e2e_h200"), help="OUT(.json, .txt)")
    args = parser.parse_args()
    work = tempfile.mkdtemp()
    rows = []
    for item in args.models.split(","):
        name, batch = item.split(":")[0], int(item.split(":")[1])
        path = export(name, batch, SIZE, work)
        row = dict(model=name, batch=batch)
        for graph in (True, False) if args.no_graph_too and batch == 1 else (True,):
            built = tvm_b2b_row(path, batch, work, graph)
            key = "tvm-b2b" if graph else "tvm-b2b no graph"
            row[key] = built["us"]
            row.update({f"{key} {k}": v for k, v in built.items() if k != "us"})
            print(f"{name} b{batch} {key}: {built['us']:.1f} us, compiled in {built['compile_s']:.0f} s, "
                  f"{built['fused']} of {built['pairs']} pairs fused, convs {built['convs']}, "
                  f"rel err vs onnxruntime {built['rel_err']:.2e}", flush=True)
        if args.breakdown:
            table = "\n".join(breakdown(os.path.join(work, f"{os.path.basename(path)}.1.so"), batch))
            print(table, flush=True)
            with open(args.out + "_breakdown.txt", "a") as f:
                f.write(f"# {name} batch {batch}: PyTorch profiler (CUPTI) over the CUDA-graph build, µs per inference summed per kernel\n{table}\n\n")
        row.update(torch_times(name, batch, args.torch_compile))
        print(f"{name} b{batch} torch: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items() if k.startswith("torch") and v), flush=True)
        rows.append(row)
        _write(args, rows)
    print(open(args.out + ".txt").read())
    return 0


def _write(args, rows) -> None:
    columns = ["tvm-b2b", *(["tvm-b2b no graph"] if args.no_graph_too else []), "torch eager", "torch CUDA graph", "torch.compile"]
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else "-"  # noqa: E731
    lines = [f"# {' '.join(sys.argv)}  ({datetime.datetime.now().isoformat(timespec='seconds')}; µs, median; "
             f"torch.compile mode: {args.torch_compile})",
             "| model, batch | " + " | ".join(columns) + " | best torch / tvm-b2b | pairs fused | convs by kernel | compile s | rel err vs onnxruntime |",
             "|---" * (len(columns) + 6) + "|"]
    for r in rows:
        best = min(v for k, v in r.items() if k in ("torch eager", "torch CUDA graph", "torch.compile") and v)
        lines.append(f"| {r['model']}, {r['batch']} | " + " | ".join(fmt(r.get(c)) for c in columns)
                     + f" | {best / r['tvm-b2b']:.2f}x | {r['tvm-b2b fused']} of {r['tvm-b2b pairs']} | "
                     + ", ".join(f"{n} {k}" for k, n in r["tvm-b2b convs"].items())
                     + f" | {r['tvm-b2b compile_s']:.0f} | {r['tvm-b2b rel_err']:.1e} |")
    with open(args.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump(dict(date=datetime.datetime.now().isoformat(timespec="seconds"), command=" ".join(sys.argv),
                       torch_compile=args.torch_compile, rows=rows), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
