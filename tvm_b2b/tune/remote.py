"""Measuring through TVM's RPC tracker: the GPUs that RPC servers (`python -m tvm.exec.rpc_server
--tracker HOST:PORT --key KEY`) register with a tracker (`python -m tvm.exec.rpc_tracker`) under a key.
What the tuner needs of them, asked up front so that a wrong setup fails in one line before any work:
the tracker is reachable, servers are registered under the key, and the device they lend is a CUDA
GPU, whose name and arch (the database a record ships in) it returns."""
from __future__ import annotations

from dataclasses import dataclass

CONNECT_TIMEOUT_S = 10  # how long reaching the tracker and getting a session may take


@dataclass(frozen=True)
class RemoteGpu:
    host: str
    port: int
    key: str
    name: str  # as the device reports it (e.g. "NVIDIA H200")
    arch: str  # sm_XX

    @property
    def tracker(self) -> str:
        return f"{self.host}:{self.port}"


def parse_tracker(text: str) -> tuple[str, int]:
    """(host, port) of --rpc HOST:PORT, or ValueError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--rpc: expected HOST:PORT of an RPC tracker, got {text!r}")
    return host, int(port)


def remote_gpu(text: str, key: str) -> RemoteGpu:
    """The GPU that the tracker at `text` (HOST:PORT) lends under `key`, asked through one session;
    ValueError in one line when the tracker cannot be reached, nothing is registered under the key, or
    the device has no CUDA GPU."""
    from tvm import rpc

    host, port = parse_tracker(text)
    try:
        tracker = rpc.connect_tracker(host, port)
        keys = tracker.summary()["queue_info"]
    except Exception as err:  # noqa: BLE001 - a socket error of any kind: the tracker is not there
        raise ValueError(f"--rpc: cannot reach an RPC tracker at {host}:{port} ({_error_line(err)})") from None
    if key not in keys or not keys[key].get("free", 0) + keys[key].get("pending", 0):
        known = ", ".join(sorted(keys)) or "none"
        raise ValueError(f"--rpc-key: no RPC server is registered under {key!r} at {host}:{port} (keys there: {known})")
    try:
        session = tracker.request(key, priority=1, session_timeout=CONNECT_TIMEOUT_S * 6, max_retry=2)
        device = session.cuda(0)
        exists = bool(device.exist)
        name, version = (device.device_name, device.compute_version) if exists else ("", "")
    except Exception as err:  # noqa: BLE001 - the server went away, or has no CUDA runtime at all
        raise ValueError(f"--rpc: the RPC server under {key!r} could not be asked for its GPU ({_error_line(err)})"
                         f"{fork_hint(str(err))}") from None
    if not exists:
        raise ValueError(f"--rpc-key: the RPC server under {key!r} at {host}:{port} has no CUDA GPU to measure on")
    return RemoteGpu(host, port, key, str(name), "sm_" + str(version).replace(".", ""))


def check_target(gpu: RemoteGpu, target) -> None:
    """ValueError in one line when --target names another arch than the remote GPU's."""
    arch = str(target.attrs.get("arch", ""))
    if arch and arch != gpu.arch:
        raise ValueError(f"--target: {arch}, but the GPU under {gpu.key!r} at {gpu.tracker} is {gpu.name} ({gpu.arch})")


FORKED_CUDA = ("CUDA_ERROR_NOT_INITIALIZED", "cudaErrorInitializationError")  # CUDA in a process forked after its init


def fork_hint(error_msg: str) -> str:
    """What to do about a CUDA error that a server forking its sessions gets (TVM's rpc_server does by
    default; measured on the H200: every CUDA call in the session fails to initialize)."""
    if any(code in error_msg for code in FORKED_CUDA):
        return "; start the RPC servers with --no-fork: a forked session cannot initialize CUDA"
    return ""


def error_cause(error_msg: str) -> str:
    """The line of an error message that says what went wrong: its last non-empty line (MetaSchedule
    puts tracebacks first; an RPC error's first line is only "Error caught from RPC call:")."""
    lines = [line.strip() for line in error_msg.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "unknown error"


def _error_line(err: Exception) -> str:
    return error_cause(str(err)) if str(err).strip() else type(err).__name__
