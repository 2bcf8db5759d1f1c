"""tvm-b2b: back-to-back (3x3 -> 1x1) convolution fusion for TVM."""
from .kernel import FusedKernel, build
from .op.conv_spec import ConvSpec
from .op.spec import FusedConvSpec


def load(path: str):
    """A model compiled by `tvm-b2b compile` (OUT.so), callable as model(**{input name: array})
    and returning {output name: array}."""
    from .frontend.model import load as _load

    return _load(path)


__all__ = ["ConvSpec", "FusedConvSpec", "FusedKernel", "build", "load"]
__version__ = "0.1.0"
