"""Keras application models (random weights, no classifier) exported to ONNX by tf2onnx: what a TensorFlow user
hands tvm-b2b. Their strided convs pad as TensorFlow does ("same": the extra row and column below and right; Keras'
ZeroPadding2D layers become ONNX Pads) and their input is NHWC. A dev tool: TensorFlow and tf2onnx are no
dependency of tvm-b2b or its tests (install them apart, e.g. `pip install tensorflow-cpu tf2onnx` in another venv).

    python onnx_models/keras_models.py NAME SIZE OUT_DIR      (NAME: mobilenet_v2, resnet50, mobilenet_v3_small)

writes OUT_DIR/NAME_SIZE.onnx (input 'input' (1, SIZE, SIZE, 3), opset 17).
"""
from __future__ import annotations

import os
import sys


def export(name: str, size: int, out_dir: str) -> str:
    import tensorflow as tf
    import tf2onnx

    apps = {"mobilenet_v2": tf.keras.applications.MobileNetV2, "resnet50": tf.keras.applications.ResNet50,
            "mobilenet_v3_small": tf.keras.applications.MobileNetV3Small}
    model = apps[name](weights=None, input_shape=(size, size, 3), include_top=False)
    spec = (tf.TensorSpec((1, size, size, 3), tf.float32, name="input"),)

    @tf.function(input_signature=spec)
    def forward(x):
        return model(x, training=False)

    path = os.path.join(out_dir, f"{name}_{size}.onnx")
    tf2onnx.convert.from_function(forward, input_signature=spec, opset=17, output_path=path)
    return path


if __name__ == "__main__":
    print(export(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
