"""Experiment (not part of the product): the 3x3 conv's A operand read from ONE shared halo tile.

Why: the fused kernel is bound by shared memory and L1 (ncu, bench/results/h200_s6_1_ncu_epilogue2.txt):
each block copies its im2col tile into shared memory once per 3x3 tap, 9 times (147 KB of the 220 KB a
block writes there at N=32 56x56 64->64->128).

The idea: compute conv1 over the pixels of the zero-padded grid (width W+2, height H+2; the extra
pixels are junk and are dropped). Then tap (rh, rw) of pixel row m of the implicit GEMM is row
m + rh*(W+2) + rw of the flattened padded input: one affine shift per tap. So one shared tile of
m_tile + 2(W+2) + 2 rows (31 KB at m_tile=128, W=56) serves all 9 taps. The ldmatrix A loads read it
at a tap-dependent row offset. TVM's ldmatrix intrinsic declares offset_factor=16 elements, which a
row shift of 72 elements (64 channels + 8 padding) breaks. The copy below declares 8: ldmatrix
itself needs 16-byte row addresses.

This script builds the stage-1 kernel (x -> mid, conv1 + s1/b1/relu), or with --fused the whole op,
both ways with the same tiles. On a GPU it checks the halo kernel against numpy and times both;
elsewhere it writes the CUDA source and, with --nvcc, compiles it for sm_90.
    python3 bench/experiments/halo_tile.py [--fused] [--case SPEC] [--config CFG] [--nvcc] [--source FILE]
The whole op computes every grid row and stores only the real pixels, each to its row of y (a
predicated store at a non-affine row: a TIR rewrite of the last block, since TE cannot write it); the
residual is read at the real pixel (no residual tile). With epilogue=2 the output tile in shared
memory has a store block of its own (a cache_write of y would over-estimate the region of y that a
tile of grid rows covers). Stride 1 only; about 7% of the work at 56x56 is junk pixels.
Found so far (2026-12-03, CPU only): TVM 0.27 schedules, tensorizes and lowers both. The ldmatrix
address is base + (tap // 3) * 58 rows + (tap % 3) rows + fragment, and the halo rows are plain
128-bit loads with zero-fill predicates. tests/test_halo_experiment.py checks the TE forms against
numpy on the CPU and the CUDA they build.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import s_tir, te, tirx  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

from tvm_b2b import FusedConvSpec  # noqa: E402
from tvm_b2b.lower import POOL_ATTR  # noqa: E402
from tvm_b2b.op.compute import _matmul, _placeholders, activation, round_up  # noqa: E402
from tvm_b2b.op.conv import guard as _guard  # noqa: E402
from tvm_b2b.codegen import compile_module  # noqa: E402
from tvm_b2b.op.device import device_arguments  # noqa: E402
from tvm_b2b.op.reference import _act, compare, np_dtype, random_inputs, reference  # noqa: E402
from tvm_b2b.schedule import cuda_wmma, plan  # noqa: E402
from tvm_b2b.target import parse_target, target_info  # noqa: E402

ROWSHIFT_LDMATRIX = "tvm_b2b_ldmatrix_f16_a_rowshift_dyn"
STAGE1 = ("x", "w1", "s1", "b1")  # the stage-1 kernel's inputs, in order


def _ldmatrix_a(offset_factor: int):
    """TVM's ldmatrix intrinsic for a 16x16 fp16 A fragment in shared.dyn (s_tir.tensor_intrin.cuda's
    get_ldmatrix_intrin(16, "float16", "A", False, "shared.dyn")), with offset_factor as given."""
    from tvm.s_tir.tensor_intrin.cuda import shared_16x16_to_ldmatrix_32x8_layout as index_map

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (16, 16), "float16", align=64, offset_factor=offset_factor, scope="shared.dyn")
        warp = T.match_buffer(warp_handle, (32, 8), "float16", align=64, offset_factor=offset_factor, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:8])
            for ax0, ax1 in T.grid(16, 16):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    thread_id, local_id = T.meta_var(index_map(v0, v1))
                    T.writes(warp[thread_id, local_id])
                    warp[thread_id, local_id] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (16, 16), "float16", align=64, offset_factor=offset_factor,
                                scope="shared.dyn", strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, 8), "float16", align=64, offset_factor=offset_factor, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(False, 4, ".b16", warp.data, warp.elem_offset + 8 * tx,
                                                 shared.access_ptr("r"), s0 * (tx % 16) + 8 * (tx // 16), dtype="float16"))

    return desc, impl


def _grid(spec: FusedConvSpec) -> tuple[int, int]:
    """(H+2, W+2): the zero-padded pixel grid's height and width."""
    return spec.h + 2, spec.w + 2


