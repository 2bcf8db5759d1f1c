"""CUDA rule of the pools TVM legalizes (max_pool2d, avg_pool2d in NHWC): a dlight rule (TVM's
`apply(func, target, tunable) -> Schedule | None`) that a model's build asks before TVM's own
(frontend.model passes it to codegen.compile_module).

Each thread computes `lanes` neighbouring channels of one output pixel (8 float16: one 16-byte load
per window tap, coalesced along the channels), its accumulators in registers, and stores them once.
TVM's fallback gives each thread one channel and writes the output in global memory at every tap.
H200, ResNet-50's max-pool at batch 32 (bench/bench_legalized.py, bench/results/legalized_h200_s13_with_layout_rule.txt):
41.0 -> 20.2 us, 33% -> 66% of the memory roofline.
The stem's input cells (NCHW float32 to NHWC float16) have their own rule, schedule/cuda_layout.py.
"""
from __future__ import annotations

from tvm import s_tir, tirx

from ..op.conv import vector_lanes

THREADS = 256
MAX_WINDOW = 64  # reduction extents up to this (a pool's window), not a global reduction


def _output_block(sch: s_tir.Schedule):
    """The last block of the function's root, if the others inline into it (padding), else None."""
    blocks = sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []
    if not blocks:
        return None
    for block in blocks[:-1]:
        try:
            sch.compute_inline(block)
        except Exception:  # noqa: BLE001 -- not a pool: leave it to TVM's rules
            return None
    return blocks[-1]


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:  # noqa: BLE001
        return False


def _window_pool(sch, block):
    """(spatial loops, reduction loops) of a 4-d float16 NHWC pool block, else None."""
    node = sch.get(block)
    out = node.writes[0].source if len(node.writes) == 1 else None
    if out is None or len(out.shape) != 4 or str(out.dtype) != "float16":
        return None
    kinds = [iv.iter_type for iv in node.iter_vars]
    loops = sch.get_loops(block)
    if len(loops) != len(kinds) or kinds[:4] != [tirx.IterVar.DataPar] * 4:
        return None
    reduce = loops[4:]
    if not reduce or any(k != tirx.IterVar.CommReduce for k in kinds[4:]):
        return None
    window = 1
    for loop in reduce:
        window *= int(sch.get(loop).extent)
    return (loops[:4], reduce) if window <= MAX_WINDOW else None


class PoolRule:
    """max/avg pools over a window, NHWC float16, with >= 2 channels per thread; None for anything else."""

    def apply(self, func, target, tunable: bool):  # noqa: ARG002 -- dlight's signature: nothing to tune
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "cuda":
            return None
        sch = s_tir.Schedule(func)
        block = _output_block(sch)
        found = _window_pool(sch, block) if block is not None else None
        if found is None:
            return None
        (n, h, w, c), reduce = found
        lanes = vector_lanes(int(sch.get(c).extent), 8)
        if lanes < 2:
            return None
        outer, lane = sch.split(c, [None, lanes])
        block_x, thread = sch.split(sch.fuse(n, h, w, outer), [None, THREADS])
        sch.reorder(block_x, thread, *reduce, lane)
        sch.bind(block_x, "blockIdx.x")
        sch.bind(thread, "threadIdx.x")
        store = sch.cache_write(block, 0, "local")  # the accumulators stay in registers
        sch.reverse_compute_at(store, thread)
        sch.vectorize(lane)  # before the init is split off: TVM vectorizes a whole reduction block's loop only
        sch.decompose_reduction(block, reduce[0])
        sch.vectorize(sch.get_loops(store)[-1])
        return sch


RULE = PoolRule()
