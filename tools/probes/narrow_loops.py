"""What the 64-bit loop counters cost: runs a benchmark module with loops counted as before
the twenty-fifth session (`for (int i = lo; i < hi; i += step)` for every constant step),
so the same benchmark with and without can be compared against MLX in the same session.

Since then a loop with a constant step above 1 whose bound may lie within a step of
INT_MAX counts in 64 bits (codegen/c_like.py, `_step_may_pass_int32`): the int32 counter
wrapped there and looped forever.  Every K loop, row loop and key loop whose bound is a
launch value is such a loop.

    python3 tools/probes/narrow_loops.py benchmarks.model_ops --ops rms_norm --output x.json
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from metile.codegen import c_like

c_like.CEmitter._step_may_pass_int32 = staticmethod(lambda op: False)
module = sys.argv[1]
sys.argv = [module] + sys.argv[2:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
