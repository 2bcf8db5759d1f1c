"""tvm-b2b command line. Each command is one small function; errors a user can fix print one line."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def _op(args) -> int:
    from . import build
    from .op import compare
    from .op.kind import op_kinds, parse_spec
    from .schedule import kind_of
    from .target import NO_GPU, has_cuda_gpu, parse_target, target_info

    spec = parse_spec(args.spec)
    pair = hasattr(spec, "k1")
    if (args.bench or args.unfused) and not pair:
        raise UserError("--bench/--unfused compare a pair with its two-kernel form; a single conv (k=) has one kernel")
    target = parse_target(args.target)
    if (args.check or args.bench) and target_info(target).is_cuda and not has_cuda_gpu():
        raise UserError(f"--check/--bench run the kernel, and {NO_GPU} (without them, op builds for {args.target} only)")
    start = time.perf_counter()
    kernel = build(spec, target, fused=not args.unfused, config=args.config, db=_db(args))
    print(f"spec    {spec.to_string()}")
    print(f"target  {kernel.target}")
    shape = ("fused, one kernel" if kernel.fused else "unfused, two kernels") if pair else \
        "one kernel" if len(kernel.func_names) == 1 else "split-K: two kernels"
    print(f"build   {time.perf_counter() - start:.2f} s ({shape})")
    if target_info(kernel.target).is_cuda:
        used = kernel.config
        origin = "given" if args.config else "tuned record" if used else "defaults"
        text = used if isinstance(used, str) else used.to_string() if used else ""
        print(f"config  {origin}{': ' + text if text else ''}")
    if args.emit_source:
        with open(args.emit_source, "w") as f:
            f.write(kernel.source())
        print(f"source  written to {args.emit_source}")
    if not (args.check or args.bench):
        print("built only: add --check to compare with the numpy reference" + (", --bench to time it against two kernels" if pair else ""))
        return 0
    kind = op_kinds()[kind_of(spec)]
    inputs, reference = kind.random_inputs(spec, seed=args.seed), kind.reference
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


def _db(args):
    """--db DIR, --no-db, or the target's shipped database ("auto")."""
    return None if args.no_db else (args.db or "auto")


@contextlib.contextmanager
def _stderr_to(path: str):
    """Sends this process's stderr (TVM's C++ warnings: hundreds of failed trace replays per
    search round) to a file while tuning; the progress lines go to stdout."""
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # its console handler follows
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _remote_gpu(args):
    """The GPU that --rpc/--rpc-key name (tune.remote.RemoteGpu), asked up front; None without --rpc."""
    from .tune.remote import remote_gpu

    if not args.rpc:
        if args.rpc_key:
            raise UserError("--rpc-key: only with --rpc HOST:PORT (the RPC tracker to ask)")
        return None
    if not args.rpc_key:
        raise UserError("--rpc: give the key the GPU servers registered under (--rpc-key KEY)")
    return remote_gpu(args.rpc, args.rpc_key)


