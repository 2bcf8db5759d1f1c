"""The fused 3x3 -> 1x1 pair as an op kind: spec (spec.py), TE definition (compute.py), numpy
reference (reference.py) and graph pattern (pattern.py), registered as spec.OP_KIND."""
from .compute import conv3x3_spec, fused_prim_func
from .conv_spec import ConvSpec
from .kind import OpKind, register
from .pattern import find_pairs
from .reference import random_inputs, reference
from .spec import OP_KIND, FusedConvSpec

FUSED_PAIR = register(OpKind(name=OP_KIND, spec=FusedConvSpec, prim_func=fused_prim_func, reference=reference,
                             random_inputs=random_inputs, find=find_pairs))


def as_single_convs(spec: FusedConvSpec) -> tuple[ConvSpec, ConvSpec]:
    """The pair as two single convs (op kind conv2d): the 3x3 with s1/b1/act1, the 1x1 with the rest."""
    first = conv3x3_spec(spec)
    second = ConvSpec(n=spec.n, h=spec.ho, w=spec.wo, c=spec.k1, k=spec.k2, act=spec.act2, residual=spec.residual,
                      dtype=spec.dtype)
    return first, second
