"""`metile.nn.Linear`: a drop-in for `mlx.nn.Linear` whose matmul (and
activation, when fused) runs as a metile kernel; see `metile.ops.linear`.
`metile.nn.QuantizedLinear` does the same for `mlx.nn.QuantizedLinear` (metile.ops.
quantized_matmul), and `metile.nn.RMSNorm` / `LayerNorm` for MLX's norms (nn_norms.py).
`metile.nn.convert(model)` puts them into an existing MLX model in place."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
import mlx.nn as mlx_nn
import numpy as np

from . import nn_norms, ops
from .op_routing import FLOAT_DTYPES, check_backend
from .nn_norms import LayerNorm, RMSNorm  # noqa: F401  (metile.nn.RMSNorm, metile.nn.LayerNorm)


def _bare(cls):
    """An instance of `cls` (a layer class) with an empty Module and no parameters: a layer
    built only to take another's arrays.  Its __init__ would draw an initialisation from
    MLX's global random key and throw it away, moving every later seeded draw (a converted
    model's dropout masks would differ from the unconverted one's after the same
    mx.random.seed); MLX's key cannot be put back from Python."""
    new = cls.__new__(cls)
    mlx_nn.Module.__init__(new)
    return new


class Linear(mlx_nn.Linear):
    """y = activation(x @ weight.T + bias), with the parameters and initialisation
    of `mlx.nn.Linear` (so existing weights load unchanged).  `leaky_relu` uses
    `negative_slope` (MLX's default, 0.01)."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True, activation=None,
                 backend: str = "auto", negative_slope: float = ops.LEAKY_SLOPE):
        for name, dims in (("input_dims", input_dims), ("output_dims", output_dims)):
            if isinstance(dims, (bool, np.bool_)) or not isinstance(dims, (int, np.integer)):
                raise TypeError(f"[metile.nn.Linear] {name} must be an int, got "
                                f"{type(dims).__name__} {dims!r}")
            if dims < 1:
                raise ValueError(f"[metile.nn.Linear] {name} must be a positive int, got {dims!r}")
        input_dims, output_dims = int(input_dims), int(output_dims)
        self._check_options(activation, backend, negative_slope)
        super().__init__(input_dims, output_dims, bias=bias)
        self._set_options(activation, backend, negative_slope)

    @staticmethod
    def _check_options(activation, backend, negative_slope):
        check_backend("metile.nn.Linear", backend)
        ops._check_activation(activation, negative_slope, "metile.nn.Linear")

    def _set_options(self, activation, backend, negative_slope):
        self.activation = activation
        self.negative_slope = ops.slope_value(negative_slope)
        self.backend = backend

    @classmethod
    def from_linear(cls, layer: mlx_nn.Linear, activation=None, backend: str = "auto",
                    negative_slope: float = ops.LEAKY_SLOPE) -> "Linear":
        """A metile.nn.Linear holding `layer`'s own weight and bias arrays (no copy),
        its frozen parameters and its training mode."""
        if not isinstance(layer, mlx_nn.Linear):
            # (a QuantizedLinear's packed uint32 weight read as a matrix gave garbage)
            raise TypeError(f"[metile.nn.Linear.from_linear] layer must be an mlx.nn.Linear, "
                            f"got {type(layer).__name__}"
                            + ("; use metile.nn.QuantizedLinear.from_quantized"
                               if isinstance(layer, mlx_nn.QuantizedLinear) else ""))
        cls._check_options(activation, backend, negative_slope)
        new = _bare(cls)
        new._set_options(activation, backend, negative_slope)
        new.weight = layer.weight
        if "bias" in layer:
            new.bias = layer.bias
        new._no_grad = set(layer._no_grad)
        new._training = layer._training
        nn_norms.carry_attributes(layer, new)
        return new

    def __call__(self, x: mx.array) -> mx.array:
        if isinstance(x, mx.array) and x.dtype != self.weight.dtype:
            # what mlx.nn.Linear (and the activation module after it) computes, promoting
            # the dtypes as MLX does (a float32 input into a float16 model is common);
            # metile's kernels take one dtype
            b = self.get("bias")
            y = x @ self.weight.T if b is None else mx.addmm(b, x, self.weight.T)
            return ops.activate(y, self.activation, self.negative_slope)
        return ops.linear(x, self.weight, self.get("bias"), self.activation, backend=self.backend,
                          negative_slope=self.negative_slope)

    def explain(self, x: mx.array) -> str:
        """Which path this layer's call on `x` takes and why, as JSON text
        (`metile.ops.explain_linear` for the layer's weight, bias, activation and backend;
        an `x` of another dtype than the weights runs MLX's composite).  Never measures."""
        if isinstance(x, mx.array) and x.dtype != self.weight.dtype:
            # what __call__ does with it (explain_linear would promote and route, as
            # ops.linear does)
            reason = (f"x has dtype {x.dtype} and the layer's weights {self.weight.dtype}: "
                      f"MLX's composite, promoting as mlx.nn.Linear does (metile's kernels "
                      f"take one dtype; backend={self.backend!r} applies to inputs of the "
                      f"weights' dtype)")
            return json.dumps({"op": "linear", "path": "mlx_composite", "reason": reason,
                               "epilogue": self.activation}, indent=2)
        return ops.explain_linear(x, self.weight, self.get("bias"), self.activation,
                                  backend=self.backend, negative_slope=self.negative_slope)

    def to_quantized(self, group_size=None, bits=None, mode: str = "affine",
                     quantize_input: bool = False):
        """What `mlx.nn.quantize` calls: MLX's quantized layer, or metile's where this
        layer has an activation to keep (applied after it) or a backend other than "auto"
        to keep (metile.nn.QuantizedLinear with that backend).  Settings metile's kernels
        do not take (bits other than 4 and 8, modes other than "affine") keep MLX's op:
        backend "metile" becomes "auto" there, as `convert` leaves such layers to MLX."""
        backend = self.backend
        if backend == "metile" and (mode != "affine" or (bits or 4) not in (4, 8)):
            backend = "auto"
        if self.activation is None and (backend == "auto" or quantize_input):
            return super().to_quantized(group_size, bits, mode, quantize_input)
        if quantize_input:
            raise ValueError(f"[metile.nn.Linear] quantize_input=True is not supported for a "
                             f"layer with activation={self.activation!r} (MLX's QQLinear has no "
                             f"activation); quantize it with quantize_input=False or exclude it "
                             f"with class_predicate")
        q = QuantizedLinear.from_linear(self, group_size, bits, mode)
        q.activation, q.negative_slope = self.activation, self.negative_slope
        q.backend = backend
        return q

    def _extra_repr(self) -> str:
        slope = f", negative_slope={self.negative_slope}" if self.activation == "leaky_relu" else ""
        return (f"{super()._extra_repr()}, activation={self.activation}{slope}, "
                f"backend={self.backend}")


class QuantizedLinear(mlx_nn.QuantizedLinear):
    """`mlx.nn.QuantizedLinear` followed by a metile.nn.Linear's activation: what
    `mlx.nn.quantize` turns a `metile.nn.Linear` with an activation into.  The
    parameters are MLX's, so quantized checkpoints load unchanged."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True, group_size=None,
                 bits=None, mode: str = "affine", activation=None,
                 negative_slope: float = ops.LEAKY_SLOPE, backend: str = "auto"):
        super().__init__(input_dims, output_dims, bias, group_size, bits, mode=mode)
        ops._check_activation(activation, negative_slope, "metile.nn.QuantizedLinear")
        check_backend("metile.nn.QuantizedLinear", backend)
        self.activation = activation
        self.negative_slope = float(negative_slope)
        self.backend = backend

    @classmethod
    def from_quantized(cls, layer: mlx_nn.QuantizedLinear,
                       backend: str = "auto") -> "QuantizedLinear":
        """A metile.nn.QuantizedLinear holding `layer`'s own packed weight, scales,
        biases and bias (no copy), its frozen parameters and its training mode."""
        check_backend("metile.nn.QuantizedLinear", backend)
        new = _bare(cls)
        new.group_size, new.bits, new.mode = layer.group_size, layer.bits, layer.mode
        new.activation, new.negative_slope, new.backend = None, ops.LEAKY_SLOPE, backend
        for name in ("weight", "scales", "biases", "bias"):
            if name in layer:
                new[name] = layer[name]
        new._no_grad = set(layer._no_grad)
        new._training = layer._training
        nn_norms.carry_attributes(layer, new)
        return new

    def __call__(self, x: mx.array) -> mx.array:
        # mlx.nn.QuantizedLinear.__call__ with metile's op (routed: MLX's op unless a
        # measurement chose a kernel)
        # (an integer x runs MLX's op whatever the backend, as metile.nn.Linear takes an x of
        # another dtype than its weights: backend="metile" refused it with a TypeError)
        backend = self.backend if not isinstance(x, mx.array) or x.dtype in FLOAT_DTYPES \
            else "mlx"
        y = ops.quantized_matmul(x, self["weight"], self["scales"], self.get("biases"),
                                 transpose=True, group_size=self.group_size, bits=self.bits,
                                 mode=self.mode, backend=backend)
        if "bias" in self:
            y = y + self["bias"]
        if self.activation is None:
            return y
        return ops.activate(y.astype(mx.float32), self.activation,
                            self.negative_slope).astype(y.dtype)

    def _extra_repr(self) -> str:
        return f"{super()._extra_repr()}, activation={self.activation}, backend={self.backend}"


def _why_not_quantized(path: str, module, predicate) -> str | None:
    """None if `module` (an mlx.nn.QuantizedLinear) should become metile's."""
    if isinstance(module, QuantizedLinear):
        return "already a metile.nn.QuantizedLinear"
    if type(module) is not mlx_nn.QuantizedLinear:
        return (f"{type(module).__name__} subclasses mlx.nn.QuantizedLinear; its own __call__ "
                f"may compute something else")
    if module.mode != "affine" or module.bits not in (4, 8):
        return (f"mode={module.mode!r}, bits={module.bits}: metile's quantized kernels take "
                f"affine 4- and 8-bit weights")
    if predicate is not None and not predicate(path, module):
        return "class_predicate returned False"
    return None


# -- converting an existing model -----------------------------------------------------------------

@dataclass
class ConversionReport:
    """What `convert` did, by module path ("layers.0", "mlp.fc1", ...)."""
    converted: dict = field(default_factory=dict)   # path -> the metile layer it became
    fused: dict = field(default_factory=dict)       # activation's path -> the Linear it joined
    skipped: dict = field(default_factory=dict)     # path -> why it was left alone

    def __str__(self) -> str:
        lines = [f"converted {len(self.converted)}, fused {len(self.fused)}, "
                 f"skipped {len(self.skipped)}"]
        lines += [f"  converted {p}: {what}" for p, what in self.converted.items()]
        lines += [f"  fused {p} into {into}" for p, into in self.fused.items()]
        lines += [f"  skipped {p}: {why}" for p, why in self.skipped.items()]
        return "\n".join(lines)


_ACTIVATION_FUNCTIONS = {mlx_nn.relu: "relu", mlx_nn.silu: "silu", mlx_nn.gelu_approx: "gelu_tanh"}


def _activation_of(item):
    """(activation, slope, None) when `item` (a Sequential entry) is an activation the
    GEMM epilogue computes exactly, (None, None, why) for one it cannot, else None."""
    slope = ops.LEAKY_SLOPE
    for base in (mlx_nn.ReLU, mlx_nn.SiLU, mlx_nn.GELU, mlx_nn.LeakyReLU):
        if isinstance(item, base) and type(item) is not base:
            # a subclass may compute something else in its own __call__
            return None, None, (f"{type(item).__name__} subclasses mlx.nn.{base.__name__}; "
                                f"it runs as its own module")
    if isinstance(item, mlx_nn.ReLU):
        return "relu", slope, None
    if isinstance(item, mlx_nn.SiLU):
        return "silu", slope, None
    if isinstance(item, mlx_nn.GELU):
        approx = getattr(item, "_approx", "none")
        if approx in ("precise", "tanh"):
            return "gelu_tanh", slope, None
        return None, None, (f"GELU(approx={approx!r}) is not the tanh approximation the GEMM "
                            f"epilogue computes; it runs as its own module")
    if isinstance(item, mlx_nn.LeakyReLU):
        slope = getattr(item, "_negative_slope", ops.LEAKY_SLOPE)
        # MLX computes max(slope * x, x), which equals the epilogue's
        # where(x > 0, x, slope * x) only for slopes in [0, 1].
        value = ops.slope_value(slope, arrays=True)   # (LeakyReLU's slope is no parameter)
        if value is not None and 0 <= value <= 1:
            return "leaky_relu", value, None
        return None, None, (f"LeakyReLU(negative_slope={slope!r}) is fused only for slopes in "
                            f"[0, 1]; it runs as its own module")
    if not isinstance(item, mlx_nn.Module) and callable(item):
        for fn, name in _ACTIVATION_FUNCTIONS.items():
            if item is fn:
                return name, slope, None
    return None


def _why_not(path: str, module, predicate) -> str | None:
    """None if `module` (an mlx.nn.Module) should become a metile.nn.Linear."""
    if isinstance(module, Linear):
        return "already a metile.nn.Linear"
    if isinstance(module, mlx_nn.QuantizedLinear):
        return ("quantized (mlx.nn.QuantizedLinear): becomes a metile.nn.QuantizedLinear; a "
                "following activation stays its own module")
    if not isinstance(module, mlx_nn.Linear):
        return f"not an mlx.nn.Linear ({type(module).__name__})"
    if type(module) is not mlx_nn.Linear:
        return (f"{type(module).__name__} subclasses mlx.nn.Linear; its own __call__ may "
                f"compute something else")
    if module.weight.dtype not in FLOAT_DTYPES:
        return f"weight dtype {module.weight.dtype} (metile's GEMM takes float32/float16/bfloat16)"
    if 0 in module.weight.shape:
        return f"weight shape {tuple(module.weight.shape)} has no elements"
    if "bias" in module and module.bias.dtype != module.weight.dtype:
        return f"bias dtype {module.bias.dtype} differs from the weight's {module.weight.dtype}"
    if "bias" in module and not ops.bias_is_vector(tuple(module.bias.shape), module.weight.shape[0]):
        # (MLX's addmm broadcasts it; metile.ops.linear's kernels add one vector to every
        # row, and take a (1, N) or one-element bias as that vector)
        return (f"bias shape {tuple(module.bias.shape)} is not one vector of the "
                f"{module.weight.shape[0]} output features")
    if predicate is not None and not predicate(path, module):
        return "class_predicate returned False"
    return None


def _has_modules(module) -> bool:
    return any(True for _ in _slots(module, ""))


def _slots(container, prefix):
    """(path, parent, key, value) for each module directly inside `container`
    (through nested lists and dicts, as mlx.nn.Module.children() sees them)."""
    items = container.items() if isinstance(container, dict) else enumerate(container)
    for key, value in list(items):
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, mlx_nn.Module):
            yield path, container, key, value
        elif isinstance(value, (list, dict)):
            yield from _slots(value, path)


