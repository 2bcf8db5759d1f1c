"""The Relax rewrite: each candidate of a registered op kind (op.kind) that its schedule rule takes
becomes call_tir of its kernels for the target (one fused kernel, or the template's two).

`fuse_pairs(mod, target)` is usable inside any TVM pipeline on a module normalized as
normalize.import_model does (NHWC/OHWI convolutions with constant weights).
"""
from __future__ import annotations

import dataclasses
import logging

from tvm import relax

from ..op.kind import op_kinds
from ..schedule import plan as schedule_plan
from ..tune.database import resolve_config

log = logging.getLogger("tvm_b2b")


@relax.expr_functor.mutator
class _KernelRewriter(relax.PyExprMutator):
    """Replaces each planned candidate's last binding with calls of its kernels."""

    def __init__(self, mod, candidates: list):
        super().__init__(mod)
        self.by_last = {c.last: c for c in candidates}
        self.count = 0

    def visit_var_binding_(self, binding):
        candidate = self.by_last.get(binding.var)
        if candidate is None:
            return super().visit_var_binding_(binding)
        value = self._kernel_calls(candidate, str(binding.var.ty.dtype))
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
        self.set_var_remap(binding.var, emit(value))

    def _kernel_calls(self, candidate, model_dtype: str):
        """The candidate's op as calls of its planned kernels (one, or two with the intermediate
        between them), cast from and back to the model's dtype."""
        spec, planned, bb = candidate.spec, candidate.plan, self.builder_

        def model_input(expr):
            value = self.visit_expr(expr)
            return bb.emit(relax.op.astype(value, spec.dtype) if str(expr.ty.dtype) != spec.dtype else value)

        args = candidate.arguments(bb.emit, model_input)
        gvars = []
        for func in planned.kernels:
            name = f"{func.attrs['global_symbol']}_{self.count}"
            gvars.append(bb.add_func(func.with_attr("global_symbol", name).with_attr("tirx.is_scheduled", True), name))
        self.count += 1
        last = planned.kernels[-1]
        out_ty = relax.TensorType([int(d) for d in last.params[-1].shape], spec.dtype)  # its output buffer
        if planned.fused:
            y = bb.emit(relax.call_tir(gvars[0], args, out_ty=out_ty))
        else:  # stage 1 takes the op's first inputs (all its parameters but its output), stage 2 the rest
            first = len(planned.kernels[0].params) - 1
            mid = bb.emit(relax.call_tir(gvars[0], args[:first], out_ty=relax.TensorType(planned.mid_shape, spec.dtype)))
            y = bb.emit(relax.call_tir(gvars[1], [mid, *args[first:]], out_ty=out_ty))
        y = relax.op.reshape(y, spec.out_shape)
        return relax.op.astype(bb.emit(y), model_dtype) if model_dtype != spec.dtype else y


def plan(mod, target, conv_names=None, dtype: str | None = None, fuse: bool = True, db="auto") -> list:
    """Every registered op kind's candidates in mod's main function (op.kind), each planned with
    the target's schedule rule for that kind: a candidate the rule cannot take stays unfused with
    the reason. dtype="float16" runs the fused candidates of a float32 model in float16 (fp32
    accumulation), casting at their boundary. fuse=False: the candidates are listed, none fused (the
    baseline). db: as for tvm_b2b.build."""
    candidates = [c for kind in op_kinds().values() for c in kind.find(mod["main"], conv_names)]
    for candidate in candidates:
        if candidate.fused and not fuse:
            candidate.fused, candidate.reason = False, "--no-fuse"
        if not candidate.fused:
            continue
        if dtype and dtype != candidate.spec.dtype:
            candidate.spec = dataclasses.replace(candidate.spec, dtype=dtype)
        try:
            config = resolve_config(candidate.spec, target, True, None, db)
            # the rule decides what fuses
            candidate.plan = schedule_plan(candidate.spec, target, True, config, policy=True, kind=candidate.kind)
        except ValueError as err:
            candidate.fused, candidate.reason = False, str(err).removeprefix("target: ")
            continue
        if not candidate.plan.fused:
            candidate.fused, candidate.reason = False, f"{candidate.plan.reason}; runs as two tensor-core kernels"
    return candidates


DEFAULT_REASON = "not in a fused pair, and tvm-b2b has no single-convolution kernel yet: TVM's own schedule"


def conv_kernels(conv_names: list[str], pairs: list) -> list[dict]:
    """Every conv of the model (ONNX names, graph order) with the kernel it gets: "fused-pair" (one
    kernel with its partner), "tensorcore" (the template's two tensor-core kernels of a pair that is
    not fused) or "default" (TVM's own schedule), and why."""
    kernels = {}
    for p in pairs:
        if p.fused:
            kernel, reason = "fused-pair", f"fused: {' -> '.join(p.convs)}"
        elif p.plan is not None:
            kernel, reason = "tensorcore", p.reason
        else:
            continue  # a pair that is not run by our kernels: its convs get the default
        kernels.update({name: (kernel, reason) for name in p.convs})
    reasons = {name: f"{DEFAULT_REASON} (its pair: {p.reason})" for p in pairs if p.plan is None
               for name in p.convs}
    return [{"name": name, "kernel": kernels.get(name, ("default",))[0],
             "reason": kernels[name][1] if name in kernels else reasons.get(name, DEFAULT_REASON)} for name in conv_names]


def fuse_pairs(mod, target, pairs: list | None = None):
    """mod with every planned pair replaced by its kernels (the fused one, or the template's two
    where fusing does not pay); (module, pairs)."""
    pairs = plan(mod, target) if pairs is None else pairs
    fused = [p for p in pairs if p.plan is not None]
    for p in pairs:
        if not p.fused:
            log.info("not fused: %s -> %s: %s", p.conv3x3, p.conv1x1, p.reason)
    if not fused:
        return mod, pairs
    rewriter = _KernelRewriter(mod, fused)
    main = rewriter.visit_expr(mod["main"])
    out = rewriter.builder_.get()
    out["main"] = main
    out = relax.transform.DeadCodeElimination()(out)
    return out, pairs
