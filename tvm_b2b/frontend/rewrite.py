"""The Relax rewrite: each fusable pair becomes a call_tir of the fused kernel for the target.

`fuse_pairs(mod, target)` is usable inside any TVM pipeline on a module normalized as
normalize.import_model does (NHWC/OHWI convolutions with constant weights).
"""
from __future__ import annotations

import dataclasses
import logging

from tvm import relax

from ..op.reference import np_dtype
from ..tune.database import resolve_config
from ..schedule import plan as schedule_plan
from .pairs import Pair, find_pairs

log = logging.getLogger("tvm_b2b")


@relax.expr_functor.mutator
class _PairRewriter(relax.PyExprMutator):
    def __init__(self, mod, pairs: list[Pair]):
        super().__init__(mod)
        self.by_last = {pair.last: pair for pair in pairs}
        self.count = 0

    def visit_var_binding_(self, binding):
        pair = self.by_last.get(binding.var)
        if pair is None:
            return super().visit_var_binding_(binding)
        value = self._fused_call(pair)
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else self.builder_.emit_output
        self.set_var_remap(binding.var, emit(value))

    def _fused_call(self, pair: Pair):
        spec, planned, bb = pair.spec, pair.plan, self.builder_
        dt = np_dtype(spec.dtype)
        p = pair.params
        consts = [relax.const(p["w1"].astype(dt)), relax.const(p["s1"]), relax.const(p["b1"])]
        stage2 = [relax.const(p["w2"].astype(dt)), relax.const(p["s2"]), relax.const(p["b2"])]
        model_dtype = str(pair.x.ty.dtype)
        cast = (lambda e: bb.emit(relax.op.astype(e, spec.dtype))) if model_dtype != spec.dtype else bb.emit  # noqa: E731
        if pair.residual is not None:
            stage2.append(bb.emit(relax.op.reshape(cast(self.visit_expr(pair.residual)), (spec.m, spec.k2))))
        gvars = []
        for func in planned.kernels:
            name = f"{func.attrs['global_symbol']}_{self.count}"
            gvars.append(bb.add_func(func.with_attr("global_symbol", name).with_attr("tirx.is_scheduled", True), name))
        self.count += 1
        out_ty = relax.TensorType((spec.m, spec.k2), spec.dtype)
        x = cast(self.visit_expr(pair.x))
        if planned.fused:
            y = bb.emit(relax.call_tir(gvars[0], [x, *consts, *stage2], out_ty=out_ty))
        else:
            mid = bb.emit(relax.call_tir(gvars[0], [x, *consts], out_ty=relax.TensorType(planned.mid_shape, spec.dtype)))
            y = bb.emit(relax.call_tir(gvars[1], [mid, *stage2], out_ty=out_ty))
        y = relax.op.reshape(y, spec.out_shape)
        return relax.op.astype(bb.emit(y), model_dtype) if model_dtype != spec.dtype else y


def plan(mod, target, conv_names=None, dtype: str | None = None, fuse: bool = True, db="auto") -> list[Pair]:
    """The pairs of mod's main function, each checked against the target's schedule: a pair
    the target's kernel cannot take stays unfused with the reason. dtype="float16" runs the
    fused pairs of a float32 model in float16 (fp32 accumulation), casting at their boundary.
    fuse=False: the pairs are listed, none fused (the baseline). db: as for tvm_b2b.build."""
    pairs = find_pairs(mod["main"], conv_names)
    for pair in pairs:
        if pair.fused and not fuse:
            pair.fused, pair.reason = False, "--no-fuse"
        if not pair.fused:
            continue
        if dtype and dtype != pair.spec.dtype:
            pair.spec = dataclasses.replace(pair.spec, dtype=dtype)
        try:
            config = resolve_config(pair.spec, target, True, None, db)
            pair.plan = schedule_plan(pair.spec, target, True, config, policy=True)  # the rule decides what fuses
        except ValueError as err:
            pair.fused, pair.reason = False, str(err).removeprefix("target: ")
            continue
        if not pair.plan.fused:
            pair.fused, pair.reason = False, f"{pair.plan.reason}; runs as two tensor-core kernels"
    return pairs


DEFAULT_REASON = "not in a fused pair, and tvm-b2b has no single-convolution kernel yet: TVM's own schedule"


def conv_kernels(conv_names: list[str], pairs: list[Pair]) -> list[dict]:
    """Every conv of the model (ONNX names, graph order) with the kernel it gets: "fused-pair" (one
    kernel with its partner), "tensorcore" (the template's two tensor-core kernels of a pair that is
    not fused) or "default" (TVM's own schedule), and why."""
    kernels = {}
    for p in pairs:
        if p.fused:
            kernel, reason = "fused-pair", f"fused: {p.conv3x3} -> {p.conv1x1}"
        elif p.plan is not None:
            kernel, reason = "tensorcore", p.reason
        else:
            continue  # a pair that is not run by our kernels: its convs get the default
        kernels[p.conv3x3] = kernels[p.conv1x1] = (kernel, reason)
    reasons = {name: f"{DEFAULT_REASON} (its pair: {p.reason})" for p in pairs if p.plan is None
               for name in (p.conv3x3, p.conv1x1)}
    return [{"name": name, "kernel": kernels.get(name, ("default",))[0],
             "reason": kernels[name][1] if name in kernels else reasons.get(name, DEFAULT_REASON)} for name in conv_names]


def fuse_pairs(mod, target, pairs: list[Pair] | None = None):
    """mod with every planned pair replaced by its kernels (the fused one, or the template's two
    where fusing does not pay); (module, pairs)."""
    pairs = plan(mod, target) if pairs is None else pairs
    fused = [p for p in pairs if p.plan is not None]
    for p in pairs:
        if not p.fused:
            log.info("not fused: %s -> %s: %s", p.conv3x3, p.conv1x1, p.reason)
    if not fused:
        return mod, pairs
    rewriter = _PairRewriter(mod, fused)
    main = rewriter.visit_expr(mod["main"])
    out = rewriter.builder_.get()
    out["main"] = main
    out = relax.transform.DeadCodeElimination()(out)
    return out, pairs
