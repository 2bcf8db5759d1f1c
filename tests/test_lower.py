"""Our lowering (tvm_b2b.lower): the shared-memory plan never overlaps live buffers, the pool pass
leaves one dynamic shared allocation, barriers leave loops only where no iteration can race, and the
pipeline is TVM's with our passes added."""
import dataclasses
import re

import pytest
import tvm
import tvm_ffi
from hypothesis import given, settings
from hypothesis import strategies as st

from cuda_source import compiled_source, kernels
from tvm_b2b import FusedConvSpec
from tvm import tirx
from tvm_b2b.lower import ALIGN, POOL_NAME, _allocations, _bytes, hoist_loop_syncs, is_pool, plan_offsets, register_pipeline
from tvm_b2b.schedule import cuda_grouped_pair, plan
from tvm_b2b.schedule.cuda_wmma import WmmaConfig, shared_bytes
from tvm_b2b.target import parse_target

pytestmark = pytest.mark.usefixtures("template_pairs")  # the lowering of the mma.sync template's kernels (sm_90 included)

SPEC = FusedConvSpec(n=2, h=56, w=56, c=64, k1=64, k2=128, dtype="float16")
OURS = {"tvm_b2b.PoolSharedMemory", "tvm_b2b.TypedPoolAccess", "tvm_b2b.CommonSubexprElimKeepingWarpIndex",
        "tvm_b2b.LowerAllWarpMemory", "tvm_b2b.HoistLoopSyncs"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 70000), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=9))
