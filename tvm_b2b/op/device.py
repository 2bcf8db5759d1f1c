"""The op's arguments on a device, laid out as its kernels take them."""
from __future__ import annotations

import numpy as np

from .spec import FusedConvSpec


def device_arguments(spec: FusedConvSpec, arrays: dict[str, np.ndarray], dev):
    """({name: device tensor} of the op's inputs in call order, an empty output): the residual
    and the output as their (m, k2) GEMM views, as every kernel of the op takes them."""
    import tvm

    flat = {k: (v.reshape(spec.m, spec.k2) if k == "residual" else np.ascontiguousarray(v)) for k, v in arrays.items()}
    tensors = {k: tvm.runtime.tensor(v, dev) for k, v in flat.items()}
    return tensors, tvm.runtime.empty((spec.m, spec.k2), spec.dtype, dev)
