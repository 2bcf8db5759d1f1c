"""Tune an op (the fused pair, a single conv: any op kind with a CUDA tensor-core rule) for one GPU: MetaSchedule's evolutionary search with the XGBoost cost model
over tvm_b2b.tune.space, records in a TuningDatabase. Resumable: `trials` is the total per
workload, and a rerun only measures what the database does not hold yet."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from ..op.kind import op_kinds
from ..schedule import cuda_wmma, kind_of, rule_for
from ..target import target_info
from .database import TuningDatabase, best_record, mean_us
from .space import config_of, design_space

FAILED_RUN_SECS = 1e10  # what MetaSchedule records for a failed measurement (its kMaxMeanTime)


def build_candidate(mod, target, _params=None):
    """The builder's build function (codegen.compile_module)."""
    import tvm

    from ..codegen import compile_module
    from ..lower import POOL_ATTR

    # the candidates are our fused kernels: plan their shared memory as kernel.build does
    mod = tvm.IRModule({gv: f.with_attr(POOL_ATTR, True) for gv, f in mod.functions.items()})
    return compile_module(mod, target).mod


class CheckedRun:
    """The runner's argument allocation and evaluation: every candidate first runs on real inputs
    and is compared with the numpy reference; a wrong result is a failed measurement (so no
    tuning record of a wrong kernel is ever valid). Pickled into the runner's worker."""

    _cache: dict = {}

    def __init__(self, spec, seed: int = 0):
        self.spec, self.seed = spec, seed

    def _data(self):
        key = (self.spec, self.seed)
        if key not in CheckedRun._cache:
            kind = op_kinds()[kind_of(self.spec)]
            inputs = kind.random_inputs(self.spec, seed=self.seed)
            CheckedRun._cache.clear()
            CheckedRun._cache[key] = (inputs, kind.reference(self.spec, **inputs))
        return CheckedRun._cache[key]

    def alloc(self, device, _args_info, alloc_repeat: int):
        from ..op.device import device_arguments

        tensors, out = device_arguments(self.spec, self._data()[0], device)
        return [[*tensors.values(), out]] * alloc_repeat

    def alloc_remote(self, _session, device, args_info, alloc_repeat: int):
        """alloc for RPCRunner: the same inputs, copied to the remote device."""
        return self.alloc(device, args_info, alloc_repeat)

    def evaluate_remote(self, _session, rt_mod, device, evaluator_config, repeated_args):
        """evaluate for RPCRunner: checked on the remote device, read back through the session."""
        return self.evaluate(rt_mod, device, evaluator_config, repeated_args)

    def evaluate(self, rt_mod, device, evaluator_config, repeated_args):
        from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

        import numpy as np

        from ..op.reference import compare, np_dtype

        spec, (_, want) = self.spec, self._data()
        args = repeated_args[0]
        # NaN first: a kernel that leaves (part of) the output unwritten cannot pass on what an
        # earlier candidate left in reused memory
        args[-1].copyfrom(np.full((spec.m, spec.out_shape[-1]), np.nan, dtype=np_dtype(spec.dtype)))
        rt_mod[rt_mod.entry_name](*args)
        device.sync()
        err, ok = compare(spec, args[-1].numpy().reshape(spec.out_shape), want)
        if not ok:
            raise RuntimeError(f"wrong result: max abs error {err:.3g} vs the numpy reference")
        return run_evaluator_common(rt_mod, device, evaluator_config, repeated_args)


@dataclass
class Progress:
    """Prints one line per measured batch: a bar, trials, best time so far, time left."""

    label: str
    total: int
    done: int
    best_us: float | None
    started: float = 0.0
    measured: int = 0
    wrong: int = 0  # candidates whose output did not match the reference (rejected)
    first_error: str = ""  # the first failed candidate's cause, one line
    out = print

    def update(self, batch_us: list[float | None]):
        self.measured += len(batch_us)
        self.done += len(batch_us)
        valid = [us for us in batch_us if us is not None]
        if valid:
            self.best_us = min(valid + ([self.best_us] if self.best_us else []))
        elapsed = time.perf_counter() - self.started
        left = elapsed / self.measured * max(self.total - self.done, 0)
        filled = int(20 * min(self.done, self.total) / self.total)
        best = f"{self.best_us:.1f} us" if self.best_us else "none valid yet"
        self.out(f"{self.label} [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} trials, "
                 f"best {best}, {elapsed:.0f} s elapsed, ~{left:.0f} s left"
                 + (f" ({self.wrong} wrong-result candidates rejected)" if self.wrong else ""), flush=True)


@derived_object
class ProgressCallback(ms.measure_callback.PyMeasureCallback):
    def __init__(self, progress: Progress):
        super().__init__()
        self.progress = progress

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        batch = []
        self.progress.wrong += sum("wrong result" in (r.error_msg or "") for r in runner_results)
        for result in [*builder_results, *runner_results]:
            if result.error_msg and not self.progress.first_error:
                self.progress.first_error = _cause(result.error_msg)
        for result in runner_results:
            batch.append(mean_us(result.run_secs) if result.run_secs and not result.error_msg else None)
        self.progress.update(batch)


