"""The Relax rewrite: each candidate of a registered op kind (op.kind) that its schedule rule takes
becomes call_tir of its kernels for the target (one fused kernel, or the template's two).

`fuse_pairs(mod, target)` is usable inside any TVM pipeline on a module normalized as
normalize.import_model does (NHWC/OHWI convolutions with constant weights).
"""
from __future__ import annotations

import dataclasses
import logging

from tvm import relax

from ..op.activation import relax_op
from ..op.kind import op_kinds
from ..op.spec import OP_KIND as PAIR
from ..schedule import plan as schedule_plan
from ..op.fused_pair import as_single_convs
from ..tune.database import best_us, resolve_config

log = logging.getLogger("tvm_b2b")


# ops whose result in float16 is exactly the float16 rounding of their float32 result: where their
# input is a kernel's float16 output cast up, they run on it in float16 (no casts around them)
EXACT_IN_FLOAT16 = {"relax.nn.max_pool2d", "relax.nn.relu", "relax.reshape", "relax.permute_dims"}


@relax.expr_functor.mutator
class _KernelRewriter(relax.PyExprMutator):
    """Replaces each planned candidate's last binding with calls of its kernels. Between kernels the
    data stays in the kernels' dtype: a kernel's output cast back to the model's dtype is remembered
    (`narrow`: model-dtype var -> the kernel-dtype value) and the next kernel, or an op exact in that
    dtype, takes the value before the cast."""

    def __init__(self, mod, candidates: list):
        super().__init__(mod)
        self.by_last = {c.last: c for c in candidates}
        self.count = 0
        self.narrow: dict = {}
        self.views: dict = {}  # a kernel output's reshaped view (n, h, w, k) -> the output itself (m, k)

    def visit_var_binding_(self, binding):
        candidate = self.by_last.get(binding.var)
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
        if candidate is not None:
            narrow = self._kernel_calls(candidate)
        else:
            narrow = self._exact_op(binding.value)
            if narrow is None:
                return super().visit_var_binding_(binding)
        model_dtype = str(binding.var.ty.dtype)
        if str(narrow.ty.dtype) == model_dtype:
            self.set_var_remap(binding.var, emit(narrow) if not isinstance(binding.var, relax.DataflowVar) else narrow)
            return
        var = emit(relax.op.astype(narrow, model_dtype))
        self.narrow[var] = narrow
        self.set_var_remap(binding.var, var)

    def _exact_op(self, value):
        """An op of EXACT_IN_FLOAT16 on a kernel's output, bound in the kernel's dtype; else None."""
        if not isinstance(value, relax.Call) or getattr(value.op, "name", "") not in EXACT_IN_FLOAT16:
            return None
        data = self.visit_expr(value.args[0])
        if data not in self.narrow:
            return None
        return self.builder_.emit(relax.Call(value.op, [self.narrow[data], *value.args[1:]], value.attrs))

    def _in_dtype(self, expr, dtype: str):
        """expr (of the graph) rewritten and in `dtype`: a kernel's output before its cast back, or cast."""
        value = self.visit_expr(expr)
        if value in self.narrow and str(self.narrow[value].ty.dtype) == dtype:
            return self.narrow[value]
        return self.builder_.emit(relax.op.astype(value, dtype)) if str(expr.ty.dtype) != dtype else value

    def _kernel_calls(self, candidate):
        """The candidate's op as calls of its planned kernels (one, or two with the intermediate
        between them), bound, in the kernels' dtype."""
        spec, planned, bb = candidate.spec, candidate.plan, self.builder_
        args = candidate.arguments(self._emit, lambda expr: self._in_dtype(expr, spec.dtype))
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
            mid_ty = relax.TensorType(planned.mid_shape, planned.mid_dtype or spec.dtype)
            mid = bb.emit(relax.call_tir(gvars[0], args[:first], out_ty=mid_ty))
            y = bb.emit(relax.call_tir(gvars[1], [mid, *args[first:]], out_ty=out_ty))
        view = bb.emit(relax.op.reshape(y, candidate.out_shape))
        self.views[view] = y
        return view

    def _emit(self, value):
        """value bound, except a reshape of a kernel output's view back to the output's own shape (a
        residual as its GEMM view), which is that output: TVM would fuse the two reshapes into a copy
        kernel (H200, ResNet-50 at batch 32: four of them, 51 MB the largest)."""
        source = self.views.get(value.args[0]) if relax_op(value) == "relax.reshape" else None
        if source is not None and [int(d) for d in value.args[1].values] == [int(d) for d in source.ty.shape]:
            return source
        return self.builder_.emit(value)


def plan(mod, target, conv_names=None, dtype: str | None = None, fuse: bool = True, db="auto", progress=None) -> list:
    """Every registered op kind's candidates in mod's main function (op.kind), each planned with
    the target's schedule rule for that kind: a candidate the rule cannot take stays as it is, with
    the reason. Kinds are asked in op.kind's order, each after the bindings that the planned
    candidates of the kinds before it cover (a conv in a fused pair is no single conv). dtype="float16"
    runs the candidates of a float32 model in float16 (fp32 accumulation), casting at their boundary.
    fuse=False: no pair fuses (the baseline: their convs run as single convs). db: as for tvm_b2b.build.
    progress: called with a line per candidate scheduled."""
    candidates, claimed = [], frozenset()
    for kind in op_kinds().values():
        found = kind.find(mod["main"], conv_names, claimed)
        for i, candidate in enumerate(found, 1):
            if progress and candidate.fused:
                progress(f"scheduling {kind.name} {i}/{len(found)}: {' -> '.join(candidate.convs)}")
            _plan_candidate(candidate, target, dtype, fuse, db)
        claimed = claimed.union(*(c.bindings for c in found if c.plan is not None))
        candidates += found
    return candidates


