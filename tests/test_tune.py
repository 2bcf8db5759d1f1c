"""Tuning on the CPU machine: the design space builds, the database round-trips, survives an
interrupted write, rejects a corrupted file, and never applies a record to another workload or
arch. Tuning itself (measuring) is a GPU test."""
import dataclasses
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir import Schedule

from cuda_source import kernels, nvcc_arches, nvcc_compile
from tvm_b2b import ConvSpec, FusedConvSpec, build
from tvm_b2b.codegen import compile_module
from tvm_b2b.op.kind import parse_spec
from tvm_b2b.tune.database import resolve_config
from tvm_b2b.schedule import cuda_wmma, kind_of, plan, rule_for
from tvm_b2b.target import has_cuda_gpu, parse_target, target_info
from tvm_b2b.tune import database, space
from tvm_b2b.tune.tuner import build_candidate, commit_record

SPEC = FusedConvSpec(n=1, h=14, w=14, c=32, k1=64, k2=128, residual=True, dtype="float16")
OTHER = FusedConvSpec(n=1, h=14, w=14, c=32, k1=64, k2=64, dtype="float16")
SINGLE = ConvSpec(n=1, h=14, w=14, c=64, k=128, dtype="float16")


def _draws(spec, target, count, seed=1):
    """Random draws of the design space that pass its postprocessors (as the search makes them)."""
    rule = rule_for(target, kind_of(spec), spec)
    mod = rule.workload(spec)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=space.design_space(spec, rule, target_info(target)),
                         search_strategy=ms.search_strategy.ReplayTrace(), task_name="t")
    traces = [s.trace for s in ctx.generate_design_space()]
    postprocs = ctx.space_generator.postprocs
    for p in postprocs:
        p._initialize_with_tune_context(ctx)
    found, attempt = [], seed
    while len(found) < count and attempt < seed + 200:
        sch = Schedule(mod, seed=attempt)
        attempt += 1
        trace = traces[attempt % len(traces)]
        try:
            trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=lambda *a: None)
        except Exception:  # noqa: BLE001 -- a draw the schedule cannot take, as in the search
            continue
        if all(p.apply(sch) for p in postprocs):
            found.append(sch)
    return found


def test_single_conv_space_draws_search_its_knobs_only():
    """The single conv (op kind conv2d) is tuned in the same database with the same template: its draws
    differ, tile its spec, and leave the pair's second-GEMM knob (frags_n2) out of the search."""
    spec = ConvSpec(n=1, h=14, w=14, c=64, k=128, kh=3, kw=3, pad_h=1, pad_w=1, dtype="float16")
    target = parse_target("cuda:sm_90")
    draws = _draws(spec, target, 4)
    configs = {space.config_of(s.trace) for s in draws}
    assert len(draws) == 4 and len(configs) > 1
    sampled = [inst for inst in draws[0].trace.insts if inst.kind.name == "SampleCategorical"]
    assert len(sampled) == len(cuda_wmma.KNOBS) - 1  # frags_n2 is recorded as a constant, not sampled


def test_depthwise_pair_space_draws_build(tmp_path, monkeypatch):
    """The grouped pair's rule (a depthwise 3x3 on CUDA cores feeding the 1x1 on tensor cores) is tuned
    through the same space: its draws differ (pixel tile and warps too: its 3x3's threads), tile the
    spec, and each builds as the tuner builds it, one kernel (nvcc-compiled for sm_90 where nvcc is). (sm_90's cluster
    kernel, which takes this pair by default and has no parameters, off.)"""
    monkeypatch.setenv("TVM_B2B_DW_CLUSTER", "0")
    spec = FusedConvSpec.parse("n=1,h=28,w=28,c=144,k1=144,k2=24,groups=144,act1=relu6,act2=none,residual=1,dtype=float16")
    target = parse_target("cuda:sm_90")
    draws = _draws(spec, target, 4)
    configs = {space.config_of(s.trace) for s in draws}
    assert len(draws) == 4 and len(configs) > 1
    assert len({(c.m_tile, c.warps_m * c.warps_n) for c in configs}) > 1, configs
    rule = rule_for(target, kind_of(spec), spec)
    for sch in draws[:2]:
        source = build_candidate(sch.mod, target).imports[0].inspect_source()
        assert len(kernels(source)) == 1 and "mma.sync" in source, space.config_of(sch.trace)
        assert rule.fits(spec, space.config_of(sch.trace), 90)
        if "sm_90" in nvcc_arches():
            nvcc_compile(source, "sm_90", tmp_path)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_space_draws_build(arch, tmp_path):
    target = parse_target(f"cuda:{arch}")
    draws = _draws(SPEC, target, 8)
    assert len(draws) == 8
    configs = {space.config_of(s.trace) for s in draws}
    assert len(configs) > 1, "the draws should differ"
    assert {c.pipeline for c in configs} == set(space.SEARCHED_DEPTHS), "every pipeline depth is drawn"
    assert {(c.mma, c.epilogue) for c in configs} == {(1, 0), (1, 2)}, "both epilogues are drawn (mma.sync: sm_80+)"
    compiled = set()
    for sch in draws:
        config = cuda_wmma.check_config(SPEC, space.config_of(sch.trace))
        # every draw builds as the tuner builds it (our shared-memory planning, no workaround)
        source = build_candidate(sch.mod, target).imports[0].inspect_source()
        assert len(kernels(source)) == 1 and ("wmma::mma_sync" in source or "mma.sync" in source)
        assert source.count("extern __shared__") == 1, config
        if arch in nvcc_arches() and (config.pipeline, config.epilogue) not in compiled:
            nvcc_compile(source, arch, tmp_path)
            compiled.add((config.pipeline, config.epilogue))


