"""Tuning of the written kernels (sm_90's TIRx kernels: schedule.cuda_hopper_conv, cuda_hopper_pair,
cuda_cluster_dw_pair). Their parameters are few and discrete (the rule's `candidates`: tiles, buffers, the halo form,
the producer's threads), and no MetaSchedule trace can carry them (the kernel is written, not scheduled), so each
candidate is built, checked against the numpy reference and timed, as CUTLASS's profiler does, in a worker process that
a hang or a CUDA fault cannot take down with the tuner. The records (database.WrittenRecord) go into the database's
written_records.json; a build takes the spec's fastest on its GPU arch (database.tuned_config), and the frontend
compares a pair's fastest with its two convs' (rewrite._measured_fusion), as for the scheduled kernels."""
from __future__ import annotations

import multiprocessing
import time

from ..schedule import kind_of, rule_for
from ..target import target_info
from .database import TuningDatabase, WrittenRecord, arch_name

NUMBER, REPEAT = 20, 3  # runs a measurement, measurements a candidate: as MetaSchedule's runner (tuner.make_runner)
TIMEOUT_S = 180  # a candidate's build, check and timing; past it the worker is stopped and the candidate fails


def tune_written(spec, target, database: TuningDatabase, trials: int, *, label: str = "", deadline: float | None = None,
                 out=print) -> dict:
    """Measures the rule's candidates for the spec that the database does not hold yet, nearest the default first, until
    it holds `trials` of them (or the deadline passes, or the space is measured); returns tune_spec's summary."""
    rule = rule_for(target, kind_of(spec), spec)
    arch, text = arch_name(target), spec.to_string()
    known = {r.config for r in database.written_for(text, arch, rule.kernel)}
    todo = [c for c in rule.candidates(spec, target_info(target)) if c.to_string() not in known]
    todo = todo[: max(0, trials - len(known))]
    label = label or text
    out(f"{label} {text}: {len(known)} config(s) of the {rule.kernel} kernel measured, {len(todo)} to measure")
    first_error = None
    with Worker() as worker:
        for cfg in todo:
            if deadline is not None and time.time() >= deadline:
                break
            us, error = worker.measure(spec, target, cfg.to_string())
            first_error = first_error or (error and f"{cfg.to_string()}: {error}")
            database.commit_written(WrittenRecord(text, arch, rule.kernel, cfg.to_string(), us, error))
            best = database.best_written(text, arch, rule.kernel)
            out(f"{label} {cfg.to_string()}: " + (f"{us:.1f} us" if us is not None else f"failed ({error})")
                + (f"; best {best.us:.1f} us ({best.config})" if best else ""))
    best = database.best_written(text, arch, rule.kernel)
    return {"spec": text, "trials_before": len(known), "trials": len(database.written_for(text, arch, rule.kernel)),
            "best_us": best.us if best else None, "config": best.config if best else None, "first_error": first_error,
            "environment_failures": 0, "environment_error": None}


class Worker:
    """One process that builds and measures candidates (it keeps TVM and the inputs loaded between them); restarted
    after a candidate that failed to run (a CUDA fault leaves the process's context unusable) or ran past TIMEOUT_S."""

    def __init__(self):
        self.pool = None

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self._stop()

    def measure(self, spec, target, config: str) -> tuple[float | None, str]:
        """(mean µs, "") or (None, why it failed)."""
        if self.pool is None:
            self.pool = multiprocessing.get_context("spawn").Pool(1)
        task = self.pool.apply_async(measure, (spec.to_string(), f"cuda:sm_{target_info(target).arch}", config))
        try:
            us, error, ran = task.get(TIMEOUT_S)
        except multiprocessing.TimeoutError:
            self._stop()
            return None, f"no result within {TIMEOUT_S} s (stopped)"
        except Exception as err:  # noqa: BLE001 -- the worker died (a fault); the candidate failed, the tuner goes on
            self._stop()
            return None, f"the measuring process failed: {type(err).__name__}: {err}"
        if error and ran:
            self._stop()
        return us, error

    def _stop(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def measure(spec_text: str, target_text: str, config: str) -> tuple[float | None, str, bool]:
    """In the worker: (mean µs, "", True), or (None, why, whether it got as far as running on the GPU), of the spec's
    kernel built with `config` (text), run on random inputs and compared with the numpy reference first (NaN in the
    output before: a kernel that leaves part of it unwritten cannot pass on an earlier candidate's values)."""
    import numpy as np
    import tvm

    from ..codegen import compile_module
    from ..lower import scheduled_module
    from ..op.device import formed_arguments
    from ..op.kind import parse_spec
    from ..op.reference import compare, np_dtype
    from ..schedule import plan
    from ..target import parse_target
    from .tuner import CheckedRun  # (tuner imports this module)

    spec, target = parse_spec(spec_text), parse_target(target_text)
    try:
        planned = plan(spec, target, True, config)
        (func,) = planned.kernels
        module = compile_module(scheduled_module([func]), target).jit()
    except Exception as err:  # noqa: BLE001 -- a config that does not build is a failed candidate
        return None, f"build: {str(err).strip().splitlines()[-1][:300]}", False
    inputs, want = CheckedRun(spec).data()  # (kept in the worker across candidates)
    try:
        dev = tvm.cuda(0)
        tensors, out = formed_arguments(spec, inputs, dev, planned.input_form)
        out.copyfrom(np.full(out.shape, np.nan, dtype=np_dtype(spec.dtype)))
        name = str(func.attrs["global_symbol"])
        module[name](*tensors.values(), out)
        dev.sync()
        err, ok = compare(spec, out.numpy().reshape(spec.out_shape), want)
        if not ok:
            return None, f"wrong result: max abs error {err:.3g} vs the numpy reference", True
        timer = module.time_evaluator(name, dev, number=NUMBER, repeat=REPEAT, min_repeat_ms=20)
        return float(np.mean(timer(*tensors.values(), out).results)) * 1e6, "", True
    except Exception as err:  # noqa: BLE001 -- a fault on the GPU fails the candidate (and restarts the worker)
        return None, f"run: {str(err).strip().splitlines()[-1][:300]}", True
