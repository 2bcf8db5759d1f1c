"""sm_90 rule of the depthwise pair (MobileNet's depthwise 3x3 -> 1x1; op.spec with groups = c = k1): ONE kernel
whose thread-block cluster splits k1, the 1x1's reduction, across its blocks, reduced through distributed shared
memory. FlashFuser's way of fusing a GEMM chain on the H100 (arXiv 2512.12949), here for the depthwise pair.

Why: cuda_grouped_pair's kernel gives each block all k1 channels of its pixels, a chain of steps (taps, 3x3, mma)
per block, and few blocks on the 14x14 and 7x7 layers (N=1 14x14 384->64: 14 blocks, 21.7 us against 10.3 for two
kernels, H100). A depthwise 3x3 has no reduction across channels, so its k1 channels split into independent slices.
Here a cluster of `cs` blocks owns `bm` output pixels; block `rank` of it takes k1 / cs channels of mid (its slice),
`kc` at a time (a step; the whole slice by default), and for each step:
  1. copies w2's rows of the step (kc rows, all k2 channels) into shared memory (16-byte cp.async), while
  2. its threads compute the 3x3 for the step's channels of the pixels, 8 channels a thread at a time (the 9 taps'
     16-byte loads issued together, fp32 sums), with s1/b1/act1, into `mid` (bm x kc, fp16, shared);
  3. its `warps` warps multiply mid by w2's rows on tensor cores (ldmatrix + mma.sync m16n8k16), each warp every
     warps-th 8-channel tile of k2, adding into its fp32 accumulators; with more than one step, mid and w2 are
     double-buffered, and the next step's w2 copy and 3x3 run while this step's mma does;
then it stores its accumulators, the slice's partial sums (bm x k2, fp32, shared, over the step buffers), and
  4. after a cluster barrier, the cluster's threads each sum 8 channels of one pixel over the cs blocks' partial
     sums (ld.shared::cluster of each block's tile, mapa), apply s2/b2/[residual]/act2 and store them; a second
     barrier keeps every block's shared memory alive until its peers have read it.
mid never leaves the block, the partial sums never leave the cluster: no global round trip, no recompute, cs
times the blocks of one block per pixel tile.

TVM 0.27's schedule primitives have no cluster or distributed shared memory, so the kernel is TIRx script (as
cuda_hopper_conv's), which has cluster launches (T.cta_id_in_cluster: the kernel's launch parameters carry
clusterCtaIdx, the runtime launches with cuLaunchKernelEx's cluster dimension) and cluster barriers
(T.cuda.cluster_sync). Its leaf steps are small device functions (T.cuda.func_call with their CUDA source, below),
each one instruction or one 8-channel vector's arithmetic, rather than TIRx's PTX table (T.ptx), whose operand
conventions for these (mapa, ld.shared::cluster, ldmatrix, mma) the project has not used. Parameters given (bm, cs,
kc, warps), not searched.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..lower import TIRX_ATTR
from ..op.spec import FusedConvSpec
from ..target import max_shared_bytes
from .cuda_hopper_pair import WrittenPairRule

ENABLE_ENV = "TVM_B2B_DW_CLUSTER"  # "1": on where measured faster (the default), "all": wherever it computes, else off
MAX_PIXELS, SLOWER_K1 = 56 * 56, 960  # where it measured faster: input pixels (n * h * w) up to these, k1 below
PORTABLE_CLUSTER, MAX_CLUSTER = 8, 16  # defaults stay portable; 9-16 (a config's) are sm_90's non-portable sizes,
# which TVM's runtime opts the kernel into (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) at launch
MMA_K, MMA_N = 16, 8
MAX_GRID_Y = 65535  # the pixel tiles run along blockIdx.y
MAX_ACC_REGS = 96  # fp32 accumulators a thread may hold (bm / 16 x its k2 tiles x 4)
ACT_CODES = {"none": 0, "relu": 1, "relu6": 2}  # the activations the device functions compute

ACT_MACRO = """#ifndef TVM_B2B_ACT
#define TVM_B2B_ACT(v, act) ((act) == 1 ? fmaxf((v), 0.f) : (act) == 2 ? fminf(fmaxf((v), 0.f), 6.f) : (v))
#endif
"""
DW_SOURCE = ACT_MACRO + """
__forceinline__ __device__ void tvm_b2b_dw3x3x8(half* out, const half* x, const half* w1, const float* s1, const float* b1,
                                                int ih0, int iw0, int h, int w, int c, int act) {
  // 8 channels of one output pixel: x at its image's channel (pixel (ih, iw) at x + (ih * w + iw) * c), w1 at tap 0
  // of the channel (tap t at w1 + t * c); the 9 taps' loads are independent (a predicated load outside the image)
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
  for (int t = 0; t < 9; ++t) {
    int ih = ih0 + t / 3, iw = iw0 + t % 3;
    uint4 xv = make_uint4(0, 0, 0, 0);
    if (ih >= 0 && ih < h && iw >= 0 && iw < w) xv = __ldg(reinterpret_cast<const uint4*>(x + (ih * w + iw) * c));
    uint4 wv = __ldg(reinterpret_cast<const uint4*>(w1 + t * c));
    const half2* xh = reinterpret_cast<const half2*>(&xv);
    const half2* wh = reinterpret_cast<const half2*>(&wv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 a = __half22float2(xh[i]), b = __half22float2(wh[i]);
      acc[2 * i] = fmaf(a.x, b.x, acc[2 * i]);
      acc[2 * i + 1] = fmaf(a.y, b.y, acc[2 * i + 1]);
    }
  }
  uint4 o;
  half2* oh = reinterpret_cast<half2*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    oh[i] = __floats2half2_rn(TVM_B2B_ACT(acc[2 * i] * s1[2 * i] + b1[2 * i], act),
                              TVM_B2B_ACT(acc[2 * i + 1] * s1[2 * i + 1] + b1[2 * i + 1], act));
  *reinterpret_cast<uint4*>(out) = o;
}
"""
ZERO_SOURCE = """
__forceinline__ __device__ void tvm_b2b_zero8(half* out) { *reinterpret_cast<uint4*>(out) = make_uint4(0, 0, 0, 0); }
"""
COPY_SOURCE = """
__forceinline__ __device__ void tvm_b2b_cp_async16(half* shared, const half* global) {
  unsigned at = (unsigned)__cvta_generic_to_shared(shared);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(at), "l"(global) : "memory");
}
"""
WAIT_SOURCE = """
__forceinline__ __device__ void tvm_b2b_cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\\n\\tcp.async.wait_group 0;" ::: "memory");
}
"""
LOAD_A_SOURCE = """
__forceinline__ __device__ void tvm_b2b_ldmatrix_a(unsigned* a, const half* tile, int stride) {
  // the 16 x 16 A tile at `tile` (rows `stride` halves apart) as mma.m16n8k16's row-major A fragment
  int lane = threadIdx.x % 32;
  unsigned at = (unsigned)__cvta_generic_to_shared(tile + (lane % 16) * stride + lane / 16 * 8);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(at));
}
"""
LOAD_B_SOURCE = """
__forceinline__ __device__ void tvm_b2b_ldmatrix_b(unsigned* b, const half* tile, int stride) {
  // the 16 (k) x 8 (n) B tile at `tile`, stored k-row-major (rows `stride` halves apart), transposed into
  // mma.m16n8k16's column-major B fragment
  int lane = threadIdx.x % 32;
  unsigned at = (unsigned)__cvta_generic_to_shared(tile + (lane % 16) * stride);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(b[0]), "=r"(b[1]) : "r"(at));
}
"""
MMA_SOURCE = """
__forceinline__ __device__ void tvm_b2b_mma16816(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
"""
STORE_ACC_SOURCE = """
__forceinline__ __device__ void tvm_b2b_store_acc(half* at, int stride, const float* c) {
  // an m16n8 accumulator into the fp32 tile at `at` (rows `stride` floats apart): rows lane / 4 and + 8,
  // channels 2 * (lane % 4) and + 1
  int lane = threadIdx.x % 32;
  float* row = reinterpret_cast<float*>(at) + (lane / 4) * stride + lane % 4 * 2;
  *reinterpret_cast<float2*>(row) = make_float2(c[0], c[1]);
  *reinterpret_cast<float2*>(row + 8 * stride) = make_float2(c[2], c[3]);
}
"""
OUT_SOURCE = ACT_MACRO + """
__forceinline__ __device__ void tvm_b2b_cluster_out8(half* y, const half* r, const half* partial, int ranks,
                                                     const float* s2, const float* b2, int act, int has_r) {
  // 8 channels of one pixel: the sum of the cluster's `ranks` blocks' partial sums at this block's offset
  // `partial` (mapa: the same offset in block q's shared memory), then scale, bias, [+ r], act
  unsigned local = (unsigned)__cvta_generic_to_shared(partial);
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
  for (int q = 0; q < ranks; ++q) {
    unsigned at;
    float v[8];
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(at) : "r"(local), "r"(q));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(at) : "memory");
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4 + 16];"
                 : "=f"(v[4]), "=f"(v[5]), "=f"(v[6]), "=f"(v[7]) : "r"(at) : "memory");
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += v[i];
  }
  float res[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) res[i] = 0.f;
  if (has_r) {
    uint4 rv = *reinterpret_cast<const uint4*>(r);
    const half2* rh = reinterpret_cast<const half2*>(&rv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = __half22float2(rh[i]);
      res[2 * i] = f.x;
      res[2 * i + 1] = f.y;
    }
  }
  uint4 o;
  half2* oh = reinterpret_cast<half2*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    oh[i] = __floats2half2_rn(TVM_B2B_ACT(acc[2 * i] * s2[2 * i] + b2[2 * i] + res[2 * i], act),
                              TVM_B2B_ACT(acc[2 * i + 1] * s2[2 * i + 1] + b2[2 * i + 1] + res[2 * i + 1], act));
  *reinterpret_cast<uint4*>(y) = o;
}
"""


@dataclass(frozen=True)
class ClusterConfig:
    bm: int = 32  # output pixels a cluster owns (16, 32 or 64: whole m16 tiles)
    cs: int = 4  # blocks a cluster: each computes k1 / cs channels of mid
    kc: int = 0  # channels of the slice a step (0: the whole slice at once); more steps double-buffer mid and w2 (the 3x3
    # of step j + 1 and its w2 copy in flight while step j's mma runs), so shared memory no longer grows with the slice
    warps: int = 4  # 4 or 8 a block; k2's n8 tiles are dealt out to them

    def to_string(self) -> str:
        extra = (f",kc={self.kc}" if self.kc else "") + (f",warps={self.warps}" if self.warps != 4 else "")
        return f"bm={self.bm},cs={self.cs}{extra}"

    @classmethod
    def parse(cls, text: str) -> "ClusterConfig":
        values = dict(item.split("=") for item in text.replace(" ", "").split(",") if item)
        unknown = set(values) - {"bm", "cs", "kc", "warps"}
        if unknown:
            raise ValueError(f"config: {sorted(unknown)[0]} is not a parameter of the cluster depthwise pair (bm, cs, kc, "
                             "warps) nor of the template's, the kernels that run this pair")
        cfg = cls(**{k: int(v) for k, v in values.items()})
        if cfg.bm not in (16, 32, 64) or not 1 <= cfg.cs <= MAX_CLUSTER or cfg.kc % MMA_K or cfg.warps not in (4, 8):
            raise ValueError(f"config: {cfg.to_string()}: bm is 16, 32 or 64, cs 1 to {MAX_CLUSTER}, kc a multiple of "
                             f"{MMA_K} (0: the whole slice), warps 4 or 8")
        return cfg

    def threads(self) -> int:
        return self.warps * 32


def cluster_sizes(spec: FusedConvSpec) -> list[int]:
    """The cluster sizes whose k1 slices are whole 16-channel steps of mma (ascending)."""
    return [cs for cs in range(1, MAX_CLUSTER + 1) if spec.k1 % cs == 0 and spec.k1 // cs % MMA_K == 0]


def acc_regs(spec: FusedConvSpec, bm: int, warps: int = 4) -> int:
    """fp32 accumulators per thread: bm / 16 m16 tiles x every `warps`-th of k2's n8 tiles x 4."""
    return bm // 16 * -(-spec.k2 // MMA_N // warps) * 4


