"""Run one build of the op a few times, for a profiler (ncu) to measure: no timing of its own.

On the GPU machine:
  ncu --clock-control none -k regex:'fused|conv' --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      python3 bench/profile_kernel.py --case SPEC [--config CFG | --tuned] [--unfused] [--source k.cu]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm_b2b import build  # noqa: E402
from tvm_b2b.op.kind import op_kinds, parse_spec  # noqa: E402
from tvm_b2b.schedule import kind_of  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="the spec of any op kind, e.g. n=32,h=56,w=56,c=64,k1=64,k2=128 "
                        "or n=32,h=14,w=14,c=256,k=256,kh=3,kw=3,pad_h=1,pad_w=1")
    parser.add_argument("--config", default=None, help="schedule parameters (default: the rule's defaults)")
    parser.add_argument("--tuned", action="store_true", help="the GPU's tuned record (schedules/) instead")
    parser.add_argument("--unfused", action="store_true", help="the two-kernel form")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--source", default=None, help="also write the CUDA source here")
    args = parser.parse_args()
    spec = parse_spec(args.case)
    kernel = build(spec, "cuda", fused=not args.unfused, config=args.config, db="auto" if args.tuned else None)
    print(f"{spec.to_string()}: config {kernel.config or 'default'}, kernels {kernel.func_names}")
    if args.source:
        with open(args.source, "w") as f:
            f.write(kernel.source())
    inputs = op_kinds()[kind_of(spec)].random_inputs(spec, 0)
    for _ in range(args.runs):
        kernel(**inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
