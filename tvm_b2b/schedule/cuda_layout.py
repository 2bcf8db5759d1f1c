"""CUDA rule of the layout changes TVM legalizes into a few channels per pixel (NCHW float32 to the
stem's NHWC float16 cells, op.conv.InputForm): a dlight rule (`apply(func, target, tunable) ->
Schedule | None`) that a model's build asks before TVM's own (frontend.model).

Each thread makes all channels of one output pixel (a cell of the stem's space-to-depth form: 12
values), so that neighbouring threads read neighbouring pixels of each input plane (coalesced in
NCHW). TVM's fallback gives each thread one output value: a warp then reads from 3 planes and 2
rows at once, through index math per value.
"""
from __future__ import annotations

from tvm import s_tir, tirx

THREADS = 128
MAX_CHANNELS = 16  # output channels per pixel up to this: a stem's input, not a feature map


def _inlined_output(sch: s_tir.Schedule):
    """The function's last block, every other block inlined into it, where all are spatial; else None."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
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


class FewChannelsLayoutRule:
    """Injective functions whose output is 4-d with at most MAX_CHANNELS on its last axis, from an input
    laid out otherwise; None for anything else."""

    def apply(self, func, target, tunable: bool):  # noqa: ARG002 -- dlight's signature: nothing to tune
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "cuda" or len(func.params) != 2:
            return None
        shapes = [p.shape for p in func.params]
        if len(shapes[1]) != 4 or int(shapes[1][3]) > MAX_CHANNELS or len(shapes[0]) != 4:
            return None
        sch = s_tir.Schedule(func)
        try:
            block = _inlined_output(sch)
        except Exception:  # noqa: BLE001 -- no root block: not a legalized op
            return None
        if block is None or len(sch.get_loops(block)) != 4:
            return None
        n, h, w, c = sch.get_loops(block)
        block_x, thread = sch.split(sch.fuse(n, h, w), [None, THREADS])
        sch.bind(block_x, "blockIdx.x")
        sch.bind(thread, "threadIdx.x")
        sch.unroll(c)
        return sch


RULE = FewChannelsLayoutRule()
