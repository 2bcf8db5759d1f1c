"""Tune an op (the fused pair, a single conv: any op kind with a CUDA tensor-core rule) for one GPU: MetaSchedule's evolutionary search with the XGBoost cost model
over tvm_b2b.tune.space, records in a TuningDatabase (a written kernel's configs: tune.written). Resumable: `trials` is
the total per workload, and a rerun only measures what the database does not hold yet."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from ..op.kind import op_kinds
from ..schedule import cuda_wmma, kind_of, rule_for
from ..target import target_info
from .database import TuningDatabase, best_record, mean_us, written
from .remote import error_cause
from .space import config_of, design_space
from .written import tune_written

FAILED_RUN_SECS = 1e10  # what MetaSchedule records for a failed measurement (its kMaxMeanTime)
ENVIRONMENT = "environment: "  # starts a runner error that says nothing of the candidate (no server, no device)


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

    def data(self):
        """(inputs, numpy reference output) of the spec: made once a process (tune.written's worker reuses them)."""
        key = (self.spec, self.seed)
        if key not in CheckedRun._cache:
            kind = op_kinds()[kind_of(self.spec)]
            inputs = kind.random_inputs(self.spec, seed=self.seed)
            CheckedRun._cache.clear()
            CheckedRun._cache[key] = (inputs, kind.reference(self.spec, **inputs))
        return CheckedRun._cache[key]

    def alloc(self, device, _args_info, alloc_repeat: int):
        from ..op.device import device_arguments

        tensors, out = device_arguments(self.spec, self.data()[0], device)
        return [[*tensors.values(), out]] * alloc_repeat

    # RPCRunner's steps. Whatever fails before the candidate runs (no session, a module the server
    # cannot load, inputs that do not reach it), and a run that fails because the server is gone, is
    # the environment's failure: it is not a verdict on the candidate, which stays unmeasured.
    def create_session(self, rpc_config):
        from tvm.s_tir.meta_schedule.runner.rpc_runner import default_create_session

        return _blame_environment("no RPC session", default_create_session, rpc_config)

    def upload_module(self, session, local_path, remote_path):
        from tvm.s_tir.meta_schedule.runner.rpc_runner import default_upload_module

        return _blame_environment("the RPC server could not load the built module", default_upload_module,
                                  session, local_path, remote_path)

    def alloc_remote(self, _session, device, args_info, alloc_repeat: int):
        """alloc for RPCRunner: the same inputs, copied to the remote device."""
        return _blame_environment("the inputs did not reach the RPC server", self.alloc, device, args_info, alloc_repeat)

    def evaluate_remote(self, session, rt_mod, device, evaluator_config, repeated_args):
        """evaluate for RPCRunner: checked on the remote device, read back through the session. A
        failure with the server no longer answering is the environment's, else the candidate's."""
        try:
            return self.evaluate(rt_mod, device, evaluator_config, repeated_args)
        except Exception as err:
            if _answers(session):
                raise
            raise RuntimeError(f"{ENVIRONMENT}lost the RPC server while measuring ({error_cause(str(err))})") from None

    def evaluate(self, rt_mod, device, evaluator_config, repeated_args):
        from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

        import numpy as np

        from ..op.reference import compare, np_dtype

        spec, (_, want) = self.spec, self.data()
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


def _blame_environment(what: str, step, *args):
    try:
        return step(*args)
    except Exception as err:
        raise RuntimeError(f"{ENVIRONMENT}{what} ({error_cause(str(err))})") from None


def _answers(session) -> bool:
    """Whether an RPC session's server still answers (a remote call round trip)."""
    try:
        return bool(session.cpu(0).exist)
    except Exception:  # noqa: BLE001 -- any failure of the round trip: the server is gone
        return False


def environment_failure(error_msg: str | None) -> bool:
    """A runner error that is no verdict on the candidate: an RPC step failed (above), or the RPC
    session timed out (a server that stopped answering; a local run's timeout is the candidate's)."""
    return bool(error_msg) and (ENVIRONMENT in error_msg or error_msg.startswith("RPCRunner: Timeout"))


def environment_cause(error_msg: str) -> str:
    """An environment failure's cause, one line starting with "environment: "."""
    if ENVIRONMENT not in error_msg:
        return f"{ENVIRONMENT}no answer from the RPC server in time ({error_cause(error_msg)})"
    return error_msg[error_msg.index(ENVIRONMENT):].splitlines()[0][:300]


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
    environment: int = 0  # trials that failed for the environment (not counted: measured again later)
    environment_error: str = ""  # the first of those causes, one line
    out = print

    def update(self, batch_us: list[float | None], environment: int = 0):
        """batch_us: the counted trials' times (None: failed); environment: trials not counted."""
        self.measured += len(batch_us) + environment
        self.done += len(batch_us)
        self.environment += environment
        valid = [us for us in batch_us if us is not None]
        if valid:
            self.best_us = min(valid + ([self.best_us] if self.best_us else []))
        elapsed = time.perf_counter() - self.started
        left = elapsed / max(self.measured, 1) * max(self.total - self.done, 0)
        filled = int(20 * min(self.done, self.total) / self.total)
        best = f"{self.best_us:.1f} us" if self.best_us else "none valid yet"
        self.out(f"{self.label} [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} trials, "
                 f"best {best}, {elapsed:.0f} s elapsed, ~{left:.0f} s left"
                 + (f" ({self.wrong} wrong-result candidates rejected)" if self.wrong else "")
                 + (f" ({self.environment} failed for the environment, not counted: {self.environment_error})"
                    if self.environment else ""), flush=True)

    def add(self, results: list[tuple]) -> None:
        """Counts measured trials, each (build error, run error, run_secs): a failure for the environment
        is not a trial; the others are, with the first failure's cause kept."""
        batch, environment = [], 0
        for build_error, run_error, run_secs in results:
            self.wrong += "wrong result" in (run_error or "")
            if environment_failure(run_error):
                environment += 1
                self.environment_error = self.environment_error or environment_cause(run_error)
                continue
            error = build_error or run_error
            if error and not self.first_error:
                self.first_error = error_cause(error)
            batch.append(mean_us(run_secs) if run_secs and not error else None)
        self.update(batch, environment)


@derived_object
class ProgressCallback(ms.measure_callback.PyMeasureCallback):
    def __init__(self, progress: Progress):
        super().__init__()
        self.progress = progress

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        self.progress.add([(b.error_msg, r.error_msg, r.run_secs) for b, r in zip(builder_results, runner_results)])


@derived_object
class RecordMeasured(ms.measure_callback.PyMeasureCallback):
    """MetaSchedule's AddToDatabase, less the trials that failed for the environment: those say
    nothing of their candidate, so they neither count toward the trials nor keep the search from
    drawing the candidate again."""

    def __init__(self, database):
        super().__init__()
        self.database = database

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        context = task_scheduler.tasks_[task_id].ctx
        workload = self.database.commit_workload(context.mod)
        for candidate, result in zip(measure_candidates, runner_results):
            if environment_failure(result.error_msg):
                continue
            run_secs = result.run_secs if result.run_secs else [FAILED_RUN_SECS]
            self.database.commit_tuning_record(ms.database.TuningRecord(
                candidate.sch.trace, workload, run_secs, context.target, candidate.args_info))


def measure_callbacks(database, progress: Progress) -> list:
    """MetaSchedule's default callbacks with RecordMeasured in AddToDatabase's place, and the progress line."""
    return [RecordMeasured(database), ms.measure_callback.RemoveBuildArtifact(), ms.measure_callback.UpdateCostModel(),
            ProgressCallback(progress)]


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
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator, f_create_session=checked.create_session,
                               f_upload_module=checked.upload_module, f_alloc_argument=checked.alloc_remote,
                               f_run_evaluator=checked.evaluate_remote, max_workers=workers)


