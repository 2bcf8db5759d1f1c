"""The ops TVM legalizes in a model, with our CUDA rules (schedule.LEGALIZED_RULES) and with TVM's own
schedules (dlight's), same run: µs, % of the memory roofline, outputs checked equal.

    python3 bench/bench_legalized.py [--batch 32] [--json OUT.json]

Cases: ResNet-50's max-pool (NHWC float16, 3x3 stride 2) and its input made into the stem's cells
(NCHW float32 -> NHWC float16 2x2 cells, op.conv.InputForm: schedule/cuda_layout.py). Times are one VM
call each (a few µs of it the VM's own).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

HBM_BYTES_PER_S = 4.8e12  # H200's HBM3e


def cases(batch: int):
    from test_cuda_legalized import max_pool_module, stem_input_module

    from tvm_b2b.op.conv import ConvSpec

    stem = ConvSpec(n=batch, h=224, w=224, c=3, k=64, kh=7, kw=7, stride=2, pad_h=3, pad_w=3)
    return {f"max-pool 112x112x64 b{batch}": (max_pool_module((batch, 112, 112, 64), 3, 2, 1), (batch, 112, 112, 64), "float16"),
            f"stem input 224x224x3 -> cells b{batch}": (stem_input_module(stem), (batch, 3, 224, 224), "float32")}


def run(module, shape, dtype, rules) -> tuple[np.ndarray, float]:
    import tvm
    from tvm import relax

    from tvm_b2b.codegen import compile_module
    from tvm_b2b.target import parse_target

    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(compile_module(module, parse_target("cuda"), rules=rules), dev)
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(shape).astype(dtype), dev)
    out = vm["main"](x)
    timer = vm.time_evaluator("main", dev, number=50, repeat=5)
    return out.numpy(), float(np.median(timer(x).results)) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 32 and 1)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    from tvm_b2b.schedule import legalized_rules
    from tvm_b2b.target import parse_target

    rows = []
    for batch in args.batch or [32, 1]:
        for name, (module, shape, dtype) in cases(batch).items():
            ours, ours_us = run(module, shape, dtype, legalized_rules(parse_target("cuda")))
            tvms, tvm_us = run(module, shape, dtype, ())
            assert np.array_equal(ours, tvms), f"{name}: our rule's output differs from TVM's"
            moved = np.prod(shape) * np.dtype(dtype).itemsize + ours.size * ours.itemsize
            roof = moved / HBM_BYTES_PER_S * 1e6
            rows.append(dict(case=name, ours_us=ours_us, tvm_us=tvm_us, roofline_us=roof))
            print(f"{name}: ours {ours_us:.1f} us ({100 * roof / ours_us:.0f}% of the memory roofline {roof:.1f} us), "
                  f"TVM's {tvm_us:.1f} us ({100 * roof / tvm_us:.0f}%); outputs equal")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
