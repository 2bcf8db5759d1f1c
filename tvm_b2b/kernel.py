"""build(spec, target) -> FusedKernel: the fused op compiled for one target, callable on numpy."""
from __future__ import annotations

import contextlib
import os

import numpy as np

from .op.reference import np_dtype
from .op.spec import FusedConvSpec
from .target import parse_target


class FusedKernel:
    """A compiled fused op. Call it with numpy arrays (x, w1, s1, b1, w2, s2, b2[, residual]);
    it returns y (n, ho, wo, k2) as numpy."""

    def __init__(self, spec: FusedConvSpec, target, executable, func_names: list[str], mid_shape=None, config=None):
        self.spec = spec
        self.target = target
        self.executable = executable
        self.func_names = func_names  # one (fused) or two (unfused stages) kernels, run in order
        self.mid_shape = mid_shape  # the intermediate's global buffer when unfused (may be padded)
        self.config = config  # the schedule parameters it was built with (None: the rule's defaults)

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, x, w1, s1, b1, w2, s2, b2, residual=None) -> np.ndarray:
        arrays = self.check_args(x, w1, s1, b1, w2, s2, b2, residual)
        dev = self.device
        stages = self._device_args(arrays, dev)
        self._run(stages)
        return stages[-1][-1].numpy().reshape(self.spec.out_shape)

    def check_args(self, x, w1, s1, b1, w2, s2, b2, residual=None) -> dict[str, np.ndarray]:
        """The arguments by name, or ValueError naming the first one of wrong shape or dtype."""
        given = dict(x=x, w1=w1, s1=s1, b1=b1, w2=w2, s2=s2, b2=b2)
        if self.spec.residual:
            if residual is None:
                raise ValueError("residual: this spec has residual=1, so a residual array is required")
            given["residual"] = residual
        elif residual is not None:
            raise ValueError("residual: this spec has residual=0, so no residual array is taken")
        for name, (shape, dtype) in self.spec.arg_shapes().items():
            value = given[name]
            if not isinstance(value, np.ndarray):
                raise ValueError(f"{name}: expected a numpy array of shape {shape} and dtype {dtype}, got {type(value).__name__}")
            if value.shape != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {value.shape}")
            if value.dtype != np_dtype(dtype):
                raise ValueError(f"{name}: expected dtype {dtype}, got {value.dtype}")
        return given

    @property
    def device(self):
        import tvm

        return tvm.cuda(0) if self.target.kind.name == "cuda" else tvm.cpu(0)

    def _device_args(self, arrays: dict[str, np.ndarray], dev) -> list[list]:
        """Each kernel's arguments, in run order; the output is the last kernel's last argument.
        The residual and output are passed as their (m, k2) GEMM view."""
        import tvm

        spec = self.spec
        tensors, out = device_arguments(spec, arrays, dev)
        if self.fused:
            return [[*tensors.values(), out]]
        mid = tvm.runtime.empty(self.mid_shape, spec.dtype, dev)
        stage1 = [tensors[k] for k in ("x", "w1", "s1", "b1")] + [mid]
        stage2 = [mid] + [tensors[k] for k in tensors if k not in ("x", "w1", "s1", "b1")] + [out]
        return [stage1, stage2]

    def _run(self, stages: list[list]):
        module = self.executable.jit()
        for name, stage_args in zip(self.func_names, stages):
            module[name](*stage_args)

    # -- measuring and inspecting ---------------------------------------------------------------
    def time_us(self, arrays: dict[str, np.ndarray], number: int = 10, repeat: int = 5) -> float:
        """Median run time in microseconds of the whole op (all its kernels) on these inputs."""
        dev = self.device
        stages = self._device_args(self.check_args(**arrays), dev)
        module = self.executable.jit()
        total = 0.0
        for name, stage_args in zip(self.func_names, stages):
            evaluator = module.time_evaluator(name, dev, number=number, repeat=repeat, min_repeat_ms=20)
            total += float(np.median(evaluator(*stage_args).results))
        return total * 1e6

    def source(self) -> str:
        """Generated source: CUDA for GPU targets, LLVM IR for CPU ones."""
        return generated_source(self.executable, self.target)

    @property
    def fused(self) -> bool:
        return len(self.func_names) == 1


def device_arguments(spec: FusedConvSpec, arrays: dict[str, np.ndarray], dev):
    """({name: device tensor} of the op's inputs in call order, an empty output): the residual
    and the output as their (m, k2) GEMM views, as every kernel of the op takes them."""
    import tvm

    flat = {k: (v.reshape(spec.m, spec.k2) if k == "residual" else np.ascontiguousarray(v)) for k, v in arrays.items()}
    tensors = {k: tvm.runtime.tensor(v, dev) for k, v in flat.items()}
    return tensors, tvm.runtime.empty((spec.m, spec.k2), spec.dtype, dev)


