"""The MSL CPU runtime never dies and never silently differs from a GPU.

Integer division faults, endless loops, Ctrl-C, damaged cached libraries, an
unwritable cache directory, bad METILE_MSL_* settings and faulting vector
accesses each end as a clear error (or a warning), and the process carries on.
Every case that could kill or hang the process runs in a subprocess with a
timeout.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import metile
from conftest import default_is_cpu

pytestmark = pytest.mark.skipif(not default_is_cpu(), reason="checks metile's MSL CPU runtime")

# Shared by every child script: a kernel runner and one kernel that must still
# work after a failed one.
PRELUDE = """
import mlx.core as mx, numpy as np, metile

def launch(name, source, inputs, n, dtype=mx.float32, **kw):
    kernel = metile.metal_kernel(name=name, input_names=["inp"], output_names=["out"], source=source)
    (out,) = kernel(inputs=inputs, grid=(n, 1, 1), threadgroup=(n, 1, 1), output_shapes=[(n,)],
                    output_dtypes=[dtype], **kw)
    return out

def error_of(out):
    try:
        mx.eval(out)
    except RuntimeError as e:
        return str(e)
    return "no error"

def check_still_works():
    out = launch("add_one", "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] + 1.0f;",
                 [mx.arange(8, dtype=mx.float32)], 8)
    np.testing.assert_array_equal(np.array(out), np.arange(8) + 1)
    print("still works", flush=True)
