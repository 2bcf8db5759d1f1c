"""Lowering of our CUDA kernels: TVM 0.27's s_tir pipeline with our passes added: PoolSharedMemory
(below) and, for ldmatrix/mma kernels, LowerAllWarpMemory with a CSE that keeps the lane index
visible (see their docstrings).

Why: the fused kernel keeps buffers of two element types in dynamic shared memory (fp16 operand
tiles and `mid`, fp32 accumulator staging). TVM 0.27 plans their reuse wrongly in two places:
  - StorageRewrite lets an fp16 tile reuse a dead fp32 buffer under the fp32 variable, and
    LowerIntrin then rejects the access ("tvm_access_ptr element type must match the source buffer");
  - with StorageRewrite off, MergeSharedMemoryAllocations grows a reused slot without moving the
    slots after it: the fp32 staging then overlaps `mid` while both are live (wrong results, seen
    on the H200).
PoolSharedMemory runs just before StorageRewrite and plans the kernel's dynamic shared memory
itself: one byte pool, each buffer a typed view at a fixed offset, and two buffers share bytes only
when no top-level statement of the kernel touches both (conservative liveness: a statement that
touches a buffer anywhere inside, e.g. in a loop, keeps it live for the whole statement). Both TVM
passes then see a single allocation and have nothing to reuse. ThreadSync, which runs later, sees
every access through the pool's one variable and puts a barrier between a statement that last
reads some bytes and the next one that writes them.
Only functions carrying POOL_ATTR (set by our schedules) are changed.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

POOL_ATTR = "tvm_b2b.pool_shared_memory"
TIRX_ATTR = "tvm_b2b.tirx"  # a kernel written in TIRx script (schedule.cuda_hopper_conv): TVM's TIRx pipeline lowers it
POOL_SCOPE = "shared.dyn"
POOL_NAME = "b2b_shared_pool"
ALIGN = 128  # bytes: every view starts on a 128-byte boundary (cp.async, ldmatrix and WMMA need 16-32)
PIPELINE = "tvm_b2b"
ACCESS_PTR, BUFFER_DATA = tvm.ir.Op.get("tirx.tvm_access_ptr"), tvm.ir.Op.get("tirx.buffer_data")


def _bytes(buffer) -> int:
    count = 1
    for extent in buffer.shape:
        count *= int(extent)
    dtype = tvm.DataType(str(buffer.dtype))
    return count * dtype.bits * dtype.lanes // 8


def _kernel_body(stmt):
    """The statement sequence under the kernel's thread launches (None if the shape is unexpected)."""
    while True:
        if isinstance(stmt, tirx.AttrStmt):
            stmt = stmt.body
        elif isinstance(stmt, tirx.SeqStmt):
            launches = [s for s in stmt.seq if isinstance(s, tirx.AttrStmt) and s.attr_key == "thread_extent"]
            if not launches:
                return stmt
            if len(launches) > 1:
                return None  # several kernels in one function: not ours
            stmt = launches[0]
        else:
            return None


class _Buffers:
    """The pooled buffers, found by identity (in TVM 0.27 a buffer is a Var)."""

    def __init__(self, buffers):
        self.buffers = buffers

    def find(self, var):
        return next((i for i, b in enumerate(self.buffers) if b.same_as(var)), None)

    def touched(self, stmt) -> set[int]:
        """Indices of the buffers that `stmt` reads, writes, declares or points to."""
        seen: set[int] = set()

        def visit(var):
            i = self.find(var)
            if i is not None:
                seen.add(i)

        tvm_ffi.structural_walk(stmt, [(tvm.ir.Var, visit)])
        return seen


def _allocations(stmt, keep) -> list:
    """The AllocBuffer statements inside `stmt` whose buffer `keep` accepts."""
    found = []
    tvm_ffi.structural_walk(stmt, [(tirx.AllocBuffer, lambda s: found.append(s) if keep(s.buffer) else None)])
    return found


def _pool_allocation(func):
    """The AllocBuffer of the pool PoolSharedMemory made in `func` (None when there is not exactly one)."""
    pools = _allocations(func.body, is_pool)
    return pools[0] if len(pools) == 1 else None


