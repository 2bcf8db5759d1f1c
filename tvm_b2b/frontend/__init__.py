"""ONNX models in: import and normalize (normalize.py), find 3x3 -> 1x1 pairs (pairs.py)."""