def test_plan_never_overlaps_live_buffers(buffers):
    sizes = [size for size, _, _ in buffers]
    live = [(min(a, b), max(a, b)) for _, a, b in buffers]
    offsets, total = plan_offsets(sizes, live)
    assert all(o % ALIGN == 0 for o in offsets) and total % ALIGN == 0
    for i in range(len(sizes)):
        assert offsets[i] + sizes[i] <= total
        for j in range(i):
            if live[i][0] <= live[j][1] and live[j][0] <= live[i][1]:  # live together: disjoint bytes
                assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i]
    # never more than every buffer side by side
    assert total <= sum((s + ALIGN - 1) // ALIGN * ALIGN for s in sizes)


def test_plan_reuses_dead_buffers():
    offsets, total = plan_offsets([4096, 4096, 1024], [(0, 1), (2, 3), (0, 3)])
    assert offsets[0] == offsets[1] and total == 4096 + 1024


def _pass_names(mod, target, pipeline):
    names = []

    @tvm.ir.instrument.pass_instrument
    class Record:
        def run_before_pass(self, _mod, info):
            names.append(info.name)

    with tvm.transform.PassContext(config={"tirx.use_async_copy": True}, instruments=[Record()]):
        tvm.compile(mod, target=target, tir_pipeline=pipeline)
    return names


def test_pipeline_is_tvms_plus_ours():
    """Our pipeline copies TVM 0.27's pass list: this fails when a TVM update changes it."""
    target = parse_target("cuda:sm_90")
    func = plan(SPEC, target, True, WmmaConfig()).kernels[0]  # a config TVM alone builds
    mod = tvm.IRModule({"main": func.with_attr("tirx.is_scheduled", True)})
    ours = _pass_names(mod, target, register_pipeline())
    assert OURS <= set(ours)
    outer = {"_pipeline", "tvm_b2b_pipeline"}
    assert [n for n in ours if n not in OURS | outer] == [n for n in _pass_names(mod, target, "default") if n not in outer]


def test_fused_kernel_has_one_shared_pool():
    target = parse_target("cuda:sm_90")
    func = plan(SPEC, target, True, WmmaConfig()).kernels[0]
    source = compiled_source([func], target)
    assert len(kernels(source)) == 1
    assert source.count("extern __shared__") == 1 and "b2b_shared_pool" in source


WIDE = FusedConvSpec(n=2, h=14, w=14, c=256, k1=256, k2=1024, residual=True, dtype="float16")
BOTTLENECK = FusedConvSpec(n=2, h=56, w=56, c=64, k1=64, k2=256, residual=True, dtype="float16")  # ResNet-50's first pair


DEPTHWISE = FusedConvSpec(n=1, h=14, w=14, c=576, k1=576, k2=96, act1="relu6", act2="none", residual=True, groups=576,
                          dtype="float16")  # a MobileNetV2 pair


@pytest.mark.parametrize(("spec", "config"), [
    (DEPTHWISE, "m_tile=32,k_tile=32,n2_tile=32,pipeline=1,mma=1,epilogue=0"),
    (DEPTHWISE, "m_tile=32,k_tile=64,n2_tile=32,pipeline=2,mma=1,epilogue=2"),
    (dataclasses.replace(DEPTHWISE, n=32), "m_tile=128,warps_m=4,k_tile=32,n2_tile=32,pipeline=3,mma=1,epilogue=2"),
    (WIDE, "m_tile=32,warps_m=2,warps_n=4,k_tile=16,n1_tile=256,n2_tile=512,pipeline=1"),  # was under-estimated
    (WIDE, "m_tile=64,warps_m=4,warps_n=4,k_tile=16,n1_tile=128,n2_tile=512,pipeline=1"),
    (SPEC, "m_tile=128,warps_m=4,k_tile=64,pipeline=1"), (SPEC, WmmaConfig().to_string()),
    (SPEC, "m_tile=128,warps_m=4,k_tile=64,pipeline=2,mma=1,epilogue=1"), (WIDE, "n1_tile=128,n2_tile=256,mma=1,epilogue=1"),
    (SPEC, "m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2"), (WIDE, "n1_tile=128,n2_tile=256,mma=1,epilogue=2"),
    (BOTTLENECK, "m_tile=128,warps_m=4,k_tile=64,n1_tile=64,n2_tile=64,pipeline=1,mma=1,epilogue=2"),
], ids=lambda v: v if isinstance(v, str) else v.to_string())
def test_shared_bytes_bounds_the_planned_pool(spec, config, monkeypatch):
    """cuda_wmma.shared_bytes (cuda_grouped_pair's for a grouped pair) decides fusing vs two kernels and which
    tuning draws fit the GPU: it must never be below the pool PoolSharedMemory plans (epilogue=2 with a residual:
    its residual tile too). (sm_90's cluster kernel, which takes the batch-1 depthwise pair, off.)"""
    monkeypatch.setenv("TVM_B2B_DW_CLUSTER", "0")
    cfg = WmmaConfig.parse(config)
    target = parse_target("cuda:sm_90")
    planned, launched = [], []
    bound = (cuda_grouped_pair.shared_bytes if spec.groups > 1 else shared_bytes)(spec, cfg)

    @tvm.ir.instrument.pass_instrument
    class Grab:
        def run_after_pass(self, mod, info):
            if info.name in ("tvm_b2b.PoolSharedMemory", "tvm_b2b_pipeline"):  # planned; as the launch sizes it
                pools = [a for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)
                         for a in _allocations(f.body, is_pool)]
                (planned if info.name.startswith("tvm_b2b.") else launched).extend(_bytes(s.buffer) for s in pools)

    func = plan(spec, target, True, cfg).kernels[0]
    with tvm.transform.PassContext(config={"tirx.use_async_copy": True}, instruments=[Grab()]):
        tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline=register_pipeline())
    assert len(planned) == 1 and 0 < planned[0] <= bound
    assert launched == planned  # no later pass resizes the pool (StorageRewrite doubled an all-fp16 one)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_every_mma_fragment_is_lowered_to_registers(fused):
    """TVM 0.27 alone lowers only the first warp-memory buffer of a kernel: the fused kernel's conv2
    accumulators stayed a 1024-element per-thread array (wrong results on the H200) and every ldmatrix
    operand a 512-element one. With LowerAllWarpMemory: 8 registers per 16x16 fragment and thread."""
    target = parse_target("cuda:sm_90")
    cfg = WmmaConfig.parse("mma=1")
    funcs = plan(SPEC, target, fused, cfg).kernels
    source = compiled_source(funcs, target)
    sizes = {name: int(n) for name, n in re.findall(r"(?:float|half) (\w+_warp_ptr)\[(\d+)\]", source)}
    assert sizes and all(n <= 32 for n in sizes.values()), sizes


