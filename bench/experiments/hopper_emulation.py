"""A check without a GPU (written by a reviewer of the kernel): a numpy emulation of
schedule/cuda_hopper_conv.kernel_func's data path (TMA boxes -> smem rows -> wgmma -> accumulator fragments ->
swizzled epilogue -> TMA store), using the generator's own Tiling / map arguments, to check the index math (taps,
coordinates, rows tiling, residual tile, store coordinates) against a reference conv. It models the hardware; it
does not run the generated code (tests/test_cuda_hopper_*.py's GPU tests do).
    python3 bench/experiments/hopper_emulation.py   (about 12 s; tests/test_cuda_hopper_conv.py runs part of it)
Hardware models: TMA tiled mode (zero fill OOB, OOB not stored, 128B swizzle = XOR of address bits [4,7) with [7,10)),
wgmma SS K-major SW128 canonical layout ((8,m),(8,2)):((8T,SBO),(1,T)) + Swizzle<3,4,3> (CUTLASS make_gmma_desc),
C fragment layout CLayout_64xN (CUTLASS mma_traits_sm90_gmma.hpp). The halo form's operands start inside a swizzle atom:
the model swizzles the absolute address, as the H100 did with the descriptor's base offset left 0 (the kernel's)."""
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from tvm_b2b.schedule import cuda_hopper_conv as H  # noqa: E402
from tvm_b2b.op.conv import ConvSpec  # noqa: E402

BK = H.BK
EMULATED_SMS = 1  # a persistent grid's SMs: with so few, its blocks take several tiles of the small convs emulated