def tune_spec(spec, target, database: TuningDatabase, trials: int, *, work_dir: str,
              label: str = "", deadline: float | None = None, round_trials: int = 16, out=print,
              remote=None, remote_workers: int = 1) -> dict:
    """Tune one spec until the database holds `trials` records of it (or the deadline passes), measuring
    on the local GPU or through an RPC tracker (`remote`: tune.remote.RemoteGpu, `remote_workers`
    servers at once). Returns what happened: trials before/after, best µs and its config."""
    rule = rule_for(target, kind_of(spec), spec)
    if written(rule):  # its configs measured whole (tune.written): no trace to search
        if remote is not None:
            raise ValueError(f"{spec.to_string()}: the {rule.kernel} kernel's configs are measured on a local GPU only "
                             "(--rpc measures MetaSchedule's candidates)")
        return tune_written(spec, target, database, trials, label=label, deadline=deadline, out=out)
    mod = rule.workload(spec)
    spec = getattr(rule, "kernel_spec", lambda s: s)(spec)  # what the kernel computes (the data it is checked on)
    before = len(database.records_for(mod))
    best = best_record(database, mod, target)
    searched = bool(rule.knobs)  # a rule without parameters has one schedule: its default, measured once
    progress = Progress(label or spec.to_string(), trials if searched else 1, before,
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
        measure_default(spec, target, database, builder, runner, progress)
    while searched and progress.done < trials and (deadline is None or time.time() < deadline):
        batch, round_start = min(round_trials, trials - progress.done), progress.done
        ms.tune_tir(
            mod, target, work_dir, max_trials_global=batch, num_trials_per_iter=batch,
            space=design_space(spec, rule, target_info(target)), database=database, cost_model=cost_model,
            strategy=ms.search_strategy.EvolutionarySearch(population_size=96, init_measured_ratio=0.1, genetic_num_iters=2),
            builder=builder, runner=runner,
            measure_callbacks=measure_callbacks(database, progress),
            task_scheduler="round-robin",
        )
        progress.done = len(database.records_for(mod))
        if progress.done <= round_start:
            break  # the search found nothing new to measure: the space is exhausted
    best = best_record(database, mod, target)
    valid = best is not None and best.run_secs and mean_us(best.run_secs) < FAILED_RUN_SECS * 1e6
    return {
        "spec": spec.to_string(), "trials_before": before, "trials": len(database.records_for(mod)),
        "best_us": mean_us(best.run_secs) if valid else None,
        "config": (config_of(best.trace).to_string() if searched else "its one schedule") if valid else None,
        "first_error": progress.first_error, "environment_failures": progress.environment,
        "environment_error": progress.environment_error,
    }


def measure_default(spec, target, database: TuningDatabase, builder, runner, progress: Progress) -> None:
    """Measures the default config as a workload's first record: the search's random draws need not
    include it, and a tuned record must never be slower than the default that it replaces. Nothing
    when the default is not a fused kernel here; no record when it failed for the environment."""
    import shutil

    rule = rule_for(target, kind_of(spec), spec)
    planned = rule.plan(spec, target_info(target))  # what build runs by default
    if not planned.fused:
        return  # not a fused kernel on this GPU: nothing to compare with
    mod = rule.workload(spec)
    (sch,) = planned.schedules
    (built,) = builder.build([ms.builder.BuilderInput(sch.mod, target)])
    run_error, run_secs = None, None
    if built.error_msg is None:
        args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, "cuda", args_info)])
        result = future.result()
        shutil.rmtree(os.path.dirname(built.artifact_path), ignore_errors=True)
        run_error, run_secs = result.error_msg, result.run_secs
    progress.add([(built.error_msg, run_error, run_secs)])
    if environment_failure(run_error):
        return
    measured = run_secs and not (built.error_msg or run_error)
    commit_record(database, mod, sch.trace, target, [float(s) for s in run_secs] if measured else [FAILED_RUN_SECS])


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
