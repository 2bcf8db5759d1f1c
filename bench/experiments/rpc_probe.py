"""Asks an RPC server lending this machine's GPU for its attributes, each way, printing every error whole
(diagnosis of tune --rpc's up-front GPU query)."""
import subprocess, sys, time, traceback, socket

def free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

port, sport = free(), free()
procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)])]
time.sleep(8)
procs.append(subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", "k", "--host", "127.0.0.1", "--port", str(sport), "--port-end", str(sport + 1)]))
from tvm import rpc
try:
    tracker = rpc.connect_tracker("127.0.0.1", port)
    for _ in range(600):  # the server imports TVM first (about 90 s on 2 cores)
        if tracker.summary()["queue_info"].get("k", {}).get("free", 0):
            break
        time.sleep(0.5)
    print(tracker.summary())
    s = tracker.request("k", priority=1, session_timeout=60)
    dev = s.cuda(0)
    for name in ("exist", "compute_version", "device_name", "max_clock_rate"):
        try:
            print(name, repr(getattr(dev, name)))
        except Exception:
            print(name, "FAILED"); traceback.print_exc()
    for attr in (0, 4, 5):
        try:
            print("remote GetDeviceAttr", attr, repr(s.get_function("runtime.GetDeviceAttr")(2, 0, attr)))
        except Exception:
            print("remote GetDeviceAttr", attr, "FAILED"); traceback.print_exc()
finally:
    for p in procs:
        p.kill()
