"""`metile.cuda_kernel`: a CUDA C++ body launched through MLX's CUDA backend.

Same contract as `mx.fast.cuda_kernel`, reached through metile's C++ layer
(`mlx::core::fast::cuda_kernel`), so metile's generated CUDA and hand-written
kernels take one path.  Returns lazy arrays that trace through `mx.compile`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import mlx.core as mx

from .. import _ext
from .source_kernel import SourceKernel, resolve_stream


class CudaKernel(SourceKernel):
    """A callable CUDA kernel; create it with `metile.cuda_kernel`."""

    op = "cuda_kernel"

    def __init__(self, name, input_names, output_names, source, header, ensure_row_contiguous, shared_memory):
        super().__init__(name, input_names, output_names, source, header, ensure_row_contiguous)
        if not isinstance(shared_memory, int) or shared_memory < 0:
            raise ValueError(self.error(f"shared_memory must be a non-negative int, got {shared_memory!r}"))
        self.shared_memory = shared_memory
        self._names: dict = {}

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                 init_value=None, verbose=False, stream=None):
        inputs, grid, threadgroup, shapes = self.prepare_call(inputs, output_shapes, output_dtypes, grid, threadgroup)
        template, init_value = self.checked_extras(template, init_value)
        s = resolve_stream(stream, self.op)
        if s.device.type != mx.gpu or not mx.cuda.is_available():
            raise RuntimeError(
                self.error(f"kernel '{self.name}' is CUDA C++, which needs MLX's CUDA backend; "
                           f"the requested device is {s.device}")
            )
        return _ext.launch_cuda(
            self.unique_name(inputs, output_dtypes, template), self.input_names, self.output_names, self.source, self.header,
            self.ensure_row_contiguous, self.shared_memory, inputs, shapes, list(output_dtypes),
            grid, threadgroup, template, init_value, verbose, s,
        )


    def unique_name(self, inputs, output_dtypes, template) -> str:
        """MLX's CUDA backend caches compiled modules by kernel name alone, so
        two kernels (or two specializations) sharing a name would silently run
        the first one's code; the name metile passes carries a content hash."""
        # Hashing a GEMM's source on every eager launch cost more than the rest of
        # the launch; the name depends only on this signature.
        signature = (tuple((x.dtype, x.ndim) for x in inputs), tuple(output_dtypes), repr(template))
        name = self._names.get(signature)
        if name is None:
            h = hashlib.sha256()
            for part in (self.source, self.header, repr([(x.dtype, x.ndim) for x in inputs]),
                         repr(list(output_dtypes)), repr(template), str(self.ensure_row_contiguous)):
                h.update(part.encode())
                h.update(b"\0")
            name = self._names[signature] = f"{self.name}_{h.hexdigest()[:16]}"
        return name


def cuda_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str = "",
    ensure_row_contiguous: bool = True,
    shared_memory: int = 0,
) -> CudaKernel:
    """A custom CUDA kernel from a body of CUDA C++, like `mx.fast.cuda_kernel`."""
    return CudaKernel(name, input_names, output_names, source, header, ensure_row_contiguous, shared_memory)