def is_pool(buffer) -> bool:
    """Whether `buffer` is a pool that PoolSharedMemory made."""
    return buffer.name.startswith(POOL_NAME + "_")


def _ours(func) -> bool:
    return bool(func.attrs and func.attrs.get(POOL_ATTR, False))


def plan_offsets(sizes: list[int], live: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Byte offsets and total for buffers of `sizes` live over the closed statement intervals
    `live`: buffers whose intervals meet never share a byte. Largest first, first fit."""
    offsets: dict[int, int] = {}
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        lo, hi = live[i]
        taken = sorted((offsets[j], offsets[j] + sizes[j]) for j in offsets if live[j][0] <= hi and lo <= live[j][1])
        at = 0
        for start, end in taken:
            if at + sizes[i] <= start:
                break
            at = max(at, _align(end))
        offsets[i] = at
    total = max((offsets[i] + sizes[i] for i in offsets), default=0)
    return [offsets[i] for i in range(len(sizes))], _align(total)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pool_shared_memory(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The function with its dynamic shared buffers placed in one pool (unchanged when it has
    fewer than two, or a form this pass does not know)."""
    body = _kernel_body(func.body)
    if body is None:
        return func
    found = _Buffers([s.buffer for s in _allocations(body, lambda b: b.scope() == POOL_SCOPE)])
    if len(found.buffers) < 2 or any(len(b.shape) != 1 for b in found.buffers):
        return func  # nothing to plan, or not flattened
    live: dict[int, list[int]] = {}
    for index, stmt in enumerate(body.seq):
        if isinstance(stmt, tirx.AllocBuffer):
            continue  # allocating is not using: a buffer is live from its first access on
        for i in found.touched(stmt):
            live.setdefault(i, [index, index])[1] = index
    sizes = [_bytes(b) for b in found.buffers]
    offsets, total = plan_offsets(sizes, [tuple(live.get(i, (0, 0))) for i in range(len(sizes))])
    pool = _pool_buffer(total, {str(b.dtype) for b in found.buffers})
    views = []
    for b, offset in zip(found.buffers, offsets):
        elem_bytes = _bytes(b) // int(b.shape[0])
        view = tirx.decl_buffer(b.shape, str(b.dtype), name=b.name, data=pool.data, scope=POOL_SCOPE)
        views.append((view, offset // elem_bytes))
    new_body = _rewrite(body, found, views, pool)
    if found.touched(new_body):
        return func  # a use this pass does not rewrite: leave the planning to TVM
    new_body = tirx.SeqStmt([tirx.AllocBuffer(pool), *new_body.seq])
    return func.with_body(_replace(func.body, body, new_body))


def _pool_buffer(total: int, dtypes: set[str]):
    """The pool: bytes, or elements of the one type all its buffers have. (StorageRewrite retypes a
    byte pool whose every access is fp16 to fp16 without dividing its extent, doubling the kernel's
    dynamic shared memory: 184 instead of 92 KiB per block, measured on the H200.)
    Named after its element type: the CUDA codegen declares it `extern __shared__ T name[]`, and all
    kernels of a model share one translation unit, where one name may have only one type (a model
    with a half pool and a byte pool failed to compile: "declaration is incompatible")."""
    dtype = dtypes.pop() if len(dtypes) == 1 else "uint8"
    return tirx.decl_buffer((total * 8 // tvm.DataType(dtype).bits,), dtype, name=f"{POOL_NAME}_{dtype}", scope=POOL_SCOPE)


def _shift(index, offset: int):
    """index + offset, for a scalar index or a vector access's Ramp."""
    if isinstance(index, tirx.Ramp):
        return tirx.Ramp(index.base + offset, index.stride, index.lanes)
    return index + offset


def _rewrite(body, found: _Buffers, views: list, pool):
    """Every access to a pooled buffer made through its view, at the view's offset."""

    def load(node):  # a TensorLoad: `source` is the buffer
        i = found.find(node.source)
        if i is None:
            return node
        view, offset = views[i]
        return tirx.BufferLoad(view, [_shift(node.indices[0], offset)])

    def store(node):
        i = found.find(node.buffer)
        if i is None:
            return node
        view, offset = views[i]
        return tirx.BufferStore(view, node.value, [_shift(node.indices[0], offset)])

    def alloc(node):
        i = found.find(node.buffer)
        return node if i is None else tirx.DeclBuffer(views[i][0], data=pool.data)

    def call(node):
        source = node.args[1] if node.op.same_as(ACCESS_PTR) else None
        if not (isinstance(source, tvm.ir.Call) and source.op.same_as(BUFFER_DATA)):
            return node
        i = found.find(source.args[0])
        if i is None:
            return node
        elem_bits = tvm.DataType(str(node.args[0].ty.dtype)).bits  # args[0]: type_annotation(elem)
        shift = views[i][1] * tvm.DataType(str(found.buffers[i].dtype)).bits // elem_bits
        # through the view's data: LowerIntrin checks the element type against the buffer named here
        args = [node.args[0], views[i][0].data, node.args[2] + shift, node.args[3], node.args[4]]
        return tvm.ir.Call(node.op, args, node.attrs, ret_ty=node.ty)

    return tvm_ffi.structural_map(body, [(tvm.ir.TensorLoad, load), (tirx.BufferStore, store),
                                         (tirx.AllocBuffer, alloc), (tvm.ir.Call, call)])


def _replace(root, old, new):
    if root.same_as(old):
        return new
    return tvm_ffi.structural_map(root, [(tirx.SeqStmt, lambda s: new if s.same_as(old) else s)], order="pre")


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_b2b.PoolSharedMemory")
def PoolSharedMemory(func, mod, ctx):  # noqa: N802 (TVM's pass naming)
    return pool_shared_memory(func) if _ours(func) else func


def typed_pool_access(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """StorageRewrite points every access pointer into the pool at the pool itself (bytes), and
    LowerIntrin then rejects those of fp16/fp32 elements: point each at a view of its element type."""
    allocation = _pool_allocation(func)
    if allocation is None:
        return func
    pool = allocation.buffer
    views: dict[str, object] = {}

    def is_pool(source):
        if isinstance(source, tvm.ir.Call) and source.op.same_as(BUFFER_DATA):
            source = source.args[0]
        return source.same_as(pool)

    def call(node):
        if not node.op.same_as(ACCESS_PTR) or not is_pool(node.args[1]):
            return node
        dtype = str(node.args[0].ty.dtype)
        if dtype == str(pool.dtype):
            return node
        if dtype not in views:
            count = _bytes(pool) * 8 // tvm.DataType(dtype).bits
            views[dtype] = tirx.decl_buffer((count,), dtype, name=f"{pool.name}_as_{dtype}", data=pool.data, scope=POOL_SCOPE)
        args = [node.args[0], views[dtype].data, *node.args[2:]]
        return tvm.ir.Call(node.op, args, node.attrs, ret_ty=node.ty)

    body = tvm_ffi.structural_map(func.body, [(tvm.ir.Call, call)])
    if not views:
        return func
    declared = [tirx.DeclBuffer(v, data=pool.data) for v in views.values()]

    def declare(seq):
        if not any(s.same_as(allocation) for s in seq.seq):
            return seq
        out = []
        for s in seq.seq:
            out.append(s)
            if s.same_as(allocation):
                out.extend(declared)
        return tirx.SeqStmt(out)

    return func.with_body(tvm_ffi.structural_map(body, [(tirx.SeqStmt, declare)]))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_b2b.TypedPoolAccess")
def TypedPoolAccess(func, mod, ctx):  # noqa: N802
    return typed_pool_access(func) if _ours(func) else func


SYNC, ADDRESS_OF = tvm.ir.Op.get("tirx.tvm_storage_sync"), tvm.ir.Op.get("tirx.address_of")


def _is_sync(stmt) -> bool:
    return isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tvm.ir.Call) and stmt.value.op.same_as(SYNC)


def _leading_sync(body):
    """(the barrier, the rest) when `body` starts with a barrier, else (None, body)."""
    seq = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    if seq and isinstance(seq[0], tirx.SeqStmt):  # ThreadSync puts the barrier in a SeqStmt with the statement
        seq = [*seq[0].seq, *seq[1:]]
    if not seq or not _is_sync(seq[0]) or any(_is_sync(s) for s in seq[1:]):
        return None, body
    return seq[0], seq[1] if len(seq) == 2 else tirx.SeqStmt(seq[1:])


def _bounded(func) -> "tvm.sym.Analyzer":
    """An analyzer that knows the range of every loop, thread index and let variable of `func`."""
    analyzer = tvm.sym.Analyzer()

    def loop(node):
        analyzer.bind(node.loop_var, tvm.ir.Range.from_min_extent(node.min, node.extent), allow_override=True)

    def attr(node):
        if node.attr_key == "thread_extent":
            analyzer.bind(node.node.var, tvm.ir.Range.from_min_extent(0, node.value), allow_override=True)

    def let(node):
        analyzer.bind(node.var, node.value, allow_override=True)

    # outer statements first: a let's value is bounded by the loops and threads around it
    tvm_ffi.structural_walk(func.body, [(tirx.For, loop), (tirx.AttrStmt, attr), (tirx.Bind, let)], order="pre")
    return analyzer


def _byte_range(buffer, index, analyzer) -> tuple[int, int]:
    """[first, last] byte of the pool that an access at `index` (scalar or Ramp) may touch."""
    ends = [index.base, index.base + index.stride * (index.lanes - 1)] if isinstance(index, tirx.Ramp) else [index]
    bounds = [analyzer.const_int_bound(e) for e in ends]
    elem = tvm.DataType(str(buffer.dtype)).bits // 8
    return min(b.min_value for b in bounds) * elem, (max(b.max_value for b in bounds) + 1) * elem - 1


def _pool_views(func, pool) -> list:
    """The pool and every buffer declared on its storage (the typed views, by DeclBuffer)."""
    views = [pool]

    def declared(node):
        data = node.data
        if isinstance(data, tvm.ir.Call) and data.op.same_as(BUFFER_DATA) and data.args[0].same_as(pool):
            views.append(node.buffer)

    tvm_ffi.structural_walk(func.body, [(tirx.DeclBuffer, declared)])
    return views


def _pool_ranges(stmt, views, analyzer):
    """(read byte ranges, written byte ranges) of the pool in `stmt`, or None when the pool is used
    otherwise than by plain loads and stores (access pointers, async copies: not analyzed)."""
    reads, writes, other = [], [], []
    on_pool = lambda buffer: any(buffer.same_as(v) for v in views)  # noqa: E731

    def load(node):  # a TensorLoad: `source` is the buffer
        if on_pool(node.source):
            reads.append(_byte_range(node.source, node.indices[0], analyzer))

    def store(node):
        if on_pool(node.buffer):
            writes.append(_byte_range(node.buffer, node.indices[0], analyzer))

    def call(node):  # a view passed by name (buffer_data, so tvm_access_ptr and copies) or by address
        for arg in node.args:
            if isinstance(arg, tvm.ir.Var) and on_pool(arg):
                other.append(arg)
            elif node.op.same_as(ADDRESS_OF) and isinstance(arg, tvm.ir.TensorLoad) and on_pool(arg.source):
                other.append(arg)

    tvm_ffi.structural_walk(stmt, [(tvm.ir.TensorLoad, load), (tirx.BufferStore, store), (tvm.ir.Call, call)])
    return None if other else (reads, writes)


def hoist_loop_syncs(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """ThreadSync compares shared accesses by buffer only, and sees the whole pool as one buffer: an
    epilogue loop that reads fp32 accumulators and writes `mid` (other bytes of the pool) gets a
    barrier in every iteration. Where the bytes a loop reads and the bytes it writes are provably
    disjoint (over all its iterations and threads), iterations cannot race: the barrier moves before
    the loop (where it still separates the loop from what came before)."""
    allocation = _pool_allocation(func)
    if allocation is None:
        return func
    views, analyzer = _pool_views(func, allocation.buffer), _bounded(func)

    def loop(node):
        sync, rest = _leading_sync(node.body)
        ranges = sync is not None and _pool_ranges(rest, views, analyzer)
        if not ranges or any(r[0] <= w[1] and w[0] <= r[1] for r in ranges[0] for w in ranges[1]):
            return node
        return tirx.SeqStmt([sync, tirx.For(node.loop_var, node.min, node.extent, node.kind, rest,
                                            node.thread_binding, node.annotations)])

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, loop)]))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_b2b.HoistLoopSyncs")
def HoistLoopSyncs(func, mod, ctx):  # noqa: N802
    return hoist_loop_syncs(func) if _ours(func) else func


def _pipeline():
    """TVM 0.27's default s_tir lowering (tvm/s_tir/pipeline.py) with PoolSharedMemory right before
    StorageRewrite. A copy of TVM's list: tests/test_lower.py checks it still equals TVM's."""
    from tvm.s_tir.pipeline import finalize_device_passes, finalize_host_passes

    @tvm.transform.module_pass(opt_level=0, name="tvm_b2b_pipeline")
    def run(mod, _ctx):
        config = tvm.transform.PassContext.current().config
        flag = lambda key: bool(config.get(key, False))  # noqa: E731
        passes = [
            s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerCrossThreadReduction(),
            s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.LiftThreadBinding(),
            s_tir.transform.ManifestSharedMemoryLocalStage(), s_tir.transform.CompactBufferAllocation(),
            s_tir.transform.LowerAutoCopy(), s_tir.transform.UnifyThreadBinding(),
            s_tir.transform.LowerMatchBuffer(), s_tir.transform.StmtSimplify(),
            s_tir.transform.InjectPermutedLayout(), s_tir.transform.AnnotateIrregularLoop(),
            s_tir.transform.InjectSoftwarePipeline(), s_tir.transform.TransformMmaBufferLayout(),
            s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
            tirx.transform.BF16ComputeLegalize(), tirx.transform.NarrowDataType(32),
            s_tir.transform.LoopPartition(), tirx.transform.VectorizeLoop(not flag("tirx.disable_vectorize")),
            s_tir.transform.InjectVirtualThread(), s_tir.transform.InjectDoubleBuffer(),
            PoolSharedMemory,
        ]
        if not flag("tirx.disable_storage_rewrite"):
            passes += [tirx.transform.StorageRewrite(), TypedPoolAccess]
        if flag("tirx.use_async_copy"):
            passes.append(s_tir.transform.LowerAsyncDMA())
        passes += [
            s_tir.transform.HoistIfThenElse(), tirx.transform.UnrollLoop(),
            s_tir.transform.RenormalizeSplitPattern(), tirx.transform.StmtSimplify(),
            tirx.transform.RemoveNoOp(), s_tir.transform.RewriteUnsafeSelect(),
        ]
        if flag("tirx.instrument_bound_checkers"):
            passes.append(s_tir.transform.InstrumentBoundCheckers())
        if flag("tirx.s_tir.ldg32"):
            passes.append(s_tir.transform.InjectPTXLDG32(True))
        if not flag("tirx.disable_cse_tir"):
            passes.append(_CommonSubexprElimKeepingWarpIndex)
        if flag("tirx.instrument_lwp"):
            passes.append(s_tir.transform.InstrumentProfileIntrinsics())
        passes += [
            tirx.transform.FP8ComputeLegalize(), s_tir.transform.VerifyVTCMLimit(),
            s_tir.transform.LowerVtcmAlloc(), tirx.transform.VerifyMemory(),
            tirx.transform.AnnotateEntryFunc(), s_tir.transform.ThreadSync("shared"),
            s_tir.transform.ThreadSync("shared.dyn"), HoistLoopSyncs, s_tir.transform.ThreadSync("warp"),
            s_tir.transform.InferFragment(), s_tir.transform.LowerThreadAllreduce(),
        ]
        if flag("tirx.use_async_copy"):
            passes.append(s_tir.transform.InjectPTXAsyncCopy())
        if flag("tirx.s_tir.ldg32"):
            passes.append(s_tir.transform.InjectPTXLDG32())
        passes += [
            s_tir.transform.MergeSharedMemoryAllocations(), tirx.transform.SplitHostDevice(),
            tirx.transform.MakePackedAPI(), tirx.transform.FP8StorageLegalize(),
            tirx.transform.BF16StorageLegalize(),
        ]
        return _lower_tirx_apart(tvm.ir.transform.Sequential(passes), mod)

    def device_passes():
        return tvm.ir.transform.Sequential([LowerAllWarpMemory, *finalize_device_passes().passes])

    return run, finalize_host_passes, device_passes


def _written_in_tirx(func) -> bool:
    return isinstance(func, tirx.PrimFunc) and bool(func.attrs) and bool(func.attrs.get(TIRX_ATTR))


def has_tirx_kernels(mod) -> bool:
    return any(_written_in_tirx(f) for f in mod.functions.values())


def _lower_tirx_apart(passes, mod):
    """mod lowered by `passes`, except its kernels written in TIRx script (TIRX_ATTR), which TVM's TIRx pipeline
    lowers (T.device_entry, T.cta_id, ... are TIRx's: the s_tir passes do not know them); one module again."""
    if not has_tirx_kernels(mod):
        return passes(mod)
    from tvm.tirx.compilation_pipeline import tirx_pipeline

    written = {gv: f for gv, f in mod.functions.items() if _written_in_tirx(f)}
    lowered = passes(tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv not in written}, attrs=mod.attrs))
    lowered.update(tirx_pipeline()[0](tvm.IRModule(written, attrs=mod.attrs)))
    return lowered


