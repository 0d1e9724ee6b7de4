"""Variants of attention_decode for tools/probes/decode_prefetch.py --replace (s39), built
from the library kernel's own source (so they differ from it only by the edits below):
attention_decode_r1 keeps each key slot's running maximum and sum as (BLOCK_N, 1) tiles,
where the library kernel keeps them as (BLOCK_N, BLOCK_D) tiles equal along each row: one
exponential a key instead of one an element, at the cost of the (BLOCK_N, 1) values' trips
through threadgroup memory (the lane layout places them apart from the rows).  s132 (H100):
no faster."""

import importlib.util
import inspect
import tempfile
from pathlib import Path

from metile_kernels import attention as library

R1_EDITS = [
    ("def attention_decode(", "def attention_decode_r1("),
    ('''    m_i = metile.full((BLOCK_N, BLOCK_D), -float("inf"), dtype=metile.float32)
    l_i = metile.zeros((BLOCK_N, BLOCK_D), dtype=metile.float32)''',
     '''    m_i = metile.full((BLOCK_N, 1), -float("inf"), dtype=metile.float32)
    l_i = metile.zeros((BLOCK_N, 1), dtype=metile.float32)'''),
    ("        key_in = (key < hi) & (d >= 0)", "        key_in = key < hi"),
    ("    l_out = metile.sum(metile.where(d == 0, l_i * weight, 0.0))",
     "    l_out = metile.sum(l_i * weight)"),
]


def _variant(edits, name):
    source = inspect.getsource(library.attention_decode.fn)
    for old, new in edits:
        if old not in source:
            raise SystemExit(f"the library's attention_decode changed: {old.strip()[:60]!r} "
                             "not found; update this probe's edits")
        source = source.replace(old, new)
    # a file of its own: a kernel's source must be readable where it is defined
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text("import metile\nfrom metile_kernels.attention import REMOVED, add_mask\n\n"
                    + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


attention_decode_r1 = _variant(R1_EDITS, "attention_decode_r1")
