"""Schedule rules of the fused op, one per target kind and file: `cpu` (llvm; also a dlight-style
`apply(func, target)`) and `cuda_wmma` (tensor cores). A rule is an object (CUTLASS's kernel with its
`can_implement`, dlight's rule) with:
  - name, and can_implement(spec, info) -> why it cannot run the spec on that target, or None;
  - default_config(spec, info), knobs (what tuning searches), parse_config(text or config);
  - plan(spec, info, config, fused, policy, unfused) -> Plan: the op's kernels, scheduled, and whether they run
    it fused. The rule's plan is the one place that decides that (its shared memory, its epilogue
    fallback, and with `policy` the measured rule of when fusing pays).
`RULES` names the rule of each (op kind, target kind); `plan` below picks it; `info` is the target's TargetInfo.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..op.conv_spec import OP_KIND as CONV
from ..op.spec import OP_KIND
from ..target import target_info


@dataclass
class Plan:
    """What a schedule rule hands to the build."""

    kernels: list  # scheduled PrimFuncs, each with its own global symbol, in run order
    fused: bool  # one kernel for the whole op; else stage 1 then stage 2
    config: object = None  # the parameters the kernels were scheduled with (None: the rule has none)
    reason: str = ""  # why the op does not run fused
    mid_shape: tuple | None = None  # the intermediate's global buffer when there are two kernels
    schedules: list = field(default_factory=list)  # the kernels' s_tir.Schedules (their traces, for tuning records)
    input_channels: int | None = None  # x's channels as the kernels take them, when they pad it (zeros)
    mid_dtype: str | None = None  # the intermediate's dtype when not the op's (split-K's float32 partial sums)


# (op kind, target kind) -> the module under schedule/ whose RULE schedules that kind for that target
RULES = {(OP_KIND, "llvm"): "cpu", (OP_KIND, "cuda"): "cuda_wmma", (CONV, "llvm"): "cpu_conv", (CONV, "cuda"): "cuda_conv"}


def kind_of(spec) -> str:
    """The op kind (op.kind's registry) whose spec type `spec` is."""
    from ..op.kind import op_kinds

    return next(k.name for k in op_kinds().values() if isinstance(spec, k.spec))


def rule_for(target, kind: str = OP_KIND):
    """The schedule rule of an op kind on a target's kind (ValueError where none serves)."""
    import importlib

    info = target_info(target)
    module = RULES.get((kind, info.kind))
    if module is None:
        raise ValueError(f"target: no schedule for {kind} on {info.kind} targets (use llvm or cuda)")
    return importlib.import_module(f"{__name__}.{module}").RULE


def plan(spec, target, fused: bool = True, config=None, policy: bool = False,
         kind: str | None = None, unfused: bool = True) -> Plan:
    """The op's kernels for `target`, scheduled by the rule for its kind. fused=False asks for the
    two-kernel form; policy: fuse only where the rule measured fusing to pay (a model's pairs);
    config: the rule's parameters (None: its defaults); unfused=False: a plan that does not fuse has
    no kernels (the caller runs the op another way)."""
    info = target_info(target)
    rule = rule_for(info, kind or kind_of(spec))
    reason = rule.can_implement(spec, info)
    if reason:
        raise ValueError(f"target: no {rule.name} schedule for this spec: {reason}")
    return rule.plan(spec, info, rule.parse_config(config), fused, policy, unfused)
