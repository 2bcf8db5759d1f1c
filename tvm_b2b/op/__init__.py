"""The fused op: its spec, its TE definition (tvm_b2b.op.compute) and its numpy reference."""
from .reference import TOLERANCES, compare, np_dtype, random_inputs, reference
from .spec import ACTIVATIONS, DTYPES, FusedConvSpec

__all__ = ["ACTIVATIONS", "DTYPES", "TOLERANCES", "FusedConvSpec", "compare", "np_dtype", "random_inputs", "reference"]
