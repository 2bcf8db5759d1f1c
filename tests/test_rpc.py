"""Tuning through TVM's RPC tracker (tune --rpc): a real tracker and two real RPC servers on 127.0.0.1
(TVM's own `python -m tvm.exec.rpc_tracker` / `rpc_server`), no mocks. On a machine without a GPU the
servers lend no CUDA device: `tune --rpc` reaches them and stops in one line before any work."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tvm_b2b.cli import main

SPEC = "n=1,h=14,w=14,c=32,k1=64,k2=64,dtype=float16"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STARTUP_S = 180  # TVM's import in three new processes at once takes a while on 2 cores


def _wait_for_port(port: int, proc) -> None:
    deadline = time.time() + STARTUP_S
    while time.time() < deadline:
        _check_alive(proc)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the tracker did not listen on {port} within {STARTUP_S} s")


def _check_alive(proc) -> None:
    """A tracker or server that ended while starting: its last line of stderr (e.g. tornado missing)."""
    if proc.poll() is not None:
        proc.log.seek(0)
        lines = proc.log.read().decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{proc.args[2]} exited with {proc.returncode}: {lines[-1] if lines else 'no output'}")


def _wait_for_servers(port: int, key: str, count: int, procs) -> None:
    from tvm import rpc

    deadline = time.time() + STARTUP_S
    while time.time() < deadline:
        for proc in procs:
            _check_alive(proc)
        if rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get(key, {}).get("free", 0) >= count:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{count} RPC server(s) under {key!r} did not register within {STARTUP_S} s")


@contextlib.contextmanager
def tracker_with_servers(count: int = 2, *server_args: str):
    """(port, key, processes: the tracker's, then each server's): a real tracker and `count` servers
    under the key on 127.0.0.1 (started with `server_args` too), all killed (with the workers they
    fork) on exit."""
    port, key = _free_port(), "b2b-test"
    procs = [_start("tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1))]
    try:
        _wait_for_port(port, procs[0])
        for _ in range(count):
            server = _free_port()
            procs.append(_start("tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1",
                                "--port", str(server), "--port-end", str(server + 1), *server_args))
        _wait_for_servers(port, key, count, procs)
        yield port, key, procs
    finally:
        for proc in procs:
            _kill(proc)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the process group: with the workers it forked
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def tracker():
    with tracker_with_servers(2) as started:
        yield started


def _start(module: str, *args: str):
    # stderr to a file, not a pipe: a full pipe would block the process; read back if it dies starting
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", module, *args, "--silent"], stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)
    proc.log = log
    return proc


def _tune_error(args, capsys) -> str:
    assert main(["tune", "--spec", SPEC, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


def test_tune_through_a_tracker_checks_its_gpu_up_front(tracker, tmp_path, capsys):
    """The servers are reached (a session is made) and found to have no CUDA GPU: one line, and the
    database directory is not even created."""
    from tvm_b2b.target import has_cuda_gpu

    if has_cuda_gpu():
        pytest.skip("the servers on this machine lend its GPU (the GPU test tunes through them)")
    port, key, _ = tracker
    err = _tune_error(["--rpc", f"127.0.0.1:{port}", "--rpc-key", key, "--db", str(tmp_path / "db")], capsys)
    assert f"the RPC server under '{key}' at 127.0.0.1:{port} has no CUDA GPU to measure on" in err
    assert not (tmp_path / "db").exists()


def test_tune_rpc_errors_name_what_is_wrong(tracker, tmp_path, capsys):
    port, key, _ = tracker
    db = ["--db", str(tmp_path / "db")]
    assert "no RPC server is registered under 'other'" in _tune_error(["--rpc", f"127.0.0.1:{port}", "--rpc-key", "other", *db], capsys)
    assert f"(keys there: {key})" in _tune_error(["--rpc", f"127.0.0.1:{port}", "--rpc-key", "other", *db], capsys)
    closed = _free_port()
    assert f"cannot reach an RPC tracker at 127.0.0.1:{closed}" in _tune_error(["--rpc", f"127.0.0.1:{closed}", "--rpc-key", key, *db], capsys)
    assert "expected HOST:PORT" in _tune_error(["--rpc", "nowhere", "--rpc-key", key, *db], capsys)
    assert "--rpc-key KEY" in _tune_error(["--rpc", f"127.0.0.1:{port}", *db], capsys)
    assert "only with --rpc" in _tune_error(["--rpc-key", key, *db], capsys)


@pytest.mark.gpu
def test_tune_through_a_tracker_on_this_gpu(tmp_path):
    """`tvm-b2b tune --rpc` through a real tracker and two servers lending this machine's GPU, 8 trials
    measured two at a time; one server is killed once the first record is in. The run goes on on the
    other server: all 8 trials count, the database reopens intact and notes the GPU it measured on,
    and its best record, built and run here, matches numpy and takes the time measured through RPC
    (within noise)."""
    from tvm_b2b import build
    from tvm_b2b.op import compare, random_inputs, reference
    from tvm_b2b.op.kind import parse_spec
    from tvm_b2b.target import parse_target
    from tvm_b2b.tune import database
    from tvm_b2b.schedule import kind_of, rule_for

    db, spec, target = tmp_path / "db", parse_spec(SPEC), parse_target("cuda")
    with tracker_with_servers(2, "--no-fork") as (port, key, procs):  # as README says: a forked server has no CUDA
        tuner = subprocess.Popen([sys.executable, "-m", "tvm_b2b", "tune", "--spec", SPEC, "--rpc", f"127.0.0.1:{port}",
                                  "--rpc-key", key, "--rpc-workers", "2", "--trials", "8", "--db", str(db)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        records = db / database.RECORDS
        deadline = time.time() + 300
        while time.time() < deadline and not (records.exists() and records.read_bytes().count(b"\n") >= 1):
            assert tuner.poll() is None, tuner.communicate()[1][-2000:]
            time.sleep(0.2)
        _kill(procs[2])  # mid-run: the default's record is in, the search has not finished
        try:
            out, err = tuner.communicate(timeout=600)
        finally:
            _kill(tuner)
    assert tuner.returncode == 0, err[-2000:]
    assert "through the RPC tracker" in out and "8 trials (8 new)" in out, out
    assert database.measured_gpu(db) == (database.local_gpu_name(), str(target.attrs["arch"]))
    workload = rule_for(target, kind_of(spec), spec).workload(spec)
    best = database.best_record(database.TuningDatabase(db), workload, target)
    assert len(database.TuningDatabase(db).records_for(workload)) == 8
    kernel = build(spec, target, db=db)
    inputs = random_inputs(spec, seed=5)
    error, ok = compare(spec, kernel(**inputs), reference(spec, **inputs))
    assert ok, f"the best record through RPC, run here: max abs error {error}"
    remote_us, local_us = database.mean_us(best.run_secs), kernel.time_us(inputs, number=50, repeat=5)
    assert 0.6 < local_us / remote_us < 1.6, (local_us, remote_us)  # the same GPU: the same time, within noise


def test_checked_measurement_through_a_tracker_on_cpu_servers(tracker, tmp_path):
    """The tuner's RPC measurement (session, upload, inputs copied over, the run checked against the
    numpy reference, the time read back) on the servers here, with the CPU kernel of a spec as the
    candidate (they have no GPU): a correct kernel gives times, a kernel checked against another
    spec's reference is the candidate's failure ("wrong result"), not the environment's."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_b2b.op.kind import parse_spec
    from tvm_b2b.schedule import plan
    from tvm_b2b.target import parse_target
    from tvm_b2b.tune.remote import RemoteGpu
    from tvm_b2b.tune.tuner import CheckedRun, environment_failure, make_runner

    port, key, procs = tracker
    if any(proc.poll() is not None for proc in procs):
        pytest.skip("a server of the module's tracker was killed by an earlier test")
    spec = parse_spec("n=1,h=8,w=8,c=16,k1=16,k2=32,dtype=float32")
    target = parse_target("llvm")
    (sch,) = plan(spec, target).schedules
    (built,) = ms.builder.LocalBuilder(timeout_sec=300, max_workers=1).build([ms.builder.BuilderInput(sch.mod, target)])
    assert built.error_msg is None, built.error_msg
    args_info = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
    remote = RemoteGpu("127.0.0.1", port, key, "none", "none")
    other = parse_spec("n=1,h=8,w=8,c=16,k1=16,k2=32,act2=none,dtype=float32")  # same shapes, another result
    results = {}
    for name, checked in [("right", CheckedRun(spec)), ("wrong", CheckedRun(other))]:
        (future,) = make_runner(checked, remote).run([ms.runner.RunnerInput(built.artifact_path, "cpu", args_info)])
        results[name] = future.result()
    assert results["right"].error_msg is None and len(results["right"].run_secs) == 3, results["right"].error_msg
    assert "wrong result" in results["wrong"].error_msg and not environment_failure(results["wrong"].error_msg)


