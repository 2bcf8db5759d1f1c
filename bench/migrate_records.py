"""Converts a tuning database made before tvm-b2b recorded a schedule's config on the schedule itself
(the root block's tvm_b2b.config.* annotations, read by schedule.cuda_wmma.config_of) into one whose
records carry it: each record's config is read the old way, from its trace's instructions, the
schedule is made again with that config, and the new trace replaces the old one (same workload,
run times, target). The generated code of a config is unchanged (tests/test_same_cuda.py).

    python3 bench/migrate_records.py DIR [DIR ...]      (e.g. schedules/nvidia-h200-sm_90)

DIR's specs.txt names its specs. The files are replaced whole (the old ones kept as *.old).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm.s_tir import Schedule  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from tvm_b2b.op import FusedConvSpec  # noqa: E402
from tvm_b2b.schedule import cuda_wmma  # noqa: E402
from tvm_b2b.target import target_info  # noqa: E402
from tvm_b2b.tune import database  # noqa: E402


def legacy_config_of(trace) -> cuda_wmma.WmmaConfig:
    """How tvm-b2b read a config back before the annotations: knobs from the SampleCategorical
    decisions in KNOBS order, the rest from the instructions' text."""
    samples = [inst for inst in trace.insts if inst.kind.name == "SampleCategorical"]
    knobs = {name: candidates[int(trace.decisions[inst])] for (name, candidates), inst in zip(cuda_wmma.KNOBS.items(), samples)}
    stages = [inst.inputs[1] for inst in trace.insts
              if inst.kind.name == "Annotate" and "software_pipeline_stage" in str(inst.attrs)]
    depth = max(int(stage) for stage in stages[0]) if stages else 0
    mma = any(inst.kind.name == "Tensorize" and "ldmatrix" in str(inst.attrs) for inst in trace.insts)
    staged = any(inst.kind.name == "Tensorize" and "store" in str(inst.attrs).lower() for inst in trace.insts)
    output_cached = any(inst.kind.name == "CacheWrite" and "shared.dyn" in str(inst.attrs) for inst in trace.insts)
    epilogue = 0 if not mma or staged else 2 if output_cached else 1
    return cuda_wmma.WmmaConfig.from_knobs(knobs, pipeline=depth, mma=int(mma), epilogue=epilogue)


def migrate(directory: Path) -> int:
    """Rewrites DIR's records with annotated traces; returns how many records it converted."""
    specs = [FusedConvSpec.parse(line) for line in (directory / "specs.txt").read_text().split()]
    workloads = {database._key(cuda_wmma.workload(spec)): spec for spec in specs}
    source = database.TuningDatabase(directory)
    out = Path(tempfile.mkdtemp()) / "db"
    target_db = database.TuningDatabase(out, lock=True)
    count = 0
    for record in source.get_all_tuning_records():
        spec = workloads[database._key(record.workload.mod)]
        config = cuda_wmma.config_of(record.trace) or legacy_config_of(record.trace)
        arch = target_info(record.target).arch
        sch = cuda_wmma.WmmaFusedSchedule(Schedule(cuda_wmma.workload(spec)), spec, config, arch).run()
        assert cuda_wmma.config_of(sch.trace) == config
        workload = target_db.commit_workload(record.workload.mod)
        target_db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, record.run_secs, record.target,
                                                                record.args_info))
        count += 1
    for name in (database.WORKLOADS, database.RECORDS):
        shutil.copy(directory / name, directory / (name + ".old"))
        shutil.move(str(out / name), str(directory / name))
    return count


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"{path}: {migrate(Path(path))} records converted (old files: *.old)")
