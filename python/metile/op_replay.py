"""Repeated eager op calls at the cost of their kernel launch.

A `metile.ops` call checks its arguments, plans its operands, routes, and launches as
an `OpFunction` that gives the kernel its backward: ~20 us of Python a call
(tools/probes/eager_host_cost.py), where MLX's own op costs one or two.  All of it
depends only on the call's signature (the arrays' shapes and dtypes and the options),
the settings and the default device; so the first call of a signature that launched
metile kernels records those launches, and later calls of the signature replay them: one
C++ call (`_ext.Replay`) that checks the device and the settings are as recorded, puts the
new arrays into the launches' inputs and launches through the bindings the kernels'
Dispatches bound, under a custom vjp that calls the op's own backward.  Each op is its
`entry` (`_ext.OpEntry`, a C function): it binds a call's arguments, finds the replay and
runs it without a Python frame, and hands any other call to the op's Python function.

What a replay assumes, and why it holds:
- the op's decisions are functions of the signature: each op's key holds every argument
  that is not an array, and the arrays' shapes and dtypes; an op whose path also reads
  something else about an array (matmul's check for a transposed view, which changes
  the kernel's operands) records only the calls where that reading is the default (a
  later call with a transposed view replays the row-major launch, which MLX's
  custom-kernel call makes contiguous first: the same numbers);
- the settings: the replay compares the raw values of the launch's settings
  (dispatch._LAUNCH_VARIABLES), of every METILE_* variable and MLX_ENABLE_TF32 set when
  it was recorded (what routing reads), and the number of environment variables (one
  set since), as routing.environment() does;
- routing decisions: recording a decision (routing.record) forgets every replay;
- each launch is plain: nothing merged afterwards (no written mask, no atomic outputs),
  bound to its device by the launcher (Dispatch._direct); a launch after the first reads
  the op's arrays, arrays the Dispatch keeps, or the previous launch's outputs (a split
  reduction, then its merge), and the last one's single output is the op's.

Not replayed: calls inside a recording (an op built from other ops), kernels edited
while the process runs (the full path's Kernel.refresh notices; a replay keeps the
launch it recorded until `forget()` or a routing decision).
"""

from __future__ import annotations

import inspect
import os
import threading
from contextlib import contextmanager

import mlx.core as mx

from . import _ext, settings
from .compiler.backend import device_type
from .runtime import routing
# (the ops' OpFunction and rules, kept where runtime/autodiff.py can import them too)
from .runtime.op_function import (OpFunction, composite_rules, forward_tangents,  # noqa: F401
                                  jvp_rule, node_backward, op_function, vmap_rule)

# signature (_ext.replay_key's bytes) -> (replay, provisional), looked up and run in C++
# (_ext.ReplayTable: one call for a repeated op call).  A provisional replay is one of a
# call routed by the cost model (no decision recorded): a call that may measure takes the
# full path instead - inside a tuning scope (checked per call), or under METILE_OPS_TUNE
# (none is recorded while it is set, and setting it fails the settings check)
_MAX_REPLAYS = 512
# (kept across importlib.reload: the ops' entries hold the table they were made with, which
# forget() and routing's listeners must clear)
_REPLAYS = globals().get("_REPLAYS")
if _REPLAYS is None:
    _REPLAYS = _ext.ReplayTable(_MAX_REPLAYS)
_SLOT = mx.zeros((0,))   # what a replay's inputs hold where each call's arrays go
# per thread: the (kernel, grid, args, kwargs) launched while a call is recorded (another
# thread's launches must not land in this thread's recording)
_local = threading.local()


def key(op: str, options: tuple, *arrays):
    """The replay key of a call of `op` (bytes: its name, options and arrays' dtypes and
    shapes), or None where an option or argument cannot key one (the op's full path names
    what it does not take)."""
    return _ext.replay_key(op, options, *arrays)


