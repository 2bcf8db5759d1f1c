"""Target spellings and what the rules read of a target (TargetInfo), resolved once."""
import pytest

from tvm_b2b.target import TargetInfo, parse_target, target_info


@pytest.mark.parametrize("tvm_spelling, ours", [("cuda -arch=sm_90", "cuda:sm_90"), ("cuda -arch=sm_80", "cuda:sm_80"),
                                                ("llvm -mcpu=native", "llvm"), ("llvm", "llvm")])
def test_tvm_target_strings_mean_what_ours_mean(tvm_spelling, ours):
    assert str(parse_target(tvm_spelling)) == str(parse_target(ours))


@pytest.mark.parametrize("target, kind, arch, tensor_cores", [
    ("cuda:sm_90", "cuda", 90, "mma"), ("cuda:sm_80", "cuda", 80, "mma"), ("cuda:sm_75", "cuda", 75, "wmma"),
    ("cuda:sm_61", "cuda", 61, None), ("llvm", "llvm", 0, None)])
def test_target_info(target, kind, arch, tensor_cores):
    info = target_info(target)
    assert (info.kind, info.arch, info.tensor_cores) == (kind, arch, tensor_cores)
    assert info.is_cuda == (kind == "cuda") and info.target.kind.name == kind
    assert info.shared_memory == (int(info.target.attrs["max_shared_memory_per_block"]) if info.is_cuda else 0)
    assert target_info(info) is info and target_info(info.target) is info  # resolved once
    assert parse_target(info) is info.target


@pytest.mark.parametrize("text, message", [("cuda -arch=90", "-arch=90 is not an sm_XX arch"), ("vulkan", "expected llvm"),
                                           ("llvm mcpu", "expected llvm"), ("{bad json", "not valid JSON")])
def test_bad_targets_are_one_line_errors(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_target(text)
    assert "\n" not in str(err.value) and isinstance(target_info("llvm"), TargetInfo)