@pytest.mark.parametrize("config", ["m_tile=32,pipeline=1", "m_tile=32,mma=1,pipeline=2", "m_tile=32,mma=1,epilogue=1", "m_tile=32,mma=1,epilogue=2"])
def test_config_of_reads_back_the_config(config):
    """A record's config comes from its trace alone (knobs, depth, instruction set, epilogue)."""
    cfg = cuda_wmma.WmmaConfig.parse(config)
    sch = cuda_wmma.WmmaFusedSchedule(Schedule(cuda_wmma.workload(SPEC)), SPEC, cfg, 90).run()
    assert space.config_of(sch.trace) == cfg


def _record(db, spec, target, cfg, secs):
    """A record of spec (any op kind) scheduled by its rule with cfg, `secs` its run time."""
    rule = rule_for(target, kind_of(spec), spec)
    mod = rule.workload(spec)
    sch = Schedule(mod)
    rule.schedule_class(sch, getattr(rule, "kernel_spec", lambda s: s)(spec), cfg, 90).run()
    commit_record(db, mod, sch.trace, target, [secs])


# an mma record: its trace holds index maps (the ldmatrix layouts), which TVM 0.27's as_json cannot write
FAST = cuda_wmma.WmmaConfig(m_tile=32, warps_m=1, warps_n=4, k_tile=64, n1_tile=64, n2_tile=128, pipeline=2, mma=1)
SLOW = cuda_wmma.WmmaConfig(m_tile=32)


@pytest.fixture
def tuned_dir(tmp_path):
    target = parse_target("cuda:sm_90")
    db = database.TuningDatabase(tmp_path / "db")
    _record(db, SPEC, target, SLOW, 9e-5)  # the run times are test values, not measurements
    _record(db, SPEC, target, FAST, 3e-5)
    return tmp_path / "db"


def test_database_round_trip(tuned_dir):
    target = parse_target("cuda:sm_90")
    db = database.TuningDatabase(tuned_dir)
    mod = cuda_wmma.workload(SPEC)
    assert len(db.records_for(mod)) == 2
    assert space.config_of(database.best_record(db, mod, target).trace) == FAST
    stock = ms.database.JSONDatabase(str(tuned_dir / database.WORKLOADS), str(tuned_dir / database.RECORDS))
    assert len(stock) == 2  # stock MetaSchedule reads the same files
    assert resolve_config(SPEC, target, True, None, tuned_dir) == FAST
    tuned, default = build(SPEC, target, db=tuned_dir), build(SPEC, target, db=None)
    assert tuned.config == FAST and default.config is None
    # what only FAST produces: its 1 x 4 warps tile conv2's 128 channels as one chunk, so the kernel's
    # code for that chunk differs from the default's (2 x 2 warps, 64-channel chunks)
    assert FAST != cuda_wmma.default_config(SPEC, 90) and tuned.source() != default.source()


