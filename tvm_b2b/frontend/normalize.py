"""ONNX -> Relax, normalized for pair matching: NHWC convolutions with OHWI constant weights,
BatchNormalization decomposed into per-channel affine ops on constants, Clip as max/min; before the import,
static shape arithmetic folded (static_shapes), zero padding moved into the convs that read it (conv_pads) and taps
that read only padding cut out of them (dead_taps)."""
from __future__ import annotations

import os

import numpy as np
import tvm
from tvm import relax

from ..op.activation import relax_const


class ModelError(ValueError):
    """A model file that cannot be read or imported: one line for the user."""


def load_onnx(path: str, batch: int | None = None):
    """The onnx.ModelProto at `path`, or a ModelError naming the problem. batch: the size of the inputs' symbolic
    first dimension (a model exported with a dynamic batch), set before anything reads the model's shapes."""
    import onnx

    if not os.path.isfile(path):
        raise ModelError(f"{path}: no such file")
    try:
        model = onnx.load(path)
        if batch is not None:
            model = with_batch(model, batch)
        if any(not _has_shape(output) for output in model.graph.output):
            # onnxruntime runs such models (exporters write them); the checker and the importer need the
            # outputs' types and shapes, which ONNX's shape inference gives
            model = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(model)
    except ModelError:
        raise
    except Exception as err:  # noqa: BLE001 - onnx raises several types for a bad file
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelError(f"{path}: not a valid ONNX model ({first})") from None
    return model


def graph_inputs(model) -> list:
    """The graph's inputs a caller gives (ValueInfoProto), not the initializers older exporters list as inputs too."""
    weights = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in weights]


def with_batch(model, batch: int):
    """`model` with `batch` for every graph input's symbolic first dimension; the shapes it declares for outputs and
    intermediate values (symbolic ones, from the same export) dropped, for shape inference to compute again. An input
    whose batch is fixed at another size is a ModelError: its graph may have that size written into it."""
    if batch < 1:
        raise ModelError(f"--batch {batch}: must be at least 1")
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if not dims:
            raise ModelError(f"input {value.name}: a scalar has no batch dimension for --batch")
        if dims[0].HasField("dim_value") and dims[0].dim_value not in (0, batch):
            raise ModelError(f"input {value.name}: its batch is fixed at {dims[0].dim_value}; --batch {batch} sets a "
                             f"symbolic batch only (export the model with a dynamic batch, or at batch {batch})")
        dims[0].dim_value = batch
    del model.graph.value_info[:]
    for output in model.graph.output:
        output.type.tensor_type.ClearField("shape")
    return model


def static_input_shapes(model) -> None:
    """A ModelError naming the first graph input whose shape is not static (a symbolic or unknown dimension)."""
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            continue
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        hint = "--batch N sets its batch" if all(d.HasField("dim_value") for d in dims[1:]) else \
            "only a symbolic batch can be set (--batch N); export it with static height and width"
        raise ModelError(f"input {value.name}: dynamic shape {shape} ({hint})")


def _has_shape(value) -> bool:
    """Whether an ONNX value declares its element type and shape."""
    tensor = value.type.tensor_type
    return value.HasField("type") and tensor.elem_type != 0 and tensor.HasField("shape")


@relax.expr_functor.mutator
class _MinMaxFromTir(relax.PyExprMutator):
    """The ONNX importer lowers Clip with tensor bounds to call_tir(maximum|minimum, (x, c));
    turn those back into relax.maximum / relax.minimum so that layout conversion and matching
    see plain elementwise ops."""

    OPS = {"maximum": relax.op.maximum, "minimum": relax.op.minimum}

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.call_tir":
            return call
        callee, args = call.args[0], call.args[1]
        name = getattr(callee, "name_hint", "").rstrip("0123456789")  # maximum, maximum1, ...
        if name in self.OPS and len(args.fields) == 2:
            return self.OPS[name](args.fields[0], args.fields[1])
        return call


def _transposed(call, values):
    return np.transpose(values[0], None if call.attrs.axes is None else [int(a) for a in call.attrs.axes])


# op -> its value from (call, its constant arguments' values); every result takes the op's output shape
NUMPY_FOLDED_OPS = {"relax.reshape": lambda call, values: values[0],
                    "relax.permute_dims": _transposed,
                    "relax.isnan": lambda call, values: np.isnan(values[0]),
                    "relax.where": lambda call, values: np.where(*values)}


@relax.expr_functor.mutator
class _ConstantsFoldedInNumpy(relax.PyExprMutator):
    """The ops of constants that every model has many of, computed with numpy: the importer reshapes each conv's bias
    and writes each Clip's bounds as where(isnan(bound), -inf or inf, bound); ConvertLayout transposes every weight
    and bias to OHWI / NHWC. FoldConstant would compile each of those with LLVM (ResNet-50: 160 builds, 5.3 of its
    import's 6.6 s on 2 cores; MobileNetV2's 140 Clip bounds 3.5 s more). Exact: they move, test or pick values. The
    rest FoldConstant still folds."""

    def visit_call_(self, call):
        ty = getattr(call, "ty", None)  # the op's output, as Relax inferred it
        call = super().visit_call_(call)
        compute, shape = NUMPY_FOLDED_OPS.get(getattr(call.op, "name", None)), getattr(ty, "shape", None)
        if compute is None or not isinstance(shape, relax.ShapeExpr):  # (before reading constants: a conv's weights)
            return call
        values = [relax_const(a) for a in call.args if not isinstance(a, relax.ShapeExpr)]
        if any(v is None for v in values):
            return call
        if not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
            return call
        result = np.asarray(compute(call, values)).astype(str(ty.dtype), order="C")  # (ascontiguousarray makes 0-d 1-d)
        return relax.const(result.reshape([int(d) for d in shape.values]), str(ty.dtype))


def _each_function_through(mutator_type, mod):
    """mod with each of its Relax functions rewritten by a mutator_type(mod)."""
    mutator = mutator_type(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            mod[gv] = mutator.visit_expr(func)
    return mod


def _constants_folded_in_numpy(mod):
    return _each_function_through(_ConstantsFoldedInNumpy, mod)


def _min_max_from_tir(mod):
    return _each_function_through(_MinMaxFromTir, mod)


def import_model(model) -> tvm.IRModule:
    """Relax module of an ONNX model, normalized (see module docstring)."""
    from tvm.relax.frontend.onnx import from_onnx

    from .conv_pads import conv_pads_inlined
    from .dead_taps import dead_taps_dropped
    from .static_shapes import fold_static_shapes

    try:
        mod = from_onnx(dead_taps_dropped(conv_pads_inlined(fold_static_shapes(model))), keep_params_in_input=False)
    except Exception as err:  # noqa: BLE001 - the importer raises many types for unsupported ops
        first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ModelError(f"cannot import the model: {first}") from None
    mod = relax.transform.FoldConstant()(_constants_folded_in_numpy(mod))
    mod = _min_max_from_tir(mod)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.FoldConstant()(mod)
    mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)
    mod = relax.transform.FoldConstant()(_constants_folded_in_numpy(mod))
    return relax.transform.DeadCodeElimination()(mod)