def entry(arrays: tuple, options: tuple, values: tuple = ()):
    """Decorator: the op `fn` as its eager entry (_ext.OpEntry), a C function that binds a
    call's arguments to fn's parameters, keys it by the parameters named in `options` (in
    that order: the tuple fn's own `key(...)` call passes) and `arrays`, and returns the
    replay recorded for the key; any other call (nothing recorded, a replay that declines,
    arguments that do not bind) is fn's, with its arguments as given.  A repeated eager
    call then costs no Python frame.  `values` name parameters passed to a Python replay
    after the arrays and keyed by their kind only (a plain int: rope's offset, which a
    decoding loop moves every call; any other value takes the full path).  fn's signature,
    name, module and docstring are the entry's (`inspect.signature` and `help` read them)."""
    def wrap(fn):
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        kinds = {p.kind for p in params}
        if kinds - {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY}:
            raise TypeError(f"[metile] {fn.__name__}: an op entry binds named parameters only")
        names = tuple(p.name for p in params)
        positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        defaults = tuple(_ext.REQUIRED if p.default is inspect.Parameter.empty else p.default
                         for p in params)
        plain = sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                        for p in params],
                            return_annotation=inspect.Signature.empty)
        doc = f"{fn.__name__}{plain}\n--\n\n{inspect.getdoc(fn) or ''}"
        made = _ext.OpEntry(_REPLAYS, fn, fn.__name__, names, positional, defaults,
                            [names.index(a) for a in arrays], [names.index(o) for o in options],
                            doc, fn.__module__, [names.index(v) for v in values])
        return made.function()
    return wrap


def entry_of(module: str, name: str):
    """The _ext.OpEntry behind op `name` of `module` (unpickling a pickled op)."""
    import importlib
    import pickle
    found = getattr(importlib.import_module(module), name)
    owner = getattr(found, "__self__", None)
    if not isinstance(owner, _ext.OpEntry):   # (replaced since: a mock, a user's wrapper)
        raise pickle.UnpicklingError(f"[metile] {module}.{name} is no longer metile's op "
                                     f"(it is {found!r}); cannot unpickle the op")
    return owner


def forget() -> None:
    """Drop every recorded replay (routing decided again, a test changed the world)."""
    _REPLAYS.clear()


routing.RECORD_LISTENERS.append(forget)


def launch(kernel, grid, args, kwargs):
    """kernel[grid](*args, **kwargs), as the ops launch their kernels: kept while a call
    is being recorded."""
    out = kernel[grid](*args, **kwargs)
    launches = getattr(_local, "launches", None)
    if launches is not None:
        launches.append((kernel, grid, args, kwargs, out))
    return out


@contextmanager
def recording():
    """Collect the launches of one op call (nested recordings: the outer one only)."""
    if getattr(_local, "launches", None) is not None:
        yield None
        return
    _local.launches = launches = []
    try:
        yield launches
    finally:
        _local.launches = None


def remember(key, launches, at, given, vjp, reshapes, out_shape=None, composite=None) -> bool:
    """Record the replay of an op call signature whose call launched `launches` (from
    `recording`): its custom vjp's primals are the first launch's arguments at positions
    `at` - or, for a pair (n, p) in `at`, launch n's argument p: an operand only a later
    launch reads, such as a split-K merge's bias - (the op's arrays `given`, each as given
    or, with `reshapes[i]`, reshaped to that), `vjp(primals, cotangent, output)` the op's backward for one output, `out_shape` the
    op's reshape of the result, `composite` the op's MLX computation of the same primals
    (its vmap rule: `vmap_rule`).  A later launch may read the previous one's outputs (a
    split reduction's partial results, then its merge); the last one's output is the op's.
    Nothing is recorded when the call does not fit a replay (module docstring), nor when
    an argument at `at` is not an array of its primal's shape and dtype (a launch on
    something the op computed from its arrays, such as a dequantized weight).  Whether a
    replay was kept."""
    if key is None or not launches:
        return False
    # (a position p is the first launch's argument p; (n, p) launch n's)
    places = [p if isinstance(p, tuple) else (0, p) for p in at]
    primals, slices = [], [None] * len(given)
    for i, ((n, p), x, shape) in enumerate(zip(places, given, reshapes)):
        args = launches[n][2] if n < len(launches) else ()
        arg = args[p] if p < len(args) else None
        view = _ext.slice_source(x) if type(arg) is mx.array and shape is None and \
            tuple(arg.shape) != tuple(x.shape) else None
        if view is not None and _ext.same_array(view[0], arg):
            # the launch read the source of the op's slice (a KV cache's buffer for its
            # prefix): a later call replays only with the same slice of such a source
            slices[i] = (view[1], view[2], view[3], list(arg.shape))
        elif type(arg) is not mx.array or arg.dtype != x.dtype or \
                tuple(arg.shape) != tuple(x.shape if shape is None else shape):
            return False
        primals.append(arg)
    stages, previous = [], ()
    for n, (kernel, grid, args, kwargs, out) in enumerate(launches):
        here = [p if m == n else None for m, p in places]
        stage = _stage(kernel, grid, args, kwargs, here, primals, previous,
                       last=n == len(launches) - 1)
        if stage is None:
            return False
        stages.append(stage)
        previous = out if isinstance(out, tuple) else (out,)
    check = _settings_now()
    if check is None:
        return False
    return _keep(key, _ext.Replay(stages, [None if r is None else list(r) for r in reshapes],
                                  None if out_shape is None else list(out_shape),
                                  node_backward(vjp), check,
                                  None if composite is None else vmap_rule(composite),
                                  None if composite is None else forward_tangents(composite),
                                  slices if any(slices) else []),
                 False)