def shared_bytes(spec: FusedConvSpec, cfg: ClusterConfig) -> int:
    return 2 * layout(spec, cfg)["pool"]


def slice_channels(spec: FusedConvSpec, cfg: ClusterConfig) -> int:
    """Channels of mid a block of the cluster computes."""
    return spec.k1 // cfg.cs


def chunk(spec: FusedConvSpec, cfg: ClusterConfig) -> int:
    """Channels of the slice a step."""
    return cfg.kc or slice_channels(spec, cfg)


def layout(spec: FusedConvSpec, cfg: ClusterConfig) -> dict[str, int]:
    """Offsets (halves) in the one dynamic shared allocation: mid's step (bm x kc) and w2's (kc x k2), twice where the
    slice takes more than one step; after the last step the partial sums (bm x k2, fp32) over them. Rows are padded by 8
    halves: 16 bytes more than a multiple of 32, so ldmatrix's 8 rows fall in distinct banks."""
    kc = chunk(spec, cfg)
    buffers = 1 if kc == slice_channels(spec, cfg) else 2
    mid_row, w2_row = kc + 8, spec.k2 + 8
    mid_size, w2_size = cfg.bm * mid_row, kc * w2_row
    return {"mid_row": mid_row, "w2_row": w2_row, "mid_size": mid_size, "w2_at": buffers * mid_size, "w2_size": w2_size,
            "pool": max(buffers * (mid_size + w2_size), cfg.bm * spec.k2 * 2)}