def build(spec: FusedConvSpec, target="llvm", fused: bool = True, config=None, db="auto") -> FusedKernel:
    """Compile the op for `target` (llvm, cuda, cuda:sm_XX, a target JSON or a Target).
    fused=False builds the unfused baseline: two kernels, intermediate in global memory.
    config: the schedule's parameters (CUDA: a WmmaConfig or its text 'm_tile=128,...').
    db: where a CUDA build without a config takes its tuned parameters: "auto" (the shipped
    database of the target's GPU, schedules/<gpu>-<arch>), a directory, or None (defaults)."""
    if not isinstance(spec, FusedConvSpec):
        raise ValueError(f"spec: expected a FusedConvSpec, got {type(spec).__name__}")
    target = parse_target(target)
    config = resolve_config(spec, target, fused, config, db)
    key = (spec, str(target), fused, str(config), *(os.environ.get(v) for v in CODE_ENV))
    if key not in _BUILT:
        _BUILT[key] = _compile(spec, target, fused, config)
    return _BUILT[key]


def resolve_config(spec: FusedConvSpec, target, fused: bool, config=None, db="auto"):
    """The schedule parameters a build uses: the given config, else the tuned one from `db`
    (CUDA, fused op), else None (the rule's defaults)."""
    if config is not None or target.kind.name != "cuda" or not fused or not db:
        return config
    from .tune.database import find_database, tuned_config

    directory = find_database(target) if db == "auto" else db
    if directory is None:
        return None
    from .schedule.cuda_wmma import unsupported_reason
    from .target import cuda_arch_number

    if unsupported_reason(spec, cuda_arch_number(target)):
        return None  # the schedule rule reports it
    return tuned_config(spec, target, directory)


_BUILT: dict[tuple, FusedKernel] = {}  # builds are deterministic: reuse them within a process


def compile_module(mod, target, cuda_graph: bool = False):
    """tvm.compile(mod) with our lowering pipeline (tvm_b2b.lower: TVM's, plus the shared-memory
    planning of our kernels that TVM 0.27 gets wrong). cuda_graph (a Relax module on CUDA): the
    static part of each function is captured as one CUDA graph on its first run and replayed after
    (TVM's RewriteCUDAGraph): one launch instead of one per kernel through the VM."""
    import tvm

    from .lower import pass_config, register_pipeline

    config = pass_config(target)
    if cuda_graph and target.kind.name == "cuda":
        config["relax.backend.use_cuda_graph"] = True
    with tvm.transform.PassContext(config=config), _cuda_source_rewrites(target):
        return tvm.compile(mod, target=target, tir_pipeline=register_pipeline())


def generated_source(executable, target) -> str:
    """The generated device code of a compiled module (a kernel's or a whole model's): the CUDA of
    every kernel for CUDA targets (one translation unit, as the GPU compiles it), else the LLVM IR."""
    if target.kind.name == "cuda":
        return "\n".join(m.inspect_source() for m in _modules(executable.mod) if m.kind == "cuda")
    return "\n".join(m.inspect_source("ll") for m in _modules(executable.mod) if m.kind == "llvm")


def _modules(module):
    """A runtime module and everything it imports, depth first (a Relax VM executable holds the host
    library, which holds the device library)."""
    yield module
    for imported in module.imports:
        yield from _modules(imported)


# Environment variables that change the generated code (a build is cached per their values)
CODE_ENV = ("TVM_B2B_CP_ASYNC",)


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
    """Applies _rewrite_cuda_source to the CUDA source of builds inside (only ours: registered for
    the duration)."""
    import tvm_ffi

    if target.kind.name != "cuda":
        yield
        return
    hook = "tvm_callback_cuda_postproc"  # CUDA codegen's hook on the generated source
    tvm_ffi.register_global_func(hook, lambda code, _target: _rewrite_cuda_source(code), override=True)
    try:
        yield
    finally:
        tvm_ffi.remove_global_func(hook)


def _compile(spec: FusedConvSpec, target, fused: bool, config) -> FusedKernel:
    from .lower import scheduled_module
    from .schedule import scheduled_funcs

    kernels = scheduled_funcs(spec, target, fused, config)
    names = [str(f.attrs["global_symbol"]) for f in kernels.funcs]
    return FusedKernel(spec, target, compile_module(scheduled_module(kernels.funcs), target), names, kernels.mid_shape, config)
