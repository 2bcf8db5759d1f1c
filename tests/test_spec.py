import pytest

from tvm_b2b import FusedConvSpec

BASE = dict(n=1, h=56, w=56, c=64, k1=64, k2=64)


@pytest.mark.parametrize(
    "field, value",
    [("n", 0), ("h", -1), ("c", 2.5), ("k2", True), ("stride", 3), ("act1", "gelu"), ("act2", "sigmoid"),
     ("dtype", "int8"), ("residual", 1)],
)
def test_bad_field_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        FusedConvSpec(**{**BASE, field: value})


def test_derived_sizes():
    spec = FusedConvSpec(n=2, h=15, w=8, c=3, k1=5, k2=7, stride=2)
    assert (spec.ho, spec.wo, spec.m) == (8, 4, 64)
    assert spec.out_shape == (2, 8, 4, 7)
    assert spec.flops == 2 * 64 * (9 * 3 * 5 + 5 * 7)


def test_parse_round_trip():
    spec = FusedConvSpec(n=3, h=7, w=9, c=5, k1=6, k2=11, stride=2, act1="relu6", act2="none", residual=True, dtype="bfloat16")
    assert FusedConvSpec.parse(spec.to_string()) == spec


def test_parse_issue_example():
    spec = FusedConvSpec.parse("n=1,h=56,w=56,c=64,k1=64,k2=64,stride=1,act1=relu,act2=relu,residual=0,dtype=float16")
    assert spec == FusedConvSpec(**BASE)


@pytest.mark.parametrize(
    "text, field",
    [("n=1,h=2,w=2,c=1,k1=1", "k2"), ("n=1,h=2,w=2,c=1,k1=1,k2=1,bogus=3", "bogus"),
     ("n=x,h=2,w=2,c=1,k1=1,k2=1", "n"), ("n=1,h=2,w=2,c=1,k1=1,k2=1,residual=maybe", "residual"),
     ("n=1,h=2,w=2,c=1,k1=1,k2=1,stride=3", "stride")],
)
def test_parse_errors_name_the_field(text, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        FusedConvSpec.parse(text)