def _plan_candidate(candidate, target, dtype, fuse: bool, db) -> None:
    if candidate.fused and not fuse and candidate.kind == PAIR:
        candidate.fused, candidate.reason = False, "--no-fuse"
    if not candidate.fused:
        return
    if dtype and dtype != candidate.spec.dtype:
        candidate.spec = dataclasses.replace(candidate.spec, dtype=dtype)
    measured = _measured_fusion(candidate, target, db)
    if measured and measured[0] > measured[1]:
        candidate.fused, candidate.fusable = False, True
        candidate.reason = (f"measured faster as two single convs ({measured[1]:.1f} us) than fused ({measured[0]:.1f} us); "
                            "its convs run as single convs")
        return
    try:
        config = resolve_config(candidate.spec, target, True, None, db)
        # the rule decides what fuses: by its measured rule, unless the database measured both forms
        candidate.plan = schedule_plan(candidate.spec, target, True, config, policy=measured is None, kind=candidate.kind,
                                       unfused=False)
    except ValueError as err:
        candidate.fused, candidate.reason = False, str(err).removeprefix("target: ")
        return
    candidate.fusable = candidate.kind == PAIR and candidate.plan.fusable
    candidate.config = config_note(candidate.plan.config, tuned=config is not None)
    if candidate.kind == PAIR and not candidate.plan.fused:
        # its convs are single convs then (the next kind's): the same template, exact extents, split-K
        reason = candidate.plan.reason + (f" (not on {candidate.plan.passed_over})" if candidate.plan.passed_over else "")
        candidate.fused, candidate.plan, candidate.reason = False, None, f"{reason}; its convs run as single convs"


def config_note(config, tuned: bool) -> str:
    """What `report` says of a planned kernel's parameters: "tuned: ..." (the database's record) or "default: ..."
    (its rule's), "" where the rule has none."""
    if config is None:
        return ""
    return f"{'tuned' if tuned else 'default'}: {config.to_string() if hasattr(config, 'to_string') else config}"


def _measured_fusion(candidate, target, db) -> tuple[float, float] | None:
    """(fused µs, µs of its two single convs) of a pair where the tuning database holds records of the
    fused kernel and of both convs as single convs (op.fused_pair.as_single_convs), else None."""
    if candidate.kind != PAIR or not db:
        return None
    fused = best_us(candidate.spec, target, db)
    halves = [best_us(spec, target, db) for spec in as_single_convs(candidate.spec)] if fused else [None]
    return None if None in halves else (fused, sum(halves))


def pairs_of(candidates: list) -> list:
    """The fused pair's candidates among all kinds' (what `report` and `compile` list as pairs)."""
    return [c for c in candidates if c.kind == PAIR]


def conv_kernels(conv_names: list[str], candidates: list) -> list[dict]:
    """Every conv of the model (ONNX names, graph order) with the kernel it gets: "fused-pair" (one
    kernel with its partner), "tensorcore" (a single conv on our tensor-core kernel), "cpu" (our CPU
    kernel of a single conv), "cuda-core" (a grouped conv on our CUDA-core kernel) or "default" (TVM's own
    schedule), and why."""
    kernels = {}
    for c in candidates:
        if c.plan is None:
            continue
        if c.kind == PAIR:  # planned pairs are fused ones: the others leave their convs to the single conv
            kernel, reason = "fused-pair", f"fused: {' -> '.join(c.convs)}"
        else:
            kernel, form = c.plan.kernel, c.plan.input_form
            reason = f"single conv: {c.spec.to_string()}"
            if form is not None and form.cells:
                reason += f" (run as its space-to-depth stride-1 conv: {form.spec(c.spec).to_string()})"
            if form is not None and form.weights == "kc":
                reason += " (sm_90's TMA + wgmma kernel)"
            if c.plan.passed_over:
                reason += f" (not on {c.plan.passed_over})"
        if c.config:
            reason += f" [{c.config}]"
        if c.kind != PAIR and not c.plan.fused and c.plan.mid_dtype == "float32":  # split-K: (slices, m, k) partial sums
            reason += f" (reduction split {c.plan.mid_shape[0]} ways: float32 partial sums, then a kernel that adds them)"
        kernels.update({name: (kernel, reason) for name in c.convs})
    reasons = {}
    for c in candidates:  # the last kind's reason is the one that decided
        if c.plan is None:
            reasons.update({name: c.reason for name in c.convs})
    return [{"name": name, "kernel": kernels.get(name, ("default",))[0],
             "reason": kernels[name][1] if name in kernels else f"TVM's own schedule: {reasons.get(name, 'no op kind matched')}"}
            for name in conv_names]


def fuse_pairs(mod, target, pairs: list | None = None):
    """mod with every planned candidate (of every op kind: `plan`) replaced by its kernels (a pair's
    fused one, or the template's two where fusing does not pay; a single conv's); (module, candidates)."""
    pairs = plan(mod, target) if pairs is None else pairs
    fused = [p for p in pairs if p.plan is not None]
    for p in pairs:
        if not p.fused:
            log.info("not run by tvm-b2b's kernels as %s: %s: %s", p.kind, " -> ".join(p.convs), p.reason)
    if not fused:
        return mod, pairs
    rewriter = _KernelRewriter(mod, fused)
    main = rewriter.visit_expr(mod["main"])
    out = rewriter.builder_.get()
    out["main"] = main
    out = relax.transform.DeadCodeElimination()(out)
    return out, pairs
