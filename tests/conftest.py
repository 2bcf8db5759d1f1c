import sys
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    from tvm_b2b.target import has_cuda_gpu

    if has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tvm.cuda(0) does not exist here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# onnx_models/: the test models' generators (torchvision_models: real exports), importable by name
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "onnx_models"))


@pytest.fixture
def mma_sync(monkeypatch):
    """The mma.sync template's kernels on sm_90 too (TVM_B2B_HOPPER=0): for tests of that template's choices, which
    the Hopper kernel (on by default on sm_90 where it measured faster) would otherwise take."""
    monkeypatch.setenv("TVM_B2B_HOPPER", "0")


@pytest.fixture
def template_pairs(monkeypatch):
    """The fused pair on the mma.sync template (cuda_wmma) on sm_90 too (TVM_B2B_HOPPER_PAIR=0): for tests of that
    template's kernel, which the Hopper pair kernel (on by default on sm_90 where it measured faster) would otherwise
    take."""
    monkeypatch.setenv("TVM_B2B_HOPPER_PAIR", "0")
