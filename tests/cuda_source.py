"""Helpers to inspect and compile generated CUDA source with the local nvcc (no GPU needed)."""
import re
import shutil
import subprocess

KERNEL = re.compile(r'extern "C" __global__ void(?: __launch_bounds__\(\d+(?:, \d+)?\))? (\w+)\(([^)]*)\)')


def kernels(source: str) -> dict[str, str]:
    """Kernel name -> parameter list, for every __global__ function (declarations count once)."""
    return {name: params for name, params in KERNEL.findall(source)}


def nvcc_arches() -> set[str]:
    if shutil.which("nvcc") is None:
        return set()
    listed = subprocess.run(["nvcc", "--list-gpu-arch"], capture_output=True, text=True).stdout
    return {a.replace("compute_", "sm_") for a in listed.split()}


def nvcc_compile(source: str, arch: str, tmp_path) -> None:
    """Compile to a cubin; raises with nvcc's message when the source does not compile. sm_90 source that holds the
    Hopper kernels (wgmma) compiles for sm_90a, as tvm_b2b.codegen builds it."""
    arch = "sm_90a" if arch == "sm_90" and "wgmma." in source else arch
    path = tmp_path / f"kernel_{arch}.cu"
    path.write_text(source)
    result = subprocess.run(
        ["nvcc", f"-arch={arch}", "-cubin", "-o", str(tmp_path / f"kernel_{arch}.cubin"), str(path)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def compiled_source(funcs, target) -> str:
    """The CUDA of scheduled PrimFuncs compiled together as kernel.build compiles them (our lowering)."""
    import tvm

    from tvm_b2b.codegen import compile_module

    mod = tvm.IRModule({f"k{i}": f for i, f in enumerate(funcs)})
    return compile_module(mod, target).mod.imports[0].inspect_source()


def compiles_for_sm90a(source: str, tmp_path) -> None:
    """nvcc compiles the source for sm_90a (wgmma, TMA), or the test skips where the local nvcc has no sm_90."""
    import pytest

    if "sm_90" not in nvcc_arches():
        pytest.skip("the local nvcc has no sm_90")
    nvcc_compile(source, "sm_90a", tmp_path)


def skip_unless_sm90() -> None:
    """Skips the test unless the GPU here is an sm_90 (wgmma and TMA run on no other)."""
    import pytest
    import tvm

    if tvm.cuda(0).compute_version != "9.0":
        pytest.skip("needs an sm_90 GPU (wgmma and TMA)")
