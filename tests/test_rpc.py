"""Tuning through TVM's RPC tracker (tune --rpc): a real tracker and two real RPC servers on 127.0.0.1
(TVM's own `python -m tvm.exec.rpc_tracker` / `rpc_server`), no mocks. On a machine without a GPU the
servers lend no CUDA device: `tune --rpc` reaches them and stops in one line before any work."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tvm_b2b.cli import main

SPEC = "n=1,h=14,w=14,c=32,k1=64,k2=64,dtype=float16"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STARTUP_S = 180  # TVM's import in three new processes at once takes a while on 2 cores


def _wait_for_port(port: int) -> None:
    deadline = time.time() + STARTUP_S
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"the tracker did not listen on {port} within {STARTUP_S} s")


def _wait_for_servers(port: int, key: str, count: int) -> None:
    from tvm import rpc

    deadline = time.time() + STARTUP_S
    while time.time() < deadline:
        if rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get(key, {}).get("free", 0) >= count:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{count} RPC server(s) under {key!r} did not register within {STARTUP_S} s")


@pytest.fixture(scope="module")
def tracker():
    """(port, key, server processes): a tracker and two servers under the key."""
    port, key = _free_port(), "b2b-test"
    procs = [_start("tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1))]
    try:
        _wait_for_port(port)
        for _ in range(2):
            server = _free_port()
            procs.append(_start("tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1",
                                "--port", str(server), "--port-end", str(server + 1)))
        _wait_for_servers(port, key, 2)
        yield port, key, procs
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)  # with the workers TVM's tracker and servers fork
            proc.wait()


def _start(module: str, *args: str):
    return subprocess.Popen([sys.executable, "-m", module, *args, "--silent"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


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
