"""static_print, device_print and device_assert (Triton's debugging ops) on the CPU runtime
and on MLX's CUDA backend, and their CUDA emission compiled with NVRTC.

On CUDA a failed device_assert printf()s its report and `__trap()`s, which leaves the
process's CUDA context unusable (as CUDA's own device assert does), so each failing case
runs there in a child process whose output must hold the report and whose mx.eval must
raise; on the CPU runtime the report is the RuntimeError's text and the process carries on.
"""

import ctypes
import os
import re
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

import metile
from metile.compiler import resolve_backend
from metile.compiler.backend import Backend
from metile.schedule.targets import target_for

sys.path.insert(0, os.path.dirname(__file__))
import nvrtc  # noqa: E402


@metile.kernel
def checked_copy(X, Y, n, LIMIT: metile.constexpr, BLOCK: metile.constexpr):
    i = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
    x = metile.load(X + i, mask=i < n, other=0.0)
    metile.device_assert(x < LIMIT, "x must stay below LIMIT", mask=i < n)
    metile.store(Y + i, x * 2.0, mask=i < n)


def _launch(n, limit, block=4, **kw):
    x = mx.arange(n, dtype=mx.float32)
    return checked_copy[(metile.cdiv(n, block),)](x, mx.zeros(n), n, LIMIT=limit, BLOCK=block,
                                                  **kw)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("pid (")]


TESTS = os.path.dirname(os.path.abspath(__file__))
ON_CUDA = resolve_backend().language == "cuda"


def _printed(capfd) -> list[str]:
    """The device_print lines written to fd 1 so far."""
    # CUDA's printf output reaches fd 1 through the C library's stdout, which may buffer it
    # (the CPU runtime's shim write(2)s directly)
    ctypes.CDLL(None).fflush(None)
    return _lines(capfd.readouterr().out)


def _float_text(v) -> str:
    """A float32 as device_print shows it: the CPU runtime prints it as NumPy does, CUDA's
    printf with %.9g (codegen/debug_ops.py)."""
    return "%.9g" % v if ON_CUDA else str(v)


_CHILD = """
import ctypes, os, sys
sys.path.insert(0, {tests!r})
import mlx.core as mx
import test_debug_ops
out = eval({call!r}, vars(test_debug_ops))
try:
    mx.eval(out)
    print("mx.eval raised nothing", flush=True)
except RuntimeError as e:
    print(f"mx.eval raised RuntimeError: {{e}}", flush=True)
ctypes.CDLL(None).fflush(None)
os._exit(0)  # no teardown on the context the trap left unusable
"""


def failed_assert_report(call: str) -> str:
    """What a launch that fails a device_assert reports; `call` is an expression over this
    module's names that launches it.  CPU runtime: the text of the RuntimeError mx.eval
    raises (in-process).  CUDA: the printed report of a child process, which must also
    have seen mx.eval raise the launch failure (not hang, not die)."""
    if not ON_CUDA:
        with pytest.raises(RuntimeError) as e:
            mx.eval(eval(call, globals()))
        return str(e.value)
    child = subprocess.run([sys.executable, "-c", _CHILD.format(tests=TESTS, call=call)],
                           capture_output=True, text=True, timeout=240, cwd=TESTS)
    text = child.stdout + child.stderr
    assert child.returncode == 0, f"child died ({child.returncode}):\n{text}"
    assert re.search(r"^mx\.eval raised RuntimeError: .*launch failure", text, re.M), text
    return text


# -- static_print ------------------------------------------------------------------------

