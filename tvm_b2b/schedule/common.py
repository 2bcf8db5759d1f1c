"""Helpers shared by the schedule rules."""
from __future__ import annotations

import contextlib

from tvm import s_tir

from ..op.conv import vector_lanes  # noqa: F401 -- defined with the op (its compute vectorizes too), used by every rule


def has_block(sch: s_tir.Schedule, name: str) -> bool:
    try:
        sch.get_sblock(name)
        return True
    except Exception:  # noqa: BLE001 - tvm raises its own error type for a missing block
        return False


class ParameterlessRule:
    """What a schedule rule without parameters has: no knobs, no default config, a given config refused
    with a message naming the schedule (`what`)."""

    knobs: dict = {}
    what = "this schedule"

    def default_config(self, spec, info):
        return None

    def parse_config(self, config):
        if config is not None:
            raise ValueError(f"config: {self.what} takes no parameters")
        return None


FLOAT32_LANES = 4


def vectorize_float32(sch, loop) -> None:
    """Vectorize a loop computing float32 values in vectors of at most FLOAT32_LANES, the rest unrolled:
    TVM 0.27's CUDA codegen writes a float32x8 constant as a ulonglong4 made of 8 floats, which does
    not compile. fp16 loads and stores in it are then 8-byte vectors."""
    extent = int(sch.get(loop).extent)
    if extent <= FLOAT32_LANES:
        sch.vectorize(loop)
        return
    outer, inner = sch.split(loop, [None, vector_lanes(extent, FLOAT32_LANES)])
    sch.vectorize(inner)
    sch.unroll(outer)


def conv_in_registers(sch, conv, thread) -> None:
    """A direct conv block (loops pixel, channels, rh, rw, rc) computed per `thread` of its consumer into
    local accumulators: the taps unrolled outside the thread's channels, which are float32 vectors."""
    sch.compute_at(conv, thread, preserve_unit_loops=True)
    sch.set_scope(conv, 0, "local")
    *_, pixel, lanes, rh, rw, rc = sch.get_loops(conv)
    sch.reorder(rh, rw, rc, pixel, lanes)
    vectorize_float32(sch, lanes)  # before decomposing: the update block alone is not a complete block
    init = sch.decompose_reduction(conv, rh)
    vectorize_float32(sch, sch.get_loops(init)[-1])
    sch.unroll(rh)
    sch.unroll(rw)


TENSOR_INTRIN = "tvm.s_tir.tensor_intrin"
# the "files" of frames that no module has: the import machinery's (frozen), the code TVMScript compiles ("<ast>"),
# a `python -c` script's or exec'd string's
MODULELESS_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<ast>", "<string>")


@contextlib.contextmanager
def moduleless_files_known():
    """TVMScript's @T.prim_func calls inspect.stack(), which looks up each frame's module. For a frame of a
    file that no module has, inspect.getmodule scans every loaded module (~2,000 once TVM is imported),
    every time, and finds none: importing TVM's CUDA intrinsics (180 prim_funcs, each under import and
    parser frames) scanned ~1,600 times, 5.5 of the import's 7.0 s on a 2-core machine. While this holds, those
    files are known to inspect as modules' files named "", a name no module has, so getmodule returns None
    at once, as its scan would have; the entries are taken out afterwards."""
    import inspect

    added = [f for f in MODULELESS_FILES if f not in inspect.modulesbyfile]
    inspect.modulesbyfile.update(dict.fromkeys(added, ""))
    try:
        yield
    finally:
        for f in added:
            inspect.modulesbyfile.pop(f, None)


def cuda_tensor_intrinsics():
    """TVM's CUDA tensor intrinsics (tvm.s_tir.tensor_intrin.cuda, registered on import), without the
    rest of its package: the package's __init__ also imports the ARM, x86, ROCm, Hexagon and RISC-V
    intrinsics wherever LLVM is enabled, none of which our schedules use (compiling ResNet-50 for
    sm_90 on a 2-core machine: 78.5 -> 49.6 s). The package stands in sys.modules uninitialized only
    while cuda imports: a later `import tvm.s_tir.tensor_intrin` runs its __init__ as usual, which
    finds cuda imported already (registering its intrinsics twice would fail)."""
    import importlib
    import importlib.util
    import sys

    import tvm.s_tir

    if TENSOR_INTRIN in sys.modules or TENSOR_INTRIN + ".cuda" in sys.modules:
        return importlib.import_module(TENSOR_INTRIN + ".cuda")
    package = importlib.util.module_from_spec(importlib.util.find_spec(TENSOR_INTRIN))  # its __init__ not run
    sys.modules[TENSOR_INTRIN] = package
    try:
        with moduleless_files_known():
            return importlib.import_module(TENSOR_INTRIN + ".cuda")
    finally:
        del sys.modules[TENSOR_INTRIN]
        if getattr(tvm.s_tir, "tensor_intrin", None) is package:
            del tvm.s_tir.tensor_intrin