def _tune(args) -> int:
    from .target import NO_GPU, cuda_target, has_cuda_gpu, parse_target, target_info
    from .tune.database import TuningDatabase, local_gpu_name, note_gpu, record_specs
    from .tune.remote import check_target
    from .tune.tuner import tune_spec

    if args.trials <= 0:
        raise UserError(f"--trials: expected a positive number, got {args.trials}")
    remote = _remote_gpu(args)
    target = cuda_target(remote.arch) if remote and args.target == "cuda" else parse_target(args.target)
    if not target_info(target).is_cuda:
        raise UserError("--target: tuning is for CUDA targets (the CPU schedule has no parameters)")
    if remote:
        check_target(remote, target)
        print(f"measuring on {remote.name} ({remote.arch}) through the RPC tracker at {remote.tracker}, key {remote.key!r}")
    elif not has_cuda_gpu():
        raise UserError(f"{NO_GPU} to measure on (tuning times every candidate on the target GPU); "
                        "run tvm-b2b tune on a machine with that GPU, or measure through an RPC tracker (--rpc)")
    specs = _specs_to_tune(args, target)
    database = TuningDatabase(args.db, lock=True)  # one tuner per database: a second one stops here
    note_gpu(args.db, remote.name if remote else local_gpu_name(), f"sm_{target_info(target).arch}")
    record_specs(args.db, specs)
    deadline = time.time() + 60 * args.minutes if args.minutes else None
    results = []
    work_dir = os.path.join(args.db, "logs")
    print(f"MetaSchedule's logs and TVM's warnings: {work_dir}")
    with _stderr_to(os.path.join(work_dir, "stderr.log")):
        for i, spec in enumerate(specs, 1):
            if deadline and time.time() >= deadline:
                print(f"time budget spent: {len(specs) - i + 1} spec(s) left; run the same command again to continue")
                break
            results.append(tune_spec(spec, target, database, args.trials, work_dir=work_dir,
                                     label=f"[{i}/{len(specs)}]", deadline=deadline, remote=remote,
                                     remote_workers=args.rpc_workers))
    for r in results:
        best = f"{r['best_us']:.1f} us with {r['config']}" if r["best_us"] else "no valid record"
        print(f"{r['spec']}: {r['trials']} trials ({r['trials'] - r['trials_before']} new), best {best}")
    print(f"database: {args.db}")
    return _tune_status(results, args.trials)


def _specs_to_tune(args, target) -> list:
    """The specs of --spec, or of --model: its pairs that fuse, its single convs, then its pairs that the
    rule could fuse but its policy runs as single convs (with records of both forms, measurement
    decides what a build runs), each group the most work first; --only keeps the pairs or the convs. A
    conv on a rule without parameters (CUDA cores) is measured once, for that decision. Not tuned: a
    single conv whose default splits its reduction over two kernels (a tuned config runs whole, and the
    split is not searched yet); with --rpc, one whose kernel is written rather than scheduled (sm_90's TIRx kernels,
    whose configs tune.written measures on a local GPU): --spec of one is a one-line error."""
    from .frontend.model import analyze
    from .frontend.rewrite import pairs_of
    from .op.kind import parse_spec
    from .op.spec import OP_KIND as PAIR
    from .schedule import kind_of, plan, rule_for
    from .tune.database import written

    def untunable(spec, planned) -> str | None:
        if kind_of(spec) != PAIR and len(planned.kernels) > 1:
            return "by default it splits its reduction over two kernels (split-K), which tuning does not search yet"
        if not planned.schedules and (getattr(args, "rpc", None) or not written(rule_for(target, kind_of(spec), spec))):
            return ("its kernel is written, not scheduled (sm_90's TIRx kernels: TMA + wgmma, the cluster pair): its configs "
                    "are measured on a local GPU only, not through --rpc")
        return None

    if not args.model:
        if args.only:
            raise UserError("--only: takes --model (it picks among the model's specs)")
        if args.batch is not None:
            raise UserError("--batch: takes --model (a spec states its own n)")
        specs = [parse_spec(s) for s in args.spec]
        for spec in specs:
            why = untunable(spec, plan(spec, target))
            if why:
                raise UserError(f"--spec: {spec.to_string()}: {why}")
        return specs
    _, candidates, _ = analyze(args.model, target, dtype="float16", db=None, batch=args.batch)
    pairs = pairs_of(candidates)
    fused = _by_work([p.spec for p in pairs if p.fused and not untunable(p.spec, p.plan)])
    unfused = _by_work([p.spec for p in pairs if p.fusable and not p.fused])
    singles = [c for c in candidates if c.kind != PAIR and c.plan is not None]
    convs = _by_work([c.spec for c in singles if not untunable(c.spec, c.plan)])
    untuned = len({c.spec for c in singles}) - len(convs)
    print(f"{args.model}: {len(fused)} distinct fused pair(s), {len(convs)} distinct single conv(s), and "
          f"{len(unfused)} pair(s) the rule's policy runs unfused (tuned fused too: measurement decides)"
          + (f"; {untuned} single conv(s) not tuned (split-K by default, or a written kernel)" if untuned else ""))
    return {"pairs": fused + unfused, "convs": convs}.get(args.only, fused + convs + unfused)


