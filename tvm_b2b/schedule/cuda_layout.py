"""CUDA rule of the layout change TVM legalizes at a model's input: NCHW float32 to a few float16 channels
per pixel (the stem's NHWC space-to-depth cells, op.conv.InputForm). A dlight rule (`apply(func, target,
tunable) -> Schedule | None`) that a model's build asks before TVM's own (frontend.model).

A block makes one output row. Its threads compute a pixel each (all its channels), reading neighbouring
pixels of each input plane (coalesced in NCHW), into a shared-memory copy of the row; the row then goes
out as contiguous 8-byte stores. Both sides of the transpose are coalesced.
Tried before and dropped (session 13): the same pixel per thread storing straight to global memory, 12
scalar 2-byte stores 24 bytes apart per thread: 41.4 us against TVM's 21.0 (H200, ResNet-50's input at
batch 32; TVM gives each thread one output value and gathers its reads).
"""
from __future__ import annotations

from tvm import s_tir, tirx

from ..op.conv import vector_lanes

THREADS = 128
MAX_CHANNELS = 16  # output channels per pixel up to this: a stem's input, not a feature map
MAX_ROW_BYTES = 16 * 1024  # one output row in shared memory


def _inlined_output(sch: s_tir.Schedule):
    """The function's last block with every other block inlined into it, where all are spatial; else None."""
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 -- no root block: not a legalized op
        return None
    if not blocks:
        return None
    for block in blocks[:-1]:
        try:
            sch.compute_inline(block)
        except Exception:  # noqa: BLE001 -- not injective: leave it to TVM's rules
            return None
    last = blocks[-1]
    if any(iv.iter_type != tirx.IterVar.DataPar for iv in sch.get(last).iter_vars):
        return None
    return last


def _takes(func) -> bool:
    """A 4-d input to a 4-d float16 output of at most MAX_CHANNELS channels whose row fits shared memory."""
    if not isinstance(func, tirx.PrimFunc) or len(func.params) != 2:
        return False
    x, out = func.params  # TVM 0.27: a PrimFunc's params are its buffers
    if len(x.shape) != 4 or len(out.shape) != 4 or str(out.dtype) != "float16":
        return False
    if not all(isinstance(d, tirx.IntImm) for d in list(out.shape) + list(x.shape)):
        return False
    _, _, w, c = (int(d) for d in out.shape)
    return c <= MAX_CHANNELS and w * c * 2 <= MAX_ROW_BYTES


class FewChannelsLayoutRule:
    """Injective functions from a 4-d input to a 4-d float16 output of a few channels per pixel; None for
    anything else (a pool, a feature map's layout change: TVM's rules)."""

    def apply(self, func, target, tunable: bool):  # noqa: ARG002 -- dlight's signature: nothing to tune
        if target.kind.name != "cuda" or not _takes(func):
            return None
        sch = s_tir.Schedule(func)
        block = _inlined_output(sch)
        if block is None or len(sch.get_loops(block)) != 4:
            return None
        row = sch.cache_write(block, 0, "shared")  # `block` now writes the shared row, `row` copies it out
        n, h, w, c = sch.get_loops(row)
        block_x = sch.fuse(n, h)
        sch.bind(block_x, "blockIdx.x")
        flat = sch.fuse(w, c)  # the row's values in memory order
        lanes = vector_lanes(int(sch.get(flat).extent), 4)  # up to 8 bytes a store (a row is 12 * w values)
        outer, thread, lane = sch.split(flat, [None, THREADS, lanes])
        sch.bind(thread, "threadIdx.x")
        sch.vectorize(lane)
        sch.compute_at(block, block_x)
        pixel, channel = sch.get_loops(block)[-2:]
        _, pixel_thread = sch.split(pixel, [None, THREADS])
        sch.bind(pixel_thread, "threadIdx.x")
        sch.unroll(channel)
        return sch


RULE = FewChannelsLayoutRule()