def _has_warp_memory(func) -> bool:
    return bool(_allocations(func.body, lambda b: b.scope() == "warp"))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_b2b.CommonSubexprElimKeepingWarpIndex")
def _CommonSubexprElimKeepingWarpIndex(func, mod, ctx):  # noqa: N802
    """TVM's CSE, except on kernels with warp memory (ldmatrix/mma fragments): it hoists
    `threadIdx.x * 8` of the ldmatrix offsets into a variable, and LowerWarpMemory then cannot find
    the lane's coefficient ("require positive constant coefficient on warp index")."""
    if _has_warp_memory(func):
        return func
    return tirx.transform.CommonSubexprElim()(tvm.IRModule({"main": func}))["main"]


@tvm.transform.module_pass(opt_level=0, name="tvm_b2b.LowerAllWarpMemory")
def LowerAllWarpMemory(mod, _ctx):  # noqa: N802
    """TVM 0.27's LowerWarpMemory lowers only the first warp-memory allocation of a statement
    sequence (it stops after rewriting it): the rest stay per-warp arrays that the mma intrinsics
    index as if lowered (wrong results for the fused kernel's second accumulator; operand fragments
    in local memory). Run it until no warp allocation is left (one per run), at most 16 times."""
    for _ in range(16):
        if not any(isinstance(f, tirx.PrimFunc) and _has_warp_memory(f) for f in mod.functions.values()):
            break
        mod = tirx.transform.LowerWarpMemory()(mod)
    return mod


