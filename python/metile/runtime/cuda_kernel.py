"""`metile.cuda_kernel`: a CUDA C++ body launched through MLX's CUDA backend.

Same contract as `mx.fast.cuda_kernel`, reached through metile's C++ layer
(`mlx::core::fast::cuda_kernel`), so metile's generated CUDA and hand-written
kernels take one path.  Returns lazy arrays that trace through `mx.compile`.

With `arch` (e.g. "sm_90a") metile builds the translation unit itself
(runtime/cuda_source.py), compiles it with NVRTC for that architecture
(runtime/nvrtc.py) and launches the cubin through
`mlx::core::fast::precompiled_cuda_kernel`: MLX's own NVRTC call targets the
device's `sm_XY`, which lacks architecture-specific instructions such as
Hopper's `wgmma`.  That path passes only pointers: no `<name>_shape`,
`_strides` or `_ndim`, and no template arguments.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import mlx.core as mx

from .. import _ext, settings
from . import nvrtc
from .cuda_source import launch_bounds_header, mlx_kernel_symbol, translation_unit
from .source_kernel import SourceKernel, resolve_stream


# metile's own launch primitive for its cubins (csrc/cuda_launch.cpp): built where MLX has
# its CUDA backend; settings.cuda_launch() chooses it or MLX's precompiled_cuda_kernel.
_OWN_LAUNCH = getattr(_ext, "has_cuda_launch", False)

# MLX takes the byte count as a C int.
_MAX_SHARED_MEMORY = 2**31 - 1


class CudaKernel(SourceKernel):
    """A callable CUDA kernel; create it with `metile.cuda_kernel`."""

    op = "cuda_kernel"

    def __init__(self, name, input_names, output_names, source, header, ensure_row_contiguous, shared_memory,
                 arch=None, value_inputs=(), min_blocks=0):
        super().__init__(name, input_names, output_names, source, header, ensure_row_contiguous)
        # inputs passed by value (precompiled kernels only): their positions among the inputs
        unknown = [n for n in value_inputs if n not in self.input_names]
        if unknown or (value_inputs and arch is None):
            raise ValueError(self.error(
                f"value_inputs {list(value_inputs)} must name inputs of a kernel with an arch "
                f"(precompiled); got inputs {list(self.input_names)}, arch={arch!r}"))
        self.value_positions = tuple(i for i, n in enumerate(self.input_names) if n in value_inputs)
        if not isinstance(shared_memory, int) or isinstance(shared_memory, bool) or \
                not 0 <= shared_memory <= _MAX_SHARED_MEMORY:
            raise ValueError(self.error(f"shared_memory must be a non-negative int (bytes of dynamic "
                                        f"shared memory), got {shared_memory!r}"))
        self.shared_memory = shared_memory
        if not isinstance(min_blocks, int) or isinstance(min_blocks, bool) or \
                not 0 <= min_blocks <= 32:
            raise ValueError(self.error(f"min_blocks must be an int from 0 to 32 (blocks per SM "
                                        f"__launch_bounds__ budgets registers for), got "
                                        f"{min_blocks!r}"))
        self.min_blocks = min_blocks
        self.arch = None if arch is None else nvrtc.check_arch(arch)
        if self.arch is not None:
            shape_info = [n for n in self.input_names
                          if re.search(rf"\b{n}_(shape|strides|ndim)\b", self.source)]
            if shape_info:
                raise ValueError(self.error(
                    f"kernel '{name}' with arch={arch!r} reads the shape, strides or ndim of "
                    f"{shape_info}; the precompiled launch passes only pointers, so pass sizes "
                    f"as scalar inputs"))
        self._names: dict = {}
        self._headers: dict = {}
        self._cubins: dict = {}
        self._resources: dict = {}
        self._functions: dict = {}

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                 init_value=None, verbose=False, stream=None, scalars=None, no_vjp=""):
        inputs, grid, threadgroup, shapes = self.prepare_call(inputs, output_shapes, output_dtypes, grid, threadgroup)
        template, init_value = self.checked_extras(template, init_value)
        if self.arch is not None and template:
            raise ValueError(self.error(
                f"kernel '{self.name}' has arch={self.arch!r}, whose precompiled launch takes no "
                f"template arguments; spell the values in the header or body instead"))
        s = resolve_stream(stream, self.op)
        if s.device.type != mx.gpu or not mx.cuda.is_available():
            raise RuntimeError(
                self.error(f"kernel '{self.name}' is CUDA C++, which needs MLX's CUDA backend; "
                           f"the requested device is {s.device}")
            )
        return self._binding(inputs, shapes, output_dtypes, grid, threadgroup, template,
                             init_value, scalars, no_vjp, verbose)(inputs, s)

    def _own_launch(self, init_value) -> bool:
        """Whether a launch runs as metile's own primitive (csrc/cuda_launch.cpp)."""
        return (self.arch is not None and init_value is None and _OWN_LAUNCH
                and settings.cuda_launch() == "metile")

    def owns_primitive(self, *, init_value=None, **launch) -> bool:
        """Whether this launch refuses a gradient with `no_vjp` itself: every binding does
        (metile's own primitive in its vjp; MLX's cuda_kernel and precompiled launch under a
        custom vjp built in C++, csrc/ext.cpp's refusing_vjp), so a Dispatch wraps none of them in
        an mx.custom_function."""
        return True

    def refusal_node(self, *, init_value=None, **launch) -> bool:
        """Whether the refusal of this launch is a node of its own: MLX's cuda_kernel and
        precompiled launch refuse under csrc/ext.cpp's custom vjp (a CustomTransforms node
        after the CustomKernel), metile's own primitive in its vjp.  A Dispatch launching
        inside an op's forward, whose node carries the op's rules, binds such a launch
        without the refusal (dispatch.op_forward)."""
        return not self._own_launch(init_value)

    def bind(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
             init_value=None, verbose=False, stream=None, scalars=None, no_vjp=""):
        """This launch reduced to its binding call, for a caller that keeps its signature
        (a Dispatch relaunching arrays of the same dtypes and shapes, with the same
        scalars): `launch(inputs)` with the checks, lookups and argument building of
        __call__ done once, here.  A call whose stream is not a GPU's takes __call__ (which
        says why it cannot run there)."""
        kwargs = dict(output_shapes=output_shapes, output_dtypes=output_dtypes, grid=grid,
                      threadgroup=threadgroup, template=template, init_value=init_value,
                      stream=stream, scalars=scalars, no_vjp=no_vjp)
        checked, grid, threadgroup, shapes = self.prepare_call(inputs, output_shapes, output_dtypes, grid, threadgroup)
        template, init_value = self.checked_extras(template, init_value)
        # metile's own launch and MLX's cuda_kernel bind in C++ (MLX's precompiled launch,
        # METILE_CUDA_LAUNCH=mlx or an init_value, keeps the Python binding below)
        direct = hasattr(_ext, "CudaLaunch") if self._own_launch(init_value) else self.arch is None
        launch = self._binding(checked, shapes, output_dtypes, grid, threadgroup, template,
                               init_value, scalars, no_vjp, direct=direct)
        fixed = None if stream is None else resolve_stream(stream, self.op)
        if direct:
            def run(arrays):
                outs = launch(arrays, fixed)   # None off a GPU
                return outs if outs is not None else self(inputs=arrays, **kwargs)
            run.direct = launch if fixed is None else None
            return run

        def run(arrays):
            s = fixed if fixed is not None else mx.default_stream(mx.default_device())
            if s.device.type != mx.gpu:
                return self(inputs=arrays, **kwargs)
            return launch(arrays, s)
        return run

    def _binding(self, inputs, shapes, output_dtypes, grid, threadgroup, template, init_value,
                 scalars, no_vjp, verbose=False, direct=False):
        """`launch(arrays, stream)`: this launch's binding call with all but its arrays and
        stream fixed (checked `inputs` give the dtypes; scalars passed by value come from
        `scalars`, else from their 0-d arrays).  The three bindings: MLX's cuda_kernel
        compiling the source, metile's own launch of its cubin, MLX's precompiled launch.
        `direct` (metile's own launch, or MLX's cuda_kernel compiling the source): an
        _ext.CudaLaunch or _ext.CudaSourceLaunch, which converts the fixed arguments once
        and takes a stream of None as the default device's, answering None when that is
        not a GPU."""
        dtypes = list(output_dtypes)
        contiguous, smem = self.ensure_row_contiguous, self.shared_memory
        refusal = (no_vjp,) if no_vjp else ()   # (a direct call's arguments end as before)
        if self.arch is None:
            name, header = self.mlx_source(inputs, output_dtypes, template, threadgroup)
            names, outs, source = self.input_names, self.output_names, self.source
            if direct:
                return _ext.CudaSourceLaunch(name, names, outs, source, header, contiguous, smem,
                                             shapes, dtypes, grid, threadgroup, template,
                                             init_value, no_vjp)
            return lambda arrays, s: _ext.launch_cuda(
                name, names, outs, source, header, contiguous, smem, arrays, shapes, dtypes, grid,
                threadgroup, template, init_value, verbose, s, *refusal)
        name, cubin = self.compiled([x.dtype for x in inputs], dtypes, threadgroup, verbose)
        kept = [i for i in range(len(inputs)) if i not in self.value_positions]
        _, values = split_value_inputs(inputs, self.value_positions, scalars)
        if self._own_launch(init_value):
            fn = self._function(name, cubin)
            if direct:
                return _ext.CudaLaunch(fn, kept, shapes, dtypes, grid, threadgroup, values,
                                       contiguous, no_vjp)
            return lambda arrays, s: _ext.launch_cuda_function(
                fn, [arrays[i] for i in kept], shapes, dtypes, grid, threadgroup, values,
                contiguous, s, no_vjp)
        return lambda arrays, s: _ext.launch_precompiled_cuda(
            name, cubin, [arrays[i] for i in kept], shapes, dtypes, grid, threadgroup, smem,
            init_value, contiguous, s, values, *refusal)

    def _function(self, name: str, cubin: bytes):
        """The loaded-once handle of a compiled cubin (metile's own launch primitive)."""
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = _ext.CudaFunction(name, cubin, self.shared_memory)
        return fn

    def mlx_source(self, inputs, output_dtypes, template, threadgroup) -> tuple[str, str]:
        """(name, header) that MLX's `cuda_kernel` compiles this kernel with for a
        block of `threadgroup`: the header ends with the kernel's
        `__launch_bounds__` (runtime/cuda_source.py, launch_bounds_header), so
        ptxas keeps registers x threads within the register file and the launch
        cannot fail for registers.  The block size is in the name, which MLX caches
        the compiled module by.  `inputs` are arrays or dtypes."""
        threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
        name = self.unique_name(inputs, output_dtypes, template, threads)
        header = self._headers.get(name)
        if header is None:
            header = self._headers[name] = self.header + launch_bounds_header(
                mlx_kernel_symbol(name, template), threads, self.min_blocks)
        return name, header


    def compiled(self, input_dtypes, output_dtypes, threadgroup, verbose=False) -> tuple[str, bytes]:
        """(kernel symbol, cubin) of this kernel for `arch`, compiled on first use.
        The block size is part of the source (`__launch_bounds__`), so it is
        part of the specialization."""
        threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
        signature = (tuple(input_dtypes), tuple(output_dtypes), threads)
        found = self._cubins.get(signature)
        if found is None:
            name, source = self.translation_unit(input_dtypes, output_dtypes, threadgroup)
            if verbose:
                print(f"Generated source code for `{name}`:\n```\n{source}\n```")
            found = self._cubins[signature] = (name, nvrtc.compile(source, self.arch, self.name))
        return found

    def resources(self, input_dtypes, output_dtypes, threadgroup) -> dict:
        """ptxas's report of this kernel for `arch`: registers a thread uses and bytes of
        spill stores and loads, from a compile of the translation unit `compiled` builds
        with --ptxas-options=-v (NVRTC: no GPU needed); remembered per signature."""
        threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
        signature = (tuple(input_dtypes), tuple(output_dtypes), threads)
        found = self._resources.get(signature)
        if found is None:
            name, source = self.translation_unit(input_dtypes, output_dtypes, threadgroup)
            ok, log, _ = nvrtc.run_nvrtc(source, self.arch, extra=("--ptxas-options=-v",))
            used = re.search(r"Used (\d+) registers", log)
            spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
            if not ok or used is None or spills is None:
                raise RuntimeError(self.error(f"NVRTC gave no resource report for kernel "
                                              f"'{self.name}' ({self.arch}):\n{log[-2000:]}"))
            found = self._resources[signature] = {
                "arch": self.arch, "registers": int(used.group(1)),
                "spill_stores": int(spills.group(1)), "spill_loads": int(spills.group(2))}
        return dict(found)

    def translation_unit(self, input_dtypes, output_dtypes, threadgroup) -> tuple[str, str]:
        """(kernel symbol, CUDA source) that `arch` compiles for these dtypes and
        block shape."""
        if self.arch is None:
            raise ValueError(self.error(f"kernel '{self.name}' has no arch: MLX builds and compiles "
                                        f"its source"))
        threads = threadgroup[0] * threadgroup[1] * threadgroup[2]
        name = self.unique_name(input_dtypes, output_dtypes, [], threads)
        typed = list(zip(self.input_names, input_dtypes))
        return name, translation_unit(
            name, self.header, self.source,
            [x for i, x in enumerate(typed) if i not in self.value_positions],
            zip(self.output_names, output_dtypes), threads,
            [typed[i] for i in self.value_positions], self.min_blocks)

    def unique_name(self, inputs, output_dtypes, template, threads=None) -> str:
        """MLX's CUDA backend caches compiled modules by kernel name alone, so
        two kernels (or two specializations) sharing a name would silently run
        the first one's code; the name metile passes carries a content hash.
        `inputs` are arrays or (on the precompiled path) dtypes."""
        # Hashing a GEMM's source on every eager launch cost more than the rest of
        # the launch; the name depends only on this signature.
        described = tuple((x.dtype, x.ndim) if isinstance(x, mx.array) else x for x in inputs)
        signature = (described, tuple(output_dtypes), repr(template), threads)
        name = self._names.get(signature)
        if name is None:
            h = hashlib.sha256()
            # shared_memory is in the hash: MLX raises a kernel's dynamic shared
            # memory limit once, when it first loads the module of that name.
            for part in (self.source, self.header, repr(list(described)), repr(list(output_dtypes)),
                         repr(template), str(self.ensure_row_contiguous), str(self.shared_memory),
                         str(self.min_blocks),
                         str(self.arch), str(threads), repr(self.value_positions)):
                h.update(part.encode())
                h.update(b"\0")
            arch = f"_{self.arch}" if self.arch else ""
            name = self._names[signature] = f"{self.name}{arch}_{h.hexdigest()[:16]}"
        return name