def _by_work(specs: list) -> list:
    """The distinct specs, the most work in the model first (FLOPs times occurrences): a run that its
    --minutes cut short has tuned what weighs most."""
    from collections import Counter

    counts = Counter(specs)
    return sorted(counts, key=lambda spec: -spec.flops * counts[spec])


def _tune_status(results: list[dict], trials: int) -> int:
    """0, or 1 with the cause in one line on stderr: a spec without a valid record (its first
    failure), or trials left unmeasured because the environment failed (a lost RPC server, a timeout)."""
    failed = [r for r in results if not r["best_us"]]
    short = [r for r in results if r["environment_failures"] and r["trials"] < trials]
    for r in results:
        if r["environment_failures"]:
            print(f"{r['spec']}: {r['environment_failures']} trial(s) failed for the environment and were not counted "
                  f"({r['environment_error']})", file=sys.stderr)
    if failed:  # every trial of a spec failed: the cause, not only "no valid record"
        cause = next(filter(None, (r["first_error"] or r["environment_error"] for r in failed)), "no trial was measured")
        print(f"tvm-b2b tune: {len(failed)} spec(s) without a valid record; first failure: {cause}", file=sys.stderr)
        return 1
    if short:
        print(f"tvm-b2b tune: {len(short)} spec(s) short of {trials} trials because the environment failed; "
              "run the same command again to measure the rest", file=sys.stderr)
        return 1
    return 0


def _report(args) -> int:
    import json

    from .frontend.model import analyze, conv_names
    from .frontend.rewrite import conv_kernels, pairs_of
    from .target import parse_target

    _, candidates, model = analyze(args.model, parse_target(args.target), dtype=None if args.dtype == "float32" else args.dtype,
                                   batch=args.batch)
    pairs, convs = pairs_of(candidates), conv_kernels(conv_names(model), candidates)
    if args.json:
        print(json.dumps({"pairs": [p.to_json() for p in pairs], "convs": convs}, indent=1))
        return 0
    print(f"{len(pairs)} 3x3 -> 1x1 pair(s), {sum(p.fused for p in pairs)} fused (target {args.target})")
    for p in pairs:
        what = f"fused: {p.spec.to_string()}" + (f" [{p.config}]" if p.config else "") if p.fused else f"not fused: {p.reason}"
        print(f"  {p.conv3x3} -> {p.conv1x1}: {what}")
    print(_conv_counts(convs))
    for c in convs:
        if c["kernel"] != "fused-pair":
            print(f"  {c['name']}: {c['kernel']}: {c['reason']}")
    return 0


def _conv_counts(convs: list[dict]) -> str:
    """'N conv(s): a fused-pair, b tensorcore, ...' (the kinds that occur; default always)."""
    kinds = [k for k in ("fused-pair", "tensorcore", "cuda-core", "cpu") if any(c["kernel"] == k for c in convs)]
    kinds += [k for k in dict.fromkeys(c["kernel"] for c in convs) if k not in kinds + ["default"]] + ["default"]
    return f"{len(convs)} conv(s): " + ", ".join(f"{sum(c['kernel'] == k for c in convs)} {k}" for k in kinds)