def make_runner(checked: CheckedRun, remote=None, workers: int = 1):
    """The runner measuring (and checking) candidates: on the local GPU, or with `remote` (a
    tune.remote.RemoteGpu) on the GPUs an RPC tracker lends, `workers` servers at once (candidates are
    built here and uploaded)."""
    evaluator = ms.runner.EvaluatorConfig(number=20, repeat=3, min_repeat_ms=20, enable_cpu_cache_flush=False)
    if remote is None:
        return ms.runner.LocalRunner(timeout_sec=120, f_alloc_argument=checked.alloc, f_run_evaluator=checked.evaluate,
                                     evaluator_config=evaluator)
    config = ms.runner.RPCConfig(tracker_host=remote.host, tracker_port=remote.port, tracker_key=remote.key,
                                 session_priority=1, session_timeout_sec=120)
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator, f_alloc_argument=checked.alloc_remote,
                               f_run_evaluator=checked.evaluate_remote, max_workers=workers)


def tune_spec(spec, target, database: TuningDatabase, trials: int, *, work_dir: str,
              label: str = "", deadline: float | None = None, round_trials: int = 16, out=print,
              remote=None, remote_workers: int = 1) -> dict:
    """Tune one spec until the database holds `trials` records of it (or the deadline passes), measuring
    on the local GPU or through an RPC tracker (`remote`: tune.remote.RemoteGpu, `remote_workers`
    servers at once). Returns what happened: trials before/after, best µs and its config."""
    rule = rule_for(target, kind_of(spec), spec)
    mod = rule.workload(spec)
    spec = getattr(rule, "kernel_spec", lambda s: s)(spec)  # what the kernel computes (the data it is checked on)
    before = len(database.records_for(mod))
    best = best_record(database, mod, target)
    progress = Progress(label or spec.to_string(), trials, before,
                        mean_us(best.run_secs) if best else None, started=time.perf_counter())
    progress.out = out
    checked = CheckedRun(spec)
    cost_model = ms.cost_model.XGBModel(extractor=ms.feature_extractor.PerStoreFeature(), adaptive_training=True)
    try:
        warm_start(cost_model, database, mod, target)
    except Exception as err:  # noqa: BLE001 -- a cold start is slower, not wrong
        out(f"{progress.label} cost model not warm-started from the database: {err}")
    builder = ms.builder.LocalBuilder(f_build=build_candidate, timeout_sec=300, initializer=cuda_wmma.register_ldmatrix_index_map)
    runner = make_runner(checked, remote, remote_workers)
    if before == 0 and trials > 0:
        batch = measure_default(spec, target, database, builder, runner)
        if batch:
            progress.update(batch)
    while progress.done < trials and (deadline is None or time.time() < deadline):
        batch, round_start = min(round_trials, trials - progress.done), progress.done
        ms.tune_tir(
            mod, target, work_dir, max_trials_global=batch, num_trials_per_iter=batch,
            space=design_space(spec, rule, target_info(target)), database=database, cost_model=cost_model,
            strategy=ms.search_strategy.EvolutionarySearch(population_size=96, init_measured_ratio=0.1, genetic_num_iters=2),
            builder=builder, runner=runner,
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), ProgressCallback(progress)],
            task_scheduler="round-robin",
        )
        progress.done = len(database.records_for(mod))
        if progress.done <= round_start:
            break  # the search found nothing new to measure: the space is exhausted
    best = best_record(database, mod, target)
    valid = best is not None and best.run_secs and mean_us(best.run_secs) < FAILED_RUN_SECS * 1e6
    return {
        "spec": spec.to_string(), "trials_before": before, "trials": len(database.records_for(mod)),
        "best_us": mean_us(best.run_secs) if valid else None, "config": config_of(best.trace).to_string() if valid else None,
        "first_error": progress.first_error,
    }


def _cause(error_msg: str) -> str:
    """The line of a builder's or runner's error message that says what went wrong (its last
    non-empty line: MetaSchedule puts tracebacks first)."""
    lines = [line.strip() for line in error_msg.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "unknown error"


def measure_default(spec, target, database: TuningDatabase, builder, runner) -> list[float | None]:
    """Measures the default config as a workload's first record: the search's random draws need not
    include it, and a tuned record must never be slower than the default that it replaces. Returns
    the batch for Progress: [us], [None] if it failed, [] if the default is not a fused kernel here."""
    import shutil

    rule = rule_for(target, kind_of(spec), spec)
    planned = rule.plan(spec, target_info(target))  # what build runs by default
    if not planned.fused:
        return []  # not a fused kernel on this GPU: nothing to compare with
    mod = rule.workload(spec)
    (sch,) = planned.schedules
    (built,) = builder.build([ms.builder.BuilderInput(sch.mod, target)])
    measured = None
    if built.error_msg is None:
        args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, "cuda", args_info)])
        result = future.result()
        measured = None if result.error_msg else [float(secs) for secs in result.run_secs]
        shutil.rmtree(os.path.dirname(built.artifact_path), ignore_errors=True)
    commit_record(database, mod, sch.trace, target, measured or [FAILED_RUN_SECS])
    return [mean_us(measured) if measured else None]


def commit_record(database: TuningDatabase, mod, trace, target, run_secs: list[float]) -> None:
    """Adds the record of one schedule of the workload `mod` (its trace) and its run times."""
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    database.commit_tuning_record(ms.database.TuningRecord(trace, database.commit_workload(mod), run_secs, target, args_info))


def warm_start(cost_model, database: TuningDatabase, mod, target) -> int:
    """Trains the cost model on the records the database already holds for this workload (a resumed
    run then starts from what earlier runs measured, not from random draws); returns how many."""
    records = database.records_for(mod)
    if records:
        context = ms.TuneContext(mod=mod, target=target, task_name="main")
        results = [ms.runner.RunnerResult(run_secs=r.run_secs, error_msg=None) for r in records]
        cost_model.update(context, [r.as_measure_candidate() for r in records], results)
    return len(records)