def spec_problem(spec: FusedConvSpec) -> str | None:
    """Why the kernel cannot compute this pair, or None."""
    if not (spec.groups == spec.c == spec.k1):
        return f"groups={spec.groups}, c={spec.c}, k1={spec.k1}: depthwise pairs only (groups = c = k1)"
    if spec.dtype != "float16":
        return f"dtype {spec.dtype} (float16 only)"
    if spec.dilation != 1:  # its halo tile holds adjacent taps
        return f"dilation {spec.dilation} (undilated pairs only)"
    if spec.pads != (1, 1, 1, 1):  # its halo tile starts a row and a column above and left of the block's pixels
        return f"3x3 padding {list(spec.pads)} (top, left, bottom, right): 1 on each side only"
    if spec.act1 not in ACT_CODES or spec.act2 not in ACT_CODES:
        return f"activations {spec.act1}/{spec.act2}: {', '.join(ACT_CODES)} only"
    if not cluster_sizes(spec) or spec.k2 % MMA_N:
        return f"k1={spec.k1}, k2={spec.k2}: k1 a multiple of 16 (mma's k), k2 of 8 (its n)"
    if acc_regs(spec, 16) > MAX_ACC_REGS:
        return f"k2={spec.k2}: {acc_regs(spec, 16)} accumulators a thread, more than {MAX_ACC_REGS}"
    return None


