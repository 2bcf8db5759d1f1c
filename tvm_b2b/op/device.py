"""The op's arguments on a device, laid out as its kernels take them."""
from __future__ import annotations

import numpy as np



def device_arguments(spec, arrays: dict[str, np.ndarray], dev):
    """({name: device tensor} of the op's inputs in call order, an empty output): the residual
    and the output as their (m, channels) GEMM views, as every kernel of every op kind takes them."""
    import tvm

    gemm = (spec.m, spec.out_shape[-1])
    flat = {k: (v.reshape(gemm) if k == "residual" else np.ascontiguousarray(v)) for k, v in arrays.items()}
    tensors = {k: tvm.runtime.tensor(v, dev) for k, v in flat.items()}
    return tensors, tvm.runtime.empty(gemm, spec.dtype, dev)
