"""Targets as users write them: `llvm`, `cuda` (the local GPU), `cuda:sm_XX`, or a TVM target JSON."""
from __future__ import annotations

import json
import re

_CUDA_ARCH = re.compile(r"^cuda:(sm_\d+a?)$")


def local_cuda_arch() -> str:
    """sm_XX of GPU 0, or a ValueError when this machine has none."""
    import tvm

    if not has_cuda_gpu():
        raise ValueError(f"target: 'cuda' means the local GPU, and {NO_GPU} (use cuda:sm_XX to cross-build)")
    return "sm_" + tvm.cuda(0).compute_version.replace(".", "")


def has_cuda_gpu() -> bool:
    """Whether this machine has a CUDA GPU that TVM can run on."""
    import tvm

    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no driver, or a runtime without CUDA: no GPU to run on
        return False


NO_GPU = "this machine has no CUDA GPU"


def parse_target(text):
    """A tvm.target.Target from its command-line spelling (or an existing Target, returned as is)."""
    import tvm

    if isinstance(text, tvm.target.Target):
        return text
    text = str(text).strip()
    if text == "llvm":
        return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    if text == "cuda":
        return cuda_target(local_cuda_arch())
    match = _CUDA_ARCH.match(text)
    if match:
        return cuda_target(match.group(1))
    if text.startswith("{"):
        try:
            config = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"target: not valid JSON ({err.msg})") from None
        return tvm.target.Target(config)
    raise ValueError(f"target: expected llvm, cuda, cuda:sm_XX or a target JSON, got {text!r}")


def cuda_target(arch: str):
    """The CUDA target of an arch, with its limits (TVM's default GPU schedules read them)."""
    import tvm

    return tvm.target.Target({
        "kind": "cuda", "arch": arch, "host": {"kind": "llvm"},
        "max_shared_memory_per_block": max_shared_bytes(arch_number(arch)), "max_threads_per_block": 1024,
        "thread_warp_size": 32, "registers_per_block": 65536,
    })


def max_shared_bytes(arch: int) -> int:
    """Dynamic shared memory per block, by compute capability (CUDA programming guide)."""
    if arch >= 90:
        return 227 * 1024
    if arch in (80, 87):
        return 163 * 1024
    if arch >= 86:
        return 99 * 1024
    if arch == 75:
        return 64 * 1024
    return 96 * 1024


def arch_number(arch: str) -> int:
    """80 for 'sm_80' (0 when it holds no number)."""
    return int(re.sub(r"\D", "", arch) or 0)


def cuda_arch_number(target) -> int:
    """80 for sm_80 (0 for a non-CUDA target)."""
    if target.kind.name != "cuda":
        return 0
    return arch_number(str(target.attrs.get("arch", "sm_0")))
