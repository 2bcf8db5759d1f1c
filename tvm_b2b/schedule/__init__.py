"""Schedule rules of the op kinds, one per template and file: `cpu`, `cpu_conv` (llvm), `cuda_wmma`,
`cuda_conv` (tensor cores), `cuda_hopper_conv` and `cuda_hopper_pair` (sm_90's TMA + wgmma, where they measured faster),
`cuda_cluster_dw_pair` (sm_90: a depthwise pair split over a thread-block cluster), `cuda_grouped_pair` (a grouped
3x3 on CUDA cores feeding a 1x1 on tensor cores), `cuda_grouped_conv` (CUDA cores). A rule is an object (CUTLASS's kernel with its
`can_implement`, dlight's rule) with:
  - name, and can_implement(spec, info) -> why it cannot run the spec on that target, or None;
  - default_config(spec, info), knobs (what tuning searches), parse_config(text or config);
  - plan(spec, info, config, fused, policy, unfused) -> Plan: the op's kernels, scheduled, and whether they run
    it fused. The rule's plan is the one place that decides that (its shared memory, its epilogue
    fallback, and with `policy` the measured rule of when fusing pays).
`RULES` names the rules of each (op kind, target kind) in the order they are asked (`LEGALIZED_RULES`
those of the ops TVM legalizes: `cuda_pool`, `cuda_layout`); `plan` below
picks the first that can implement the spec (as dlight tries its rules); `info` is the target's TargetInfo.
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
    input_form: object = None  # how the kernels take x and w where not as given (op.conv.InputForm), else None
    mid_dtype: str | None = None  # the intermediate's dtype when not the op's (split-K's float32 partial sums)
    kernel: str = "tensorcore"  # what runs it, as `report` names it: "tensorcore", "cuda-core" or "cpu"
    fusable: bool = True  # the rule can run it fused (where `fused` is False, only its fusion policy declined)
    passed_over: str = ""  # an optional rule asked first that computes the op but measured slower, and why (report)


# (op kind, target kind) -> the modules under schedule/ whose RULEs schedule that kind for that target
RULES = {
    (OP_KIND, "llvm"): ("cpu",),
    (OP_KIND, "cuda"): ("cuda_hopper_pair", "cuda_wmma", "cuda_cluster_dw_pair", "cuda_grouped_pair"),
    (CONV, "llvm"): ("cpu_conv",),
    (CONV, "cuda"): ("cuda_hopper_conv", "cuda_conv", "cuda_grouped_conv"),
}


# dlight rules (TVM's `apply(func, target, tunable) -> Schedule | None`) of the ops TVM legalizes in a
# model (pools, layout changes), per target kind: a model's build asks them before TVM's own
LEGALIZED_RULES = {"cuda": ("cuda_pool", "cuda_layout")}


def legalized_rules(target) -> list:
    """The dlight rules of our own for the ops TVM legalizes on `target` (none where it has none)."""
    import importlib

    modules = LEGALIZED_RULES.get(target_info(target).kind, ())
    return [importlib.import_module(f"{__name__}.{module}").RULE for module in modules]


def kind_of(spec) -> str:
    """The op kind (op.kind's registry) whose spec type `spec` is."""
    from ..op.kind import op_kinds

    return next(k.name for k in op_kinds().values() if isinstance(spec, k.spec))


def rule_for(target, kind: str = OP_KIND, spec=None):
    """The schedule rule of an op kind on a target's kind: the first of RULES that can implement
    `spec` (when none can, or no spec is given, the first that is not `optional`, a rule for some specs
    only: its can_implement then says why; ValueError where the target kind has none)."""
    info = target_info(target)
    if (kind, info.kind) not in RULES:
        raise ValueError(f"target: no schedule for {kind} on {info.kind} targets (use llvm or cuda)")
    rules = _rules(kind, info)
    main = next(r for r in rules if not getattr(r, "optional", False))
    if spec is None:
        return main
    return next((r for r in rules if r.can_implement(spec, info) is None), main)


def plan(spec, target, fused: bool = True, config=None, policy: bool = False,
         kind: str | None = None, unfused: bool = True) -> Plan:
    """The op's kernels for `target`, scheduled by the rule for its kind. fused=False asks for the
    two-kernel form; policy: fuse only where the rule measured fusing to pay (a model's pairs);
    config: the rule's parameters (None: its defaults); unfused=False: a plan that does not fuse has
    no kernels (the caller runs the op another way)."""
    info = target_info(target)
    kind = kind or kind_of(spec)
    rule = rule_for(info, kind, spec)  # (first: it refuses a target kind without rules)
    if config is not None:
        rule = _rule_taking(config, info, kind, spec) or rule
    reason = rule.can_implement(spec, info)
    if reason:
        raise ValueError(f"target: no {rule.name} schedule for this spec: {reason}")
    planned = rule.plan(spec, info, rule.parse_config(config), fused, policy, unfused)
    planned.passed_over = "; ".join(f"{r.name}: {why}" for r, why in _passed_over(info, kind, spec, rule))
    return planned


def _rule_taking(config, info, kind: str, spec):
    """The first rule able to run the spec whose parameters `config` is (a config text it parses, or a config object
    of its type), or None: a config names the kernel it was made for (the template's m_tile=..., a Hopper kernel's
    bm=...), so it picks that kernel where an earlier rule would run the spec by default."""
    for rule in _rules(kind, info):
        if rule.can_implement(spec, info) is not None:
            continue
        try:
            parsed = rule.parse_config(config)
        except ValueError:
            continue
        if isinstance(config, str) or type(parsed) is type(rule.default_config(spec, info)):
            return rule
    return None


def _rules(kind: str, info) -> list:
    """The RULE objects of RULES[(kind, the target's kind)], in order."""
    import importlib

    return [importlib.import_module(f"{__name__}.{module}").RULE for module in RULES[(kind, info.kind)]]


def _passed_over(info, kind: str, spec, chosen) -> list:
    """(rule, reason) of the optional rules before `chosen` that compute the spec but measured slower (their
    `measured_slower(spec, info)`), for `report` to say why they did not take it."""
    rules = _rules(kind, info)
    before = rules[:rules.index(chosen)] if chosen in rules else []
    found = [(r, r.measured_slower(spec, info)) for r in before if hasattr(r, "measured_slower")]
    return [(r, why) for r, why in found if why]
