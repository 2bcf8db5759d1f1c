"""Ship a tuning database: the best records of each workload of DB into schedules/<gpu>-<arch>/,
with specs.txt and a README (workloads, trials, date, TVM version).

On the GPU machine it was tuned on:  python3 bench/ship_schedules.py DB [DB ...] [--top 3]
Elsewhere, name the GPU:             python3 bench/ship_schedules.py DB... --gpu "NVIDIA H200" --arch sm_90
Several databases are merged first (e.g. the shipped one and a new tuning run). Only records of the
workloads that the listed specs build now ship (a kernel whose PrimFunc changed leaves its old
records behind); --drop SPEC ships none of a spec.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm_b2b.op.kind import parse_spec  # noqa: E402
from tvm_b2b.schedule import kind_of, rule_for  # noqa: E402
from tvm_b2b.target import local_cuda_arch, parse_target  # noqa: E402
from tvm_b2b.tune import database  # noqa: E402
from tvm_b2b.tune.space import config_of  # noqa: E402


HISTORY = "## History"


def _history(readme: str) -> str:
    """The hand-written part of a shipped README (from its History heading on), kept on reshipping."""
    if not os.path.exists(readme):
        return ""
    text = open(readme).read()
    return "\n" + text[text.index(HISTORY):] if HISTORY in text else ""


def _shipped_trials(readme: str) -> dict[str, int]:
    """The 'trials measured' of each spec in a shipped README's table (the shipped database keeps only
    the best records, so its record count is not what was measured)."""
    if not os.path.exists(readme):
        return {}
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \|", open(readme).read(), flags=re.MULTILINE)
    return {spec: int(trials) for spec, trials in rows}


def _measured_on(args) -> tuple[str, str]:
    """(GPU name, arch) of the records: as given, else what `tvm-b2b tune` noted in the databases (the
    remote GPU's when it measured through an RPC tracker), else the local GPU's. Databases of
    different GPUs are never merged."""
    noted = {gpu for gpu in (database.measured_gpu(db) for db in args.db) if gpu}
    if len(noted) > 1 and not (args.gpu and args.arch):
        sys.exit("ship_schedules: the databases were measured on different GPUs: "
                 + ", ".join(f"{name} ({arch})" for name, arch in sorted(noted)))
    name, arch = next(iter(noted)) if noted else (None, None)
    gpu, arch = args.gpu or name or database.local_gpu_name(), args.arch or arch or local_cuda_arch()
    if not gpu or not arch:
        sys.exit("ship_schedules: no GPU noted in the databases and none here: name it (--gpu NAME --arch sm_XX)")
    return gpu, arch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="+", help="tuning databases (tvm-b2b tune --db)")
    parser.add_argument("--top", type=int, default=3, help="records kept per workload")
    parser.add_argument("--out", help="destination (default schedules/<gpu>-<arch>)")
    parser.add_argument("--gpu", help="the GPU's name as CUDA reports it (default: the one the databases were measured "
                        "on, else the local GPU's)")
    parser.add_argument("--arch", help="its arch, sm_XX (default: as for --gpu)")
    parser.add_argument("--drop", action="append", default=[], metavar="SPEC",
                        help="ship no records of this spec (e.g. one whose record is slower than a newer default)")
    args = parser.parse_args()
    import tvm

    gpu, arch = _measured_on(args)
    out = args.out or os.path.join(database.schedules_root(), database.database_name(gpu, arch))
    tmp, merged = out + ".tmp", out + ".merged"
    for path in (tmp, merged):
        shutil.rmtree(path, ignore_errors=True)
    database.merge(args.db, merged)
    target = parse_target(f"cuda:{arch}")
    dropped = {parse_spec(s) for s in args.drop}
    specs = [parse_spec(s) for s in open(os.path.join(merged, "specs.txt")).read().split()]  # pairs and single convs
    specs = [s for s in specs if s not in dropped]
    # the workloads the specs build now: records of a kernel since changed (another PrimFunc) are not shipped
    kept = database.prune(merged, tmp, args.top, [rule_for(target, kind_of(s), s).workload(s) for s in specs],
                          {s.to_string() for s in specs})
    source = database.TuningDatabase(merged)
    # trials: those the shipped README counted, plus the records of the other (new) databases
    readme = os.path.join(out, "README.md")
    before = _shipped_trials(readme)
    new = [database.TuningDatabase(db) for db in args.db if not (os.path.isdir(out) and os.path.samefile(db, out))]
    rows, shipped = [], []
    written_specs = 0  # specs whose records are a written kernel's configs (written_records.json)
    for spec in specs:
        rule = rule_for(target, kind_of(spec), spec)
        if database.written(rule):  # a written kernel's configs (tune.written)
            best = source.best_written(spec.to_string(), arch, rule.kernel)
            if best is not None:
                shipped.append(spec)
                written_specs += 1
                trials = before.get(spec.to_string(), 0) + sum(len(db.written_for(spec.to_string(), arch, rule.kernel))
                                                                for db in new)
                rows.append(f"| `{spec.to_string()}` | {trials} | {best.us:.1f} | `{best.config}` ({rule.kernel}) |")
            continue
        mod = rule.workload(spec)
        best = database.best_record(source, mod, target)
        if best is not None:
            shipped.append(spec)
            us = database.mean_us(best.run_secs)
            trials = before.get(spec.to_string(), 0) + sum(len(db.records_for(mod)) for db in new)
            rows.append(f"| `{spec.to_string()}` | {trials} | {us:.1f} | `{config_of(best.trace).to_string()}` |")
    database.record_specs(tmp, shipped)
    history = _history(readme)
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write(f"# Tuned schedules: {gpu} ({arch})\n\n"
                f"MetaSchedule JSON database (stock `ms.database.JSONDatabase` reads it), the {args.top} best records "
                f"per workload, {kept} in all. Tuned {datetime.date.today()} with TVM {tvm.__version__} by "
                f"`tvm-b2b tune` (XGBoost cost model, evolutionary search); times are MetaSchedule's runner "
                f"(mean of 3 x 20 runs). The written kernels' configs (sm_90's TIRx kernels, named in the config column) are in "
                f"`written_records.json`, each built, checked and timed the same way (tvm_b2b.tune.written). Specs not listed "
                f"build with the default parameters.\n\n| spec | trials measured | best us | config |\n|---|---|---|---|\n" + "\n".join(rows) + "\n" + history)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    shutil.rmtree(merged, ignore_errors=True)
    print(f"shipped {kept} MetaSchedule records of {len(rows) - written_specs} workloads and the written kernels' configs of "
          f"{written_specs} specs to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
