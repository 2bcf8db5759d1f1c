"""Targets as users write them (`llvm`, `cuda` (the local GPU), `cuda:sm_XX`, TVM's `cuda -arch=sm_90`
or `llvm -mcpu=native`, a target JSON) and what our rules need to know of one (TargetInfo)."""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

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
SM90_SMS = 132  # SMs of the sm_90 GPUs measured (H100 SXM, H200), assumed where no sm_90 GPU is here


@functools.cache
def sm90_count() -> int:
    """The SMs of an sm_90 build's GPU: the GPU here where it is one (an H100 PCIe has 114), else SM90_SMS (a build
    on a machine without it). A persistent grid of more blocks than the SMs hold would run the rest after them."""
    import tvm

    if has_cuda_gpu() and tvm.cuda(0).compute_version == "9.0":
        return int(tvm.cuda(0).multi_processor_count)
    return SM90_SMS


def parse_target(text):
    """A tvm.target.Target from its command-line spelling (or an existing Target, returned as is):
    llvm, cuda (the local GPU), cuda:sm_XX, TVM's own "KIND -key=value ..." ("cuda -arch=sm_90",
    "llvm -mcpu=native"), or a target JSON."""
    import tvm

    if isinstance(text, TargetInfo):
        return text.target
    if isinstance(text, tvm.target.Target):
        return text
    text = str(text).strip()
    match = _CUDA_ARCH.match(text)
    if match:
        return cuda_target(match.group(1))
    if text.startswith("{"):
        try:
            config = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"target: not valid JSON ({err.msg})") from None
        return tvm.target.Target(config)
    kind, *options = text.split()
    if kind in ("llvm", "cuda") and all(o.startswith("-") and "=" in o for o in options):
        return _from_options(kind, dict(o.lstrip("-").split("=", 1) for o in options))
    raise ValueError(f"target: expected llvm, cuda, cuda:sm_XX, 'cuda -arch=sm_XX', 'llvm -mcpu=CPU' or a target "
                     f"JSON, got {text!r}")


def _from_options(kind: str, options: dict[str, str]):
    """The target of TVM's "KIND -key=value" spelling, with our defaults for what it leaves out."""
    import tvm

    if kind == "cuda":
        arch = options.pop("arch", None) or local_cuda_arch()
        if not _CUDA_ARCH.match(f"cuda:{arch}"):
            raise ValueError(f"target: -arch={arch} is not an sm_XX arch")
        target = cuda_target(arch)
        return tvm.target.Target({**target.export(), **options}) if options else target
    if options.get("mcpu", "native") == "native":
        options["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", **options})


@dataclass(frozen=True)
class TargetInfo:
    """What our rules need to know of a target, resolved once (target_info) and passed down."""

    target: object  # the tvm.target.Target
    kind: str  # "llvm" or "cuda"
    arch: int  # the CUDA compute capability as a number (90 for sm_90); 0 on CPUs
    shared_memory: int  # dynamic shared memory per thread block, bytes (0 on CPUs)
    tensor_cores: str | None  # "mma" (ldmatrix + mma.sync, sm_80+), "wmma" (sm_70+) or None

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"


def target_info(target) -> TargetInfo:
    """The TargetInfo of a target (any spelling parse_target takes, a Target, or a TargetInfo)."""
    if isinstance(target, TargetInfo):
        return target
    target = parse_target(target)
    key = str(target)
    if key not in _INFO:
        kind = target.kind.name
        arch = arch_number(str(target.attrs.get("arch", "sm_0"))) if kind == "cuda" else 0
        cores = None if kind != "cuda" or arch < 70 else "mma" if arch >= 80 else "wmma"
        _INFO[key] = TargetInfo(target, kind, arch, max_shared_bytes(arch) if kind == "cuda" else 0, cores)
    return _INFO[key]


_INFO: dict[str, TargetInfo] = {}


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