def register_pipeline() -> str:
    """Registers our pipeline with TVM (idempotent); its name, for tvm.compile(tir_pipeline=...)."""
    from tvm.tirx import compilation_pipeline

    compilation_pipeline.PIPELINE_MAP.setdefault(PIPELINE, _pipeline)
    return PIPELINE


def scheduled_module(funcs) -> tvm.IRModule:
    """Scheduled PrimFuncs as the IRModule that tvm.compile takes, each under its global symbol."""
    return tvm.IRModule({str(f.attrs["global_symbol"]): f.with_attr("tirx.is_scheduled", True) for f in funcs})


def pass_config(target) -> dict:
    """The PassContext config of our builds: pipelined copies become cp.async on sm_80+ (zero-filling
    where the im2col gather is out of bounds)."""
    from .target import target_info

    return {"tirx.use_async_copy": True} if target_info(target).arch >= 80 else {}


def lowering_error(funcs, target) -> str | None:
    """The first line of what TVM raises lowering these scheduled PrimFuncs as a build would, up to
    code generation (our pipeline, then the device passes, where LowerWarpMemory runs), or None. A
    check that costs no code generation and no nvcc."""
    from tvm.tirx.build import split_host_device_mods

    pipeline, _, finalize_device = tvm.tirx.get_tir_pipeline(register_pipeline())
    try:
        with tvm.transform.PassContext(config=pass_config(target)):
            mod = tirx.transform.BindTarget(target.with_host("llvm"))(scheduled_module(funcs))
            _, device_mods = split_host_device_mods(pipeline(mod))
            for device_mod in device_mods.values():
                finalize_device()(device_mod)
    except Exception as err:  # noqa: BLE001 -- any error here is one the build would raise
        return error_line(err)
    return None


def error_line(err: Exception) -> str:
    """The first line of a TVM error (its full text holds the IR), at most 200 characters: for a log line."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