def _uses(container, counts: dict) -> dict:
    """How many slots of the model hold each module object (id -> count): a module held
    twice (tied layers, `enc = dec = lin`) must stay one object after conversion."""
    for _, _, _, child in _slots(container, ""):
        counts[id(child)] = counts.get(id(child), 0) + 1
        if counts[id(child)] == 1:
            _uses(child, counts)
    return counts


def _convert(container, prefix, backend, predicate, report, counts=None, done=None):
    counts = _uses(container, {}) if counts is None else counts
    done = {} if done is None else done        # id(original) -> its metile layer
    fusions = {}
    # only a plain Sequential runs its layers one after another (a subclass's __call__ may
    # combine them otherwise); a Linear held elsewhere too keeps its own activation-free form
    if type(container) is mlx_nn.Sequential:
        layers = container.layers
        for i in range(len(layers) - 1):
            path = f"{prefix}.layers.{i}" if prefix else f"layers.{i}"
            nxt = f"{prefix}.layers.{i + 1}" if prefix else f"layers.{i + 1}"
            if not isinstance(layers[i], mlx_nn.Module) or _why_not(path, layers[i], predicate):
                continue
            found = _activation_of(layers[i + 1])
            if found is None:
                continue
            activation, slope, why = found
            if why is None and counts.get(id(layers[i]), 0) > 1:
                report.skipped.setdefault(nxt, f"{path} is held at more than one place; its "
                                               f"activation runs as its own module")
            elif why is not None:
                report.skipped[nxt] = why
            else:
                fusions[i] = (activation, slope, nxt)
    for path, parent, key, child in list(_slots(container, prefix)):
        # The same module seen at another path is the same layer: the first path's
        # decision holds for every path, converted or kept (kept, its other paths were
        # judged on their own and converted, splitting a tied layer in two).
        if id(child) in done:
            if done[id(child)] is not child:
                parent[key] = done[id(child)]
                report.converted[path] = f"the layer converted at another path ({parent[key]!r})"
            elif not _has_modules(child) and path not in report.skipped \
                    and path not in report.fused:
                report.skipped[path] = "the same layer is kept at another path"
            continue
        if nn_norms.is_norm(child):
            nn_norms.swap_norm(parent, key, path, child, backend, predicate, report)
            done[id(child)] = parent[key]
            continue
        if isinstance(child, mlx_nn.QuantizedLinear):
            why = _why_not_quantized(path, child, predicate)
            if why is None:
                parent[key] = QuantizedLinear.from_quantized(child, backend)
                report.converted[path] = repr(parent[key])
            elif path not in report.skipped:
                report.skipped[path] = why
            done[id(child)] = parent[key]
            continue
        why = _why_not(path, child, predicate)
        if why is None:
            activation, slope, act_path = None, ops.LEAKY_SLOPE, None
            if parent is getattr(container, "layers", None) and key in fusions:
                activation, slope, act_path = fusions[key]
            parent[key] = done[id(child)] = Linear.from_linear(child, activation, backend, slope)
            if act_path is not None:
                parent[key + 1] = mlx_nn.Identity()
                parent[key + 1].train(child.training)
                report.fused[act_path] = path
            report.converted[path] = repr(parent[key])
        elif isinstance(child, (mlx_nn.Linear, mlx_nn.QuantizedLinear)) or not _has_modules(child):
            if path not in report.fused and path not in report.skipped:
                report.skipped[path] = why
            done[id(child)] = child
        else:
            done[id(child)] = child   # a container: converted in place once
            _convert(child, path, backend, predicate, report, counts, done)