def _stage(kernel, grid, args, kwargs, at, primals, previous, last):
    """One launch of a replay: (its bound launch, the inputs it keeps, per input its
    source - a primal's index, -1 for an array the Dispatch keeps, -2 - j for output j of
    the previous launch), or None where it cannot be replayed."""
    d = kernel._launches.last
    if d is None or d._guard is None or d._direct is None or not d._plain or \
            (last and d.results != 1):
        return None
    inputs = d._guard(grid, args, kwargs)
    if inputs is None:   # the kernel's last launch is not this call's
        return None
    # Per kernel input, where it comes from: an argument that is one of the op's arrays (a
    # custom function hands its forward new Python objects for them, so the op names their
    # positions), or the same object as one (an absent operand's slot filled with another),
    # or an output of the previous launch; a call with any other array among the kernel's
    # inputs is not replayed (that array would be kept, stale).
    sources = []
    for fixed, v in d._input_plan:
        if fixed:
            sources.append(-1)
        elif v in at:   # (by position first: matmul(a, a) passes one object twice)
            sources.append(at.index(v))   # (`at`: this launch's position of each primal)
        else:
            same = [j for j, x in enumerate(primals) if args[v] is x]
            made = [j for j, x in enumerate(previous) if args[v] is x]
            if same:
                sources.append(same[0])
            elif made:
                sources.append(-2 - made[0])
            else:
                return None
    # the recorded call's own arrays are not kept (a replay swaps every one of them)
    kept = [_SLOT if j != -1 else x for j, x in zip(sources, inputs)]
    return d._direct, kept, sources


def remember_composite(key, run, decision) -> None:
    """Record that calls of this signature run `run(*arrays)` (MLX's composite, or a
    Python launch of the kernels routing chose by `decision`): later calls skip the op's
    checks and routing while the device and the settings are unchanged (a requested route,
    backend="mlx", too: it depends on nothing else, and without a replay it costs several
    times MLX's own call).
    Nothing is recorded without a key; a cost-model route's replay is provisional."""
    if key is None:
        return
    check = _settings_now()
    if check is not None:
        _keep(key, lambda *arrays: run(*arrays) if check() else None,
              decision.source == "cost_model")


_REQUESTED = routing.Decision("mlx", "requested", "backend='mlx' requested")


def remember_requested(key, run) -> None:
    """remember_composite for a call that asked for MLX's op (backend="mlx") before any
    routing."""
    remember_composite(key, run, _REQUESTED)


def _keep(key, replay, provisional: bool) -> bool:
    if provisional and routing.measuring_requested():
        return False   # (the next eager call of the signature measures)
    _REPLAYS.put(key, replay, provisional)   # (full: cleared first)
    return True


def _settings_now():
    """An _ext.SettingsCheck of the device and the settings a decision depends on (None
    where the environment cannot be read from C++)."""
    names = _replay_variables()
    source = settings.raw_source(names)
    if source is None:
        return None
    environ, encoded = source
    # (every METILE_* variable counted: one set since, where another was removed, fails
    # the check as the count of all variables would not)
    return _ext.SettingsCheck(environ, encoded, settings.raw_values(names), len(environ),
                              device_type(), ["METILE_*", "MLX_ENABLE_TF32"])


_variables_memo: list = [None, None]


def _replay_variables() -> tuple:
    """The settings a replay compares: the launch's, every METILE_* variable (and
    MLX_ENABLE_TF32) set now, which routing reads, and where the decisions it reads are
    kept (settings.cache_root: XDG_CACHE_HOME, HOME).  Scanned again only when os.environ
    changes (its epoch, where there is one): every recorded call asked, and a scan of the
    environment cost ~15 us - each call of a new signature (a decode step over a grown
    cache) records one."""
    epoch = routing.environ_epoch()
    if epoch is not None and _variables_memo[0] == epoch:
        return _variables_memo[1]
    from .runtime.dispatch import _LAUNCH_VARIABLES
    present = sorted(k for k in os.environ if k.startswith("METILE_") or k == "MLX_ENABLE_TF32")
    names = tuple(dict.fromkeys((*_LAUNCH_VARIABLES, "MLX_ENABLE_TF32", "XDG_CACHE_HOME", "HOME",
                                 *present)))
    _variables_memo[:] = [epoch, names]
    return names