def _stage1_tensors(spec: FusedConvSpec, m_tile: int):
    """((x, w1, s1, b1), mid): mid over the padded pixel grid, (rows, k1); row n*(H+2)*(W+2) + oh*(W+2) + ow
    holds pixel (n, oh, ow) for oh < H, ow < W; the other rows are junk."""
    assert spec.stride == 1, "the halo form needs stride 1 (a tap is then a row shift)"
    (hp, wp), cp = _grid(spec), round_up(spec.c, 64)
    rows = round_up(spec.n * hp * wp, m_tile)
    x, w1, s1, b1 = inputs = _placeholders(spec, "x", "w1", "s1", "b1")

    def padded(q, c):
        n, i, j = q // (hp * wp), q // wp % hp, q % wp
        inside = tirx.all(n < spec.n, i >= 1, i <= spec.h, j >= 1, j <= spec.w, c < spec.c)
        return _guard(inside, x[n, i - 1, j - 1, c], spec.dtype)

    xflat = te.compute((round_up(rows + 2 * wp + 2, 64), cp), padded, name="xflat")
    a1 = te.compute((rows, 9 * cp), lambda m, r: xflat[m + r // (3 * cp) * wp + r // cp % 3, r % cp], name="im2col")
    b1g = te.compute((9 * cp, round_up(spec.k1, 64)), lambda r, k: _guard(
        tirx.all(r % cp < spec.c, k < spec.k1), w1[r // (3 * cp), r // cp % 3, r % cp, k], spec.dtype), name="w1_gemm")
    conv1 = _matmul(a1, b1g, rows, b1g.shape[1], 9 * cp, "conv1")
    mid = te.compute(conv1.shape, lambda m, k: _guard(
        k < spec.k1, activation(conv1[m, k] * s1[k] + b1[k], spec.act1).astype(spec.dtype), spec.dtype), name="mid")
    return inputs, mid


def halo_stage1(spec: FusedConvSpec, m_tile: int):
    """(x, w1, s1, b1) -> mid over the padded pixel grid (see _stage1_tensors)."""
    inputs, mid = _stage1_tensors(spec, m_tile)
    return te.create_prim_func([*inputs, mid]).with_attr("global_symbol", "halo_stage1")


def halo_fused(spec: FusedConvSpec, m_tile: int):
    """The whole op over the padded pixel grid, (x, w1, s1, b1, w2, s2, b2, [residual], y): y (m, k2) as
    the product's kernels take it. The block "out" computes every grid row; "y_store" stores only the
    real pixels, each to its row of y (a predicated store at a non-affine row, which TE cannot write:
    see _store_real_pixels). With epilogue=2 "out" is the shared fp16 tile and "y_store" its 128-bit
    store; otherwise "out" is inlined into "y_store"."""
    inputs1, mid = _stage1_tensors(spec, m_tile)
    rows, k2 = mid.shape[0], round_up(spec.k2, 64)
    w2, s2, b2 = inputs2 = _placeholders(spec, "w2", "s2", "b2")
    b2g = te.compute((mid.shape[1], k2), lambda r, k: _guard(tirx.all(r < spec.k1, k < spec.k2), w2[r, k], spec.dtype),
                     name="w2_gemm")
    conv2 = _matmul(mid, b2g, rows, k2, mid.shape[1], "conv2")
    out_pad = te.compute((rows, k2), lambda m, k: _guard(k < spec.k2, conv2[m, k] * s2[k] + b2[k], "float32"), name="out_pad")
    extra = _placeholders(spec, "residual") if spec.residual else []

    def value(m, k):
        v = out_pad[m, k]
        if extra:  # junk rows read some row in bounds
            v = v + extra[0][tirx.min(_real_pixel(spec, m), spec.m - 1), k].astype("float32")
        return activation(v, spec.act2).astype(spec.dtype)

    out = te.compute((rows, spec.k2), value, name="out")
    y_store = te.compute(out.shape, lambda m, k: out[m, k], name="y_store")  # becomes the store of the real pixels
    func = te.create_prim_func([*inputs1, *inputs2, *extra, y_store]).with_attr("global_symbol", "halo_fused")
    return _store_real_pixels(func, spec)


def _real_pixel(spec: FusedConvSpec, m):
    """The row of y (n, oh, ow) for grid row m."""
    hp, wp = _grid(spec)
    return (m // (hp * wp) * spec.h + m % (hp * wp) // wp) * spec.w + m % wp


def _is_real_pixel(spec: FusedConvSpec, m):
    hp, wp = _grid(spec)
    return tirx.all(m < spec.n * hp * wp, m % (hp * wp) // wp < spec.h, m % wp < spec.w)


def _store_real_pixels(func, spec: FusedConvSpec):
    """func with its last parameter (grid rows, k2) replaced by y (m, k2): the block "y_store" stores grid
    row m to row _real_pixel(m) of y, only where _is_real_pixel(m)."""
    y = tirx.decl_buffer((spec.m, spec.k2), spec.dtype, "y")

    def block(node):
        if node.name_hint != "y_store":
            return node
        vm, vk = node.body.indices
        row = _real_pixel(spec, vm)
        body = tirx.IfThenElse(_is_real_pixel(spec, vm), tirx.BufferStore(y, node.body.value, [row, vk]), None)
        writes = [tirx.BufferRegion(y, [tvm.ir.Range.from_min_extent(row, 1), tvm.ir.Range.from_min_extent(vk, 1)])]
        return s_tir.SBlock(node.iter_vars, node.reads, writes, node.name_hint, body, node.init, node.alloc_buffers,
                            node.match_buffers, node.annotations)

    body = tvm_ffi.structural_map(func.body, [(s_tir.SBlock, block)])
    return tirx.PrimFunc([*func.params[:-1], y], body, attrs=func.attrs)


class HaloSchedule(cuda_wmma.WmmaFusedSchedule):
    """The template's schedule (stage 1, or the whole op), with conv1's A fragments loaded from the halo tile."""

    def _stage1(self, fused: bool):
        sch, spec = self.sch, self.spec
        conv1 = sch.get_sblock("conv1")
        anchor = sch.get_loops(conv1)[1 if not fused else 0]  # the block: its channel chunk, or its pixel tile
        g = self._gemm(conv1, self.knob["frags_n1"], self.knob["frags_k"])
        self.intrin["load_a"] = ROWSHIFT_LDMATRIX
        self._to_shared(g, 1, 8)  # w1, pipelined as in the template
        sch.compute_inline(sch.get_sblock("w1_gemm"))
        mid = sch.get_sblock("mid")
        self._epilogue(g, mid, spec.k1, to_global=not fused)
        if fused:  # as the template: mid stays in shared memory for conv2
            sch.set_scope(mid, 0, "shared.dyn")
            sch.storage_align(mid, 0, axis=-2, factor=64, offset=8)
        sch.compute_inline(sch.get_sblock("im2col"))  # the A fragments now read xflat at a shifted row
        halo = sch.get_sblock("xflat")
        sch.compute_at(halo, anchor, preserve_unit_loops=True)
        sch.set_scope(halo, 0, "shared.dyn")
        self._threads(halo, 8)
        sch.storage_align(halo, 0, axis=-2, factor=64, offset=8)
        self._tensorize(g)

    def _stage2(self, fused: bool):
        """The template's conv2, with its epilogue split in two: "out" (in registers, or into a shared fp16
        tile with epilogue=2) and "y_store", which stores the real pixels (a cache_write of y would
        over-estimate the region of y a tile of grid rows covers). No residual tile: the residual's rows
        are the real pixels' (read where "out" is computed)."""
        sch, spec = self.sch, self.spec
        g = self._gemm(sch.get_sblock("conv2"), self.knob["frags_n2"], cuda_wmma.CONV2_K_FRAGS)
        self._to_shared(g, 1, 8)
        sch.compute_inline(sch.get_sblock("w2_gemm"))
        sch.compute_inline(sch.get_sblock("out_pad"))
        out, store = sch.get_sblock("out"), sch.get_sblock("y_store")
        if self.stage_output:
            sch.set_scope(out, 0, "shared.dyn")
            self._fragments(g, out)
            sch.reverse_compute_at(store, g.chunk, preserve_unit_loops=True)
            sch.storage_align(out, 0, axis=-2, factor=64, offset=8)
            self._threads(store, 8)
        else:
            sch.compute_inline(out)
            self._epilogue(g, store, spec.k2, to_global=True)
        self._tensorize(g)


def build_halo(spec: FusedConvSpec, cfg: cuda_wmma.WmmaConfig, target, fused: bool = False):
    """The halo kernel's executable: stage 1 alone, or the whole op."""
    tvm.s_tir.TensorIntrin.register(ROWSHIFT_LDMATRIX, *_ldmatrix_a(offset_factor=8), override=True)
    func = halo_fused(spec, cfg.m_tile) if fused else halo_stage1(spec, cfg.m_tile)
    halo = HaloSchedule(s_tir.Schedule(func), spec, cfg, target_info(target).arch).run().mod["main"]
    return _compile(halo, target)


def build_template(spec: FusedConvSpec, cfg: cuda_wmma.WmmaConfig, target, fused: bool = False):
    """The product template's executable with the same tiles (what the halo kernel is timed against)."""
    return _compile(plan(spec, target, fused, cfg).kernels[0], target)


def _compile(func, target):
    return compile_module(tvm.IRModule({"main": func.with_attr(POOL_ATTR, True)}), target)


def reference_mid(spec: FusedConvSpec, x, w1, s1, b1) -> np.ndarray:
    """numpy: act1(conv3x3(x, w1) * s1 + b1), (n, h, w, k1), fp32 accumulation."""
    xp = np.pad(x.astype(np.float32), ((0, 0), (1, 1), (1, 1), (0, 0)))
    acc = sum(xp[:, rh:rh + spec.h, rw:rw + spec.w, :] @ w1[rh, rw].astype(np.float32) for rh in range(3) for rw in range(3))
    return _act(acc * s1 + b1, spec.act1).astype(np_dtype(spec.dtype))


def nvcc_compiles(source: str) -> bool:
    """Compiles the CUDA for sm_90 with the local nvcc; prints ptxas's last line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "halo.cu")
        open(path, "w").write(source)
        run = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", "-o", path + ".cubin", path],
                             capture_output=True, text=True)
    print("nvcc sm_90:", "OK" if run.returncode == 0 else "FAILED", run.stderr.strip().splitlines()[-1:])
    return run.returncode == 0


def run_stage1(exe, rows: int, spec: FusedConvSpec, arrays) -> tuple[float, np.ndarray]:
    """(median us, mid) of one stage-1 executable on the GPU."""
    dev = tvm.cuda(0)
    inputs = [tvm.runtime.tensor(np.ascontiguousarray(arrays[k]), dev) for k in STAGE1]
    mid = tvm.runtime.empty((rows, round_up(spec.k1, 64)), spec.dtype, dev)
    module = exe.jit()
    module["main"](*inputs, mid)
    timer = module.time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=20)
    return float(np.median(timer(*inputs, mid).results)) * 1e6, mid.numpy()


def run_fused(exe, spec: FusedConvSpec, arrays) -> tuple[float, np.ndarray]:
    """(median us, y as NHWC) of one fused executable on the GPU; y starts as NaN, so unwritten pixels show."""
    dev = tvm.cuda(0)
    tensors, out = device_arguments(spec, arrays, dev)
    out.copyfrom(np.full((spec.m, spec.k2), np.nan, dtype=np_dtype(spec.dtype)))
    module = exe.jit()
    module["main"](*tensors.values(), out)
    y = out.numpy().reshape(spec.out_shape)
    timer = module.time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=20)
    return float(np.median(timer(*tensors.values(), out).results)) * 1e6, y


def check_stage1(spec: FusedConvSpec, cfg, halo, template, arrays) -> bool:
    hp, wp = _grid(spec)
    halo_us, grid = run_stage1(halo, round_up(spec.n * hp * wp, cfg.m_tile), spec, arrays)
    template_us, _ = run_stage1(template, cuda_wmma.extents(spec)["m"], spec, arrays)
    got = grid[: spec.n * hp * wp].reshape(spec.n, hp, wp, -1)[:, : spec.h, : spec.w, : spec.k1].astype(np.float32)
    want = reference_mid(spec, *(arrays[k] for k in STAGE1)).astype(np.float32)
    ok = bool(np.allclose(got, want, rtol=2e-2, atol=2e-2))
    print(f"halo stage 1:     {halo_us:.1f} us, max abs error {np.abs(got - want).max():.3g} vs numpy: {'OK' if ok else 'WRONG'}")
    print(f"template stage 1: {template_us:.1f} us")
    return ok


def check_fused(spec: FusedConvSpec, halo, template, arrays) -> bool:
    want = reference(spec, **arrays)
    ok = True
    for name, exe in (("halo fused", halo), ("template fused", template)):
        us, got = run_fused(exe, spec, arrays)
        err, good = compare(spec, got, want)
        ok = ok and good
        print(f"{name + ':':16s}{us:.1f} us, max abs error {err:.3g} vs numpy: {'OK' if good else 'WRONG'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="n=32,h=56,w=56,c=64,k1=64,k2=128,dtype=float16")
    parser.add_argument("--config", default="m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2")
    parser.add_argument("--fused", action="store_true", help="the whole op, not stage 1 alone")
    parser.add_argument("--nvcc", action="store_true", help="compile the CUDA for sm_90 with the local nvcc")
    parser.add_argument("--source", help="write the halo kernel's CUDA here")
    args = parser.parse_args()
    spec, cfg = FusedConvSpec.parse(args.case), cuda_wmma.WmmaConfig.parse(args.config)
    gpu = tvm.cuda(0).exist
    target = parse_target("cuda" if gpu else "cuda:sm_90")
    halo = build_halo(spec, cfg, target, args.fused)
    source = halo.mod.imports[0].inspect_source()
    if args.source:
        open(args.source, "w").write(source)
    if args.nvcc and not nvcc_compiles(source):
        return 1
    if not gpu:
        print("no GPU here: built only")
        return 0
    print(f"{spec.to_string()} {cfg.to_string()}")
    arrays = random_inputs(spec, seed=3)
    template = build_template(spec, cfg, target, args.fused)
    if args.fused:
        ok = check_fused(spec, halo, template, arrays)
    else:
        ok = check_stage1(spec, cfg, halo, template, arrays)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