def convert(model: mlx_nn.Module, *, backend: str = "auto",
            class_predicate: Callable[[str, mlx_nn.Module], bool] | None = None) -> ConversionReport:
    """Swap, in place, each `mlx.nn.Linear` of `model` for a `metile.nn.Linear` holding
    the same weight and bias arrays (as `mlx.nn.quantize` swaps layers).  In an
    `nn.Sequential`, a Linear followed by ReLU, SiLU, GELU(approx="precise"/"tanh"),
    LeakyReLU (slope in [0, 1]) or the functions nn.relu/nn.silu/nn.gelu_approx takes
    that activation into its epilogue and the activation's slot becomes nn.Identity
    (it has no parameters, so parameters(), save_weights and load_weights keep their
    keys).  Each `mlx.nn.RMSNorm` and `mlx.nn.LayerNorm` becomes a `metile.nn.RMSNorm` /
    `LayerNorm` holding the same arrays (nn_norms.py), and each affine 4-/8-bit
    `mlx.nn.QuantizedLinear` (from `mlx.nn.quantize`) a `metile.nn.QuantizedLinear`
    calling `metile.ops.quantized_matmul` on its packed weight, scales, biases and
    bias.  `class_predicate(path, module)`
    returning False keeps a layer as it is.
    Returns a ConversionReport: what was converted or fused, and why every other
    leaf module was skipped."""
    if not isinstance(model, mlx_nn.Module):
        raise TypeError(f"[metile.nn.convert] model must be an mlx.nn.Module, got "
                        f"{type(model).__name__}")
    check_backend("metile.nn.convert", backend)
    if class_predicate is not None and not callable(class_predicate):
        raise TypeError("[metile.nn.convert] class_predicate must be callable (path, module) -> "
                        "bool")
    if isinstance(model, mlx_nn.Linear):
        raise ValueError("[metile.nn.convert] the model is itself a Linear and cannot be replaced "
                         "in place; use metile.nn.Linear.from_linear(layer)")
    leaf = {mlx_nn.QuantizedLinear: "metile.nn.QuantizedLinear.from_quantized(layer)",
            mlx_nn.RMSNorm: "metile.nn.RMSNorm.from_module(layer)",
            mlx_nn.LayerNorm: "metile.nn.LayerNorm.from_module(layer)"}.get(type(model))
    if leaf is not None:
        raise ValueError(f"[metile.nn.convert] the model is itself a {type(model).__name__} and "
                         f"cannot be replaced in place; use {leaf}")
    report = ConversionReport()
    _convert(model, "", backend, class_predicate, report)
    return report
