"""tvm-b2b: back-to-back (3x3 -> 1x1) convolution fusion for TVM."""
from .kernel import FusedKernel, build
from .op.spec import FusedConvSpec

__all__ = ["FusedConvSpec", "FusedKernel", "build"]
__version__ = "0.1.0"
