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


def formed_arguments(spec, arrays: dict[str, np.ndarray], dev, input_form=None):
    """device_arguments of the inputs as a kernel takes them: through its input form (an InputForm's arrays of its spec)
    where it has one (a plan's input_form), else as given."""
    if input_form is not None:
        arrays, spec = input_form.arrays(spec, arrays), input_form.spec(spec)
    return device_arguments(spec, arrays, dev)