"""


def child_env(**overrides) -> dict:
    env = dict(os.environ)
    env.update(overrides)
    return env


def run_child(body: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    script = PRELUDE + textwrap.dedent(body)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=timeout, env=child_env(**env))
    assert result.returncode == 0, f"child died ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


# -- integer division ------------------------------------------------------------------------

DIVISION_CASES = {
    # name: (body, dtype, numerators, divisors)
    "int_div_zero": ("out[i] = inp[i] / inp[i + 4];", "int32", [7, 8, 9, 10], [1, 2, 0, 5]),
    "int_mod_zero": ("out[i] = inp[i] % inp[i + 4];", "int32", [7, 8, 9, 10], [1, 0, 3, 5]),
    "int_min_div_minus_one": ("out[i] = inp[i] / inp[i + 4];", "int32",
                              [-2**31, 8, 9, 10], [-1, 2, 3, 5]),
    "int_min_mod_minus_one": ("out[i] = inp[i] % inp[i + 4];", "int32",
                              [-2**31, 8, 9, 10], [-1, 2, 3, 5]),
    "uint_div_zero": ("out[i] = inp[i] / inp[i + 4];", "uint32", [7, 8, 9, 10], [1, 2, 3, 0]),
    "long_div_zero": ("out[i] = long(inp[i]) / long(inp[i + 4]);", "int32", [7, 8, 9, 10],
                      [0, 2, 3, 5]),
}


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"),
                    reason="only x86 traps integer division by zero; arm64 returns 0 (see csrc/README.md)")
def test_integer_division_faults_are_reported_not_fatal():
    body = "results = {}\n"
    for name, (expr, dtype, num, den) in DIVISION_CASES.items():
        body += (
            f"out = launch({name!r}, 'uint i = thread_position_in_grid.x; {expr}', "
            f"[mx.array({num + den!r}, dtype=mx.{dtype})], 4, dtype=mx.{dtype})\n"
            f"print({name!r}, '->', error_of(out), flush=True)\n"
        )
    body += "check_still_works()\n"
    out = run_child(body).stdout
    for name in DIVISION_CASES:
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " ->"))
        assert line == (
            f"{name} -> [metal_kernel] kernel '{name}': integer division by zero (or INT_MIN / -1) in "
            "threadgroup (0, 0, 0): Metal leaves the result unspecified, so metile's CPU runtime "
            "stops the kernel (guard the divisor of `/` and `%`; a masked load's off lanes "
            "hold its `other`, 0 unless given, and are computed too: load the divisor with "
            "other=1, or divide by where(d != 0, d, 1))"
        ), out
    assert "still works" in out


def test_division_by_nonzero_is_unchanged():
    kernel = metile.metal_kernel(
        name="divide_ok", input_names=["a", "b"], output_names=["q", "r"],
        source="uint i = thread_position_in_grid.x; q[i] = a[i] / b[i]; r[i] = a[i] % b[i];")
    a = np.array([7, -7, 2**31 - 1, -2**31, 0, 13], np.int32)
    b = np.array([2, 2, -1, 3, 5, -4], np.int32)
    q, r = kernel(inputs=[mx.array(a), mx.array(b)], grid=(6, 1, 1), threadgroup=(6, 1, 1),
                  output_shapes=[(6,), (6,)], output_dtypes=[mx.int32, mx.int32])
    # Metal, like C, truncates toward zero
    expected_q = np.trunc(a.astype(np.float64) / b).astype(np.int64)
    np.testing.assert_array_equal(np.array(q), expected_q)
    np.testing.assert_array_equal(np.array(r), a - expected_q * b)


# -- loops keep their forward-progress behaviour ----------------------------------------------

@pytest.mark.parametrize("name,body", [
    # a forgotten increment: the loop has no side effect, so C++ may assume it ends
    ("forgot_increment", "uint i = 0; float acc = 0.0f; while (i < 4) { acc += inp[i]; } "
                         "out[thread_position_in_grid.x] = acc;"),
    ("spin_forever", "while (true) {} out[thread_position_in_grid.x] = inp[0];"),
])
def test_endless_loop_without_side_effects_is_caught_by_the_timeout(name, body):
    result = run_child(f"""
        print(error_of(launch({name!r}, {body!r}, [mx.zeros(8)], 8)), flush=True)
        check_still_works()
    """, timeout=120, METILE_MSL_TIMEOUT_S="1")
    assert result.stdout.splitlines()[0] == (
        f"[metal_kernel] kernel '{name}': kernel exceeded METILE_MSL_TIMEOUT_S=1 s in threadgroup "
        "(0, 0, 0) (a loop that never ends?)"
    )
    assert "still works" in result.stdout


# -- Ctrl-C -------------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spinning(pid: int, timeout: float = 60) -> bool:
    """Whether the process burns half a CPU-second within `timeout` (a kernel in a loop)."""
    if not os.path.exists(f"/proc/{pid}/stat"):
        time.sleep(2.0)   # no procfs: the fixed wait this replaced
        return True
    start, deadline = _cpu_seconds(pid), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _cpu_seconds(pid) - start > 0.5:
            return True
        time.sleep(0.05)
    return False


def _signal_state(pid: int) -> str:
    try:
        return " ".join(line.strip() for line in open(f"/proc/{pid}/status")
                        if line.startswith(("SigBlk", "SigIgn", "SigCgt", "Threads")))
    except OSError as e:
        return str(e)


def test_ctrl_c_interrupts_a_running_kernel():
    script = PRELUDE + textwrap.dedent("""
        import signal, time
        # Python's own Ctrl-C handler whatever this process inherited: a child forked while
        # the test process runs a command through C's system() (MLX's CPU JIT compiler
        # does) starts with SIGINT ignored, and Python then leaves it ignored (seen in the
        # full suite: SigIgn with SIGINT and SIGQUIT, system()'s pair).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        endless = ("float v = inp[0]; while (v >= 0.0f) { v = v + 1.0f; if (v > 1e30f) v = 0.0f; } "
                   "out[thread_position_in_grid.x] = v;")
        out = launch("never_ends", endless, [mx.zeros(32)], 32)
        print("running", flush=True)
        try:
            mx.eval(out)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
        check_still_works()
    """)
    # no watchdog: only Ctrl-C can end this kernel
    env = child_env(METILE_MSL_TIMEOUT_S="0")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline() == "running\n"
        # Only a running dispatch takes Ctrl-C to its kernel (a SIGINT before it starts is
        # Python's alone): wait until the endless kernel is seen spinning, not a fixed time,
        # which a loaded machine can outlast.
        assert _spinning(child.pid), "the endless kernel never ran"
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        try:
            out, err = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"Ctrl-C did not stop the kernel; the child's signal state: "
                                 f"{_signal_state(child.pid)}") from None
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert out.splitlines() == ["KeyboardInterrupt", "still works"], (out, err)
    assert time.monotonic() - sent < 10


def test_ctrl_c_left_at_its_default_still_ends_the_process():
    # With SIGINT at SIG_DFL the runtime installs nothing: the signal kills the
    # process as it would any other program.
    script = PRELUDE + textwrap.dedent("""
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        out = launch("never_ends_dfl", "while (true) {} out[0] = inp[0];", [mx.zeros(4)], 4)
        print("running", flush=True)
        mx.eval(out)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env(METILE_MSL_TIMEOUT_S="0"))
    try:
        assert child.stdout.readline() == "running\n"
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGINT


