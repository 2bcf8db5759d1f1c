"""build(spec, target) -> FusedKernel: the fused op compiled for one target, callable on numpy."""
from __future__ import annotations

import numpy as np

from .op.conv_spec import ConvSpec
from .op.reference import np_dtype
from .op.spec import FusedConvSpec
from .target import parse_target, target_info


class FusedKernel:
    """A compiled op of any kind (op.kind): the fused pair, called with numpy arrays (x, w1, s1, b1, w2,
    s2, b2[, residual]), or a single conv (x, w, s, b[, residual]): its spec's arg_shapes, by position
    or name. Returns y (n, ho, wo, channels) as numpy."""

    def __init__(self, spec, target, executable, func_names: list[str], mid_shape=None, config=None,
                 fused: bool = True, input_form=None, stage1_inputs: int = 4, mid_dtype: str | None = None):
        self.spec = spec
        self.input_form = input_form  # how the kernel takes x and w where not as given (op.conv.InputForm)
        self.stage1_inputs = stage1_inputs  # with two kernels: how many of the op's inputs the first takes
        self.mid_dtype = mid_dtype  # with two kernels: the intermediate's dtype when not the op's
        self.target = target
        self.executable = executable
        self.func_names = func_names  # one (fused) or two (unfused stages) kernels, run in order
        self.mid_shape = mid_shape  # the intermediate's global buffer when unfused (may be padded)
        self.config = config  # the schedule parameters it was built with (None: the rule's defaults)
        self.fused = fused  # one kernel for the whole op (the schedule rule's plan decided)

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs) -> np.ndarray:
        arrays = self.check_args(*args, **kwargs)
        dev = self.device
        stages = self._device_args(arrays, dev)
        self._run(stages)
        return stages[-1][-1].numpy().reshape(self.spec.out_shape)

    def check_args(self, *args, **kwargs) -> dict[str, np.ndarray]:
        """The arguments by name (positional ones in the spec's order), or ValueError naming the
        first one missing or of wrong shape or dtype."""
        shapes = self.spec.arg_shapes()
        names = [n for n in shapes if n != "residual"] + ["residual"]
        given = dict(zip(names, args), **kwargs)
        if len(args) > len(names) or set(given) - set(names):
            raise ValueError(f"arguments: this op takes {', '.join(names[:-1])}[, residual]")
        residual = given.pop("residual", None)
        if self.spec.residual:
            if residual is None:
                raise ValueError("residual: this spec has residual=1, so a residual array is required")
            given["residual"] = residual
        elif residual is not None:
            raise ValueError("residual: this spec has residual=0, so no residual array is taken")
        for name, (shape, dtype) in shapes.items():
            value = given.get(name)
            if not isinstance(value, np.ndarray):
                raise ValueError(f"{name}: expected a numpy array of shape {shape} and dtype {dtype}, got {type(value).__name__}")
            if value.shape != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {value.shape}")
            if value.dtype != np_dtype(dtype):
                raise ValueError(f"{name}: expected dtype {dtype}, got {value.dtype}")
        return {name: given[name] for name in shapes}

    @property
    def device(self):
        import tvm

        return tvm.cuda(0) if target_info(self.target).is_cuda else tvm.cpu(0)

    def _device_args(self, arrays: dict[str, np.ndarray], dev) -> list[list]:
        """Each kernel's arguments, in run order; the output is the last kernel's last argument.
        The residual and output are passed as their (m, k2) GEMM view."""
        import tvm

        from .op.device import formed_arguments

        tensors, out = formed_arguments(self.spec, arrays, dev, self.input_form)
        if len(self.func_names) == 1:
            return [[*tensors.values(), out]]
        mid = tvm.runtime.empty(self.mid_shape, self.mid_dtype or self.spec.dtype, dev)
        given = list(tensors.values())  # stage 1 takes the op's first inputs, stage 2 the intermediate and the rest
        return [given[: self.stage1_inputs] + [mid], [mid] + given[self.stage1_inputs:] + [out]]

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
        from .codegen import generated_source

        return generated_source(self.executable, self.target)


def build(spec, target="llvm", fused: bool = True, config=None, db="auto") -> FusedKernel:
    """Compile the op of `spec` (a FusedConvSpec, or a ConvSpec: a single conv) for `target` (llvm,
    cuda, cuda:sm_XX, a target JSON or a Target).
    fused=False builds the unfused baseline: two kernels, intermediate in global memory.
    config: the schedule's parameters (CUDA: a WmmaConfig or its text 'm_tile=128,...').
    db: where a CUDA build without a config takes its tuned parameters: "auto" (the shipped
    database of the target's GPU, schedules/<gpu>-<arch>), a directory, or None (defaults)."""
    if not isinstance(spec, (FusedConvSpec, ConvSpec)):
        raise ValueError(f"spec: expected a FusedConvSpec or a ConvSpec, got {type(spec).__name__}")
    from .codegen import code_env
    from .tune.database import resolve_config

    target = parse_target(target)
    config = resolve_config(spec, target, fused, config, db)
    key = (spec, str(target), fused, str(config), code_env())
    if key not in _BUILT:
        _BUILT[key] = _compile(spec, target, fused, config)
    return _BUILT[key]


_BUILT: dict[tuple, FusedKernel] = {}  # builds are deterministic: reuse them within a process


def _compile(spec, target, fused: bool, config) -> FusedKernel:
    from .codegen import compile_module
    from .lower import scheduled_module
    from .schedule import plan

    planned = plan(spec, target, fused, config)
    names = [str(f.attrs["global_symbol"]) for f in planned.kernels]
    return FusedKernel(spec, target, compile_module(scheduled_module(planned.kernels), target), names, planned.mid_shape, config,
                       planned.fused, planned.input_form, len(planned.kernels[0].params) - 1, planned.mid_dtype)
