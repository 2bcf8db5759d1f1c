import pytest


def pytest_collection_modifyitems(config, items):
    from tvm_b2b.target import has_cuda_gpu

    if has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tvm.cuda(0) does not exist here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
