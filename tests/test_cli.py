import re
import subprocess
import sys
from pathlib import Path

import pytest

from tvm_b2b.cli import latency, main
from tvm_b2b.target import has_cuda_gpu

SPEC = "n=1,h=9,w=9,c=8,k1=16,k2=16,stride=1,act1=relu,act2=relu,residual=0,dtype=float16"


COMMANDS = ("op", "report", "compile", "tune", "run")


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in COMMANDS:  # each on a line of its own with its one-line help
        assert re.search(rf"^\s+{command}\s+\w+", out, re.MULTILINE), (command, out)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_a_description(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]  # usage, then the paragraph
    assert len(description.split()) >= 20 and not description.lstrip().startswith(("options", "positional")), out


def test_spec_help_names_required_fields_and_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["op", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "n, h, w, c, k1, k2 required" in out
    for default in ("stride=1", "act1=relu", "act2=relu", "residual=0", "dtype=float16"):
        assert default in out


def test_op_without_check_says_it_only_built(capsys):
    assert main(["op", "--spec", SPEC, "--target", "llvm"]) == 0
    assert "built only: add --check" in capsys.readouterr().out


@pytest.mark.skipif(has_cuda_gpu(), reason="checks the machine without a GPU")
def test_running_cuda_without_a_gpu_fails_before_any_work():
    """--check needs the GPU: one line before anything is built (nothing on stdout: no build ran)."""
    run = subprocess.run([*installed_command(), "op", "--spec", SPEC, "--target", "cuda:sm_90", "--check"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "tvm-b2b op: error: --check/--bench run the kernel, and this machine has no CUDA GPU "
        "(without them, op builds for cuda:sm_90 only)"]


def test_latency_is_in_ms_from_one_ms_on():
    assert latency(999.94) == "999.9 us" and latency(1000.0) == "1.00 ms" and latency(15234.0) == "15.23 ms"


def test_op_check_passes_and_times(capsys):
    assert main(["op", "--spec", SPEC, "--target", "llvm", "--check", "--bench"]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "max abs error" in out
    assert " us " in out and "unfused" in out


def test_op_emits_source(tmp_path):
    path = tmp_path / "k.ll"
    assert main(["op", "--spec", SPEC, "--target", "llvm", "--emit-source", str(path)]) == 0
    assert "fused_conv3x3_conv1x1" in path.read_text()


@pytest.mark.parametrize(
    "args, message",
    [(["--spec", SPEC.replace("stride=1", "stride=3")], "stride:"),
     (["--spec", SPEC, "--target", "vulkan-ish"], "target:"),
     (["--spec", "n=1,h=2"], "w: missing")],
)
def test_op_bad_input_is_one_line(capsys, args, message):
    assert main(["op", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def installed_command() -> list[str]:
    """The tvm-b2b console script beside this Python (as pip installs it), else `python -m tvm_b2b`."""
    script = Path(sys.executable).parent / "tvm-b2b"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tvm_b2b"]


def test_command_line_runs_and_fails_cleanly():
    ok = subprocess.run([*installed_command(), "op", "--spec", SPEC, "--check"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout
    bad = subprocess.run([*installed_command(), "op", "--spec", SPEC + ",k9=1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["tvm-b2b op: error: k9: not a spec field (expected one of n, h, w, c, k1, k2, "
                                               "stride, act1, act2, residual, dtype, groups, dilation, pad_h, pad_w)"]