def test_ship_merges_databases(tuned_dir, tmp_path):
    """ship_schedules merges databases (the shipped one and a new run) and keeps the best of each workload."""
    target = parse_target("cuda:sm_90")
    other = database.TuningDatabase(tmp_path / "other")
    _record(other, OTHER, target, SLOW, 5e-5)
    _record(other, SPEC, target, SLOW, 1e-5)  # now the fastest record of SPEC
    _record(other, SINGLE, target, SLOW, 2e-5)  # a single conv's record ships too
    orphan = dataclasses.replace(OTHER, h=7, w=7)  # as a record of a kernel whose PrimFunc changed: no spec builds it
    _record(other, orphan, target, SLOW, 2e-5)
    database.record_specs(tmp_path / "other", [OTHER, SPEC, SINGLE])
    out = tmp_path / "shipped"
    out.mkdir()
    old_row = f"| `{SPEC.to_string()}` | 7 | 1.0 | `...` |"  # 7 trials measured before
    (out / "README.md").write_text(f"# old table\n\n{old_row}\n\n## History\n- session 1: by hand\n")  # notes survive reshipping
    run = subprocess.run([sys.executable, "bench/ship_schedules.py", str(tuned_dir), str(tmp_path / "other"), "--top", "2",
                          "--gpu", "NVIDIA H200", "--arch", "sm_90", "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-1500:]
    shipped = database.TuningDatabase(out)
    assert len(shipped.records_for(cuda_wmma.workload(SPEC))) == 2 and len(shipped.records_for(cuda_wmma.workload(OTHER))) == 1
    assert resolve_config(SPEC, target, True, None, out) == SLOW
    assert resolve_config(SINGLE, target, True, None, out) == SLOW and SINGLE.to_string() in (out / "specs.txt").read_text()
    readme = (out / "README.md").read_text()
    assert OTHER.to_string() in (out / "specs.txt").read_text() and "NVIDIA H200 (sm_90)" in readme
    assert "## History\n- session 1: by hand" in readme and "old table" not in readme
    # trials add up: the README's 7, then the 2 and 1 records of SPEC in the two new databases
    assert f"| `{SPEC.to_string()}` | 10 |" in readme and f"| `{OTHER.to_string()}` | 1 |" in readme, readme
    assert not shipped.has_workload(cuda_wmma.workload(orphan))
    # --drop SPEC: none of its records ship (one slower than a newer default, say)
    run = subprocess.run([sys.executable, "bench/ship_schedules.py", str(out), "--drop", OTHER.to_string(),
                          "--gpu", "NVIDIA H200", "--arch", "sm_90", "--out", str(tmp_path / "dropped")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-1500:]
    dropped = database.TuningDatabase(tmp_path / "dropped")
    assert not dropped.has_workload(cuda_wmma.workload(OTHER)) and len(dropped.records_for(cuda_wmma.workload(SPEC))) == 2
    assert OTHER.to_string() not in (tmp_path / "dropped" / "specs.txt").read_text()


def test_a_database_ships_to_the_gpu_it_was_measured_on(tuned_dir, tmp_path):
    """tune notes the GPU it measures on (the remote one with --rpc) in the database; ship_schedules
    names the shipped directory after it without --gpu/--arch, refuses databases of two GPUs, and a
    database never takes another GPU's records."""
    database.record_specs(tuned_dir, [SPEC])
    database.note_gpu(tuned_dir, "NVIDIA H200", "sm_90")
    database.note_gpu(tuned_dir, "NVIDIA H200", "sm_90")  # the same GPU again: fine
    with pytest.raises(ValueError, match=r"holds records measured on NVIDIA H200 \(sm_90\), not NVIDIA A100"):
        database.note_gpu(tuned_dir, "NVIDIA A100", "sm_80")
    root = tmp_path / "schedules"
    env = {**os.environ, "TVM_B2B_SCHEDULES": str(root)}
    ship = [sys.executable, "bench/ship_schedules.py", str(tuned_dir)]
    run = subprocess.run(ship, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-1500:]
    assert len(database.TuningDatabase(root / "nvidia-h200-sm_90").records_for(cuda_wmma.workload(SPEC))) == 2
    other = tmp_path / "other"
    database.TuningDatabase(other)
    database.note_gpu(other, "NVIDIA A100", "sm_80")
    run = subprocess.run([*ship, str(other)], capture_output=True, text=True, env=env)
    assert run.returncode == 1 and "measured on different GPUs: NVIDIA A100 (sm_80), NVIDIA H200 (sm_90)" in run.stderr


def test_records_apply_only_to_their_workload_and_arch(tuned_dir):
    assert resolve_config(OTHER, parse_target("cuda:sm_90"), True, None, tuned_dir) is None
    assert resolve_config(SPEC, parse_target("cuda:sm_80"), True, None, tuned_dir) is None
    assert resolve_config(SPEC, parse_target("cuda:sm_90"), False, None, tuned_dir) is None  # unfused: defaults


def test_interrupted_write_loses_no_finished_record(tuned_dir):
    records = tuned_dir / database.RECORDS
    whole = records.read_bytes()
    torn = whole + whole.splitlines(keepends=True)[0][:57]  # a third record cut short
    records.write_bytes(torn)
    assert len(database.TuningDatabase(tuned_dir).records_for(cuda_wmma.workload(SPEC))) == 2
    assert records.read_bytes() == torn  # a reader (a build) drops the torn line in memory only
    db = database.TuningDatabase(tuned_dir, lock=True)  # the writer repairs the file
    assert len(db.records_for(cuda_wmma.workload(SPEC))) == 2
    assert records.read_bytes() == whole  # the torn tail is gone, the rest untouched
    _record(db, SPEC, parse_target("cuda:sm_90"), SLOW, 8e-5)  # tuning resumes: appends after it
    assert len(database.TuningDatabase(tuned_dir).records_for(cuda_wmma.workload(SPEC))) == 3


def test_repairing_a_torn_line_is_atomic(tuned_dir, monkeypatch):
    """The repair writes the whole lines to a new file that replaces the old one: a crash before the
    replace (simulated: os.replace fails) leaves the old file as it was, never a half-written one."""
    records = tuned_dir / database.RECORDS
    torn = records.read_bytes() + b'[0, ["cut'
    records.write_bytes(torn)

    def crash(*_args):
        raise OSError("simulated crash before the replace")

    monkeypatch.setattr(database.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        database.TuningDatabase(tuned_dir, lock=True)
    assert records.read_bytes() == torn


def test_a_second_writer_stops_with_a_one_line_error(tuned_dir):
    """Two tuners on one database: the second stops before it writes anything (a lock held by a real
    second process, released however that process ends)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from tvm_b2b.tune.database import lock_database; "
         "lock_database(sys.argv[1]); print('locked', flush=True); time.sleep(120)", str(tuned_dir)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = {p.name: p.read_bytes() for p in tuned_dir.iterdir() if p.is_file()}
        with pytest.raises(ValueError, match=f"in use by another tvm-b2b tune \\(pid {holder.pid}\\)") as err:
            database.TuningDatabase(tuned_dir, lock=True)
        assert "\n" not in str(err.value)
        assert {p.name: p.read_bytes() for p in tuned_dir.iterdir() if p.is_file()} == before
        assert len(database.TuningDatabase(tuned_dir).records_for(cuda_wmma.workload(SPEC))) == 2  # readers still read
    finally:
        holder.kill()
        holder.wait()
    database.TuningDatabase(tuned_dir, lock=True)  # a killed holder leaves no stale lock


@pytest.mark.parametrize("bad", [b"{not json\n", b'[0, ["trace?"]]\n'])
def test_corrupted_database_is_a_one_line_error(tuned_dir, bad):
    records = tuned_dir / database.RECORDS
    lines = records.read_bytes().splitlines(keepends=True)
    records.write_bytes(lines[0] + bad + lines[1])
    with pytest.raises(ValueError, match=f"{database.RECORDS}: line 2 is not"):
        database.TuningDatabase(tuned_dir)
    cli = subprocess.run([sys.executable, "-m", "tvm_b2b", "op", "--spec", SPEC.to_string(), "--target", "cuda:sm_90",
                          "--db", str(tuned_dir)], capture_output=True, text=True)
    assert cli.returncode == 2
    assert cli.stderr.count("\n") == 1 and "line 2 is not" in cli.stderr and "Traceback" not in cli.stderr


# TVM 0.27 cannot lower the register epilogue of this shape's default (k2=16 at stride 2): build uses epilogue=0
STAGED_FALLBACK = FusedConvSpec.parse("n=32,h=31,w=31,c=16,k1=24,k2=16,stride=2,dtype=float16")


@pytest.mark.parametrize(("spec", "fallback"), [(SPEC, False), (STAGED_FALLBACK, True)], ids=["default", "staged_fallback"])
def test_default_config_is_the_first_record(spec, fallback, tmp_path):
    """tune_spec measures the default config before it searches (the search's random draws need not
    include it), as build would run it (with the staged epilogue where TVM cannot lower the register
    one). Real builder and runner: on a machine without a GPU the run fails, and the record says so
    (MetaSchedule's failed-run time) instead of being dropped."""
    from tvm_b2b.tune.tuner import FAILED_RUN_SECS, Progress, measure_default

    target = parse_target("cuda:sm_90")
    db = database.TuningDatabase(tmp_path / "db")
    builder = ms.builder.LocalBuilder(f_build=build_candidate, timeout_sec=300, initializer=cuda_wmma.register_ldmatrix_index_map)
    progress = Progress("default", 4, 0, None, started=time.perf_counter())
    progress.out = lambda *a, **k: None
    measure_default(spec, target, db, builder, ms.runner.LocalRunner(timeout_sec=60), progress)
    (record,) = database.TuningDatabase(tmp_path / "db").records_for(cuda_wmma.workload(spec))
    default = cuda_wmma.default_config(spec, 90)
    if fallback:
        assert default.epilogue == 2
        default = dataclasses.replace(default, epilogue=0)
    assert space.config_of(record.trace) == default
    failed = [float(secs) for secs in record.run_secs] == [FAILED_RUN_SECS]
    assert progress.done == 1 and progress.environment == 0  # a local run's failure is the candidate's: counted
    assert progress.best_us == (None if failed else database.mean_us(record.run_secs))
    assert bool(progress.first_error) == failed


def test_missing_db_dir_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="is not a directory"):
        build(SPEC, "cuda:sm_90", db=tmp_path / "nope")


def test_shipped_databases_are_found_by_arch(monkeypatch, tmp_path):
    (tmp_path / "nvidia-h200-sm_90").mkdir()
    monkeypatch.setenv("TVM_B2B_SCHEDULES", str(tmp_path))
    assert database.find_database(parse_target("cuda:sm_90")).name == "nvidia-h200-sm_90"
    assert database.find_database(parse_target("cuda:sm_80")) is None
    (tmp_path / "nvidia-h100-sm_90").mkdir()
    assert database.find_database(parse_target("cuda:sm_90")) is None  # two GPUs of that arch, none here


def _tune_cli(db, trials):
    cmd = [sys.executable, "-m", "tvm_b2b", "tune", "--spec", SPEC.to_string(), "--target", "cuda",
           "--trials", str(trials), "--db", str(db)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.mark.gpu
def test_tune_measures_resumes_and_build_uses_the_record(tmp_path):
    from tvm_b2b.op import compare, random_inputs, reference

    first = _tune_cli(tmp_path / "db", 2)
    assert "2 trials (2 new)" in first and "trials, best" in first  # the progress line
    default = database.TuningDatabase(tmp_path / "db").records_for(cuda_wmma.workload(SPEC))[0]
    assert space.config_of(default.trace) == cuda_wmma.default_config(SPEC, target_info("cuda").arch)
    assert database.mean_us(default.run_secs) < 1e6  # measured: the default runs on this GPU
    second = _tune_cli(tmp_path / "db", 4)
    assert "4 trials (2 new)" in second
    target = parse_target("cuda")
    config = resolve_config(SPEC, target, True, None, tmp_path / "db")
    assert config is not None
    inputs = random_inputs(SPEC, seed=11)
    kernel = build(SPEC, target, db=tmp_path / "db")
    assert kernel.fused and kernel.config == config
    err, ok = compare(SPEC, kernel(**inputs), reference(SPEC, **inputs))
    assert ok, f"tuned {config}: max abs error {err}"


@pytest.mark.gpu
def test_tune_killed_mid_round_keeps_every_finished_record(tmp_path):
    """A real `tvm-b2b tune` killed with SIGKILL (with its build and run workers) while its first search
    round runs: every record finished before is still there and readable, and a rerun continues. While
    it runs, a second tuner on the same database stops with a one-line error."""
    db = tmp_path / "db"
    cmd = [sys.executable, "-m", "tvm_b2b", "tune", "--spec", SPEC.to_string(), "--target", "cuda", "--db", str(db)]
    tuner = subprocess.Popen([*cmd, "--trials", "40"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    records = db / database.RECORDS
    try:
        deadline = time.time() + 400
        while time.time() < deadline and not (records.exists() and records.read_bytes().count(b"\n") >= 1):
            assert tuner.poll() is None, tuner.communicate()[1][-2000:]
            time.sleep(0.2)
        assert records.exists(), "the default's record was never committed"
        second = subprocess.run([*cmd, "--trials", "2"], capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"in use by another tvm-b2b tune (pid {tuner.pid})" in second.stderr
        time.sleep(5)  # into the first search round (16 candidates: drawn, built, measured, then committed)
        assert tuner.poll() is None, "the tuner ended before it could be killed mid-round"
    finally:
        os.killpg(tuner.pid, signal.SIGKILL)
        tuner.wait()
    whole = records.read_bytes().count(b"\n")
    kept = len(database.TuningDatabase(db).records_for(cuda_wmma.workload(SPEC)))
    assert kept == whole >= 1  # every finished line is a readable record
    out = _tune_cli(db, kept + 2)
    assert f"{kept + 2} trials (2 new)" in out


@pytest.mark.gpu
def test_shipped_database_records_are_correct():
    """Every spec the local GPU's shipped database holds builds from it and matches numpy."""
    from tvm_b2b.op import compare, random_inputs, reference

    target = parse_target("cuda")
    directory = database.find_database(target)
    if directory is None:
        pytest.skip(f"no shipped database for this GPU ({database.local_gpu_name()})")
    specs = [parse_spec(line) for line in (directory / "specs.txt").read_text().split()]
    checked = 0
    for spec in specs:
        if resolve_config(spec, target, True, None, directory) is None:
            continue
        inputs = random_inputs(spec, seed=13)
        kernel = build(spec, target, db=directory)
        if isinstance(spec, FusedConvSpec):
            assert kernel.fused, f"{spec.to_string()}: the tuned record of the fused kernel built two kernels"
        err, ok = compare(spec, kernel(**inputs), reference(spec, **inputs))
        assert ok, f"{spec.to_string()} tuned: max abs error {err}"
        checked += 1
    assert checked > 0


def test_tune_cli_errors_are_one_line(tmp_path, capsys):
    from tvm_b2b.cli import main

    cases = [(["--target", "llvm", "--db", str(tmp_path)], "tuning is for CUDA targets"),
             (["--target", "cuda:sm_90", "--db", str(tmp_path), "--trials", "0"], "--trials: expected a positive number")]
    if not has_cuda_gpu():
        cases.append((["--target", "cuda:sm_90", "--db", str(tmp_path)], "this machine has no CUDA GPU"))
    for args, message in cases:
        assert main(["tune", "--spec", SPEC.to_string(), *args]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("tvm-b2b tune: error: ") and message in err, err


def test_shipped_h200_database_is_used_when_cross_building(capsys, monkeypatch, tmp_path):
    """The repo's schedules/nvidia-h200-sm_90 holds a record for this bench spec: a cross-build for
    sm_90 takes it where it is the one database of sm_90, --no-db the defaults. (With the H100's beside it, a
    cross-build takes neither: --db names one.)"""
    from tvm_b2b.cli import main

    (tmp_path / "nvidia-h200-sm_90").symlink_to(Path(__file__).resolve().parents[1] / "schedules" / "nvidia-h200-sm_90")
    monkeypatch.setenv("TVM_B2B_SCHEDULES", str(tmp_path))

    spec = "n=1,h=28,w=28,c=128,k1=128,k2=512,residual=1,dtype=float16"  # its record (n1_tile=128, ...) is not the default
    target = parse_target("cuda:sm_90")
    tuned = resolve_config(FusedConvSpec.parse(spec), target, True)
    assert tuned is not None and tuned != cuda_wmma.default_config(FusedConvSpec.parse(spec), 90)
    assert main(["op", "--spec", spec, "--target", "cuda:sm_90"]) == 0
    assert f"config  tuned record: {tuned.to_string()}" in capsys.readouterr().out
    assert main(["op", "--spec", spec, "--target", "cuda:sm_90", "--no-db"]) == 0
    assert "config  defaults" in capsys.readouterr().out


def test_build_worker_compiles_mma_without_tensor_intrin(tmp_path):
    """The tuner's build workers never import tensor_intrin (15-60 s each): they register the
    ldmatrix index map themselves, and the CUDA is the same as in a process that imported it."""
    target = parse_target("cuda:sm_90")
    func = plan(SPEC, target, False, cuda_wmma.WmmaConfig.parse("mma=1,m_tile=32")).kernels[0]
    mod = tvm.IRModule({"main": func})
    here = compile_module(mod, target).mod.imports[0].inspect_source()
    (tmp_path / "mod.json").write_text(tvm.ir.save_json(mod))
    worker = (
        "import sys, tvm\n"
        "from tvm_b2b.codegen import compile_module\n"
        "from tvm_b2b.schedule.cuda_wmma import register_ldmatrix_index_map\n"
        "from tvm_b2b.target import parse_target\n"
        "register_ldmatrix_index_map()\n"
        f"mod = tvm.ir.load_json(open({str(tmp_path / 'mod.json')!r}).read())\n"
        "sys.stdout.write(compile_module(mod, parse_target('cuda:sm_90')).mod.imports[0].inspect_source())\n"
        "assert 'tvm.s_tir.tensor_intrin.cuda' not in sys.modules\n"
    )
    run = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-1500:]
    assert run.stdout == here


def test_checked_run_rejects_a_wrong_result():
    """The tuner's runner compares each candidate with the numpy reference before timing it. Here
    on the CPU kernel (same signature as the CUDA one): right inputs pass, a changed weight fails."""
    from tvm_b2b.schedule import cpu
    from tvm_b2b.tune.tuner import CheckedRun

    func = cpu.RULE.plan(SPEC, target_info("llvm")).kernels[0].with_attr("global_symbol", "main")
    rt_mod = tvm.compile(tvm.IRModule({"main": func.with_attr("tirx.is_scheduled", True)}), target="llvm").mod
    checked, dev = CheckedRun(SPEC), tvm.cpu(0)
    config = ms.runner.EvaluatorConfig(number=1, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
    args = checked.alloc(dev, None, 1)
    assert len(checked.evaluate(rt_mod, dev, config, args)) == 1
    args[0][1].copyfrom(args[0][1].numpy() * 2)  # w1 no longer what the reference used
    with pytest.raises(RuntimeError, match="wrong result"):
        checked.evaluate(rt_mod, dev, config, args)


def test_resumed_tuning_warm_starts_the_cost_model(tuned_dir):
    from tvm_b2b.tune.tuner import warm_start

    model = ms.cost_model.XGBModel(extractor=ms.feature_extractor.PerStoreFeature(), adaptive_training=True)
    db = database.TuningDatabase(tuned_dir)
    assert warm_start(model, db, cuda_wmma.workload(SPEC), parse_target("cuda:sm_90")) == 2
    assert model.data_size == 2
    assert warm_start(model, db, cuda_wmma.workload(OTHER), parse_target("cuda:sm_90")) == 0


def test_installed_package_finds_the_shipped_records(tmp_path):
    """The shipped records are package data: a wheel of the project holds them (the written kernels' too), and tvm-b2b
    installed from it (unpacked into a directory of its own, used from outside the checkout) finds them."""
    root = Path(__file__).resolve().parents[1]
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(root),
                            "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=600)
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    (built,) = (tmp_path / "dist").glob("tvm_b2b-*.whl")
    with zipfile.ZipFile(built) as archive:
        for shipped in ("nvidia-h200-sm_90/database_tuning_record.json", "nvidia-h100-80gb-hbm3-sm_90/written_records.json"):
            assert f"tvm_b2b/schedules/{shipped}" in archive.namelist(), shipped
        archive.extractall(tmp_path / "site")
    probe = ("import tvm_b2b; from tvm_b2b.tune.database import schedules_root; "
             "print(tvm_b2b.__file__); root = schedules_root(); print(root); print(','.join(sorted(p.name for p in root.iterdir())))")
    env = {k: v for k, v in os.environ.items() if k != "TVM_B2B_SCHEDULES"}
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**env, "PYTHONPATH": str(tmp_path / "site")})
    assert run.returncode == 0, run.stderr[-2000:]
    module, root, found = run.stdout.split()
    site = str(tmp_path / "site")
    assert module.startswith(site) and root == str(tmp_path / "site" / "tvm_b2b" / "schedules")
    assert found.split(",") == ["nvidia-h100-80gb-hbm3-sm_90", "nvidia-h200-sm_90"], found


def _without_config_annotations(trace):
    """The trace as tvm-b2b wrote it before schedules recorded their config (no root annotations)."""
    from tvm.s_tir.schedule import Trace

    insts = [i for i in trace.insts
             if not (i.kind.name == "Annotate" and str(i.attrs[0]).startswith(cuda_wmma.CONFIG_ANNOTATION))]
    return Trace(insts, {i: trace.decisions[i] for i in insts if i in trace.decisions})


def test_old_records_are_not_misread_and_migrate(tmp_path, caplog):
    """A record without the config annotations is not guessed at (config_of: None, a logged hint); the
    migration tool reads it the old way and rewrites it with them, keeping its run times."""
    import importlib.util

    target = parse_target("cuda:sm_90")
    mod = cuda_wmma.workload(SPEC)
    sch = cuda_wmma.WmmaFusedSchedule(Schedule(mod), SPEC, FAST, 90).run()
    old = _without_config_annotations(sch.trace)
    assert cuda_wmma.config_of(sch.trace) == FAST and cuda_wmma.config_of(old) is None
    db = database.TuningDatabase(tmp_path / "old")
    commit_record(db, mod, old, target, [3e-5])
    database.record_specs(tmp_path / "old", [SPEC])
    with caplog.at_level("WARNING"):
        assert resolve_config(SPEC, target, True, None, tmp_path / "old") is None
    assert "predates the config annotations" in caplog.text
    path = Path(__file__).resolve().parents[1] / "bench" / "migrate_records.py"
    spec = importlib.util.spec_from_file_location("migrate_records", path)
    migrate_records = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migrate_records)
    assert migrate_records.migrate(tmp_path / "old") == 1
    (record,) = database.TuningDatabase(tmp_path / "old").records_for(mod)
    assert cuda_wmma.config_of(record.trace) == FAST and [float(s) for s in record.run_secs] == [3e-5]


def test_tune_refuses_what_it_cannot_search(mma_sync):
    """A single conv that splits its reduction by default (a tuned config runs whole; the split is not
    searched) is a one-line reason; a batch-32 conv (one kernel by default; on the mma.sync template: the Hopper
    kernel has nothing to tune) is tuned, and a CUDA-core conv (no parameters) is measured once (tune_spec: no search)."""
    import argparse

    from tvm_b2b.cli import UserError, _specs_to_tune

    target = parse_target("cuda:sm_90")
    tuned = ["n=32,h=14,w=14,c=256,k=256,kh=3,kw=3,pad_h=1,pad_w=1", "n=1,h=28,w=28,c=32,k=32,kh=3,kw=3,pad_h=1,pad_w=1,groups=32"]
    assert [s.to_string() for s in _specs_to_tune(argparse.Namespace(model=None, spec=tuned, only=None, batch=None), target)] == \
        [parse_spec(s).to_string() for s in tuned]
    with pytest.raises(UserError, match="splits its reduction"):
        _specs_to_tune(argparse.Namespace(model=None, spec=["n=1,h=14,w=14,c=256,k=256,kh=3,kw=3,pad_h=1,pad_w=1"], only=None,
                                          batch=None), target)
    with pytest.raises(UserError, match="--only: takes --model"):
        _specs_to_tune(argparse.Namespace(model=None, spec=tuned, only="pairs", batch=None), target)
    with pytest.raises(UserError, match="--batch: takes --model"):
        _specs_to_tune(argparse.Namespace(model=None, spec=tuned, only=None, batch=8), target)


def test_a_conv_without_parameters_is_measured_once(tmp_path):
    """A CUDA-core conv has one schedule: tune measures it (its record decides its pair's fusion) and
    searches nothing. Real builder and runner: without a GPU here its one trial fails, and still counts."""
    from tvm_b2b.tune.tuner import tune_spec

    spec = parse_spec("n=1,h=8,w=8,c=16,k=16,kh=3,kw=3,pad_h=1,pad_w=1,groups=16,dtype=float16")
    db = database.TuningDatabase(tmp_path / "db", lock=True)
    result = tune_spec(spec, parse_target("cuda:sm_90"), db, 8, work_dir=str(tmp_path / "logs"), out=lambda *a, **k: None)
    assert result["trials"] == 1, result
    assert (result["config"] == "its one schedule") == has_cuda_gpu() and (result["best_us"] is not None) == has_cuda_gpu()
    assert len(database.TuningDatabase(tmp_path / "db").records_for(rule_for("cuda:sm_90", kind_of(spec), spec).workload(spec))) == 1


def test_a_model_is_tuned_where_it_spends_most_first():
    """tune --model orders specs by FLOPs times occurrences (a --minutes budget then goes where the
    model's time is): three convs of F FLOPs outweigh one of 2F; a tie keeps graph order."""
    from tvm_b2b.cli import _by_work

    small, big, other = (parse_spec(f"n=1,h=14,w=14,c={c},k=256") for c in (256, 512, 128))
    assert big.flops == 2 * small.flops
    assert _by_work([big, small, other, small, small, other, other, other]) == [small, big, other]  # 3F, 2F, 2F
    assert _by_work([other, big, big]) == [big, other]


def test_cuda_intrinsics_import_alone_then_the_whole_package():
    """Our schedules import TVM's CUDA tensor intrinsics without the package's ARM/x86/ROCm/Hexagon ones
    (schedule.common.cuda_tensor_intrinsics); the package imported afterwards is whole and does not
    register the CUDA intrinsics twice (that would raise). In a fresh process: nothing imported it yet."""
    script = (
        "import sys\n"
        "from tvm_b2b.schedule.common import cuda_tensor_intrinsics\n"
        "cuda = cuda_tensor_intrinsics()\n"
        "from tvm.s_tir import TensorIntrin\n"
        "assert TensorIntrin.get('mma_f16f16f32') is not None\n"
        "assert 'tvm.s_tir.tensor_intrin' not in sys.modules and 'tvm.s_tir.tensor_intrin.x86' not in sys.modules\n"
        "import tvm.s_tir.tensor_intrin as package\n"
        "assert package.cuda is cuda and package.x86 is sys.modules['tvm.s_tir.tensor_intrin.x86']\n"
        "assert cuda_tensor_intrinsics() is cuda\n"
        "import inspect\n"
        "from tvm_b2b.schedule.common import MODULELESS_FILES\n"
        "assert not set(MODULELESS_FILES) & set(inspect.modulesbyfile)\n"  # what the import set up is gone
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-1500:]


def test_frames_of_no_module_are_looked_up_without_scanning_every_module(monkeypatch):
    """inspect.getmodule of a frame whose file no module has (the import machinery's, TVMScript's "<ast>") scans
    every loaded module and finds none; under moduleless_files_known (what the CUDA intrinsics import under: 7.0 ->
    1.5 s) it finds none without the scan. A module in sys.modules counts the scans: each reads its __file__."""
    import inspect
    import types

    from tvm_b2b.schedule.common import MODULELESS_FILES, moduleless_files_known

    class Counting(types.ModuleType):
        reads = 0

        @property
        def __file__(self):
            Counting.reads += 1
            return "/nowhere/counting.py"

    monkeypatch.setitem(sys.modules, "counting_module", Counting("counting_module"))
    frame = inspect.currentframe()
    for name in MODULELESS_FILES:
        before = Counting.reads
        assert inspect.getmodule(frame, name) is None and Counting.reads > before  # the scan
        with moduleless_files_known():
            before = Counting.reads
            assert inspect.getmodule(frame, name) is None and Counting.reads == before  # none
    assert not set(MODULELESS_FILES) & set(inspect.modulesbyfile)


# -- the written kernels (sm_90's TIRx kernels): their configs measured whole (tune.written) ---------------------------
HOPPER_PAIR = FusedConvSpec.parse("n=32,h=56,w=56,c=64,k1=64,k2=128,dtype=float16")
HOPPER_CONV = ConvSpec.parse("n=32,h=28,w=28,c=128,k=128,kh=3,kw=3,pad_h=1,pad_w=1,dtype=float16")
DEPTHWISE_PAIR = FusedConvSpec.parse("n=1,h=14,w=14,c=384,k1=384,k2=96,groups=384,dtype=float16")


def _written_rules():
    from tvm_b2b.schedule import cuda_cluster_dw_pair, cuda_hopper_conv, cuda_hopper_pair

    return [(cuda_hopper_pair.RULE, HOPPER_PAIR), (cuda_hopper_conv.RULE, HOPPER_CONV), (cuda_cluster_dw_pair.RULE, DEPTHWISE_PAIR)]


@pytest.mark.parametrize("index", range(3), ids=["hopper_pair", "hopper_conv", "cluster_pair"])
def test_written_kernels_tuning_space(index):
    """A written kernel's candidates: its default first, then the fewest knobs away from it first; each one the kernel
    takes on sm_90 (shapes, shared memory), none building the same kernel as another, each text parsing back; every
    searched knob varies (the Hopper kernels' producer warp and halo form, the cluster's sizes and steps)."""
    rule, spec = _written_rules()[index]
    info = target_info(parse_target("cuda:sm_90"))
    found = rule.candidates(spec, info)
    default = rule.default_config(spec, info)
    assert found[0] == default and len(found) > 8
    assert len({rule.built(spec, c) for c in found}) == len(found)
    assert all(rule.config_problem(spec, c, 90) is None and rule.parse_config(c.to_string()) == c for c in found)
    distance = [sum(getattr(c, f) != getattr(default, f) for f in rule.searched(spec)) for c in found]
    assert distance == sorted(distance) and distance[1] == 1
    for knob, values in rule.searched(spec).items():
        assert len({getattr(c, knob) for c in found}) > 1 or len(values) == 1, knob


def _written(spec_text, kernel, config, us, arch="sm_90", error=""):
    return database.WrittenRecord(spec_text, arch, kernel, config, us, error)


def test_written_records_choose_the_build_and_ship(tmp_path):
    """A written kernel's records: the build takes the fastest valid config of its spec on its arch (not a failed one,
    nor another arch's or spec's), a reopened database sees a new record, a torn last line is dropped, and
    ship_schedules keeps the best of each spec."""
    target, text = parse_target("cuda:sm_90"), HOPPER_PAIR.to_string()
    db = database.TuningDatabase(tmp_path / "db", lock=True)
    for record in (_written(text, "Hopper", "bm=128,bn=64,stages=3,halo=1", 36.0),
                   _written(text, "Hopper", "bm=64,bn=64,stages=6", None, error="wrong result"),
                   _written(text, "Hopper", "bm=128,bn=64,stages=4,halo=1,warp=1", 31.0),
                   _written(text, "Hopper", "bm=64,bn=128,stages=2", 5.0, arch="sm_100"),
                   _written(OTHER.to_string(), "Hopper", "bm=64,bn=64,stages=2", 1.0)):
        db.commit_written(record)
    database.record_specs(tmp_path / "db", [HOPPER_PAIR])
    fastest = "bm=128,bn=64,stages=4,halo=1,warp=1"
    assert resolve_config(HOPPER_PAIR, target, True, None, tmp_path / "db").to_string() == fastest
    assert database.best_us(HOPPER_PAIR, target, tmp_path / "db") == 31.0
    assert resolve_config(HOPPER_PAIR, target, False, None, tmp_path / "db") is None  # two kernels: the template's
    assert build(HOPPER_PAIR, "cuda:sm_90", db=tmp_path / "db").config.to_string() == fastest
    db.commit_written(_written(text, "Hopper", "bm=128,bn=64,stages=6,halo=1", 30.0))
    assert resolve_config(HOPPER_PAIR, target, True, None, tmp_path / "db").stages == 6  # reopened: the new record
    path = tmp_path / "db" / database.WRITTEN
    path.write_bytes(path.read_bytes() + b'{"spec": "n=32,h=56')  # an append cut short
    assert len(database.TuningDatabase(tmp_path / "db").written_for(text, "sm_90", "Hopper")) == 4
    run = subprocess.run([sys.executable, "bench/ship_schedules.py", str(tmp_path / "db"), "--top", "2", "--gpu", "NVIDIA H200",
                          "--arch", "sm_90", "--out", str(tmp_path / "shipped")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-1500:]
    shipped = database.TuningDatabase(tmp_path / "shipped")
    assert [r.us for r in shipped.written_for(text, "sm_90", "Hopper")] == [30.0, 31.0]  # the 2 best valid ones
    assert f"| `{text}` | 4 | 30.0 | `bm=128,bn=64,stages=6,halo=1` (Hopper) |" in (tmp_path / "shipped" / "README.md").read_text()


@pytest.mark.gpu
def test_tuning_a_written_kernel_measures_its_candidates(tmp_path, monkeypatch):
    """On an sm_90 GPU: tune measures the Hopper pair's candidates, the default first, each checked against numpy; a
    rerun measures only what the database lacks; the build then takes the fastest and matches numpy."""
    from cuda_source import skip_unless_sm90
    from tvm_b2b.op.reference import compare, random_inputs, reference
    from tvm_b2b.tune.tuner import tune_spec

    skip_unless_sm90()
    monkeypatch.setenv("TVM_B2B_HOPPER_PAIR", "all")  # (a pair this small runs on the template by default)
    spec, target = FusedConvSpec.parse("n=2,h=14,w=14,c=64,k1=64,k2=256,residual=1,dtype=float16"), parse_target("cuda")
    db = database.TuningDatabase(tmp_path / "db", lock=True)
    result = tune_spec(spec, target, db, 3, work_dir=str(tmp_path / "logs"), label="[1/1]")
    records = db.written_for(spec.to_string(), "sm_90", "Hopper")
    assert result["trials"] == 3 and len(records) == 3 and all(r.us for r in records), records
    rule = rule_for(target, kind_of(spec), spec)
    assert {r.config for r in records} == {c.to_string() for c in rule.candidates(spec, target_info(target))[:3]}
    assert tune_spec(spec, target, db, 4, work_dir=str(tmp_path / "logs"))["trials"] == 4  # one more, not four
    kernel = build(spec, "cuda", db=tmp_path / "db")
    assert kernel.config.to_string() == db.best_written(spec.to_string(), "sm_90", "Hopper").config
    arrays = random_inputs(spec, seed=3)
    err, ok = compare(spec, kernel(**arrays), reference(spec, **arrays))
    assert ok, f"max abs error {err}"


def test_written_tuning_records_every_candidate_it_measures(tmp_path, monkeypatch):
    """tune_spec of a written kernel (tune.written), real worker process: each candidate is built there and run; on a
    machine without a GPU each run fails, is recorded as failed with its reason (the worker restarted after it), and
    the summary names the first failure; with a GPU, each is a valid record. A rerun measures only what is missing."""
    from tvm_b2b.tune.tuner import tune_spec

    monkeypatch.setenv("TVM_B2B_HOPPER_PAIR", "all")
    spec, target = FusedConvSpec.parse("n=2,h=14,w=14,c=64,k1=64,k2=128,dtype=float16"), parse_target("cuda:sm_90")
    db = database.TuningDatabase(tmp_path / "db", lock=True)
    lines = []
    result = tune_spec(spec, target, db, 2, work_dir=str(tmp_path / "logs"), out=lines.append)
    records = db.written_for(spec.to_string(), "sm_90", "Hopper")
    assert result["trials"] == 2 and len(records) == 2 and len(lines) == 3, lines
    if has_cuda_gpu():
        assert all(r.us for r in records) and result["best_us"]
    else:
        assert all(r.us is None and r.error.startswith("run: ") for r in records), records
        assert result["best_us"] is None and result["first_error"].startswith(records[0].config + ": run: ")
    assert tune_spec(spec, target, db, 2, work_dir=str(tmp_path / "logs"), out=lines.append)["trials"] == 2
    assert len(database.TuningDatabase(tmp_path / "db").written_for(spec.to_string(), "sm_90", "Hopper")) == 2
