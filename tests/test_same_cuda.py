"""The generated CUDA of a fixed set of builds, as sha256 digests in tests/data/cuda_digests.json: a
refactoring must leave every one unchanged (several specs, sm_75 WMMA and sm_90 mma.sync, fused and
two-kernel builds, the staged-epilogue fallback, a shipped tuned record).

A change that means to change the generated code updates the file and says why in its commit:
    python tests/test_same_cuda.py --update
"""
import hashlib
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("template_pairs")  # the mma.sync template's generated CUDA (sm_90 included)

DIGESTS = Path(__file__).parent / "data" / "cuda_digests.json"
SEED = "n=32,h=56,w=56,c=64,k1=64,k2=128,dtype=float16"
# (spec, target, fused, db): db a shipped database (relative to the repo: a cross-build takes none by itself where
# schedules/ holds two of the arch), None the defaults
BUILDS = [
    (SEED, "cuda:sm_90", True, None),
    (SEED, "cuda:sm_90", False, None),
    ("n=8,h=56,w=56,c=64,k1=64,k2=256,residual=1,dtype=float16", "cuda:sm_90", True, None),
    ("n=1,h=56,w=56,c=64,k1=64,k2=64,dtype=float16", "cuda:sm_90", True, None),
    ("n=32,h=31,w=31,c=16,k1=24,k2=16,stride=2,dtype=float16", "cuda:sm_90", True, None),
    ("n=1,h=28,w=28,c=128,k1=128,k2=512,residual=1,dtype=float16", "cuda:sm_90", True, "schedules/nvidia-h200-sm_90"),
    ("n=1,h=13,w=7,c=20,k1=24,k2=40,stride=2,act1=relu6,act2=none,residual=1,dtype=float16", "cuda:sm_75", True, None),
    (SEED, "cuda:sm_75", False, None),
]


def key(build) -> str:
    spec, target, fused, db = build
    return f"{spec} {target} {'fused' if fused else 'two kernels'} {db or 'defaults'}"


def digest(build) -> str:
    from tvm_b2b import FusedConvSpec
    from tvm_b2b import build as build_op

    spec, target, fused, db = build
    db = db and Path(__file__).resolve().parents[1] / db
    return hashlib.sha256(build_op(FusedConvSpec.parse(spec), target, fused=fused, db=db).source().encode()).hexdigest()


@pytest.mark.parametrize("build", BUILDS, ids=key)
def test_generated_cuda_is_unchanged(build):
    assert digest(build) == json.loads(DIGESTS.read_text())[key(build)]


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    DIGESTS.write_text(json.dumps({key(b): digest(b) for b in BUILDS}, indent=1) + "\n")
    print(f"written: {DIGESTS}")
