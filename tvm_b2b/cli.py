"""tvm-b2b command line. Each command is one small function; errors a user can fix print one line."""
from __future__ import annotations

import argparse
import sys
import time


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def _op(args) -> int:
    from . import build
    from .op import FusedConvSpec, compare, random_inputs, reference

    spec = FusedConvSpec.parse(args.spec)
    start = time.perf_counter()
    kernel = build(spec, args.target, fused=not args.unfused, config=args.config)
    print(f"spec    {spec.to_string()}")
    print(f"target  {kernel.target}")
    print(f"build   {time.perf_counter() - start:.2f} s ({'fused, one kernel' if kernel.fused else 'unfused, two kernels'})")
    if args.emit_source:
        with open(args.emit_source, "w") as f:
            f.write(kernel.source())
        print(f"source  written to {args.emit_source}")
    if not (args.check or args.bench):
        return 0
    inputs = random_inputs(spec, seed=args.seed)
    status = 0
    if args.check:
        err, ok = compare(spec, kernel(**inputs), reference(spec, **inputs))
        print(f"check   max abs error {err:.3g} vs numpy reference: {'OK' if ok else 'MISMATCH'}")
        status = 0 if ok else 1
    us = kernel.time_us(inputs)
    print(f"time    {us:.1f} us  ({spec.flops / us / 1e6:.3f} TFLOP/s)")
    if args.bench:
        baseline = build(spec, args.target, fused=not kernel.fused)
        other = baseline.time_us(inputs)
        print(f"        {other:.1f} us {'fused' if baseline.fused else 'unfused'} (same schedule, "
              f"{'one kernel' if baseline.fused else 'intermediate through memory'})")
    return status


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-b2b", description="Back-to-back 3x3 -> 1x1 convolution fusion for TVM."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    op = commands.add_parser("op", help="build one fused op, optionally check it against numpy and time it")
    op.add_argument("--spec", required=True, help='e.g. "n=1,h=56,w=56,c=64,k1=64,k2=64,stride=1,act1=relu,act2=relu,residual=0,dtype=float16"')
    op.add_argument("--target", default="llvm", help="llvm, cuda (the local GPU), cuda:sm_XX, or a TVM target JSON")
    op.add_argument("--check", action="store_true", help="run on random data and compare with the numpy reference (exit 1 on mismatch)")
    op.add_argument("--bench", action="store_true", help="also time the unfused baseline (two kernels)")
    op.add_argument("--unfused", action="store_true", help="build the unfused baseline instead of the fused kernel")
    op.add_argument("--emit-source", metavar="FILE", help="write the generated source (LLVM IR on CPU, CUDA on GPU)")
    op.add_argument("--config", help="schedule parameters (CUDA), e.g. 'm_tile=128,warps_m=4,tile_scope=shared,pipeline=1'")
    op.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    op.set_defaults(handler=_op)
    return parser


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except (ValueError, UserError, OSError) as err:
        print(f"tvm-b2b {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
