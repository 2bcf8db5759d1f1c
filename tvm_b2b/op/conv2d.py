"""The single convolution with its epilogue as an op kind: spec, TE definition and numpy reference
(conv.py) and graph pattern (conv_pattern.py), registered as conv.OP_KIND."""
from .conv import OP_KIND, ConvSpec, conv_prim_func, conv_random_inputs, conv_reference
from .conv_pattern import find_convs
from .kind import OpKind, register

CONV2D = register(OpKind(name=OP_KIND, spec=ConvSpec, prim_func=conv_prim_func, reference=conv_reference,
                         random_inputs=conv_random_inputs, find=find_convs))