def _epilogue_kernel(write_offset: int, value=lambda load: load, write_stride: int = 32):
    """A pool holding 256 fp32 (bytes 0-1023 of 2048) and a loop that, after a barrier, reads
    acc[i * 32 + tx] and writes fp16 value(it) to mid[write_offset + i * write_stride + tx]."""
    pool = tirx.decl_buffer((2048,), "uint8", name=f"{POOL_NAME}_uint8", scope="shared.dyn")
    acc = tirx.decl_buffer((512,), "float32", name="acc", data=pool.data, scope="shared.dyn")
    mid = tirx.decl_buffer((1024,), "float16", name="mid", data=pool.data, scope="shared.dyn")
    tx, i = tirx.Var("tx", "int32"), tirx.Var("i", "int32")
    sync = tirx.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared.dyn"))
    store = tirx.BufferStore(mid, tirx.Cast("float16", value(tirx.BufferLoad(acc, [i * 32 + tx]))), [write_offset + i * write_stride + tx])
    loop = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.SeqStmt([sync, store]))
    body = tirx.SeqStmt([tirx.AllocBuffer(pool), tirx.DeclBuffer(acc, data=pool.data), tirx.DeclBuffer(mid, data=pool.data), loop])
    thread = tirx.IterVar(tvm.ir.Range(0, 32), tx, tirx.IterVar.ThreadIndex, "threadIdx.x")
    return tirx.PrimFunc([], tirx.AttrStmt(thread, "thread_extent", 32, body))


PADDED = lambda load: tirx.if_then_else(load > 0, load, tirx.const(0, "float32"))  # noqa: E731 (a value, analyzed)
# a pointer into the pool: what it touches is unknown, so the barrier stays
ADDRESS = lambda load: tirx.Cast("float32", tirx.call_intrin("int64", "tirx.address_of", load))  # noqa: E731


@pytest.mark.parametrize(("write_offset", "value", "hoisted"), [
    (512, None, True), (511, None, False), (0, None, False), (100, None, False), (512, PADDED, True), (512, ADDRESS, False),
])
def test_loop_barrier_moves_out_only_when_reads_and_writes_are_disjoint(write_offset, value, hoisted):
    """acc spans bytes 0-1023 (256 floats read), mid's writes start at byte 2 * write_offset: from
    512 on they cannot meet the reads, and the per-iteration barrier goes before the loop."""
    body = hoist_loop_syncs(_epilogue_kernel(write_offset, value or (lambda load: load))).body
    loops = []
    tvm_ffi.structural_walk(body, [(tirx.For, loops.append)])
    barrier_in_loop = isinstance(loops[0].body, tirx.SeqStmt)
    assert barrier_in_loop != hoisted


@settings(max_examples=60, deadline=None)
@given(write_offset=st.integers(0, 800), write_stride=st.integers(1, 64))
def test_loop_barrier_moves_out_only_when_no_iteration_can_race(write_offset, write_stride):
    """Safe: hoisted only if no byte read (any iteration, any thread) is written by another. Precise
    for these affine accesses: hoisted whenever the read and written byte intervals are apart."""
    reads = {4 * (i * 32 + tx) + b for i in range(8) for tx in range(32) for b in range(4)}
    writes = {2 * (write_offset + i * write_stride + tx) + b for i in range(8) for tx in range(32) for b in range(2)}
    loops = []
    tvm_ffi.structural_walk(hoist_loop_syncs(_epilogue_kernel(write_offset, write_stride=write_stride)).body,
                            [(tirx.For, loops.append)])
    hoisted = not isinstance(loops[0].body, tirx.SeqStmt)
    if hoisted:
        assert not reads & writes
    if max(reads) < min(writes) or max(writes) < min(reads):
        assert hoisted


def test_fused_epilogue_loops_have_no_barrier_per_iteration():
    """ThreadSync alone puts a barrier in every iteration of conv1's epilogue (it sees the pool as one
    buffer); HoistLoopSyncs proves the accumulator reads and `mid` writes disjoint and moves it out."""
    target = parse_target("cuda:sm_90")
    func = plan(SPEC, target, True, WmmaConfig()).kernels[0]
    source = compiled_source([func], target)
    loops = source.split("for (")[1:]  # each loop's header and body, up to the next loop
    epilogue = [body for body in loops if "s1_ptr" in body]  # conv1's epilogue scales by s1
    assert epilogue and not any(re.match(r"[^)]*\) \{\s*__syncthreads\(\);", body) for body in epilogue)