def test_static_print_shows_constexprs_and_types_once_per_specialization(capsys, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))  # a cache hit would not print

    @metile.kernel
    def shown(X, Y, n, BLOCK: metile.constexpr):
        i = metile.arange(0, BLOCK)
        x = metile.load(X + i, mask=i < n)
        metile.static_print("BLOCK", BLOCK, "x", x, "n", n, "row", x[None, :])
        metile.store(Y + i, x, mask=i < n)

    x = mx.arange(8, dtype=mx.float32)
    for _ in range(2):
        mx.eval(shown[(1,)](x, mx.zeros(8), 8, BLOCK=8))
    mx.eval(shown[(1,)](x, mx.zeros(8), 8, BLOCK=4))
    out = [ln for ln in capsys.readouterr().out.splitlines() if "static_print" in ln]
    assert [ln.split("static_print: ")[1] for ln in out] == [
        "BLOCK 8 x tile<8, float32> n int32 row tile<1x8, float32>",
        "BLOCK 4 x tile<4, float32> n int32 row tile<1x4, float32>"]
    assert out[0].startswith(f"{__file__}:")


# -- device_assert ---------------------------------------------------------------------------

def test_passing_assert_changes_nothing():
    y = _launch(10, 100.0, debug=True)
    np.testing.assert_array_equal(np.array(y), 2 * np.arange(10, dtype=np.float32))


def test_failing_assert_names_kernel_message_program_and_element():
    # element 9 (value 9.0) is the only one to fail: program 2, element 1 of its tile
    text = failed_assert_report("_launch(10, 9.0, debug=True)")
    assert "device_assert failed in kernel 'checked_copy'" in text
    assert re.search(r"test_debug_ops\.py:\d+\) in program \(2, 0, 0\), element \(1\): "
                     r"x must stay below LIMIT", text), text
    if ON_CUDA:
        return  # the trap took the child's context with it
    # the process survives and the runtime takes the next launch
    y = _launch(10, 100.0, debug=True)
    np.testing.assert_array_equal(np.array(y), 2 * np.arange(10, dtype=np.float32))


def _twin():
    @metile.kernel(debug=True)
    def below_one(X, Y, BLOCK: metile.constexpr):
        o = metile.arange(0, BLOCK)
        metile.device_assert(metile.load(X + o) < 1.0, "too big")  # MARK-twin-a
        metile.store(Y + o, metile.load(X + o))
    return below_one


@metile.kernel(debug=True)
def below_one(X, Y, BLOCK: metile.constexpr):
    o = metile.arange(0, BLOCK)
    metile.device_assert(metile.load(X + o) < 1.0, "too big")  # MARK-twin-b
    metile.store(Y + o, metile.load(X + o))


@pytest.mark.skipif(ON_CUDA, reason="the CPU runtime's in-process report (CUDA: a child's)")
def test_a_failed_assert_names_its_own_line_where_the_same_text_stands_twice():
    # (a docs trial: the generated code is cached by the kernel's text, so the second of
    # two identical kernels reported the first one's file and line)
    import inspect
    lines = inspect.getsource(sys.modules[__name__]).splitlines()
    for kernel, mark in ((_twin(), "MARK-twin-a"), (below_one, "MARK-twin-b")):
        line = next(i + 1 for i, t in enumerate(lines) if mark in t and "metile." in t)
        with pytest.raises(RuntimeError, match=rf"test_debug_ops\.py:{line}\) in program"):
            mx.eval(kernel[(1,)](mx.array([0.5, 2.0]), mx.zeros((2,)), BLOCK=2))


@metile.kernel
def _nonnegative(X, Y, n, BLOCK: metile.constexpr, MASKED: metile.constexpr):
    i = metile.arange(0, BLOCK)
    x = metile.load(X + i, mask=i < n, other=-1.0)
    if MASKED:
        metile.device_assert(x >= 0.0, "negative", mask=i < n)
    else:
        metile.device_assert(x >= 0.0, "negative")
    metile.store(Y + i, x, mask=i < n)