def _compile(args) -> int:
    import json

    from .frontend.model import compile_model
    from .frontend.rewrite import pairs_of
    from .target import parse_target, target_info

    start = time.perf_counter()
    dtype = None if args.dtype == "float32" else args.dtype
    target = parse_target(args.target)
    if target_info(target).is_cuda and dtype is None:
        print("hint: --dtype float16 runs the convolutions on tensor cores; this build keeps float32", file=sys.stderr)
    def progress(line: str) -> None:
        if args.progress or (args.progress is None and sys.stderr.isatty()):
            print(f"[{time.perf_counter() - start:6.1f} s] {line}", file=sys.stderr, flush=True)

    candidates = compile_model(args.model, args.output, target, fuse=not args.no_fuse, dtype=dtype, db=_db(args),
                               emit_source=args.emit_source, cuda_graph=not args.no_cuda_graph, progress=progress,
                               batch=args.batch)
    pairs = pairs_of(candidates)
    with open(args.output + ".json") as f:
        convs = json.load(f)["convs"]
    print(f"compiled {args.model} -> {args.output} (+ .json) in {time.perf_counter() - start:.1f} s: "
          f"{sum(p.fused for p in pairs)} of {len(pairs)} 3x3 -> 1x1 pair(s) fused; {_conv_counts(convs)}")
    if args.emit_source:
        print(f"source written to {args.emit_source}")
    for p in pairs:
        if not p.fused:
            print(f"  not fused: {p.conv3x3} -> {p.conv1x1}: {p.reason}")
    return 0


def _run(args) -> int:
    import numpy as np

    from .frontend.model import load

    model = load(args.library)
    inputs = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep:
            raise UserError(f"--input {item}: expected NAME=FILE.npy")
        inputs[name] = np.load(path)
    missing = [name for name in model.input_names if name not in inputs]
    if missing and set(inputs) <= set(model.input_names):  # (an unknown name: the model's own error says so)
        raise UserError(f"input {missing[0]}: missing: give it as --input {missing[0]}=FILE.npy (this model's inputs: "
                        f"{model.signature()})")
    outputs = model(**inputs)
    for name, value in outputs.items():
        print(f"{name}: {summary(value)}")
    if args.output:
        np.savez(args.output, **outputs)
        print(f"written: {args.output}")
    if args.bench:
        print(f"latency {latency(model.time_us(inputs))} (median)")
    return 0


def summary(value) -> str:
    """One line about an output: dtype, shape, min/max/mean, and for one vector of scores (shape (K,)
    or (1, K)) the top-5 indices."""
    import numpy as np

    line = f"{value.dtype} {value.shape}"
    if value.size == 0:
        return line
    data = value.astype(np.float64)
    line += f"  min {data.min():.4g}  max {data.max():.4g}  mean {data.mean():.4g}"
    if value.ndim == 1 or (value.ndim == 2 and value.shape[0] == 1):
        scores = data.reshape(-1)
        top = np.argsort(-scores, kind="stable")[:5]
        line += "  top-5 " + ", ".join(f"{i} ({scores[i]:.4g})" for i in top)
    return line