def test_register_epilogue_has_no_fp32_staging(tmp_path):
    """epilogue=1 (mma): both epilogues read the accumulator registers, so the pool holds fp16 only and
    no accumulator is stored to shared memory."""
    from cuda_source import nvcc_arches, nvcc_compile
    from tvm_b2b.schedule import cuda_wmma

    target, cfg = parse_target("cuda:sm_90"), WmmaConfig.parse("mma=1,epilogue=1,pipeline=1")
    source = compiled_source(plan(SPEC, target, True, cfg).kernels, target)
    assert "half b2b_shared_pool_float16_ptr[]" in source and "(float*)b2b_shared_pool" not in source
    assert re.search(r"mid_ptr\[|b2b_shared_pool_float16_ptr\[[^=]*\] = \(\(half\)max\(\(\(conv1_warp_ptr\[", source)
    assert re.search(r"out_ptr\[[^=]*\] = \(\(half\)max\(\(\(conv2_warp_ptr\[", source)
    assert cuda_wmma.shared_bytes(SPEC, cfg) < cuda_wmma.shared_bytes(SPEC, WmmaConfig.parse("mma=1,pipeline=1"))
    if "sm_90" in nvcc_arches():
        nvcc_compile(source, "sm_90", tmp_path)


def test_staged_output_epilogue_stores_128_bits(tmp_path):
    """epilogue=2: the register epilogue writes fp16 into a shared tile, and the global stores (y; mid
    when unfused) are 128-bit; epilogue=1 stores each thread's 2-byte pieces."""
    from cuda_source import nvcc_arches, nvcc_compile

    target, cfg = parse_target("cuda:sm_90"), WmmaConfig.parse("m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2")
    fused = compiled_source(plan(SPEC, target, True, cfg).kernels, target)
    unfused = compiled_source(plan(SPEC, target, False, cfg).kernels, target)
    for source, name in ((fused, "out"), (unfused, "out"), (unfused, "mid")):
        assert f"*(uint4*)({name}_ptr + " in source and not re.search(rf"\b{name}_ptr\[[^\]]*\] = ", source)
    assert "half b2b_shared_pool_float16_ptr[]" in fused and "(float*)b2b_shared_pool" not in fused
    if "sm_90" in nvcc_arches():
        nvcc_compile(fused, "sm_90", tmp_path)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_register_epilogue_loads_the_residual_tile_with_128_bits(fused, tmp_path):
    """epilogue=2 with a residual: all threads load the residual into shared memory with 128-bit
    accesses, and the register epilogue reads it there (from global memory, its reads would be the
    2-byte pieces of the mma layout: 79.4 vs 68.9 us on the H200); epilogue=0 reads it as it always did."""
    from cuda_source import nvcc_arches, nvcc_compile

    target, cfg = parse_target("cuda:sm_90"), WmmaConfig.parse("m_tile=128,k_tile=64,pipeline=1,mma=1,epilogue=2")
    tiled = compiled_source(plan(BOTTLENECK, target, fused, cfg).kernels, target)
    assert "= *(uint4*)(residual_ptr + " in tiled and "residual_ptr[" not in tiled
    staged = compiled_source(plan(BOTTLENECK, target, fused, dataclasses.replace(cfg, epilogue=0)).kernels, target)
    assert "= *(half4*)(residual_ptr + " in staged  # 64-bit loads, no tile
    if "sm_90" in nvcc_arches():
        nvcc_compile(tiled, "sm_90", tmp_path)


@pytest.mark.parametrize("mma", [0, 1])
def test_accumulator_staging_rows_are_padded(mma):
    """64-float rows put all 8 rows of a fragment store on the same banks (8-way conflicts; 8% of the
    fused kernel's time on the H200): the staging rows are 68 floats. tensorize drops the block's
    storage_align, so the schedule sets it again after tensorizing."""
    target = parse_target("cuda:sm_90")
    funcs = plan(SPEC, target, True, WmmaConfig(mma=mma, pipeline=1)).kernels
    source = compiled_source(funcs[:1], target)
    if mma:
        assert re.search(r"\* 68\) \+ \(\(\(\(local_id / 4\) \* 8\)", source)
    else:
        stores = re.findall(r"store_matrix_sync\(.*, (\d+), nvcuda::wmma::mem_row_major\)", source)
        assert stores and set(stores) == {"68"}


def test_async_copies_go_through_l1(monkeypatch):
    """The nine 3x3 taps read overlapping rows of x: cp.async .ca lets L1 serve them (TVM emits .cg,
    L2 only); TVM_B2B_CP_ASYNC=cg keeps TVM's form."""
    target = parse_target("cuda:sm_90")
    funcs = plan(SPEC, target, True, WmmaConfig(pipeline=1, mma=1)).kernels
    source = compiled_source(funcs, target)
    assert "cp.async.ca.shared.global" in source and "cp.async.cg" not in source
    monkeypatch.setenv("TVM_B2B_CP_ASYNC", "cg")
    assert "cp.async.ca" not in compiled_source(funcs, target)