def test_a_server_lost_mid_run_costs_no_trials_and_no_records(tracker, tmp_path):
    """Tuning through the tracker (the API under `tune --rpc`, past the CLI's up-front GPU check): one
    of the two servers is killed once the first trial is done, mid-run. The servers here lend no
    CUDA device, so every trial fails for the environment: none counts toward the trials, the
    database keeps no record of them and reopens intact, and the cause is one clear line. (Kept last:
    it kills a server of the module's tracker.)"""
    from tvm_b2b.op.kind import parse_spec
    from tvm_b2b.target import cuda_target
    from tvm_b2b.tune.database import TuningDatabase
    from tvm_b2b.tune.remote import RemoteGpu
    from tvm_b2b.target import has_cuda_gpu
    from tvm_b2b.tune.tuner import tune_spec

    if has_cuda_gpu():
        pytest.skip("the servers on this machine lend its GPU: trials succeed there (the GPU test kills a server)")
    port, key, procs = tracker
    lines = []

    def out(line, **_):
        lines.append(line)
        if len(lines) == 1:
            _kill(procs[1])

    db = TuningDatabase(tmp_path / "db", lock=True)
    result = tune_spec(parse_spec(SPEC), cuda_target("sm_90"), db, trials=4, work_dir=str(tmp_path / "logs"), out=out,
                       remote=RemoteGpu("127.0.0.1", port, key, "a GPU", "sm_90"), remote_workers=2)
    assert procs[1].poll() is not None, "the server was not killed mid-run"
    assert result["trials"] == 0 and result["best_us"] is None, result
    assert result["environment_failures"] >= 2, result  # the default config's trial and the search's
    assert result["environment_error"].startswith("environment: "), result
    assert "\n" not in result["environment_error"]
    assert "failed for the environment, not counted" in lines[0]
    reopened = TuningDatabase(tmp_path / "db")  # both files parse: nothing torn
    assert len(reopened) == 0


def test_a_forked_servers_cuda_error_says_to_start_it_without_fork():
    """The errors a session of a forking rpc_server (TVM's default) gave on the H200 for the GPU's name and
    arch (bench/results/rpc_probe_h200_s12.log) point to --no-fork; other errors get no such hint."""
    from tvm_b2b.tune.remote import error_cause, fork_hint

    name = ("RPCError: Error caught from RPC call:\ncuDeviceGetName(&name[0], name.size(), dev.device_id) failed "
            "with error: CUDA_ERROR_NOT_INITIALIZED")
    arch = "RPCError: Error caught from RPC call:\nCUDA Runtime Error: cudaErrorInitializationError (3): initialization error"
    assert error_cause(name).startswith("cuDeviceGetName") and error_cause(arch).startswith("CUDA Runtime Error")
    assert all("--no-fork" in fork_hint(text) for text in (name, arch))
    assert fork_hint("RPCError: Error caught from RPC call:\nDevice API cuda is not enabled.") == ""