def config_problem(spec: FusedConvSpec, cfg: ClusterConfig, arch: int = 90) -> str | None:
    if cfg.cs not in cluster_sizes(spec):
        return f"cs={cfg.cs}: k1={spec.k1} does not split into {cfg.cs} slices of whole 16-channel steps"
    ks = slice_channels(spec, cfg)
    if cfg.kc and ks % cfg.kc:
        return f"kc={cfg.kc}: the slice of {ks} channels does not split into steps of {cfg.kc}"
    regs = acc_regs(spec, cfg.bm, cfg.warps)
    if regs > MAX_ACC_REGS:
        return f"bm={cfg.bm}: {regs} accumulators a thread for k2={spec.k2}, more than {MAX_ACC_REGS}"
    if shared_bytes(spec, cfg) > max_shared_bytes(arch):
        return f"{cfg.to_string()} needs {shared_bytes(spec, cfg) // 1024} KiB of shared memory"
    if -(-spec.m // cfg.bm) > MAX_GRID_Y:
        return f"bm={cfg.bm}: {-(-spec.m // cfg.bm)} pixel tiles, more than CUDA's grid takes (blockIdx.y, {MAX_GRID_Y})"
    return None


def default_config(spec: FusedConvSpec, arch: int = 90) -> ClusterConfig:
    """The largest portable cluster (the most blocks, the shortest chain per block), and the largest pixel tile that still
    gives two clusters per SM's worth of blocks (132 SMs), within the accumulators and shared memory."""
    cs = [cs for cs in cluster_sizes(spec) if cs <= PORTABLE_CLUSTER][-1]
    fits = [bm for bm in (64, 32, 16) if config_problem(spec, ClusterConfig(bm, cs), arch) is None] or [16]
    bm = next((bm for bm in fits if -(-spec.m // bm) * cs >= 2 * 132), fits[-1])
    return ClusterConfig(bm=bm, cs=cs)


def pair_func(spec: FusedConvSpec, cfg: ClusterConfig, name: str = "fused_dw3x3_conv1x1_cluster"):
    """The kernel as a TIRx PrimFunc: (x, w1, s1, b1, w2, s2, b2, [residual (m, k2)], y (m, k2)), the op's arrays as
    given (w1 (3, 3, 1, k1), w2 (k1, k2))."""
    from tvm import tirx
    from tvm.script import tirx as T

    problem = spec_problem(spec) or config_problem(spec, cfg)
    if problem:
        raise ValueError(f"{spec.to_string()}: {problem}")
    m, c, k1, k2, bm, cs, threads, warps = spec.m, spec.c, spec.k1, spec.k2, cfg.bm, cfg.cs, cfg.threads(), cfg.warps
    at = layout(spec, cfg)
    mid_row, w2_row, mid_size, w2_at, w2_size = at["mid_row"], at["w2_row"], at["mid_size"], at["w2_at"], at["w2_size"]
    ks, kc, tiles, m_tiles = slice_channels(spec, cfg), chunk(spec, cfg), -(-m // bm), bm // 16
    steps, mid_vectors, out_vectors, n_tiles = ks // kc, kc // 8, k2 // 8, k2 // MMA_N
    warp_tiles = -(-n_tiles // warps)  # a warp's n8 tiles of k2: warp, warp + warps, ...
    stride, act1, act2, residual = spec.stride, ACT_CODES[spec.act1], ACT_CODES[spec.act2], bool(spec.residual)

    def pixel(p):
        return p // (spec.ho * spec.wo), p // spec.wo % spec.ho, p % spec.wo

    @T.macro(hygienic=False)
    def copy_w2_step(pool, w2, tx, rank, step):
        """w2's rows of the slice's step (rows rank * ks + step * kc ...) into its buffer, 16-byte cp.async"""
        for i in T.unroll(-(-kc * out_vectors // threads)):
            u = T.meta_var(tx + i * threads)
            if u < kc * out_vectors:
                row, col = T.meta_var((u // out_vectors, u % out_vectors * 8))
                T.cuda.func_call("tvm_b2b_cp_async16", T.address_of(pool[w2_at + step % 2 * w2_size + row * w2_row + col]),
                                 T.address_of(w2[rank * ks + step * kc + row, col]), source_code=COPY_SOURCE)

    @T.prim_func
    def func(x_ptr: T.handle, w1_ptr: T.handle, s1_ptr: T.handle, b1_ptr: T.handle, w2_ptr: T.handle, s2_ptr: T.handle,
             b2_ptr: T.handle, r_ptr: T.handle, y_ptr: T.handle):
        x = T.match_buffer(x_ptr, (spec.n, spec.h, spec.w, c), "float16", align=16)
        w1 = T.match_buffer(w1_ptr, (3, 3, 1, k1), "float16", align=16)
        s1 = T.match_buffer(s1_ptr, (k1,), "float32", align=16)
        b1 = T.match_buffer(b1_ptr, (k1,), "float32", align=16)
        w2 = T.match_buffer(w2_ptr, (k1, k2), "float16", align=16)
        s2 = T.match_buffer(s2_ptr, (k2,), "float32", align=16)
        b2 = T.match_buffer(b2_ptr, (k2,), "float32", align=16)
        r = T.match_buffer(r_ptr, (m, k2), "float16", align=16)
        y = T.match_buffer(y_ptr, (m, k2), "float16", align=16)

        T.device_entry()
        _slice, tile = T.cta_id([cs, tiles])  # a cluster: the cs blocks of one pixel tile
        rank = T.cta_id_in_cluster([cs])
        tx = T.thread_id([threads])
        pool = T.alloc_buffer((at["pool"],), "float16", scope="shared.dyn", align=128)
        a_frag = T.alloc_buffer((m_tiles * 4,), "uint32", scope="local")
        b_frag = T.alloc_buffer((2,), "uint32", scope="local")
        acc = T.alloc_buffer((m_tiles * warp_tiles * 4,), "float32", scope="local")
        warp = T.meta_var(tx // 32)
        for i in T.unroll(m_tiles * warp_tiles * 4):
            acc[i] = T.float32(0)
        copy_w2_step(pool, w2, tx, rank, 0)  # in flight while its 3x3 runs
        for step in T.serial(steps):
            mid_at = T.meta_var(step % 2 * mid_size)
            # 1. the 3x3 of the step's channels, 8 a thread at a time, into mid (zeros past the last pixel)
            for i in T.unroll(-(-bm * mid_vectors // threads)):
                u = T.meta_var(tx + i * threads)
                if u < bm * mid_vectors:
                    p = T.meta_var(tile * bm + u // mid_vectors)
                    ch = T.meta_var(rank * ks + step * kc + u % mid_vectors * 8)
                    img, oh, ow = T.meta_var(pixel(p))
                    out = T.meta_var(T.address_of(pool[mid_at + u // mid_vectors * mid_row + u % mid_vectors * 8]))
                    if p < m:
                        T.cuda.func_call("tvm_b2b_dw3x3x8", out, T.address_of(x[img, 0, 0, ch]), T.address_of(w1[0, 0, 0, ch]),
                                         T.address_of(s1[ch]), T.address_of(b1[ch]), oh * stride - 1, ow * stride - 1, spec.h,
                                         spec.w, c, act1, source_code=DW_SOURCE)
                    else:
                        T.cuda.func_call("tvm_b2b_zero8", out, source_code=ZERO_SOURCE)
            T.cuda.func_call("tvm_b2b_cp_async_wait_all", source_code=WAIT_SOURCE)
            T.cuda.cta_sync()  # the step's mid and w2 in; every warp is past step - 1's mma (its buffers free again)
            # 2. the next step's w2 rows into the other buffer, in flight during this mma and the next 3x3
            if step + 1 < steps:
                copy_w2_step(pool, w2, tx, rank, step + 1)
            # 3. mid @ w2's step: warp w's n8 tiles w, w + warps, ... for every m16 tile, 16 channels of mid at a time
            w2_step = T.meta_var(w2_at + step % 2 * w2_size)
            for kk in T.unroll(kc // MMA_K):
                for t in T.unroll(m_tiles):
                    T.cuda.func_call("tvm_b2b_ldmatrix_a", T.address_of(a_frag[t * 4]),
                                     T.address_of(pool[mid_at + t * 16 * mid_row + kk * MMA_K]), mid_row,
                                     source_code=LOAD_A_SOURCE)
                for j in T.unroll(warp_tiles):
                    if j * warps + warp < n_tiles:
                        T.cuda.func_call("tvm_b2b_ldmatrix_b", T.address_of(b_frag[0]),
                                         T.address_of(pool[w2_step + kk * MMA_K * w2_row + (j * warps + warp) * MMA_N]), w2_row,
                                         source_code=LOAD_B_SOURCE)
                        for t in T.unroll(m_tiles):
                            T.cuda.func_call("tvm_b2b_mma16816", T.address_of(acc[(t * warp_tiles + j) * 4]),
                                             T.address_of(a_frag[t * 4]), T.address_of(b_frag[0]), source_code=MMA_SOURCE)
        T.cuda.cta_sync()  # the partial sums go over mid and w2: every warp past its last mma
        for j in T.unroll(warp_tiles):
            if j * warps + warp < n_tiles:
                for t in T.unroll(m_tiles):
                    tile_at = T.meta_var(2 * (t * 16 * k2 + (j * warps + warp) * MMA_N))  # fp32: 2 halves each
                    T.cuda.func_call("tvm_b2b_store_acc", T.address_of(pool[tile_at]), k2,
                                     T.address_of(acc[(t * warp_tiles + j) * 4]), source_code=STORE_ACC_SOURCE)
        T.cuda.cluster_sync()  # every block's partial sums written (release), visible to the cluster (acquire)
        # 4. each of the cluster's threads: 8 channels of one pixel summed over the cs blocks, the epilogue, the store
        for i in T.unroll(-(-bm * out_vectors // (threads * cs))):
            u = T.meta_var(rank * threads + tx + i * threads * cs)
            if u < bm * out_vectors:
                p = T.meta_var(tile * bm + u // out_vectors)
                ch = T.meta_var(u % out_vectors * 8)
                partial = T.meta_var(T.address_of(pool[2 * (u // out_vectors * k2 + ch)]))
                if p < m:
                    if residual:
                        T.cuda.func_call("tvm_b2b_cluster_out8", T.address_of(y[p, ch]), T.address_of(r[p, ch]), partial, cs,
                                         T.address_of(s2[ch]), T.address_of(b2[ch]), act2, 1, source_code=OUT_SOURCE)
                    else:  # (r is not a parameter: y's address in its place, not read)
                        T.cuda.func_call("tvm_b2b_cluster_out8", T.address_of(y[p, ch]), T.address_of(y[p, ch]), partial, cs,
                                         T.address_of(s2[ch]), T.address_of(b2[ch]), act2, 0, source_code=OUT_SOURCE)
        T.cuda.cluster_sync()  # no block exits (its shared memory gone) while a peer still reads its partial sums

    params = [p for p in func.params if residual or p.name != "r"]
    func = tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)
    return func.with_attr("global_symbol", name).with_attr(TIRX_ATTR, True).with_attr("op_pattern", 8)


class ClusterDepthwisePairRule(WrittenPairRule):
    """sm_90 depthwise pairs fused on a thread-block cluster; the Hopper rules' switch ("1": where measured faster, the
    default; "all": wherever it computes the spec; else off) and fallback (optional: rule_for falls back past it to the
    template's rule, and its reasons)."""

    name = "cluster depthwise pair (sm_90)"
    kernel, needs = "cluster", "thread-block clusters and distributed shared memory"
    switch, default = ENABLE_ENV, "1"
    config_type = ClusterConfig

    def searched(self, spec: FusedConvSpec) -> dict[str, tuple]:
        """What tuning measures (candidates): every cluster size that splits k1, the slice whole or in steps of 16-64
        channels, 4 or 8 warps."""
        return {"bm": (16, 32, 64), "cs": tuple(cluster_sizes(spec)), "kc": (0, 16, 32, 48, 64), "warps": (4, 8)}

    def built(self, spec: FusedConvSpec, cfg: ClusterConfig) -> ClusterConfig:
        """A step of the whole slice is the whole slice (kc=0)."""
        return dataclasses.replace(cfg, kc=0) if cfg.kc == slice_channels(spec, cfg) else cfg

    def problem(self, spec: FusedConvSpec) -> str | None:
        return spec_problem(spec)

    def slower(self, spec: FusedConvSpec) -> str | None:
        """Where the kernel measured slower than the template's plan (its fused kernel or the two single convs), or None.
        H100 (bench/results/fused_dwcluster_n1_h100_s21.txt, _n32_): at batch 1 it wins from 56x56 down (14x14 384->64 +r
        6.8 us against 10.2; 56x56/2 144->32 6.3 against 11.3) except on k1 = 960 (7x7 960->160 +r 10.3 against 9.8), and
        loses on more pixels (112x112 32->16 6.6 against the template's fused 4.8; batch 32 28x28 192->32 +r 36.5
        against 15.9; in steps on 8 warps no further than 1.05x ahead anywhere, _n32_steps_h100_s22.txt): there each
        block's slice of the reduction is too short for its fixed costs (w2's slice, the cluster's reduction). k1 = 960
        on clusters of 15 (a config: bm=16,cs=15) measured faster (7.9 us against 9.5, _n1_cs15_h100_s22.txt), not yet
        run in a model."""
        pixels = spec.n * spec.h * spec.w
        if pixels > MAX_PIXELS:
            return f"{pixels} input pixels, more than {MAX_PIXELS}: the cluster kernel measured slower there (H100)"
        if spec.k1 >= SLOWER_K1:
            return f"k1={spec.k1} >= {SLOWER_K1}: the cluster kernel measured slower there (H100, 7x7 960->160)"
        return None

    def parse_config(self, config):
        if config is None or isinstance(config, ClusterConfig):
            return config
        if isinstance(config, str):
            return ClusterConfig.parse(config)
        raise ValueError(f"config: a {type(config).__name__} is the config of neither kernel that runs this pair (the "
                         "cluster kernel's: bm, cs, kc, warps)")

    def default_config(self, spec: FusedConvSpec, info) -> ClusterConfig:
        return default_config(spec, info.arch)

    def template(self):
        from .cuda_grouped_pair import RULE as TEMPLATE

        return TEMPLATE

    def func(self, spec: FusedConvSpec, cfg: ClusterConfig):
        return pair_func(spec, cfg)

    def config_problem(self, spec: FusedConvSpec, cfg: ClusterConfig, arch: int) -> str | None:
        return config_problem(spec, cfg, arch)


RULE = ClusterDepthwisePairRule()