def test_masked_off_elements_are_not_checked():
    # elements 3.. are masked off and read `other`, -1.0
    x = mx.arange(3, dtype=mx.float32)
    y = _nonnegative[(1,)](x, mx.zeros(3), 3, BLOCK=8, MASKED=True, debug=True)
    np.testing.assert_array_equal(np.array(y), [0, 1, 2])
    text = failed_assert_report("_nonnegative[(1,)](mx.arange(3, dtype=mx.float32), mx.zeros(3), "
                                "3, BLOCK=8, MASKED=False, debug=True)")
    assert re.search(r"program \(0, 0, 0\), element \(3\): negative", text), text


@metile.kernel
def scalar(X, Y, n, BLOCK: metile.constexpr):
    pid = metile.program_id(0)
    assert pid * BLOCK < n, "program past the end"
    metile.device_assert(metile.thread_id() < 64, "thread")
    i = pid * BLOCK + metile.arange(0, BLOCK)
    metile.store(Y + i, metile.load(X + i, mask=i < n), mask=i < n)


def test_scalar_and_python_assert():
    x = mx.arange(8, dtype=mx.float32)
    np.testing.assert_array_equal(np.array(scalar[(2,)](x, mx.zeros(8), 8, BLOCK=4,
                                                        debug=True)), np.arange(8))
    text = failed_assert_report("scalar[(3,)](mx.arange(8, dtype=mx.float32), mx.zeros(8), 8, "
                                "BLOCK=4, debug=True)")
    # (?m): on CUDA every thread of program 2 prints the report, one line each
    assert re.search(r"(?m)kernel 'scalar' \(.*\) in program \(2, 0, 0\): "
                     r"program past the end$", text), text


def test_debug_off_compiles_the_assert_out():
    off = checked_copy[(1,)].prepare(mx.zeros(4), mx.zeros(4), 4, LIMIT=1.0, BLOCK=4)
    on = checked_copy[(1,)].prepare(mx.zeros(4), mx.zeros(4), 4, LIMIT=1.0, BLOCK=4, debug=True)
    assert "device_assert" in on.variant.compiled.body
    # no check and nothing computed for it: the off body is the kernel without the call
    assert "device_assert" not in off.variant.compiled.body
    assert "1.0f" not in off.variant.compiled.body
    y = _launch(10, 0.0)  # fails every element when checked
    np.testing.assert_array_equal(np.array(y), 2 * np.arange(10, dtype=np.float32))


@metile.kernel(debug=True)
def always(X, Y, n, BLOCK: metile.constexpr):
    i = metile.arange(0, BLOCK)
    metile.device_assert(i < n, "i < n")
    metile.store(Y + i, metile.load(X + i, mask=i < n), mask=i < n)


def test_debug_switches(monkeypatch):
    monkeypatch.setenv("METILE_DEBUG", "asserts")  # a CUDA child inherits it
    assert "x must stay below LIMIT" in failed_assert_report("_launch(6, 3.0)")
    np.testing.assert_array_equal(np.array(_launch(6, 3.0, debug=False)), 2 * np.arange(6))
    monkeypatch.delenv("METILE_DEBUG")
    np.testing.assert_array_equal(np.array(_launch(6, 3.0)), 2 * np.arange(6))

    text = failed_assert_report("always[(1,)](mx.zeros(3), mx.zeros(3), 3, BLOCK=4)")
    assert re.search(r"element \(3\): i < n", text), text
    mx.eval(always[(1,)](mx.zeros(3), mx.zeros(3), 3, BLOCK=4, debug=False))
    with pytest.raises(metile.LaunchError, match="debug must be True or False"):
        _launch(4, 1.0, debug=1)


# -- device_print ------------------------------------------------------------------------------

