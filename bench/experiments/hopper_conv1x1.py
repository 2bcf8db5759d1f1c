"""Experiment (not part of the product): a 1x1 conv on Hopper's own instructions, TMA loads + wgmma.

Why: the product's template (ldmatrix + mma.sync) stops near 250 TFLOP/s on ResNet-50's batch-32
convs, and 1x1 convs run at 110-190 (bench/results/convs_h200_s12_configs.txt). That puts the
batch-32 target (1200 us) out of reach: the convs alone take about 1050 us. Hopper's warpgroup MMA
(wgmma, operands read from shared memory by the tensor cores) and the TMA unit (one thread issues a
whole tile's copy; rows past the end read as zeros and are not written) are what cuBLAS and CUTLASS
use on sm_90. TVM 0.27 has no schedule primitive that emits them, but its TIRx script does:
T.ptx["wgmma.mma_async..."], T.cuda.wgmma.encode_matrix_descriptor, cp.async.bulk.tensor with a
CUtensorMap made on the host by runtime.cuTensorMapEncodeTiled (tests/python/tirx/codegen/
test_codegen_hopper.py upstream). Built with tvm.compile(..., tir_pipeline="tirx").

The kernel: y (m, k) = act(x (m, c) @ w^T * s + b [+ residual]) for a stride-1 1x1 conv in NHWC (m = n*h*w
pixels), w given as (k, c) (a 1x1 conv's OHWI weights, so both operands are K-major in shared memory).
- One block: BM pixels x BN channels; BM / 64 consumer warpgroups each own 64 rows (wgmma m64nBNk16),
  one producer warpgroup whose thread 0 issues the TMA copies (warp specialization).
- STAGES buffers of 64-channel steps (128 B rows, 128B swizzle: the layout wgmma's descriptors read),
  each with a "full" mbarrier (TMA's transaction count) and an "empty" one (each consumer warp
  arrives once its wgmma.wait_group returned: the buffer is free for the step STAGES later).
- Epilogue from the accumulator registers: scale, bias, [residual], act, fp16 into a 128B-swizzled shared
  tile (no bank conflicts), stored by TMA in boxes of 64 channels (rows past m clipped by the unit).
c and k must be multiples of 8 (TMA's 16-byte strides) and k of BN. Stride 2 (ResNet's downsample) is not
covered: its rows are not one box.

    python3 bench/experiments/hopper_conv1x1.py [--spec SPEC ...] [--config BM,BN,STAGES ...] [--nvcc] [--source F]
On a GPU: checks each build against numpy and times it, with the product's kernel (default config) and
torch's (cuDNN, channels_last fp16) in the same run. Elsewhere: builds (and with --nvcc compiles for sm_90a).
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

BK = 64  # reduction step: 64 fp16 = 128 bytes, one row of the 128B swizzle atom
WGMMA_K = 16
SWIZZLE_128B = 3  # CUtensorMapSwizzle and the wgmma descriptor's layout code
DESC_LBO, DESC_SBO = 1, 64  # K-major 128B swizzle: leading offset unused; 8 rows x 128 B = 1024 B apart (16-B units)
FENCE_SOURCE = """
__forceinline__ __device__ void tvm_b2b_fence_acc(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
"""  # after wgmma.wait_group: keeps the compiler from reading the accumulators before the wait (CUTLASS's
# warpgroup_fence_operand); TVM 0.27's T.cuda.wgmma.noop_barrier fails in codegen and takes its operand by value
DEFAULT_CONFIGS = ("128,128,4", "128,64,4", "128,256,3", "64,128,4")
RESNET50_1X1 = ["n=32,h=56,w=56,c=64,k=256,act=none", "n=32,h=56,w=56,c=256,k=64", "n=32,h=56,w=56,c=64,k=256,residual=1",
                "n=32,h=28,w=28,c=512,k=128", "n=32,h=28,w=28,c=128,k=512,residual=1",
                "n=32,h=14,w=14,c=1024,k=256", "n=32,h=14,w=14,c=256,k=1024,residual=1",
                "n=32,h=7,w=7,c=2048,k=512", "n=32,h=7,w=7,c=512,k=2048,residual=1"]


def check_spec(spec: ConvSpec, bn: int) -> None:
    """ValueError naming what this kernel does not take."""
    if (spec.kh, spec.kw, spec.stride, spec.groups, spec.pad_h, spec.pad_w) != (1, 1, 1, 1, 0, 0):
        raise ValueError(f"{spec.to_string()}: only stride-1 1x1 convs without groups")
    if spec.dtype != "float16" or spec.c % 8 or spec.k % bn:
        raise ValueError(f"{spec.to_string()}: needs float16, c a multiple of 8 and k of {bn}")


def _act(v, name: str):
    from tvm.script import tirx as T

    if name == "relu":
        return T.max(v, T.float32(0))
    if name == "relu6":
        return T.min(T.max(v, T.float32(0)), T.float32(6))
    assert name == "none", name
    return v


def conv1x1_func(spec: ConvSpec, bm: int = 128, bn: int = 128, stages: int = 4):
    """The kernel as a TIRx PrimFunc (x, w (k, c), s, b, residual, y); residual is read only when the spec has one
    (pass any (m, k) fp16 tensor otherwise)."""
    import tvm
    from tvm.script import tirx as T

    check_spec(spec, bn)
    m, c, k = spec.m, spec.c, spec.k
    wgs, steps, acc_regs, boxes = bm // 64, -(-c // BK), bn // 2, bn // 64
    stages = min(stages, steps)  # more buffers than steps only cost shared memory (fewer blocks per SM)
    threads = 128 * (wgs + 1)
    tx_bytes = (bm + bn) * BK * 2
    x_map_args = [c, m, c * 2, BK, bm, 1, 1, 0, SWIZZLE_128B, 0, 0]  # inner dim first; rows past m read as 0
    w_map_args = [c, k, c * 2, BK, bn, 1, 1, 0, SWIZZLE_128B, 0, 0]
    y_map_args = [k, m, k * 2, 64, bm, 1, 1, 0, SWIZZLE_128B, 0, 0]  # stores: boxes of 64 channels
    mma = f"wgmma.mma_async.sync.aligned.m64n{bn}k{WGMMA_K}.f32.f16.f16"
    load = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
    store = "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"
    residual, act = bool(spec.residual), spec.act
    w_at = stages * bm * BK  # element offsets in the shared pool, each a multiple of 1024 bytes
    y_at = w_at + stages * bn * BK
    pool = y_at + bm * bn

    @T.prim_func
    def conv1x1(x_ptr: T.handle, w_ptr: T.handle, s_ptr: T.handle, b_ptr: T.handle, r_ptr: T.handle, y_ptr: T.handle):
        x = T.match_buffer(x_ptr, (m, c), "float16", align=16)
        w = T.match_buffer(w_ptr, (k, c), "float16", align=16)
        s = T.match_buffer(s_ptr, (k,), "float32", align=16)
        b = T.match_buffer(b_ptr, (k,), "float32", align=16)
        r = T.match_buffer(r_ptr, (m, k), "float16", align=16)
        y = T.match_buffer(y_ptr, (m, k), "float16", align=16)
        x_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", x_map, "float16", 2, x.data, *x_map_args)
        w_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", w_map, "float16", 2, w.data, *w_map_args)
        y_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
        T.call_packed("runtime.cuTensorMapEncodeTiled", y_map, "float16", 2, y.data, *y_map_args)

        T.device_entry()
        bk, bi = T.cta_id([k // bn, (m + bm - 1) // bm])
        tx = T.thread_id([threads])
        # one dynamic allocation (TVM allows one): the x steps, then the w steps, then the output tile
        tiles = T.alloc_buffer((pool,), "float16", scope="shared.dyn", align=1024)
        full = T.alloc_buffer((stages,), "uint64", scope="shared", align=8)
        empty = T.alloc_buffer((stages,), "uint64", scope="shared", align=8)
        acc = T.alloc_buffer((acc_regs,), "float32", scope="local")
        desc_x: T.uint64
        desc_w: T.uint64
        wg = T.meta_var(tx // 128)
        if tx == 0:
            for i in T.serial(stages):
                T.ptx.mbarrier.init.shared.b64(T.address_of(full[i]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(T.address_of(empty[i]), T.uint32(4 * wgs))
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if wg == wgs:  # the producer: one thread issues every step's two copies
            if tx == wgs * 128:
                for ko in T.serial(steps):
                    if ko >= stages:  # wait until both consumers released this buffer's previous step
                        T.cuda.mbarrier_wait(T.address_of(empty[ko % stages]), (ko // stages + 1) % 2)
                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(T.address_of(full[ko % stages]), T.uint32(tx_bytes))
                    T.ptx[load](T.address_of(tiles[ko % stages * bm * BK]), T.address_of(x_map), ko * BK, bi * bm,
                                T.address_of(full[ko % stages]))
                    T.ptx[load](T.address_of(tiles[w_at + ko % stages * bn * BK]), T.address_of(w_map), ko * BK, bk * bn,
                                T.address_of(full[ko % stages]))
        else:
            for ko in T.serial(steps):
                T.cuda.mbarrier_wait(T.address_of(full[ko % stages]), (ko // stages) % 2)
                T.ptx.wgmma.fence.sync.aligned()
                for kk in T.unroll(BK // WGMMA_K):  # the start address moves 32 B per step inside the swizzle atom
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_x), T.address_of(
                        tiles[ko % stages * bm * BK + wg * 64 * BK + kk * WGMMA_K]), DESC_LBO, DESC_SBO, SWIZZLE_128B)
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc_w), T.address_of(
                        tiles[w_at + ko % stages * bn * BK + kk * WGMMA_K]), DESC_LBO, DESC_SBO, SWIZZLE_128B)
                    T.ptx[mma](*[acc[i] for i in range(acc_regs)], desc_x, desc_w, ko * (BK // WGMMA_K) + kk > 0,
                               1, 1, 0, 0)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(0)
                if tx % 32 == 0:  # each warp, once its wait returned
                    T.ptx.mbarrier.arrive.shared.b64(T.address_of(empty[ko % stages]))
            for i in T.unroll(acc_regs):
                T.cuda.func_call("tvm_b2b_fence_acc", acc[i], source_code=FENCE_SOURCE)
            # accumulator j of m64nNk16 (f32): row 16 * warp + lane / 4 (+8 for j % 4 >= 2), channel
            # 8 * (j // 4) + 2 * (lane % 4) + j % 2; ys is 128B-swizzled: 16-byte chunk (ch / 8) ^ (row % 8)
            for j in T.unroll(acc_regs):
                row = T.meta_var(wg * 64 + tx % 128 // 32 * 16 + tx % 32 // 4 + j % 4 // 2 * 8)
                ch = T.meta_var(j // 4 * 8 + tx % 4 * 2 + j % 2)
                pre = T.meta_var(acc[j] * s[bk * bn + ch] + b[bk * bn + ch])
                if residual:
                    tiles[y_at + ch // 64 * bm * 64 + row * 64 + (ch % 64 // 8 ^ row % 8) * 8 + ch % 8] = T.Cast("float16", _act(
                        pre + T.Cast("float32", r[T.min(bi * bm + row, m - 1), bk * bn + ch]), act))
                else:
                    tiles[y_at + ch // 64 * bm * 64 + row * 64 + (ch % 64 // 8 ^ row % 8) * 8 + ch % 8] = T.Cast("float16", _act(pre, act))
        T.ptx.fence.proxy.async_.shared__cta()  # the tile's generic-proxy writes, visible to the TMA store
        T.cuda.cta_sync()
        if tx == 0:
            for box in T.serial(boxes):
                T.ptx[store](T.address_of(y_map), bk * bn + box * 64, bi * bm, T.address_of(tiles[y_at + box * bm * 64]))
            T.ptx.cp.async_.bulk.commit_group()
            T.ptx.cp.async_.bulk.wait_group(0)

    return conv1x1.with_attr("global_symbol", "main")


def build(spec: ConvSpec, bm: int, bn: int, stages: int, arch: str = "sm_90a"):
    import tvm

    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    return tvm.compile(tvm.IRModule({"main": conv1x1_func(spec, bm, bn, stages)}), target=target, tir_pipeline="tirx")


def shared_bytes(spec: ConvSpec, bm: int, bn: int, stages: int) -> int:
    """Dynamic shared memory: the operand buffers (at most one per reduction step) and the output tile."""
    return min(stages, -(-spec.c // BK)) * (bm + bn) * BK * 2 + bm * bn * 2


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
    w_kc = np.ascontiguousarray(arrays["w"].reshape(spec.c, spec.k).T)
    res = arrays.get("residual", np.zeros(spec.out_shape, np.float16)).reshape(spec.m, spec.k)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in
            (arrays["x"].reshape(spec.m, spec.c), w_kc, arrays["s"], arrays["b"], res)]
    lines = []
    for bm, bn, stages in configs:
        name = f"wgmma bm={bm},bn={bn},stages={stages}"
        try:
            lib = build(spec, bm, bn, stages, "sm_90a")
        except Exception as err:  # noqa: BLE001 - an experiment reports every build failure and goes on
            lines.append(f"{spec.to_string()} {name}: build failed: {str(err).strip().splitlines()[-1][:200]}")
            continue
        y = tvm.runtime.tensor(np.full((spec.m, spec.k), np.nan, np.float16), dev)
        lib["main"](*args, y)
        err, ok = compare(spec, y.numpy().reshape(spec.out_shape), want)
        us = float(np.median(lib.time_evaluator("main", dev, number=20, repeat=5)(*args, y).results)) * 1e6
        lines.append(f"{spec.to_string()} {name}: {us:.1f} us {spec.flops / us / 1e6:.0f} TFLOP/s, "
                     f"max abs error {err:.3g}: {'OK' if ok else 'WRONG'}")
    kernel = product_build(spec, "cuda", db=None)
    us = kernel.time_us(arrays)
    lines.append(f"{spec.to_string()} product default: {us:.1f} us {spec.flops / us / 1e6:.0f} TFLOP/s")
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
        for bm, bn, stages in configs:
            source = build(spec, bm, bn, stages).mod.imports[0].inspect_source()
            if args.source:
                open(args.source, "w").write(source)
                args.source = None
            line = f"{spec.to_string()} bm={bm},bn={bn},stages={stages}: built, {shared_bytes(spec, bm, bn, stages) // 1024} KiB shared"
            if args.nvcc:
                compiled, info = nvcc_compile(source)
                ok = ok and compiled
                line += f"; nvcc sm_90a: {'OK' if compiled else 'FAILED'} {info}"
            print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