def latency(us: float) -> str:
    """µs below 1 ms, ms from 1 ms on."""
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-b2b", description="Back-to-back 3x3 -> 1x1 convolution fusion for TVM."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    op = commands.add_parser(
        "op", help="build one fused op, optionally check it against numpy and time it",
        description="Builds one fused 3x3 -> 1x1 convolution pair (y = act2(conv1x1(act1(conv3x3(x) * s1 + b1)) * s2 + b2 "
                    "[+ residual])), or one single convolution (y = act(conv(x) * s + b [+ residual])), for a target. Without --check or --bench it only builds (and with --emit-source writes "
                    "the generated code); --check runs it on random data against the numpy reference, --bench times it "
                    "against the same template's two-kernel form. Both need the target's device on this machine.")
    op.add_argument("--spec", required=True, help="the pair as comma-separated fields: n, h, w, c, k1, k2 required "
                    "(batch, height, width, input channels, 3x3 and 1x1 output channels); optional stride=1 (or 2), "
                    "act1=relu, act2=relu (relu, relu6, none), residual=0 (or 1), dtype=float16 (bfloat16, float32), "
                    "groups=1, dilation=1 (the 3x3's; padded by it); "
                    'e.g. "n=1,h=56,w=56,c=64,k1=64,k2=64". A single conv: n, h, w, c, k required; optional kh=1, kw=1, '
                    'stride=1, pad_h=0, pad_w=0 (top, left), pad_bottom, pad_right (default: as top, left), groups=1, dilation=1, '
                    'act=relu, residual=0, dtype=float16; '
                    'e.g. "n=1,h=224,w=224,c=3,k=64,kh=7,kw=7,stride=2,pad_h=3,pad_w=3"')
    op.add_argument("--target", default="llvm", help="llvm, cuda (the local GPU), cuda:sm_XX, TVM's 'cuda -arch=sm_XX' or "
                    "'llvm -mcpu=native', or a target JSON")
    op.add_argument("--check", action="store_true", help="run on random data and compare with the numpy reference (exit 1 on mismatch)")
    op.add_argument("--bench", action="store_true", help="also time the unfused baseline (two kernels)")
    op.add_argument("--unfused", action="store_true", help="build the unfused baseline instead of the fused kernel")
    op.add_argument("--emit-source", metavar="FILE", help="write the generated source (LLVM IR on CPU, CUDA on GPU)")
    op.add_argument("--config", help="schedule parameters (CUDA), e.g. 'm_tile=128,warps_m=4,k_tile=64,pipeline=1,mma=1' "
                    "(fields left out: WmmaConfig's base values, not the per-spec defaults)")
    op.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    _db_options(op)
    op.set_defaults(handler=_op)

    report = commands.add_parser(
        "report", help="list the 3x3 -> 1x1 pairs of an ONNX model and whether each fuses",
        description="Imports an ONNX model and lists every 3x3 -> 1x1 convolution pair it has, with the fused spec "
                    "or every reason it is not fused on the target, then every conv with the kernel it gets (fused-pair; "
                    "tensorcore: a single conv on our tensor-core kernel; cuda-core: a grouped conv on our CUDA-core "
                    "kernel; cpu: our CPU kernel; default: TVM's own schedule) and why. Compiles nothing.")
    report.add_argument("model", help="MODEL.onnx")
    report.add_argument("--target", default="llvm", help="the target whose kernel decides what fuses (default llvm)")
    report.add_argument("--json", action="store_true", help='print {"pairs": [...], "convs": [...]} as JSON')
    report.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="as for compile")
    _batch_option(report)
    report.set_defaults(handler=_report)

    comp = commands.add_parser(
        "compile", help="compile an ONNX model, fusing its pairs, to a deployable library",
        description="Compiles an ONNX model (static input shapes, or a symbolic batch that --batch sets) for a target "
                    "into OUT.so plus OUT.so.json (its inputs, outputs and pairs), which `tvm-b2b run` and tvm_b2b.load() "
                    "take. Each fusable 3x3 -> 1x1 pair runs as one fused kernel; the rest compiles with TVM. On CUDA, "
                    "--dtype float16 is what runs on tensor cores.")
    comp.add_argument("model", help="MODEL.onnx")
    comp.add_argument("-o", "--output", required=True, help="OUT.so (metadata goes to OUT.so.json)")
    comp.add_argument("--target", default="llvm", help="llvm, cuda, cuda:sm_XX, 'cuda -arch=sm_XX', "
                      "'llvm -mcpu=native', or a target JSON")
    comp.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="float16: the whole model runs in float16 with float32 accumulation in every conv "
                      "(the GPU path: tensor cores), outputs in the model's dtype; default keeps float32")
    comp.add_argument("--no-fuse", action="store_true", help="compile without fusing (the baseline)")
    comp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="a line on stderr per stage and per kernel scheduled (default: when stderr is a terminal)")
    comp.add_argument("--no-cuda-graph", action="store_true", help="on CUDA, launch each kernel through the VM instead of "
                      "replaying the model as one CUDA graph (the default)")
    comp.add_argument("--emit-source", metavar="FILE", help="write the whole model's generated device code (CUDA on cuda "
                      "targets, one translation unit as the GPU compiles it; LLVM IR on CPUs)")
    _batch_option(comp)
    _db_options(comp)
    comp.set_defaults(handler=_compile)

    tune = commands.add_parser(
        "tune", help="tune the fused kernel for a GPU with MetaSchedule (resumable)",
        description="Searches the CUDA schedule's parameters of one or more specs (or every fused pair of a model) "
                    "with MetaSchedule's evolutionary search and XGBoost cost model, measuring on this machine's GPU; "
                    "every candidate is checked against the numpy reference. Records go to a MetaSchedule JSON "
                    "database; rerunning the same command continues it.")
    what = tune.add_mutually_exclusive_group(required=True)
    what.add_argument("--spec", action="append", help="a fused op spec to tune (repeat for several)")
    what.add_argument("--model", help="MODEL.onnx: tune every distinct fused pair it has (float16)")
    tune.add_argument("--only", choices=["pairs", "convs"], help="with --model: only its pairs (those that fuse, then those "
                      "its policy runs unfused), or only its single convs")
    tune.add_argument("--target", default="cuda", help="cuda (the local GPU) or cuda:sm_XX; measuring needs that GPU")
    _batch_option(tune)
    tune.add_argument("--trials", type=int, default=64, help="trials per spec in total: a rerun continues up to it (default 64)")
    tune.add_argument("--db", required=True, metavar="DIR", help="the tuning database (created if missing; MetaSchedule's JSON files)")
    tune.add_argument("--minutes", type=float, help="stop starting new rounds after this long (rerun to continue)")
    tune.add_argument("--rpc", metavar="HOST:PORT", help="measure on the GPUs an RPC tracker lends (python -m tvm.exec.rpc_tracker; "
                      "servers: python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY); candidates build here")
    tune.add_argument("--rpc-key", metavar="KEY", help="with --rpc: the key the GPU servers registered under")
    tune.add_argument("--rpc-workers", type=int, default=1, metavar="N", help="with --rpc: measure on N servers at once (default 1)")
    tune.set_defaults(handler=_tune)

    run = commands.add_parser(
        "run", help="run a compiled model on .npy inputs",
        description="Runs a model compiled by `tvm-b2b compile` on inputs from .npy files and prints a summary of "
                    "each output (shape, min/max/mean, top-5 of a score vector); --output saves them, --bench "
                    "prints the latency. The target's device must be on this machine.")
    run.add_argument("library", help="OUT.so from tvm-b2b compile")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input by its ONNX name (repeat)")
    run.add_argument("--output", metavar="OUT.npz", help="write the outputs under their ONNX names")
    run.add_argument("--bench", action="store_true", help="print the median latency")
    run.set_defaults(handler=_run)
    return parser


def _batch_option(parser) -> None:
    parser.add_argument("--batch", type=int, metavar="N", help="the batch of a model exported with a dynamic one (its "
                        "inputs' symbolic first dimension); the compiled model runs at that batch")


def _db_options(parser):
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--db", metavar="DIR", help="take tuned CUDA parameters from this database (default: the target GPU's in schedules/)")
    group.add_argument("--no-db", action="store_true", help="use the schedule's default parameters")


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"tvm-b2b {args.command}: interrupted (a tuning database keeps every finished record; "
              "rerun the same command to continue)", file=sys.stderr)
        return 130
    except (ValueError, UserError, OSError) as err:
        print(f"tvm-b2b {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - TVM's own errors: one line unless asked for more
        if os.environ.get("TVM_B2B_TRACEBACK"):
            raise
        print(f"tvm-b2b {args.command}: error: {type(err).__name__}: {_one_line(err)} "
              "(set TVM_B2B_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return 1


def _one_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
