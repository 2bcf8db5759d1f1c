"""Whole models: compile an ONNX file to a deployable TVM library, load it back, run it.

A compiled model is two files: OUT.so (export_library) and OUT.so.json (input and output names,
shapes and dtypes, the target, the fused pairs), which `load` and `tvm-b2b run` need.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..target import NO_GPU, has_cuda_gpu, target_info
from .normalize import ModelError, graph_inputs, import_model, load_onnx, static_input_shapes


def onnx_signature(model) -> tuple[list[dict], list[str]]:
    """(inputs as {name, shape, dtype}, output names) of an ONNX graph (initializers excluded)."""
    from onnx import helper

    inputs = []
    for value in graph_inputs(model):
        tensor = value.type.tensor_type
        shape = [d.dim_value for d in tensor.shape.dim]  # static: analyze checked
        inputs.append({"name": value.name, "shape": shape, "dtype": helper.tensor_dtype_to_np_dtype(tensor.elem_type).name})
    return inputs, [o.name for o in model.graph.output]


def conv_names(model) -> list[str]:
    """Names of the ONNX Conv nodes in graph order (the importer emits conv2d in that order)."""
    return [node.name or node.output[0] for node in model.graph.node if node.op_type == "Conv"]


def analyze(path: str, target, fuse: bool = True, dtype: str | None = None, db="auto", progress=None,
            batch: int | None = None):
    """(normalized Relax module, candidates of every op kind, planned (frontend.rewrite.plan), ONNX
    model) for `path` on `target`; dtype="float16" runs them in float16. progress: called with a line
    per stage and per scheduled kernel. batch: the size of a symbolic batch (a model exported with a
    dynamic one); every input shape must be static once it is set."""
    from .rewrite import plan

    say = progress or (lambda line: None)
    say(f"importing {path}")
    model = load_onnx(path, batch)
    static_input_shapes(model)
    mod = import_model(model)
    pairs = plan(mod, target, conv_names(model), dtype, fuse, db, progress=say)
    return mod, pairs, model


def compile_model(path: str, out: str, target, fuse: bool = True, dtype: str | None = None, db="auto",
                  emit_source: str | None = None, cuda_graph: bool = True, progress=None, batch: int | None = None) -> list:
    """Compile the ONNX model at `path` for `target` into `out` (+ `out`.json); returns the candidates
    of every op kind (frontend.rewrite.plan). dtype="float16": our kernels run in float16 with float32
    accumulation, and the data stays float16 between them. db: where the fused
    kernels take tuned parameters ("auto": the target GPU's shipped database; None: defaults).
    emit_source: a file for the whole model's generated device code (CUDA, or LLVM IR on CPUs).
    cuda_graph: on CUDA, the model's kernels replay as one CUDA graph (its shapes are static).
    progress: called with a line per stage (tvm-b2b compile prints them on stderr). batch: as for analyze."""
    from ..codegen import compile_module, generated_source
    from ..schedule import legalized_rules
    from .rewrite import conv_kernels, fuse_pairs, pairs_of

    say = progress or (lambda line: None)
    mod, pairs, model = analyze(path, target, fuse, dtype, db, progress=say, batch=batch)
    mod, _ = fuse_pairs(mod, target, pairs)
    say("building the model (TVM: the other ops, code generation)")
    executable = compile_module(mod, target, cuda_graph=cuda_graph, rules=legalized_rules(target))
    if emit_source:
        with open(emit_source, "w") as f:
            f.write(generated_source(executable, target))
    executable.export_library(out)
    inputs, outputs = onnx_signature(model)
    info = target_info(target)
    meta = {"inputs": inputs, "outputs": outputs, "target": str(target), "device": info.kind, "dtype": dtype or "float32",
            "cuda_graph": bool(cuda_graph and info.is_cuda), "pairs": [p.to_json() for p in pairs_of(pairs)],
            "convs": conv_kernels(conv_names(model), pairs)}
    tmp = out + ".json.tmp"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, out + ".json")
    return pairs


class CompiledModel:
    """A loaded model: call it with numpy arrays by input name; returns {output name: array}."""

    def __init__(self, path: str):
        import tvm
        from tvm import relax

        meta_path = path + ".json"
        if not os.path.isfile(path):
            raise ModelError(f"{path}: no such file")
        if not os.path.isfile(meta_path):
            raise ModelError(f"{meta_path}: missing (compile the model with tvm-b2b compile)")
        with open(meta_path) as f:
            self.meta = json.load(f)
        if self.meta["device"] == "cuda" and not has_cuda_gpu():
            raise ModelError(f"{path}: compiled for {self.meta['target']}, and {NO_GPU} to run it on")
        self.device = tvm.cuda(0) if self.meta["device"] == "cuda" else tvm.cpu(0)
        self.vm = relax.VirtualMachine(tvm.runtime.load_module(path), self.device)

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.meta["inputs"]]

    def signature(self) -> str:
        """The inputs as 'name dtype (shape)', comma-separated."""
        return ", ".join(f"{i['name']} {i['dtype']} {tuple(i['shape'])}" for i in self.meta["inputs"])

    def _args(self, inputs: dict[str, np.ndarray]) -> list:
        import tvm

        unknown = set(inputs) - set(self.input_names)
        if unknown:
            raise ValueError(f"input {sorted(unknown)[0]}: not an input of this model (inputs: {', '.join(self.input_names)})")
        args = []
        for spec in self.meta["inputs"]:
            name = spec["name"]
            if name not in inputs:
                raise ValueError(f"input {name}: missing (this model's inputs: {self.signature()})")
            value = np.asarray(inputs[name])
            if list(value.shape) != spec["shape"] or value.dtype.name != spec["dtype"]:
                raise ValueError(f"input {name}: expected {spec['dtype']} {tuple(spec['shape'])}, got {value.dtype.name} {value.shape}")
            args.append(tvm.runtime.tensor(np.ascontiguousarray(value), self.device))
        return args

    def __call__(self, **inputs) -> dict[str, np.ndarray]:
        result = self.vm["main"](*self._args(inputs))
        values = list(result) if not hasattr(result, "numpy") else [result]
        return {name: v.numpy() for name, v in zip(self.meta["outputs"], values)}

    def time_us(self, inputs: dict[str, np.ndarray], number: int = 10, repeat: int = 5) -> float:
        """Median latency of one inference, in microseconds."""
        args = self._args(inputs)
        self.vm.set_input("main", *args)
        timer = self.vm.module.time_evaluator("invoke_stateful", self.device, number=number, repeat=repeat)
        return float(np.median(timer("main").results)) * 1e6


def load(path: str) -> CompiledModel:
    """A compiled model (tvm-b2b compile's OUT.so), callable on numpy inputs by name."""
    return CompiledModel(path)
