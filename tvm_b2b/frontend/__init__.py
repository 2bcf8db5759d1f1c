"""ONNX models in: import and normalize (normalize.py), plan and rewrite every op kind's candidates (rewrite.py), compile, load and run (model.py)."""