def tma_load(flat, dims, strides_b, box, coords, element_strides=(1, 1, 1, 1)):
    """Box rows (row r = i1 + b1*(i2 + b2*i3)) x box[0] elements; OOB -> 0. flat: fp16 elements. With element
    strides, ceil(box / stride) elements a dimension, every stride-th (dimension 0's is ignored, as CUDA's)."""
    e = 2
    es = [1] + list(element_strides[1:])
    b0, b1, b2, b3 = (-(-b // t) for b, t in zip(box, es))
    out = np.zeros((b1 * b2 * b3, b0), np.float32)
    st = [e] + list(strides_b)
    for i3 in range(b3):
        for i2 in range(b2):
            for i1 in range(b1):
                r = i1 + b1 * (i2 + b2 * i3)
                for i0 in range(b0):
                    c = (coords[0] + i0, coords[1] + i1 * es[1], coords[2] + i2 * es[2], coords[3] + i3 * es[3])
                    if all(0 <= c[d] < dims[d] for d in range(4)):
                        off = sum(c[d] * st[d] for d in range(4))
                        assert off % e == 0
                        out[r, i0] = flat[off // e]
    return out


def tma_load2(flat, dims, stride_b, box, coords):
    return tma_load(flat, list(dims) + [1, 1], [stride_b, stride_b * dims[1], stride_b * dims[1]], list(box) + [1, 1],
                    list(coords) + [0, 0])


def swizzle(a: int, row_bytes: int) -> int:
    """TMA's and wgmma's swizzle of rows of row_bytes (32, 64, 128) on byte address a: Swizzle<B,4,3>, B = log2 of the
    row's 16-byte chunks (address bits [4, 4+B) XOR bits [7, 7+B))."""
    mask = row_bytes // 16 - 1
    return a ^ (((a >> 7) & mask) << 4)


def smem_write_rows(smem, base_el, rows):
    """TMA's swizzled write of rows (64, 32 or 16 elements: 128-, 64- or 32-byte swizzle) at base_el (aligned to the
    swizzle's 8 rows): 16-byte chunk j of row r moves as swizzle() moves its address (128B: j -> j ^ (r % 8))."""
    row_bytes = rows.shape[1] * 2
    assert (base_el * 2) % (8 * row_bytes) == 0
    for r in range(rows.shape[0]):
        for j in range(row_bytes // 16):
            at = swizzle(base_el * 2 + r * row_bytes + j * 16, row_bytes) // 2
            smem[at: at + 8] = rows[r, j * 8:j * 8 + 8]


def desc_read(smem, start_el, nrows, lbo=1, sbo=64, row_bytes=128):
    """wgmma K-major swizzled operand of nrows x 16 from a descriptor whose start address is start_el (elements):
    byte address of (row, k) = start + (row%8)*row_bytes + (row//8)*SBO*16 + (k//8)*16 + (k%8)*2, then swizzle()
    (SW128: Swizzle<3,4,3>; a narrow conv's x rows, narrow_taps: 32 or 64 bytes)."""
    out = np.zeros((nrows, 16), np.float32)
    for row in range(nrows):
        for k in range(16):
            a = start_el * 2 + (row % 8) * row_bytes + (row // 8) * sbo * 16 + (k // 8) * 16 + (k % 8) * 2
            out[row, k] = smem[swizzle(a, row_bytes) // 2]
    return out


def c_layout(n):
    """(thread 0..127, value j) -> (row, col) of m64nNk16's f32 accumulator, from CUTLASS CLayout_64xN:
    Shape ((4,8,4),(2,2,N/8)) Stride ((128,1,16),(64,8,512)) into m + 64*n."""
    res = {}
    for t in range(128):
        t0, t1, t2 = t % 4, (t // 4) % 8, t // 32
        for j in range(n // 2):
            v0, v1, v2 = j % 2, (j // 2) % 2, j // 4
            idx = t0 * 128 + t1 * 1 + t2 * 16 + v0 * 64 + v1 * 8 + v2 * 512
            res[(t, j)] = (idx % 64, idx // 64)
    return res


def a_layout():
    """(thread 0..127, value v 0..7) -> (row, k) of wgmma m64k16's A fragment in registers (its register form), from
    CUTLASS ALayout_64x16 (mma_traits_sm90_gmma.hpp): Shape ((4,8,4),(2,2,2)) Stride ((128,1,16),(64,8,512)) into
    m + 64*k. Register i of the fragment holds values 2i, 2i + 1."""
    res = {}
    for t in range(128):
        t0, t1, t2 = t % 4, (t // 4) % 8, t // 32
        for v in range(8):
            idx = t0 * 128 + t1 + t2 * 16 + v % 2 * 64 + v // 2 % 2 * 8 + v // 4 * 512
            res[(t, v)] = (idx % 64, idx // 64)
    return res


def register_operand(mid, al, wg: int, kc: int, kk: int):
    """The A operand (64 x 16) that warpgroup wg's threads hand wgmma from their mid registers for k-slice kk of
    step kc: register i of thread t is mid register H.mid_register(kc, kk, i), placed where CUTLASS's layout says."""
    out = np.full((64, 16), np.nan, np.float32)
    for t in range(128):
        for v in range(8):
            row, col = al[(t, v)]
            out[row, col] = mid[wg][t][H.mid_register(kc, kk, v // 2)][v % 2]
    return out


def kernel_assumed(t, j):
    """Where kernel_func's epilogue puts register j of thread t (H.fragment of its pair j // 2; j odd: the next channel)."""
    row, ch = H.fragment(t, 0, j // 2)
    return row, ch + j % 2


def fragments(acc, cl, wgs: int, n: int):
    """(tile row, channel, value) of every accumulator register of the consumer warpgroups: the value where
    CUTLASS's layout `cl` puts it, the row and channel as the kernel's epilogue indexes them (kernel_assumed)."""
    for wg in range(wgs):
        for t in range(128):
            for j in range(n // 2):
                lr, lc = cl[(t, j)]
                row, ch = kernel_assumed(t, j)
                yield wg * 64 + row, ch, acc[wg * 64 + lr, lc]


def act(v, name):
    if name == "relu":
        return np.maximum(v, 0)
    if name == "relu6":
        return np.minimum(np.maximum(v, 0), 6)
    return v


def emulate(spec, cfg, second=None, rng=None):
    """Returns (y emulated (m, k2), y reference)."""
    rng = rng or np.random.default_rng(0)
    m, c, k, bm, bn, halo = spec.m, spec.c, spec.k, cfg.bm, cfg.bn, bool(cfg.halo)
    tiling = H.Tiling(spec, bm, halo)
    n_steps, c_steps, wgs, taps = H.steps(spec), -(-c // BK), bm // 64, spec.kh * spec.kw
    tps, xw = H.narrow_taps(spec), H.x_row(spec)  # a narrow conv's taps a step, each a box of rows of xw channels
    fused = second is not None
    k2, bn2 = (second.k2, second.bn2) if fused else (k, bn)
    ranks = k // bn if fused else 1  # the pair's cluster form (its size): block rank bk computes mid's channels bk * bn on
    k2s = k2 // ranks  # a block's output channels (its rank's share of k2)
    k1_steps, chunks = k // BK, k2s // bn2
    stages = min(cfg.stages, n_steps)
    r_dim = spec.kh * spec.kw * c
    out = dataclasses.replace(spec, k=k2)
    xm, ym = tiling.x_map(), H.Tiling(out, bm, halo).y_map()
    b_rows = max(bn, bn2) if fused else bn
    xs, x_rows = H.x_buffers(spec, cfg)
    w_at = xs * x_rows * BK
    y_at = w_at + stages * b_rows * BK
    pool = y_at + bm * bn2
    y2_at = pool  # a persistent pair's other output tile (its chunks alternate: the kernel's second_tile_apart)
    pool += bm * bn2 if fused and cfg.persist else 0
    mid_at = pool  # the cluster's mid (bm rows x k1 in 64-channel boxes), each block's slice and its peers' copies
    pool += bm * k if ranks > 1 else 0
    threads = H.block_threads(cfg)
    resident = H.resident_blocks(pool * 2, threads, H.pair_registers(bn // 2, bn2 // 2)) if fused else H.resident_of(spec, cfg)
    tiles = k // bn * tiling.blocks
    grid = H.persistent_grid(tiles, resident, EMULATED_SMS)
    chunk_count = {}  # a persistent pair block's chunks so far (the kernel's j: its output tile j % 2, residual order)
    residual = second.residual if fused else bool(spec.residual)
    act1, act2 = spec.act, (second.act if fused else spec.act)

    x = rng.standard_normal((spec.n, spec.h, spec.w, c)).astype(np.float16)
    w = (rng.standard_normal((k, r_dim)) / np.sqrt(r_dim)).astype(np.float16)
    s = rng.uniform(0.5, 1.5, k).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    w2 = (rng.standard_normal((k2, k)) / np.sqrt(k)).astype(np.float16)
    s2 = rng.uniform(0.5, 1.5, k2).astype(np.float32)
    b2 = rng.standard_normal(k2).astype(np.float32)
    r = rng.standard_normal((m, k2)).astype(np.float16)
    y = np.full((m, k2), np.nan, np.float32)
    xf, wf, w2f, rf = x.reshape(-1), w.reshape(-1), w2.reshape(-1), r.reshape(-1)
    cl = c_layout(bn)
    cl2 = c_layout(bn2)
    al = a_layout()
    for (t, j), v in cl.items():
        assert kernel_assumed(t, j) == v, ("C layout", t, j, v)

    resident = {}  # a persistent grid's blocks: their shared memory, which stays from tile to tile
    x_steps = {}  # a persistent block's halo boxes so far: its x buffers alternate on across its tiles (the kernel's xg)
    for bi, visits in pixel_blocks(spec, cfg, tiling, grid):
        blocks = {}  # the cluster's blocks (rank bk: its shared memory, its mid registers) after their first GEMM
        for bk, block in visits:
            # uninitialised: NaN, to catch reads of unwritten rows (a persistent block's: what its last tile left)
            smem = resident.setdefault(block, np.full(pool, np.nan, np.float32)) if block is not None else (
                np.full(pool, np.nan, np.float32))
            acc = np.zeros((wgs * 64, bn), np.float32)
            for ko in range(n_steps):
                st = ko % stages
                if halo:  # tap ko % taps of channel step ko // taps: its operand starts shift rows into the step's box
                    cs, t = ko // taps, ko % taps
                    xg = x_steps.get(block, 0) + cs  # the block's channel steps so far (a persistent grid's: all tiles')
                    if t == 0:
                        xa = tma_load(xf, xm[0:4], xm[4:7], xm[7:11], [cs * BK, *tiling.tap(bi, 0)])
                        assert xa.shape[0] == tiling.width * (tiling.rows + spec.kh - 1) <= x_rows
                        smem_write_rows(smem, xg % xs * x_rows * BK, xa)
                    a_at, w_col = xg % xs * x_rows * BK + tiling.shift(t) * BK, t * c + cs * BK
                elif tps > 1:  # taps ko * tps on, each its box of xw channels into its part of the buffer
                    for j in range(tps):
                        xa = tma_load(xf, xm[0:4], xm[4:7], xm[7:11], [0, *tiling.tap(bi, ko * tps + j)],
                                      tiling.element_strides())
                        assert xa.shape == (tiling.pixels, xw)
                        smem_write_rows(smem, st * bm * BK + j * bm * xw, xa)
                    a_at, w_col = st * bm * BK, ko * BK
                else:
                    xa = tma_load(xf, xm[0:4], xm[4:7], xm[7:11], [ko % c_steps * BK, *tiling.tap(bi, ko // c_steps)],
                                  tiling.element_strides())
                    assert xa.shape[0] == tiling.pixels
                    smem_write_rows(smem, st * bm * BK, xa)
                    a_at, w_col = st * bm * BK, ko // c_steps * c + ko % c_steps * BK
                wa = tma_load2(wf, (r_dim, k), r_dim * 2, (BK, bn), (w_col, bk * bn))
                smem_write_rows(smem, w_at + st * b_rows * BK, wa)
                for wg in range(wgs):
                    for kk in range(BK // 16):
                        if tps > 1:  # k-slice kk: part kk * 16 // xw of the buffer, 8 rows of xw * 2 bytes apart
                            A = desc_read(smem, a_at + kk * 16 // xw * bm * xw + wg * 64 * xw + kk * 16 % xw, 64, sbo=xw,
                                          row_bytes=xw * 2)
                        else:
                            A = desc_read(smem, a_at + wg * 64 * BK + kk * 16, 64)
                        B = desc_read(smem, w_at + st * b_rows * BK + kk * 16, bn)
                        with np.errstate(invalid="ignore"):
                            acc[wg * 64:(wg + 1) * 64] = (acc[wg * 64:(wg + 1) * 64] if (ko * 4 + kk > 0) else 0) + A @ B.T
            if block is not None:
                x_steps[block] = x_steps.get(block, 0) + c_steps
            # epilogue 1
            mid = [[{} for _ in range(128)] for _ in range(wgs)]  # per thread: mid register p -> its fp16 pair
            if ranks > 1:  # the slice into the block's mid, as the kernel's epilogue indexes it
                for row, ch, val in fragments(acc, cl, wgs, bn):
                    smem[mid_at + bk * bn * bm + H.swizzled(row, ch, bm)] = np.float16(
                        act(val * s[bk * bn + ch] + b[bk * bn + ch], act1))
            elif fused:
                for wg in range(wgs):
                    for t in range(128):
                        for j in range(bn // 2):  # register j of pair j // 2: the value where CUTLASS puts it
                            lr, lc = cl[(t, j)]
                            _, ch = kernel_assumed(t, j)
                            pre = acc[wg * 64 + lr, lc] * s[bk * bn + ch] + b[bk * bn + ch]
                            mid[wg][t].setdefault(j // 2, [0.0, 0.0])[j % 2] = np.float16(act(pre, act1))
            if residual and not fused:
                load_residual(smem, rf, ym, y_at, bm, bn, [bk * bn, *tiling.origin(bi)])
            for row, ch, val in fragments(acc, cl, wgs, bn) if not fused else ():
                pre = val * s[bk * bn + ch] + b[bk * bn + ch]
                out_row, pixel = tiling.tile_row(row)
                if not pixel:
                    continue
                at = H.swizzled(out_row, ch, bm)
                if residual:  # the residual tile's element, where the output's goes
                    smem[y_at + at] = np.float16(act(pre + smem[y_at + at], act1))
                else:
                    smem[y_at + at] = np.float16(act(pre, act1))
            if not fused:
                for box in range(bn // 64):
                    tma_store(y, smem, y_at + box * bm * 64, ym, [bk * bn + box * 64, *tiling.origin(bi)])
                continue
            blocks[bk] = smem, mid
        for bk, (smem, _) in blocks.items():  # the cluster's push: each slice into every peer, at the same offset
            for q, (peer, _) in blocks.items():
                if q != bk:
                    at = mid_at + bk * bn * bm
                    peer[at: at + bm * bn] = smem[at: at + bm * bn]
        for bk, (smem, mid) in blocks.items():
            c2 = bk * k2s  # the block's first output channel
            block = visits[0][1]  # (a persistent grid's)
            if block is not None and block not in chunk_count:  # its first and second chunks' residuals, at its start
                chunk_count[block] = 0
                for j in range(min(2, H.tiles_of(block, grid, tiles) * chunks) if residual else 0):
                    pixel_block, channel = H.chunk_origin(block, j, chunks, grid, bn2)
                    load_residual(smem, rf, ym, (y_at, y2_at)[j], bm, bn2, [channel, *tiling.origin(pixel_block)])
            for jc in range(chunks):
                acc2 = np.zeros((wgs * 64, bn2), np.float32)
                for kc in range(k1_steps):
                    g = n_steps + jc * k1_steps + kc
                    st = g % stages
                    wa = tma_load2(w2f, (k, k2), k * 2, (BK, bn2),
                                   ((g - n_steps) % k1_steps * BK, c2 + (g - n_steps) // k1_steps * bn2))
                    smem_write_rows(smem, w_at + st * b_rows * BK, wa)
                    for wg in range(wgs):
                        for kk in range(4):
                            if ranks > 1:  # mid from shared memory (wgmma's SS form), as the first GEMM's x
                                A = desc_read(smem, mid_at + kc * bm * BK + wg * 64 * BK + kk * 16, 64)
                            else:
                                A = register_operand(mid, al, wg, kc, kk)
                            B = desc_read(smem, w_at + st * b_rows * BK + kk * 16, bn2)
                            with np.errstate(invalid="ignore"):
                                acc2[wg * 64:(wg + 1) * 64] = (acc2[wg * 64:(wg + 1) * 64] if kc * 4 + kk > 0 else 0) + A @ B.T
                j = chunk_count[block] if block is not None else None
                tile_at = (y_at, y2_at)[j % 2] if block is not None else y_at
                if residual and block is None:
                    load_residual(smem, rf, ym, y_at, bm, bn2, [c2 + jc * bn2, *tiling.origin(bi)])
                for row, ch, val in fragments(acc2, cl2, wgs, bn2):
                    pre = val * s2[c2 + jc * bn2 + ch] + b2[c2 + jc * bn2 + ch]
                    out_row, pixel = tiling.tile_row(row)
                    if not pixel:
                        continue
                    at = tile_at + H.swizzled(out_row, ch, bm)
                    if residual:
                        smem[at] = np.float16(act(pre + smem[at], act2))
                    else:
                        smem[at] = np.float16(act(pre, act2))
                for box in range(bn2 // 64):
                    tma_store(y, smem, tile_at + box * bm * 64, ym, [c2 + jc * bn2 + box * 64, *tiling.origin(bi)])
                if block is not None:  # the kernel's order: chunk j + 1's residual once chunk j - 1's store has read its tile
                    if residual and 0 < j and j + 1 < H.tiles_of(block, grid, tiles) * chunks:
                        pixel_block, channel = H.chunk_origin(block, j + 1, chunks, grid, bn2)
                        load_residual(smem, rf, ym, (y_at, y2_at)[(j + 1) % 2], bm, bn2, [channel, *tiling.origin(pixel_block)])
                    chunk_count[block] = j + 1

    # reference
    top, left, bottom, right = spec.pads
    xp = np.pad(x.astype(np.float32), [(0, 0), (top, bottom), (left, right), (0, 0)])
    cols = np.zeros((spec.n, spec.ho, spec.wo, spec.kh, spec.kw, c), np.float32)
    d = spec.dilation
    for rh in range(spec.kh):
        for rw in range(spec.kw):
            cols[:, :, :, rh, rw] = xp[:, rh * d: rh * d + spec.stride * (spec.ho - 1) + 1: spec.stride,
                                       rw * d: rw * d + spec.stride * (spec.wo - 1) + 1: spec.stride]
    conv = cols.reshape(m, r_dim) @ w.astype(np.float32).T
    pre = conv * s + b
    if fused:
        mid = act(pre, act1).astype(np.float16).astype(np.float32)
        pre2 = mid @ w2.astype(np.float32).T * s2 + b2
        ref = act(pre2 + (r.astype(np.float32) if residual else 0), act2)
    else:
        ref = act(pre + (r.astype(np.float32) if residual else 0), act1)
    return y, ref


def pixel_blocks(spec, cfg, tiling, grid: int):
    """[(pixel block, [(channel block, persistent block or None), ...]), ...] in the order the kernel's blocks take
    them: every channel block of each pixel block (a block a tile; the pair's cluster), or a persistent grid's blocks'
    tiles (persist=1: tile_at; the pair's, one channel block), each tile once (asserted)."""
    channel_blocks = spec.k // cfg.bn
    if not cfg.persist:
        return [(bi, [(bk, None) for bk in range(channel_blocks)]) for bi in range(tiling.blocks)]
    tiles = channel_blocks * tiling.blocks
    order = [(b, *H.tile_at(b, it, grid, channel_blocks)) for b in range(grid) for it in range(H.tiles_of(b, grid, tiles))]
    assert sorted(bi * channel_blocks + bk for _, bk, bi in order) == list(range(tiles)), "persistent tiles"
    return [(bi, [(bk, b)]) for b, bk, bi in order]


def load_residual(smem, rf, ym, y_at, bm, channels, coords):
    """The residual tile's TMA loads (y's map on r, in boxes of 64 channels) into the output tile."""
    for box in range(channels // 64):
        rows = tma_load(rf, ym[0:4], ym[4:7], ym[7:11], [coords[0] + box * 64, *coords[1:]])
        smem_write_rows(smem, y_at + box * bm * 64, rows)


def tma_store(y, smem, base_el, ym, coords):
    """TMA store of box ym[7:11] from the swizzled smem box at base_el to y (m, K) viewed by ym's dims/strides."""
    dims, strides, box = ym[0:4], ym[4:7], ym[7:11]
    yf = y.reshape(-1)
    st = [2] + list(strides)
    b0, b1, b2, b3 = box
    for i3 in range(b3):
        for i2 in range(b2):
            for i1 in range(b1):
                rr = i1 + b1 * (i2 + b2 * i3)
                for i0 in range(b0):
                    cc = (coords[0] + i0, coords[1] + i1, coords[2] + i2, coords[3] + i3)
                    if all(0 <= cc[d] < dims[d] for d in range(4)):
                        a = base_el * 2 + rr * 128 + i0 * 2
                        a = a ^ (((a >> 7) & 7) << 4)
                        yf[sum(cc[d] * st[d] for d in range(4)) // 2] = smem[a // 2]


CONVS = [
    ("n=2,h=7,w=9,c=64,k=128", "bm=128,bn=128,stages=4"),
    ("n=1,h=5,w=7,c=256,k=128,residual=1,act=relu6", "bm=128,bn=64,stages=3"),
    ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", "bm=128,bn=128,stages=4"),
    ("n=2,h=14,w=15,c=128,k=256,stride=2,act=none", "bm=128,bn=256,stages=2"),
    ("n=1,h=9,w=11,c=96,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "bm=64,bn=64,stages=3"),
    ("n=2,h=6,w=5,c=32,k=64,kh=3,kw=3,pad_h=0,pad_w=0,residual=1", "bm=64,bn=64,stages=2"),
    ("n=1,h=8,w=8,c=16,k=64,kh=5,kw=5,pad_h=2,pad_w=2", "bm=128,bn=64,stages=4"),
    ("n=1,h=4,w=40,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "bm=64,bn=64,stages=4"),  # one row per block
    ("n=1,h=10,w=10,c=72,k=64", "bm=64,bn=64,stages=1"),
    ("n=2,h=15,w=15,c=128,k=256,stride=2,act=none", "bm=128,bn=256,stages=2"),  # odd h: no strided view needed
    ("n=2,h=14,w=13,c=64,k=128,kh=3,kw=3,stride=2,pad_h=1,pad_w=1,residual=1", "bm=64,bn=128,stages=3"),
    ("n=1,h=9,w=9,c=40,k=64,kh=3,kw=3,stride=3,pad_h=1,pad_w=1", "bm=64,bn=64,stages=2"),
    ("n=2,h=14,w=14,c=128,k=64,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", "bm=128,bn=64,stages=4,halo=1"),  # the halo form
    ("n=1,h=6,w=13,c=200,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "bm=64,bn=64,stages=3,halo=1"),  # 4 channel steps, 2 buffers
    ("n=1,h=8,w=8,c=16,k=64,kh=5,kw=5,pad_h=2,pad_w=2", "bm=128,bn=64,stages=4,halo=1"),
    # a subsampled 1x1 (x's map every stride-th pixel) of several blocks an image (rows 0, 4, 8, 12), and of stride 3
    ("n=1,h=30,w=29,c=64,k=64,stride=2,residual=1", "bm=64,bn=64,stages=2"),
    ("n=2,h=17,w=16,c=72,k=128,stride=3,act=none", "bm=64,bn=128,stages=3"),
    # persistent grids (EMULATED_SMS): 4 tiles on 3 blocks; 6 (+residual) on 3; a strided 3x3's 8 (+residual) on 3
    ("n=2,h=7,w=9,c=64,k=128", "bm=64,bn=64,stages=2,persist=1"),
    ("n=2,h=9,w=8,c=256,k=128,residual=1,act=relu6", "bm=64,bn=64,stages=3,persist=1"),
    ("n=2,h=14,w=13,c=64,k=128,kh=3,kw=3,stride=2,pad_h=1,pad_w=1,residual=1", "bm=64,bn=64,stages=3,persist=1"),
    # narrow convs (narrow_taps): a stem's 4x4 conv of 16-channel cells (4 taps a step, 32-byte rows), 32 channels
    # (2 taps a step, 64-byte rows) with padding and a residual, in a persistent grid
    ("n=2,h=11,w=11,c=16,k=64,kh=4,kw=4", "bm=64,bn=64,stages=3"),
    ("n=1,h=9,w=12,c=32,k=128,kh=2,kw=2,pad_h=1,pad_w=1,residual=1", "bm=128,bn=64,stages=2,persist=1"),
    # padded differently on each side (TensorFlow's "same": the extra row and column below and right), in the taps'
    # form, strided, the halo form and a persistent grid
    ("n=1,h=9,w=11,c=64,k=64,kh=3,kw=3,pad_h=0,pad_w=1,pad_bottom=2,pad_right=1", "bm=64,bn=64,stages=3"),
    ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,stride=2,pad_h=0,pad_w=0,pad_bottom=1,pad_right=1,residual=1", "bm=64,bn=128,stages=3"),
    ("n=2,h=10,w=12,c=64,k=64,kh=3,kw=3,pad_h=2,pad_w=0,pad_bottom=0,pad_right=2", "bm=128,bn=64,stages=3,halo=1"),
    ("n=2,h=14,w=13,c=64,k=128,kh=3,kw=3,stride=2,pad_h=0,pad_w=1,pad_bottom=1,residual=1", "bm=64,bn=64,stages=3,persist=1"),
    # the halo form in a persistent grid: x's two buffers alternate on across a block's tiles (1 channel step a tile,
    # +residual; 4 steps, rows of 2 blocks an image)
    ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,pad_h=1,pad_w=1,residual=1", "bm=64,bn=64,stages=3,halo=1,persist=1"),
    ("n=1,h=12,w=13,c=200,k=64,kh=3,kw=3,pad_h=1,pad_w=1", "bm=64,bn=64,stages=2,halo=1,persist=1"),
    # dilated convs (the taps' form): DeepLabV3's rate 2 (+residual), rate 4 strided, a persistent one of 2 channel steps
    ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,pad_h=2,pad_w=2,dilation=2,residual=1", "bm=64,bn=64,stages=3"),
    ("n=1,h=13,w=12,c=64,k=64,kh=3,kw=3,stride=2,pad_h=4,pad_w=4,dilation=4", "bm=64,bn=64,stages=2"),
    ("n=2,h=10,w=9,c=128,k=64,kh=3,kw=3,pad_h=3,pad_w=3,dilation=3", "bm=64,bn=64,stages=3,persist=1"),
]
PAIRS = [  # (the 3x3 conv, bm, stages, k2, bn2, residual[, halo[, cs[, persist]]])
    ("n=2,h=14,w=14,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 64, 4, 256, 128, True),
    ("n=1,h=7,w=7,c=96,k=128,kh=3,kw=3,pad_h=1,pad_w=1,act=relu6", 128, 3, 192, 64, False),
    ("n=1,h=9,w=10,c=64,k=256,kh=3,kw=3,pad_h=1,pad_w=1", 64, 2, 128, 128, True),
    ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,stride=2,pad_h=1,pad_w=1", 128, 3, 256, 128, True),  # a stride-2 pair
    ("n=1,h=10,w=12,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 128, 3, 128, 64, True, 1),  # the halo form
    # the cluster form (its cluster size last): k1 = 512 in 4 slices, a stride-2 one in 2, the halo form in 2
    ("n=1,h=7,w=7,c=64,k=512,kh=3,kw=3,pad_h=1,pad_w=1", 64, 4, 512, 64, True, 0, 4),
    ("n=2,h=10,w=9,c=72,k=256,kh=3,kw=3,stride=2,pad_h=1,pad_w=1", 64, 3, 256, 64, True, 0, 2),
    ("n=1,h=9,w=10,c=64,k=128,kh=3,kw=3,pad_h=1,pad_w=1,act=relu6", 128, 3, 256, 64, False, 1, 2),
    # TensorFlow's "same" at stride 2 (0 above, 1 below): a Keras model's strided pair
    ("n=2,h=14,w=14,c=64,k=128,kh=3,kw=3,stride=2,pad_h=0,pad_w=0,pad_bottom=1,pad_right=1", 128, 3, 256, 128, True),
    # persistent grids (EMULATED_SMS; persist last): 2 chunks +residual, 4 chunks (tiles of 2 rows, the last one ragged),
    # 1 chunk +residual (the output tiles alternate from tile to tile), a strided 3x3
    ("n=2,h=9,w=8,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 64, 3, 128, 64, True, 0, 1, 1),
    ("n=1,h=11,w=30,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 64, 2, 256, 64, False, 0, 1, 1),
    ("n=3,h=7,w=7,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1,act=relu6", 64, 3, 64, 64, True, 0, 1, 1),
    ("n=2,h=14,w=13,c=128,k=128,kh=3,kw=3,stride=2,pad_h=1,pad_w=1", 64, 3, 256, 128, True, 0, 1, 1),
    # ... in the halo form: 2 chunks +residual, 1 chunk
    ("n=2,h=10,w=12,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 64, 2, 128, 64, True, 1, 1, 1),
    ("n=3,h=7,w=7,c=64,k=64,kh=3,kw=3,pad_h=1,pad_w=1", 128, 3, 64, 64, False, 1, 1, 1),
    # a dilated pair (DeepLabV3's bottlenecks at rate 2), and in a cluster of 2
    ("n=2,h=12,w=12,c=64,k=64,kh=3,kw=3,pad_h=2,pad_w=2,dilation=2", 64, 3, 256, 128, True),
    ("n=1,h=9,w=9,c=64,k=256,kh=3,kw=3,pad_h=4,pad_w=4,dilation=4", 64, 3, 256, 64, True, 0, 2),
]


def pair_config(conv, bm: int, stages: int, halo: int = 0, cs: int = 1, persist: int = 0):
    """The first GEMM's config of a PAIRS case: its block's channels of mid (all of k1, or a cluster rank's slice)."""
    return H.HopperConfig(bm=bm, bn=conv.k // cs, stages=stages, halo=halo, persist=persist)


def main() -> int:
    ok = True
    for sp, cf in CONVS:
        spec = ConvSpec.parse(sp + ",dtype=float16")
        y, ref = emulate(spec, H.HopperConfig.parse(cf))
        good = not np.isnan(y).any() and np.abs(y - ref).max() < 2e-2 * (1 + np.abs(ref).max())
        ok = ok and good
        print(sp, cf, "unwritten output" if np.isnan(y).any() else f"max abs error {np.abs(y - ref).max():.3g}", flush=True)
    for sp, bm, stages, k2, bn2, res, *form in PAIRS:
        spec = ConvSpec.parse(sp + ",dtype=float16")
        y, ref = emulate(spec, pair_config(spec, bm, stages, *form), H.Second(k2, bn2, "relu", res))
        good = not np.isnan(y).any() and np.abs(y - ref).max() < 2e-2 * (1 + np.abs(ref).max())
        ok = ok and good
        print("pair", sp, f"k2={k2},bn2={bn2}", "unwritten output" if np.isnan(y).any() else
              f"max abs error {np.abs(y - ref).max():.3g}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
