"""The package's layers (pyproject.toml's import-linter contract): op and target at the bottom, then
lowering (lower, codegen), schedules, tuning, the frontend and the build API, the command line;
nothing imports a layer above its own, lazily inside a function included."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_imports_a_layer_above_its_own():
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert command, "lint-imports (import-linter, in the test extra) is not installed"
    run = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 kept, 0 broken" in run.stdout
