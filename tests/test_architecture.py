"""The compiler's structure, checked: no import cycles, the device and
METILE_BACKEND read in one place, one matrix-unit table, typed results between
compiler and runtime, and explain() listing the steps that ran."""

import ast
import json
import pathlib

import mlx.core as mx
import numpy as np

import metile
from metile.compiler import Analysis, CompiledKernel, resolve_backend
from metile.schedule import TARGETS, targets

PACKAGE = pathlib.Path(metile.__file__).parent
# Compiled extension modules: leaves of the import graph.
EXTENSIONS = {"metile._ext"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Every metile module `name` imports, at module level or inside functions
    (a lazy import hides a cycle, it does not remove it); TYPE_CHECKING imports
    are not imports."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            subs = {f"{target}.{a.name}" for a in node.names} & known
            out |= subs
            if len(subs) < len(node.names):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    out.add(target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names} & known
    return {m for m in out if m.startswith("metile") and m != name}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    modules = _modules()
    known = set(modules) | EXTENSIONS
    edges = {name: _imports(name, path, known) for name, path in modules.items()}
    assert _cycles(edges) == []
    # the check finds a cycle when there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]


def _uses(names: set[str]) -> dict[str, set[str]]:
    """file -> which of `names` it reads (attribute names or string literals)."""
    out = {}
    for f in PACKAGE.rglob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in names:
                found.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("get", "getenv", "__getitem__", "_get") and node.args and \
                    isinstance(node.args[0], ast.Constant) and node.args[0].value in names:
                found.add(node.args[0].value)
        if found:
            out[str(f.relative_to(PACKAGE))] = found
    return out


def test_the_device_and_backend_are_read_in_one_place():
    device = _uses({"default_device", "is_available", "device_info"})
    # The compiler learns the device from compiler/backend.py alone; the launchers
    # check the stream they were given, and ops route between metile and MLX.
    compiler_layers = ("compiler/", "frontend/", "ir/", "passes/", "codegen/", "schedule/",
                       "language/")
    assert [f for f in device if f.startswith(compiler_layers)] == ["compiler/backend.py"]
    ops = {f for f in device if f in ("ops.py", "op_routing.py") or f.endswith("_ops.py")}
    assert set(device) - ops <= {"compiler/backend.py", "runtime/metal_kernel.py",
                                 "runtime/cuda_kernel.py", "runtime/source_kernel.py"}
    assert list(_uses({"METILE_BACKEND"})) == ["compiler/backend.py"]


def test_one_matrix_unit_table(monkeypatch):
    from metile.codegen.cuda import CUDAEmitter
    from metile.codegen.msl import MSLEmitter

    # the emitters keep no table of their own
    assert not hasattr(MSLEmitter, "MATRIX_UNITS") and not hasattr(CUDAEmitter, "MATRIX_UNITS")
    # a backend's units are entries of the table (less those made for other targets)
    table = {id(u) for units in targets.MATRIX_UNITS.values() for u in units}
    for name in ("msl", "cuda"):
        units = resolve_backend(name).matrix_units
        assert units and all(id(u) in table for u in units)
    sm80 = resolve_backend("cuda", target="sm_80").matrix_units
    assert not any(u.warpgroup for u in sm80)
    # sm_90: one warpgroup unit (the METILE_CUDA_WGMMA variant), none with 0
    monkeypatch.delenv("METILE_CUDA_WGMMA", raising=False)
    sm90 = resolve_backend("cuda", target="sm_90").matrix_units
    assert [(u.warp_specialized, u.whole_copies, u.bulk_tensor) for u in sm90 if u.warpgroup] \
        == [(False, True, True)]
    monkeypatch.setenv("METILE_CUDA_WGMMA", "0")
    assert not any(u.warpgroup for u in resolve_backend("cuda", target="sm_90").matrix_units)
    for target in TARGETS.values():
        for path in target.matrix_paths:
            assert all(id(u) in table for u in path.units)
    # the planner checks the fragment the lowering will use
    cuda = TARGETS["sm_90"].matrix_path("simdgroup")
    assert cuda.fragment_for(("float16",), False) == (16, 16, 16)
    assert cuda.fragment_for(("float32",), True) == (16, 16, 8)


@metile.kernel
def _scale(X, Y, n, BLOCK: metile.constexpr):
    offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    mask = offs < n
    metile.store(Y + offs, metile.load(X + offs, mask=mask) * 2.0, mask=mask)


def _steps(dispatch) -> list[str]:
    steps = json.loads(dispatch.explain())["passes"]
    assert steps == list(dispatch.execution_report.passes) == dispatch.variant.compiled.steps
    # each step in explain()'s "steps", the main ones saying what they proved or produced
    assert "steps" not in json.loads(dispatch.explain())  # the recorded report format
    log = json.loads(dispatch.explain(steps=True))["steps"]
    assert [e["step"] for e in log] == steps
    detailed = {e["step"] for e in log if e.get("detail")}
    assert {"frontend", "uniformity", "buffer_usage", "plan_schedule", steps[-1]} <= detailed
    return steps


def test_explain_lists_the_steps_that_ran(rng):
    # Compiled for MSL by argument (prepare compiles without launching), so the steps
    # are the same on every machine; the elementwise kernel also runs on the default
    # device's own backend.
    x = mx.array(rng.standard_normal(100).astype(np.float32))
    native = resolve_backend().language
    run = _scale[(4,)].prepare(x, mx.zeros((100,)), 100, BLOCK=32)
    np.testing.assert_allclose(np.array(run()), np.array(x) * 2.0, rtol=3e-4, atol=3e-5)
    assert _steps(run)[-1] == f"emit_{native}"
    assert isinstance(run.variant.compiled, CompiledKernel)
    assert isinstance(run.spec.analysis, Analysis)

    d = _scale[(4,)].prepare(x, mx.zeros((100,)), 100, BLOCK=32, backend="msl")
    assert _steps(d) == ["frontend", "verify", "uniformity", "buffer_usage", "plan_schedule",
                         "placement", "lower_tiles", "verify", "emit_msl"]

    from metile_kernels.gemm import grid, matmul
    a = mx.zeros((40, 40))
    g = matmul[grid(40, 40, 32, 32)].prepare(a, a, mx.zeros((40, 40)), 40, 40, 40, BLOCK_M=32,
                                             BLOCK_N=32, BLOCK_K=8, backend="msl",
                                             SCHEDULE=metile.Schedule(double_buffer=True))
    assert _steps(g) == ["frontend", "verify", "uniformity", "buffer_usage", "plan_schedule",
                         "placement", "lower_tiles", "prove_gemm_bounds", "lower_matmul",
                         "split_k_loop", "double_buffer_staging", "register_epilogue", "verify",
                         "emit_msl"]

    from test_fragments import two_products
    f = two_products[(1,)].prepare(a[:8, :8], a[:8, :8], mx.zeros((8, 8)), backend="msl",
                                   SCHEDULE=metile.Schedule(backend="simdgroup_inline"))
    assert _steps(f) == ["frontend", "verify", "uniformity", "buffer_usage", "plan_schedule",
                         "shared_hazards", "lower_fragments", "verify", "emit_msl"]
    # the same steps, written by the other emitter
    c = _scale[(4,)].prepare(x, mx.zeros((100,)), 100, BLOCK=32, backend="cuda")
    assert _steps(c) == _steps(d)[:-1] + ["emit_cuda"]