def split_value_inputs(inputs, positions, scalars=None) -> tuple[list, list]:
    """(arrays, values) of a precompiled launch: the inputs at `positions` become the
    by-value scalars, from `scalars` (their Python values, as the launch got them) or else
    each 0-d array's value (read on the host: a computed one waits for its result)."""
    if not positions:
        return list(inputs), []
    if scalars is None:
        scalars = [inputs[i].item() for i in positions]
    if len(scalars) != len(positions):
        raise ValueError(f"[cuda_kernel] expected {len(positions)} scalars passed by value, "
                         f"got {len(scalars)}")
    kept = [x for i, x in enumerate(inputs) if i not in positions]
    return kept, [v if isinstance(v, (bool, float)) else int(v) for v in scalars]


def cuda_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    ensure_row_contiguous: bool = True,
    shared_memory: int = 0,
    arch: str | None = None,
    value_inputs: Sequence[str] = (),
    min_blocks: int = 0,
) -> CudaKernel:
    """A custom CUDA kernel from a body of CUDA C++, like `mx.fast.cuda_kernel`.

    `shared_memory`: bytes of dynamic shared memory (`extern __shared__`) per
    block; above 48 KB MLX raises the kernel's limit to it.  `arch` (e.g.
    "sm_90a"): compile with NVRTC for that architecture here and launch the
    cubin, for instructions MLX's own `sm_XY` compile cannot use (wgmma).
    `value_inputs` (with `arch`): inputs passed as kernel parameters by value (int32,
    float32 or bool), declared after the outputs; the body reads them as values.
    `min_blocks` (> 1): the blocks per SM `__launch_bounds__` asks ptxas to leave room
    for (it caps registers per thread at the register file / (threads x min_blocks))."""
    return CudaKernel(name, input_names, output_names, source, header, ensure_row_contiguous, shared_memory,
                      arch, value_inputs, min_blocks)