def test_device_print_tiles_scalars_and_masks(capfd):
    @metile.kernel
    def show(X, Y, n, BLOCK: metile.constexpr):
        pid = metile.program_id(0)
        i = pid * BLOCK + metile.arange(0, BLOCK)
        x = metile.load(X + i, mask=i < n, other=-1.0)
        metile.device_print("x:", x, i < n)
        metile.device_print("pid", pid, n)
        metile.device_print("h", metile.cast(x, metile.float16), i, hex=True)
        metile.store(Y + i, x, mask=i < n)

    x = mx.array([0.1, 1.5, -2.0, 3.0, 1e20, float("nan")], dtype=mx.float32)
    y = show[(2,)](x, mx.zeros(6), 6, BLOCK=4)
    mx.eval(y)
    lines = _printed(capfd)
    xs = np.array(x)
    expect = []
    for pid in range(2):
        expect.append(f"pid ({pid}, 0, 0) idx () pid: {pid}, 6")
        for e in range(4):
            g = pid * 4 + e
            v = xs[g] if g < 6 else np.float32(-1.0)
            # on the CPU runtime floats print as NumPy prints them: the shortest text that
            # reads back exactly
            expect.append(f"pid ({pid}, 0, 0) idx ({e}) x: {_float_text(v)}, {g < 6}")
            with np.errstate(over="ignore"):  # 1e20 is inf in half
                bits = np.array(v, np.float32).astype(np.float16).view(np.uint16)
            if ON_CUDA and np.isnan(v):
                bits = 0x7FFF   # CUDA's float->half conversion gives its canonical NaN
            expect.append(f"pid ({pid}, 0, 0) idx ({e}) h: 0x{int(bits):04x}, 0x{g:08x}")
    assert sorted(lines) == sorted(expect)
    # program order within a thread: thread 0 of program 0 prints x, then pid, then h
    # (program 1 runs concurrently: only program 0's lines keep an order)
    p0 = [ln for ln in lines if ln.startswith(("pid (0, 0, 0) idx (0)", "pid (0, 0, 0) idx ()"))]
    assert [ln.split(")")[2][:3] for ln in p0[:3]] == [" x:", " pi", " h:"]


def test_device_print_2d_and_per_thread(capfd):
    @metile.kernel
    def grid2(X, Y, M: metile.constexpr, N: metile.constexpr):
        r = metile.arange(0, M)[:, None]
        c = metile.arange(0, N)[None, :]
        x = metile.load(X + r * N + c)
        metile.device_print("v", x, r)
        if metile.thread_id() < 2:
            metile.device_print("t", metile.thread_id() * 10)
        metile.store(Y + r * N + c, x)

    x = mx.arange(6, dtype=mx.int32).reshape(2, 3)
    mx.eval(grid2[(1,)](x, mx.zeros((2, 3), dtype=mx.int32), M=2, N=3))
    lines = _printed(capfd)
    expect = [f"pid (0, 0, 0) idx ({i}, {j}) v: {3 * i + j}, {i}" for i in range(2)
              for j in range(3)]
    expect += [f"pid (0, 0, 0) thread {t} t: {10 * t}" for t in range(2)]
    assert sorted(lines) == sorted(expect)


@metile.kernel
def _print_pointer(X, Y):
    i = metile.arange(0, 4)
    metile.device_print("p", X + i)
    metile.store(Y + i, metile.load(X + i))


@metile.kernel
def _print_number_prefix(X, Y):
    i = metile.arange(0, 4)
    metile.device_print(3, i)
    metile.store(Y + i, metile.load(X + i))


@metile.kernel
def _print_bad_keyword(X, Y):
    i = metile.arange(0, 4)
    metile.device_print("p", i, hexx=True)
    metile.store(Y + i, metile.load(X + i))


@metile.kernel
def _assert_tile_message(X, Y):
    i = metile.arange(0, 4)
    metile.device_assert(i < 2, i)
    metile.store(Y + i, metile.load(X + i))


@pytest.mark.parametrize("kernel,message", [
    (_print_pointer, r"device_print\(\) argument 1 is a pointer"),
    (_print_number_prefix, r"device_print\(\) prefix must be a compile-time str"),
    (_print_bad_keyword, "unexpected keyword argument 'hexx'"),
    (_assert_tile_message, r"device_assert\(\) msg must be a compile-time str"),
])
def test_bad_calls_are_located_compile_errors(kernel, message):
    with pytest.raises(metile.CompilationError, match=message) as e:
        kernel[(1,)].prepare(mx.zeros(4), mx.zeros(4), debug=True)
    assert "test_debug_ops.py" in str(e.value)


