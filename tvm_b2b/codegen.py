"""Compilation of scheduled kernels and of whole models: tvm.compile with our lowering pipeline
(tvm_b2b.lower), our CUDA source rewrites (chained to any hook already registered), and the
generated source of a build."""
from __future__ import annotations

import contextlib
import os

import tvm
import tvm_ffi

from .lower import has_tirx_kernels, pass_config, register_pipeline
from .target import target_info


def compile_module(mod, target, cuda_graph: bool = False, rules=()):
    """tvm.compile(mod) with our lowering pipeline (tvm_b2b.lower: TVM's, plus the shared-memory
    planning of our kernels that TVM 0.27 gets wrong). cuda_graph (a Relax module on CUDA): the
    static part of each function is captured as one CUDA graph on its first run and replayed after
    (TVM's RewriteCUDAGraph): one launch instead of one per kernel through the VM. rules (a Relax
    module on CUDA): dlight rules asked before TVM's own for the kernels that TVM legalizes."""
    config = pass_config(target)
    cuda = target_info(target).is_cuda
    target = target_info(target).target
    if cuda and has_tirx_kernels(mod) and str(target.attrs.get("arch", "")) == "sm_90":
        # wgmma and its kin are sm_90a's (arch-specific): NVRTC/nvcc compile for sm_90a, which runs only on sm_90
        target = tvm.target.Target({**target.export(), "arch": "sm_90a"})
    if cuda_graph and cuda:
        config["relax.backend.use_cuda_graph"] = True
    pipeline = _cuda_relax_pipeline(target, rules) if rules and cuda else "default"
    with tvm.transform.PassContext(config=config), _cuda_source_rewrites(target):
        return tvm.compile(mod, target=target, relax_pipeline=pipeline, tir_pipeline=register_pipeline())


def _cuda_relax_pipeline(target, rules):
    """TVM's Relax pipeline for CUDA (relax.backend.cuda.pipeline) with `rules` asked first where it
    schedules the legalized kernels (its dlight ApplyDefaultSchedule, given TVM 0.27's rules after ours)."""
    from tvm.relax.backend.cuda import pipeline as cuda
    from tvm.s_tir import dlight as dl

    ours = dl.ApplyDefaultSchedule(*rules, dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                   dl.gpu.Fallback())
    legalize = cuda.legalize_passes(target)
    scheduling = [i for i, p in enumerate(legalize) if p.info.name == "ApplyDefaultSchedule"]
    if len(scheduling) != 1:  # a TVM whose pipeline we do not know: say so rather than build without our rules
        raise RuntimeError(f"TVM's CUDA pipeline has {len(scheduling)} ApplyDefaultSchedule passes (tvm-b2b expects 1)")
    legalize[scheduling[0]] = ours
    passes = cuda.library_dispatch_passes(target) + legalize + cuda.dataflow_lower_passes(target) + cuda.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="TvmB2bCudaPipeline")
    def pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return pipeline


def generated_source(executable, target) -> str:
    """The generated device code of a compiled module (a kernel's or a whole model's): the CUDA of
    every kernel for CUDA targets (one translation unit, as the GPU compiles it), else the LLVM IR."""
    if target_info(target).is_cuda:
        return "\n".join(m.inspect_source() for m in _modules(executable.mod) if m.kind == "cuda")
    return "\n".join(m.inspect_source("ll") for m in _modules(executable.mod) if m.kind == "llvm")


def _modules(module):
    """A runtime module and everything it imports, depth first (a Relax VM executable holds the host
    library, which holds the device library)."""
    yield module
    for imported in module.imports:
        yield from _modules(imported)


def code_env() -> tuple:
    """The TVM_B2B_* switches set now (a build is cached per their values): every one but the traceback switch may
    change the generated code or the records a build takes, and a list of them by name missed new ones (a process
    that built under TVM_B2B_HOPPER_PERSIST=1 after a build without it reused the first kernel)."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("TVM_B2B_") and k != "TVM_B2B_TRACEBACK"))


def _rewrite_cuda_source(code: str) -> str:
    """16-byte cp.async as .ca (through L1) instead of TVM's .cg (L2 only): the nine 3x3 taps read
    overlapping rows of x, which L1 then serves (H200, N=32 56x56 64->64->128: 54.4 -> 49.6 us,
    bench/results/h200_s5_1_*); TVM_B2B_CP_ASYNC=cg keeps TVM's, for comparison. (Asking for 4 resident
    blocks per SM with `__launch_bounds__(threads, 4)` measured slower: 44.5 vs 41.3 us at 64->64->128,
    bench/results/h200_s7_2_*.)"""
    if os.environ.get("TVM_B2B_CP_ASYNC") != "cg":
        code = code.replace("cp.async.cg.shared.global", "cp.async.ca.shared.global")
    return code


@contextlib.contextmanager
def _cuda_source_rewrites(target):
    """Applies _rewrite_cuda_source to the CUDA source of builds inside, after any hook that was
    registered before (a user's own), which is back in place afterwards."""
    if not target_info(target).is_cuda:
        yield
        return
    hook = "tvm_callback_cuda_postproc"  # CUDA codegen's hook on the generated source
    previous = tvm_ffi.get_global_func(hook, allow_missing=True)

    def chained(code, target_):
        return _rewrite_cuda_source(previous(code, target_) if previous is not None else code)

    tvm_ffi.register_global_func(hook, chained, override=True)
    try:
        yield
    finally:
        if previous is None:
            tvm_ffi.remove_global_func(hook)
        else:
            tvm_ffi.register_global_func(hook, previous, override=True)
