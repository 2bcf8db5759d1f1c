"""The fused 3x3 -> 1x1 pair as an op kind: spec (spec.py), TE definition (compute.py), numpy
reference (reference.py) and graph pattern (pattern.py), registered as spec.OP_KIND."""
from .compute import fused_prim_func
from .kind import OpKind, register
from .pattern import find_pairs
from .reference import random_inputs, reference
from .spec import OP_KIND, FusedConvSpec

FUSED_PAIR = register(OpKind(name=OP_KIND, spec=FusedConvSpec, prim_func=fused_prim_func, reference=reference,
                             random_inputs=random_inputs, find=find_pairs))