# -- the compiled-library cache -----------------------------------------------------------------

CACHED_KERNEL = """
out = launch("cached_square", "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] * inp[thread_position_in_grid.x];",
             [mx.arange(16, dtype=mx.float32)], 16)
np.testing.assert_array_equal(np.array(out), np.arange(16) ** 2)
print("correct", flush=True)
"""


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "no_record"])
def test_damaged_cached_library_is_rebuilt(tmp_path, damage):
    run_child(CACHED_KERNEL, METILE_CACHE_DIR=str(tmp_path))
    (library,) = (tmp_path / "msl_cpu").glob("*.so")
    good = library.read_bytes()
    record = library.with_name(library.name + ".sha256")
    if damage == "truncate":  # dlopen of this maps pages past the end: SIGBUS
        library.write_bytes(good[: len(good) // 3])
    elif damage == "overwrite":  # same size, different bytes
        library.write_bytes(good[:4096] + bytes(len(good) - 8192) + good[-4096:])
    else:
        record.unlink()
    assert "correct" in run_child(CACHED_KERNEL, METILE_CACHE_DIR=str(tmp_path)).stdout
    assert library.read_bytes() == good  # the same compiler and source build the same bytes
    assert record.exists()


@pytest.mark.parametrize("kind", ["under_a_file", "a_file"])
def test_unwritable_cache_directory_is_a_warning(tmp_path, monkeypatch, kind):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("")
    # As root, permission bits do not stop writes; a path through a regular
    # file cannot be created by anyone.
    directory = blocker / "cache" if kind == "under_a_file" else blocker
    monkeypatch.setenv("METILE_CACHE_DIR", str(directory))
    kernel = metile.metal_kernel(
        name="uncached", input_names=["inp"], output_names=["out"],
        source=f"out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] * 3.0f; // {kind}")
    with pytest.warns(RuntimeWarning) as record:
        (out,) = kernel(inputs=[mx.arange(8, dtype=mx.float32)], grid=(8, 1, 1),
                        threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[mx.float32])
    np.testing.assert_array_equal(np.array(out), np.arange(8) * 3)
    (warning,) = [str(w.message) for w in record if "cannot write" in str(w.message)]
    assert warning.startswith(f"metile: cannot write the cache directory {directory / 'msl_cpu'} (")
    assert warning.endswith(
        "compiled kernels are not kept between runs, so each process compiles them again. "
        "Point METILE_CACHE_DIR at a writable directory.")


def test_unwritable_source_cache_is_a_warning(tmp_path, monkeypatch):
    from metile.runtime import cache

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("METILE_CACHE_DIR", str(blocker / "sub"))
    monkeypatch.delenv("METILE_DISABLE_DISK_CACHE", raising=False)
    with pytest.warns(RuntimeWarning, match=r"metile: cannot write the cache directory .*file/sub/dsl "
                                            r"\(Not a directory\); generated kernel sources are not kept "
                                            r"between runs.* Point METILE_CACHE_DIR at a writable"):
        cache.disk_store("0" * 32, {"source": ""})
    assert cache.disk_load("0" * 32) is None


def test_a_directory_at_a_source_entry_is_named_not_the_folder(tmp_path, monkeypatch):
    # (the warning said the dsl folder could not be written, which it could, and the
    # temporary file stayed behind)
    from metile.runtime import cache

    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("METILE_DISABLE_DISK_CACHE", raising=False)
    (tmp_path / "dsl" / ("1" * 32 + ".json")).mkdir(parents=True)
    with pytest.warns(RuntimeWarning, match=r"metile: cannot write the cache entry .*dsl/1{32}"
                                            r"\.json \(Is a directory\); .* Remove what is there"):
        cache.disk_store("1" * 32, {"source": ""})
    assert sorted(p.name for p in (tmp_path / "dsl").iterdir()) == ["1" * 32 + ".json"]


def test_unwritable_tuning_cache_is_a_warning(tmp_path):
    from metile.runtime.tuning import TuningCache

    blocker = tmp_path / "file"
    blocker.write_text("")
    tuning = TuningCache(blocker / "tuning")
    assert tuning.load("k") is None
    with pytest.warns(RuntimeWarning) as record:
        tuning.store("k", {"key": "k"})
    assert [str(w.message) for w in record] == [
        f"metile: cannot write the cache directory {blocker / 'tuning'} (Not a directory); autotuning "
        "results are not kept between runs, so each process measures them again. Point "
        "METILE_CACHE_DIR at a writable directory."]


# -- settings -----------------------------------------------------------------------------------

@pytest.mark.parametrize("variable,value,accepted", [
    ("METILE_MSL_THREADS", "abc",
     "a whole number of CPU runtime worker threads from 1 to 4096 (unset: one per core)"),
    ("METILE_MSL_THREADS", "0",
     "a whole number of CPU runtime worker threads from 1 to 4096 (unset: one per core)"),
    ("METILE_MSL_THREADS", "2.5",
     "a whole number of CPU runtime worker threads from 1 to 4096 (unset: one per core)"),
    ("METILE_MSL_TIMEOUT_S", "abc", "a number of seconds >= 0 (0 or unset: no limit)"),
    ("METILE_MSL_TIMEOUT_S", "-1", "a number of seconds >= 0 (0 or unset: no limit)"),
    ("METILE_MSL_TIMEOUT_S", "nan", "a number of seconds >= 0 (0 or unset: no limit)"),
    ("METILE_MSL_STACK_KB", "8", "a whole number of KiB per fiber stack from 16 to 65536 (unset: 128)"),
    ("METILE_MSL_STACK_KB", "64k", "a whole number of KiB per fiber stack from 16 to 65536 (unset: 128)"),
])
def test_invalid_settings_are_errors_naming_the_variable(monkeypatch, variable, value, accepted):
    kernel = metile.metal_kernel(name="settings", input_names=["inp"], output_names=["out"],
                                 source="out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as info:
        kernel(inputs=[mx.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
               output_shapes=[(4,)], output_dtypes=[mx.float32])
    assert str(info.value) == f"[metal_kernel] invalid {variable}='{value}': expected {accepted}"


def test_valid_settings_are_accepted():
    result = run_child("""
        out = launch("settings_ok", "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x] * 2.0f;",
                     [mx.arange(8, dtype=mx.float32)], 8)
        np.testing.assert_array_equal(np.array(out), np.arange(8) * 2)
        print("ok", flush=True)
    """, METILE_MSL_THREADS="3", METILE_MSL_STACK_KB="256", METILE_MSL_TIMEOUT_S="30.5")
    assert "ok" in result.stdout


# -- fault messages -----------------------------------------------------------------------------

def test_misaligned_vector_store_is_named():
    # x86 stores a float4 with an aligned move; 4 bytes past a 16-byte aligned
    # buffer it raises a general-protection fault, which has no address.
    result = run_child("""
        source = '''
            uint i = thread_position_in_grid.x;
            float4 v = float4(inp[i]);
            if (i < 2) *(device float4*)((device char*)out + 4 + 16 * i) = v;
        '''
        print(error_of(launch("misaligned_store", source, [mx.zeros(16)], 16)), flush=True)
        check_still_works()
    """)
    assert result.stdout.splitlines()[0] == (
        "[metal_kernel] kernel 'misaligned_store': invalid memory access in threadgroup (0, 0, 0): "
        "a general-protection fault, most likely a misaligned vector access (a pointer cast to a "
        "16-byte type such as float4 or uint4 on an address that is not 16-byte aligned), else a wild pointer"
    )


def test_out_of_bounds_and_stack_overflow_are_named():
    result = run_child("""
        wild = "device float* p = (device float*)(16); p[thread_position_in_grid.x] = inp[0];"
        print(error_of(launch("wild_store", wild, [mx.zeros(4)], 4, bounds_check=False)), flush=True)
        deep = ("float big[200000]; for (int i = 0; i < 200000; ++i) big[i] = inp[0] + i; "
                "out[thread_position_in_grid.x] = big[thread_position_in_grid.x * 1000];")
        print(error_of(launch("deep_stack", deep, [mx.zeros(4)], 4)), flush=True)
    """, METILE_MSL_STACK_KB="128")
    wild, deep = result.stdout.splitlines()
    assert wild == (
        "[metal_kernel] kernel 'wild_store': invalid memory access at address 0x10 in threadgroup "
        "(0, 0, 0): out of bounds (an index outside its buffer, or a wild pointer; "
        "METILE_MSL_BOUNDS_CHECK=1 names the buffer)"
    )
    assert deep.startswith("[metal_kernel] kernel 'deep_stack': invalid memory access at address 0x")
    assert deep.endswith(
        " in threadgroup (0, 0, 0): fiber stack overflow (the thread's locals need more than "
        "METILE_MSL_STACK_KB=128 KiB; raise it)")


def test_a_deeply_nested_source_cache_entry_is_a_miss(tmp_path, monkeypatch):
    # (json's parser raised RecursionError, which took down every launch of the kernel)
    from metile.runtime import cache

    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("METILE_DISABLE_DISK_CACHE", raising=False)
    cache.cache_dir().mkdir(parents=True, exist_ok=True)
    (cache.cache_dir() / f"{'0' * 32}.json").write_text("[" * 100000)
    with pytest.warns(UserWarning, match="ignoring the damaged kernel cache entry"):
        assert cache.disk_load("0" * 32) is None


def test_cache_files_are_readable_as_ordinary_new_files(tmp_path, monkeypatch):
    # (mkstemp made every entry 0600: a cache directory shared by users could not be read)
    import stat
    from metile.runtime import cache
    from metile.runtime.tuning import TuningCache

    monkeypatch.setenv("METILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("METILE_DISABLE_DISK_CACHE", raising=False)
    want = 0o666 & ~cache._UMASK
    cache.disk_store("1" * 32, {"a": 1})
    assert stat.S_IMODE((cache.cache_dir() / ("1" * 32 + ".json")).stat().st_mode) == want
    tuning = TuningCache()
    tuning.store("k", {"format": 1, "key": "k", "winner": "w", "timings": {}})
    assert stat.S_IMODE(tuning.path("k").stat().st_mode) == want


def test_every_setting_the_code_reads_is_in_the_readme():
    # (METILE_WGMMA_REFILL became a default without a line in the settings table)
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    read = set()
    for path in (root / "python" / "metile").rglob("*.py"):
        read |= set(re.findall(r'"(METILE_[A-Z0-9_]+)"', path.read_text()))
    readme = (root / "README.md").read_text()
    assert sorted(n for n in read if n not in readme) == []


SWEEP = textwrap.dedent("""
    import gc, mlx.core as mx, numpy as np, metile
    from metile.runtime import dispatch, kernel, metal_kernel

    # the caches' bounds made small, so a short sweep crosses them
    dispatch._LAUNCH_CACHE_SIZE = kernel.SPECIALIZATION_CACHE_SIZE = 4
    metal_kernel._PRUNE_EVERY = metal_kernel._PRUNE_AT = 4

    @metile.kernel
    def scaled(X, Y, n, BLOCK: metile.constexpr):
        offs = metile.program_id(0) * BLOCK + metile.arange(0, BLOCK)
        m = offs < n
        metile.store(Y + offs, metile.load(X + offs, mask=m) * 2.0, mask=m)

    def loaded():
        return len({l.split()[-1] for l in open("/proc/self/maps")
                    if "msl_cpu" in l and l.rstrip().endswith(".so")})

    x = mx.arange(100).astype(mx.float32)
    start = loaded()
    for i in range(24):
        out = scaled[(metile.cdiv(100, 8 * (i + 1)),)](x, mx.zeros((100,)), 100, BLOCK=8 * (i + 1))
        np.testing.assert_array_equal(np.array(out), 2 * np.arange(100.0))
    gc.collect()
    # (4 launches, 4 families, 4 specializations and 4 not yet pruned at most)
    print("loaded", loaded() - start, len(metal_kernel._libraries))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts loaded libraries "
                    "in /proc/self/maps")
def test_kernels_of_many_constexprs_do_not_stay_loaded(tmp_path):
    # every distinct constexpr is a library; the launch cache was bounded, but the launch
    # families, the specializations and the loaded-library table kept each one loaded
    # (~65 KB a constexpr, never freed)
    script = tmp_path / "sweep.py"   # a file: the kernel's source must be readable
    script.write_text(SWEEP)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded, table = map(int, r.stdout.split()[-2:])
    assert loaded <= 12 and table <= 12, r.stdout
