"""The MetaSchedule design space of an op kind on tensor cores (the fused pair, a single conv): the
CUDA schedule with its knobs (schedule.cuda_wmma.KNOBS) left to sample_categorical, one trace per pipeline depth and MMA
instruction set, a mutator that re-draws one knob, and a postprocessor that drops draws the
spec or the GPU's shared memory cannot take."""
from __future__ import annotations

import dataclasses
import random

from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from ..schedule.cuda_wmma import config_of

SEARCHED_DEPTHS = (0, 1, 2)  # pipeline depths tuned (3 rarely fits next to the intermediate)


@derived_object
class MutateKnob(ms.mutator.PyMutator):
    """Re-draws one sampled knob of a trace (stock mutators only touch the categorical samples of
    thread bindings and unrolling)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.rng = random.Random(seed)

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, _rand_state):
        samples = [inst for inst in trace.insts if inst.kind.name == "SampleCategorical"]
        if not samples:
            return None
        inst = self.rng.choice(samples)
        count = len(inst.attrs[0])
        old = int(trace.decisions[inst])
        choices = [i for i in range(count) if i != old]
        if not choices:
            return None
        return trace.with_decision(inst, self.rng.choice(choices), remove_postproc=True)

    def clone(self):
        return MutateKnob(self.rng.randrange(1 << 30))


@derived_object
class FitsTemplate(ms.postproc.PyPostproc):
    """Rejects a candidate whose tiles do not divide the spec's padded extents (such a draw can
    replay, the splits adding predicates, but only wastes a measurement) or whose shared memory
    exceeds the arch's. (Stock VerifyGPUCode rejects every pipelined candidate: its own lowering
    lacks the cp.async pass.)"""

    def __init__(self, spec, rule, arch: int):
        super().__init__()
        self.spec, self.rule, self.arch = spec, rule, arch

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch) -> bool:
        cfg = config_of(sch.trace)
        return cfg is not None and self.rule.fits(self.spec, cfg, self.arch)

    def clone(self):
        return FitsTemplate(self.spec, self.rule, self.arch)


def design_space(spec, rule, info):
    """The space: one trace per pipeline depth and MMA instruction set (WMMA; ldmatrix + mma.sync
    from sm_80 on), whose knobs start at the default config (a space must produce valid schedules)
    and are re-drawn by the search; draws that do not tile the spec fail in replay or in
    FitsTemplate and are skipped."""

    arch = info.arch

    def schedule_fn(sch):
        spaces = []
        for mma, epilogue in _instruction_sets(arch):
            for pipeline in SEARCHED_DEPTHS:
                cfg = dataclasses.replace(rule.default_config(spec, info), pipeline=pipeline, mma=mma, epilogue=epilogue)
                spaces.append(rule.schedule_class(sch.copy(), spec, cfg, arch).run())
        return spaces

    return ms.space_generator.ScheduleFn(
        schedule_fn, sch_rules=[], postprocs=[FitsTemplate(spec, rule, arch)], mutator_probs={MutateKnob(): 1.0},
    )


def _instruction_sets(arch: int) -> list[tuple[int, int]]:
    """(mma, epilogue) variants searched: before sm_80, WMMA; from sm_80 on, mma.sync with the
    staged epilogue (0) or from registers through the fp16 output tile (2). Not WMMA there (slower
    than mma.sync on the H200: bench/results/h200_s4_1_*), nor epilogue=1 (1.6x slower: its 2-byte
    global stores, h200_s5_3_*): their traces would only take trials from the others."""
    return [(0, 0)] if arch < 80 else [(1, 0), (1, 2)]