def test_metal_gpu_refuses_print_and_warns_for_assert():
    metal = Backend("msl", target_for("metal", "apple9"), "metal:applegpu_g15s:Apple M3")

    @metile.kernel
    def p(X, Y):
        i = metile.arange(0, 4)
        metile.device_print("x", i)
        metile.store(Y + i, metile.load(X + i))

    with pytest.raises(metile.CompilationError, match="device_print is not supported on a "
                                                      "Metal GPU"):
        p[(1,)].prepare(mx.zeros(4), mx.zeros(4), backend=metal)
    with pytest.warns(UserWarning, match=r"kernel .checked_copy.: 1 device_assert check\(s\) "
                                         r"\(line \d+\) not checked on a Metal GPU"):
        d = checked_copy[(1,)].prepare(mx.zeros(4), mx.zeros(4), 4, LIMIT=1.0, BLOCK=4,
                                       debug=True, backend=metal)
    # the MSL keeps the check only for the CPU runtime (the macro Metal never defines)
    body = d.variant.compiled.body
    assert "#if defined(METILE_MSL_CPU_RUNTIME)" in body and "device_assert_fail" in body


@pytest.mark.skipif(nvrtc.TOOLKIT is None, reason="no NVRTC")
def test_cuda_emission_compiles_with_nvrtc():
    @metile.kernel
    def both(X, Y, n, BLOCK: metile.constexpr):
        pid = metile.program_id(0)
        i = pid * BLOCK + metile.arange(0, BLOCK)
        x = metile.load(X + i, mask=i < n)
        metile.device_print("x %d \"q\"", x, metile.cast(x, metile.float16),
                            metile.cast(x, metile.bfloat16), i, i < n)
        metile.device_print("bits", x, i, hex=True)
        metile.device_print("pid", pid)
        metile.device_assert(x < 100.0, "too big", mask=i < n)
        metile.device_assert(pid < 1000)
        metile.store(Y + i, x, mask=i < n)

    d = both[(2,)].prepare(mx.zeros(8), mx.zeros(8), 8, BLOCK=4, debug=True, backend="cuda")
    body = d.variant.compiled.body
    assert 'printf("pid (%d, %d, %d) idx (%d) %s: %.9g, %.5g, %.4g, %d, %s\\n"' in body
    assert '"x %d \\"q\\""' in body  # the prefix is an argument, never a format
    assert body.count("__trap();") == 2
    ok, log = nvrtc.compile_cuda(nvrtc.translation_unit(d), "sm_80")
    assert ok, log
    off = both[(2,)].prepare(mx.zeros(8), mx.zeros(8), 8, BLOCK=4, backend="cuda")
    assert "__trap" not in off.variant.compiled.body


def test_device_print_without_values_and_long_lines(capfd):
    @metile.kernel
    def notes(X, Y, LONG: metile.constexpr):
        i = metile.arange(0, 2)
        metile.device_print("reached")
        metile.device_print(LONG, i)
        metile.store(Y + i, metile.load(X + i))

    mx.eval(notes[(1,)](mx.zeros(2), mx.zeros(2), LONG="p" * 3000))
    lines = _printed(capfd)
    assert "pid (0, 0, 0) idx () reached" in lines
    long = [ln for ln in lines if "ppp" in ln]
    if ON_CUDA:  # printf takes the prefix whole, as a %s argument
        assert sorted(long) == [f"pid (0, 0, 0) idx ({i}) {'p' * 3000}: {i}" for i in range(2)]
        return
    # the CPU runtime's shim cuts a line at 2048 characters and says so
    assert len(long) == 2 and all(len(ln) == 2048 + 3 and ln.endswith("p...") for ln in long)
