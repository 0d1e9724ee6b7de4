"""A printer for thread-form Tile IR in C-like languages.

Everything a backend differs in is a table entry or a small method on a
subclass (`msl.MSLEmitter`; a CUDA emitter is the same size).  The printer
never decides anything about tiles, layouts or memory: `passes.lower_tiles`
already did.  Each SSA value becomes one `const` local; mutable state is only
what `decl` ops declare.
"""

from __future__ import annotations

import math
import struct

from ..ir.core import Block, Function, Op, Value
from ..ir.types import ScalarType
from ..language import dtypes as dt
from . import fp8

INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "/", "mod": "%",
         "and": "&", "or": "|", "xor": "^", "shl": "<<", "shr": ">>",
         "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
from ..ir.ops import MATH_BINARY, MATH_UNARY as MATH


# Run loops unrolled up to this many slots: past it the tile's registers (V elements a
# slot) could not stay in registers anyway, and the unrolled body only grows the code.
MAX_UNROLLED_SLOTS = 32


class CEmitter:
    # --- tables a backend fills in ---------------------------------------------------
    TYPES: dict[str, str] = {}          # dtype name -> spelling
    GEOMETRY: dict[str, str] = {}       # program_id/num_programs/thread_id/simd_* -> expression
    MATH_FUNCS: dict[str, str] = {}     # math op -> format over {x} (float32)
    UMULHI = ""                         # high half of a uint32 product, over {x} {y}
    SIMD_REDUCE: dict[str, str] = {}    # reduce kind -> function
    BARRIER = ""
    DEVICE_BARRIER = ""
    INFINITY = "INFINITY"
    NAN = "NAN"
    SHARED_DECL = "{type} {name}[{size}];"
    HELPERS: dict[str, str] = {}        # helper name -> source; emitted into the header when used
    # Matrix fragments (thread-form frag_* ops; see passes/lower_matmul.py).  Format fields:
    # {frag} "name[index]", {type} fragment type, {root}/{offset}/{ld} threadgroup source,
    # {d} {a} {b} {c} fragments of a multiply-accumulate, {value} fill value.
    FRAGMENT: dict[str, str] = {}       # decl fill load store mma
    SIMD_BARRIER = ""
    DEBUG_OPS = None                    # device_print / device_assert (codegen/debug_ops.py)

    def __init__(self, fn: Function):
        assert fn.form == "thread", "emit the thread form (run passes.lower_tiles first)"
        self.fn = fn
        self.threads = fn.meta["threads"]
        self.names: dict[int, str] = {}
        self.lines: list[str] = []
        self.helpers_used: set[str] = set()
        self.count = 0
        self.packed_locals: dict[str, tuple[str, str, str]] = {}

    # --- naming ------------------------------------------------------------------------
    def type(self, t) -> str:
        d = t.dtype if isinstance(t, ScalarType) else t
        return self.TYPES[d.name]

    def bind(self, v: Value, prefix="_v") -> str:
        self.count += 1
        name = f"{prefix}{self.count}"
        self.names[v.id] = name
        return name

    def ref(self, v: Value) -> str:
        return self.names[v.id]

    def literal(self, value, d: dt.DType) -> str:
        if d.is_bool:
            return "true" if value else "false"
        if d.is_int:
            # 64-bit literals carry L/UL (a 64-bit long on Metal and on 64-bit Linux CUDA), so
            # a value past 32 bits never starts life as a narrower type
            suffix = ("u" if d.kind == "u" else "") + ("L" if d.bits == 64 else "")
            if d.kind == "i" and value == -2**(d.bits - 1):  # its magnitude has no literal
                return f"({value + 1}{suffix} - 1)"
            return f"({value}{suffix})" if value < 0 else f"{int(value)}{suffix}"
        if not math.isnan(value) and d.bits <= 32:
            # rounded to float32 here, once: the compiler rounding the double's shortest
            # decimal to float rounded a value halfway between two floats (1 + 2**-24) the
            # other way than the run-time conversion of the same number does
            try:
                value = struct.unpack("f", struct.pack("f", value))[0]
            except OverflowError:   # (beyond the largest float32 once rounded)
                value = math.copysign(math.inf, value)
        if math.isinf(value):
            text = self.INFINITY if value > 0 else f"(-{self.INFINITY})"
        elif math.isnan(value):
            text = self.NAN
        else:
            text = repr(float(value)) + "f"
            text = f"({text})" if value < 0 else text
        return text if d == dt.float32 else f"static_cast<{self.TYPES[d.name]}>({text})"

    # --- expressions -------------------------------------------------------------------
    def expr(self, op: Op) -> str:
        a = [self.ref(v) for v in op.operands]
        name = op.name
        rt = op.results[0].type if op.results else None
        if name == "const":
            return self.literal(op.attrs["value"], rt.dtype)
        if name in self.GEOMETRY:
            return self.GEOMETRY[name].format(axis="xyz"[op.attrs.get("axis", 0)])
        if name == "param" or name == "var_get":
            return op.attrs["name"]
        if name == "local_get":
            packed = self.packed_locals.get(op.attrs["name"])
            if packed is not None:
                return packed[1].format(name=op.attrs["name"], s=a[0])
            return f"{op.attrs['name']}[{a[0]}]"
        if name == "mem_load":
            load = f"{op.attrs['root']}[{a[0]}]"
            return f"({a[1]} ? {load} : {a[2]})" if len(a) == 3 else load
        if name in INFIX:
            return f"({a[0]} {INFIX[name]} {a[1]})"
        if name in ("maximum", "minimum"):
            return self.minmax(name, a, rt)
        if name == "neg":
            return f"(-{a[0]})"
        if name == "not":
            return f"(!{a[0]})" if rt.dtype.is_bool else f"(~{a[0]})"
        if name == "abs":
            if rt.dtype.bits == 64:  # neither Metal's abs nor CUDA's int abs is declared for it
                return a[0] if rt.dtype.kind == "u" else f"({a[0]} < 0 ? -{a[0]} : {a[0]})"
            return self.math("abs", a[0], rt) if rt.dtype.is_float else f"metal::abs({a[0]})"
        if name in MATH:
            return self.math(name, a[0], rt)
        if name in MATH_BINARY:
            return self.math(name, a[0], rt, a[1])
        if name == "umulhi":
            return self.umulhi(a, rt)
        if name == "pair_fma":
            self.helpers_used.add("pair_" + op.attrs["pair"])
            return self.PAIR_FMA[op.attrs["pair"]].format(a=a[0], b=a[1], c=a[2])
        if name == "pack_pair":     # two 16-bit values as one word (vectorize_rows.py)
            return self.PACKED_PAIRS[op.operands[0].type.dtype.name][0].format(a=a[0], b=a[1])
        if name == "unpack_half":
            return self.PACKED_PAIRS[rt.dtype.name][1].format(w=a[0], shift=16 * op.attrs["half"])
        if name == "cast":
            if op.attrs.get("bitcast"):
                if rt.dtype.bits == 8:   # fp8 is held as its byte already
                    return f"static_cast<{self.type(rt)}>({a[0]})"
                return self.bitcast(a[0], rt)
            return self.cast(a[0], op.operands[0].type, rt)
        if name == "where":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if name == "simd_reduce":
            d = rt.dtype
            if d.is_int and d.bits < 32:
                # Metal's simd_* and CUDA's shuffles take 32-bit integers: the lanes combine
                # widened (sign kept), and the result narrows back (sum/or/xor wrap exactly)
                wide = self.TYPES["int32" if d.kind == "i" else "uint32"]
                return (f"static_cast<{self.type(rt)}>({self.SIMD_REDUCE[op.attrs['kind']]}("
                        f"static_cast<{wide}>({a[0]})))")
            return f"{self.SIMD_REDUCE[op.attrs['kind']]}({a[0]})"
        if name == "frag_get":  # element a[0] of the ones this lane holds (opaque mapping)
            at = op.attrs
            return self.FRAGMENT["get"].format(frag=f"{at['name']}[{at['index']}]", e=a[0])
        raise NotImplementedError(f"{type(self).__name__} cannot print {name}")

    def minmax(self, name, a, rt) -> str:
        cmp = ">" if name == "maximum" else "<"
        if rt.dtype.is_float:  # fmax/fmin (Triton's PropagateNan.NONE): a NaN operand loses
            return f"({a[0]} {cmp} {a[1]} || {a[1]} != {a[1]} ? {a[0]} : {a[1]})"
        return f"({a[0]} {cmp} {a[1]} ? {a[0]} : {a[1]})"

    def math(self, name: str, x: str, rt, y: str | None = None) -> str:
        """Float math in float32: half and bfloat16 operands convert around the call."""
        if name in self.HELPERS:
            self.helpers_used.add(name)
        fmt = self.MATH_FUNCS[name]
        if rt.dtype == dt.float32:
            return fmt.format(x=x, y=y)
        t = self.type(rt)
        x, y = (f"static_cast<float>({v})" for v in (x, y))
        return f"static_cast<{t}>({fmt.format(x=x, y=y)})"

    def umulhi(self, a, rt) -> str:
        """Unsigned on every dtype (Triton's rule): int32 operands are read as uint32."""
        if rt.dtype.kind == "u":
            return self.UMULHI.format(x=a[0], y=a[1])
        u = self.TYPES["uint32"]
        x, y = (f"static_cast<{u}>({v})" for v in a)
        return f"static_cast<{self.type(rt)}>({self.UMULHI.format(x=x, y=y)})"

    def cast(self, x: str, src, dst) -> str:
        if src.dtype.is_fp8 or dst.dtype.is_fp8:  # through float32, codegen/fp8.py
            self.helpers_used.add("fp8")
            if src.dtype.is_fp8:
                x, src = fp8.to_float(src.dtype.name, x), ScalarType(dt.float32)
            if dst.dtype.is_fp8:
                if src.dtype != dt.float32:
                    x = f"static_cast<float>({x})"
                return fp8.from_float(dst.dtype.name, x)
            if dst.dtype == dt.float32:
                return x
        if dst.dtype.is_bool:
            if src.dtype in (dt.float16, dt.bfloat16):
                # (CUDA's __half/__nv_bfloat16 != int is ambiguous between its overloads;
                # through float, exact for both, -0.0 stays False and NaN True)
                return f"(static_cast<float>({x}) != 0.0f)"
            return f"({x} != 0)"
        if {src.dtype, dst.dtype} == {dt.float16, dt.bfloat16}:
            # clang (the CPU runtime) has no half <-> bfloat conversion; through float, which
            # holds both exactly, it rounds once
            x = f"static_cast<float>({x})"
        return f"static_cast<{self.type(dst)}>({x})"

    # --- statements ------------------------------------------------------------------------
    @staticmethod
    def _step_may_pass_int32(op: Op) -> bool:
        """Whether a loop's last `iv += step` can pass INT_MAX: a constant step above 1
        with an upper bound that is not a constant at least a step below it.  (Steps known
        only at launch, and negative ones, are lowered to a count from 0 by 1.)"""
        def constant(v):
            owner = v.owner
            return owner.attrs["value"] if isinstance(owner, Op) and owner.name == "const" else None
        step, hi = constant(op.operands[2]), constant(op.operands[1])
        if step is None or step <= 1:
            return False
        return hi is None or hi > 2**31 - step

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("  " * depth + line)

    def block(self, block: Block, depth: int) -> None:
        for op in block.ops:
            self.statement(op, depth)

    def statement(self, op: Op, depth: int) -> None:
        name = op.name
        a = [self.ref(v) for v in op.operands]
        if name == "decl":
            self.declare(op, depth)
        elif name == "lane_loop":
            self.lane_loop(op, depth)
        elif name == "for":
            if op.attrs.get("unroll"):
                self.emit("#pragma unroll", depth)
            iv = self.bind(op.regions[0].args[0], "_k")
            if self._step_may_pass_int32(op):
                # `iv += step` past INT_MAX is undefined and, wrapped, loops forever: the
                # counter is 64-bit where an int32 bound within a step of it is possible
                wide = f"{iv}_w"
                self.emit(f"for ({self.TYPES['int64']} {wide} = {a[0]}; {wide} < {a[1]}; "
                          f"{wide} += {a[2]}) {{", depth)
                self.emit(f"const int {iv} = (int){wide};", depth + 1)
            else:
                self.emit(f"for (int {iv} = {a[0]}; {iv} < {a[1]}; {iv} += {a[2]}) {{", depth)
            self.block(op.regions[0], depth + 1)
            self.emit("}", depth)
        elif name == "if":
            self.emit(f"if ({a[0]}) {{", depth)
            self.block(op.regions[0], depth + 1)
            if op.regions[1].ops:
                self.emit("} else {", depth)
                self.block(op.regions[1], depth + 1)
            self.emit("}", depth)
        elif name == "while":
            self.emit("while (true) {", depth)
            self.block(op.regions[0], depth + 1)
            self.block(op.regions[1], depth + 1)
            self.emit("}", depth)
        elif name == "condition":
            self.emit(f"if (!{a[0]}) break;", depth)
        elif name == "barrier":
            self.emit(self.DEVICE_BARRIER if op.attrs.get("device") else self.BARRIER, depth)
        elif name == "var_set":
            self.emit(f"{op.attrs['name']} = {a[0]};", depth)
        elif name == "local_set":
            packed = self.packed_locals.get(op.attrs["name"])
            if packed is not None:
                self.emit(packed[2].format(name=op.attrs["name"], s=a[0], v=a[1]), depth)
            else:
                self.emit(f"{op.attrs['name']}[{a[0]}] = {a[1]};", depth)
        elif name == "local_set_pair":   # slots a[0] (even) and a[0] + 1
            if op.attrs["name"] in self.packed_locals:   # their word
                pair = self.PACKED_PAIRS[op.operands[1].type.dtype.name][0]
                self.emit(f"{op.attrs['name']}[({a[0]}) >> 1] = {pair.format(a=a[1], b=a[2])};",
                          depth)
            else:
                self.emit(f"{op.attrs['name']}[{a[0]}] = {a[1]};", depth)
                self.emit(f"{op.attrs['name']}[{a[0]} + 1] = {a[2]};", depth)
        elif name == "mem_store":
            store = f"{op.attrs['root']}[{a[0]}] = {a[1]};"
            self.emit(f"if ({a[2]}) {store}" if len(a) == 3 else store, depth)
        elif name == "mem_atomic":
            self.atomic(op, a, depth)
        elif name == "const":
            self.names[op.result.id] = self.expr(op)
        elif name == "param" and op.attrs.get("capture"):
            r, cap = op.result, op.attrs["capture"]
            self.emit(f"const {self.type(r.type)} {cap} = {self.expr(op)};", depth)
            self.names[r.id] = cap
        elif name == "vec_load":
            self.vector_load(op, a, depth)
        elif name == "vec_store":
            self.vector_store(op, a, depth)
        elif name.startswith("frag_") and name != "frag_get":
            self.fragment_op(op, a, depth)
        elif name == "simd_barrier":
            self.emit(self.SIMD_BARRIER, depth)
        elif name in ("device_print", "device_assert"):
            self.DEBUG_OPS.emit(self, op, a, depth)
        else:
            r = op.result
            self.emit(f"const {self.type(r.type)} {self.bind(r)} = {self.expr(op)};", depth)

    # mem_atomic: (kind, dtype name) or kind -> the call returning the old value, over {p} the
    # element's address, {v} the value, {c} the compare value, {t} the value's type (kind
    # "read": a relaxed load of the element, a plain load of an atomic buffer); ATOMIC_HELPERS
    # name the header helpers those calls use; ATOMIC_INIT copies the element in first
    # ({state}, {out}, {init}, {index}).
    ATOMIC: dict = {}
    ATOMIC_HELPER = "atomics"
    ATOMIC_INIT = ""
    # scope -> the fence a release puts before the atomic and an acquire after it (the
    # fence-based release/acquire patterns: the atomic itself stays relaxed)
    ATOMIC_FENCE: dict = {}

    def atomic(self, op: Op, a: list[str], depth: int) -> None:
        at, r = op.attrs, op.result
        kind, dname = at["kind"], r.type.dtype.name
        fmt = self.ATOMIC.get((kind, dname)) or self.ATOMIC[kind]
        cas = kind == "cas"
        arity = {"cas": 3, "read": 1}.get(kind, 2)   # (a read takes no value)
        mask = a[arity] if len(a) > arity else None
        self.helpers_used.add(self.ATOMIC_HELPER)
        name, t = self.bind(r), self.type(r.type)
        call = fmt.format(p=f"&{at['root']}[{a[0]}]", v=a[1] if arity > 1 else "",
                          c=a[2] if cas else "", t=t)
        lines = [self.ATOMIC_INIT.format(state=at["state"], out=at["root"], init=at["init"],
                                         index=a[0])] if "init" in at else []
        fence, sem = self.ATOMIC_FENCE.get(at["scope"]), at["sem"]
        lines = ([fence] if fence and sem in ("release", "acq_rel") else []) + lines
        lines.append(f"{name} = {call};")
        if fence and sem in ("acquire", "acq_rel"):
            lines.append(fence)
        self.emit(f"{t} {name} = {t}(0);", depth)
        if mask is not None:
            self.emit(f"if ({mask}) {{", depth)
        for line in lines:
            self.emit(line, depth + (mask is not None))
        if mask is not None:
            self.emit("}", depth)

    # 4-wide loads (thread-form vec_load): dtype name -> (vector type, element format over
    # {v} the vector, {i} the element index, {c} its xyzw name, {h}/{shift} the word and
    # bit offset of a 16-bit element).  A wider load is read as consecutive chunks of
    # VECTOR_CHUNKS (dtype name, width) -> (vector type, elements, element format) where
    # an emitter has them, else of 4.
    VECTOR_TYPES: dict[str, tuple[str, str]] = {}
    VECTOR_CHUNKS: dict[tuple[str, int], tuple[str, int, str]] = {}
    VECTOR_LOAD = "const {vtype} {name} = *reinterpret_cast<const {vtype}*>(&{root}[{index}]);"
    # From a kernel's own aligned shared array at an index the pass proved a multiple of
    # the width (the scalar-FMA GEMM's operand reads): no run-time address test.
    SHARED_VECTOR_LOAD = VECTOR_LOAD
    # A device load whose address the kernel tested aligned first (vectorize_rows.py).
    ALIGNED_VECTOR_LOAD = VECTOR_LOAD
    # The HELPERS entry VECTOR_LOAD calls, if any (MSL: its address-space overloads).
    VECTOR_LOAD_HELPER: str | None = None

    def vector_chunk(self, dname: str, width: int) -> tuple[str, int, str]:
        chunk = self.VECTOR_CHUNKS.get((dname, width))
        if chunk is not None:
            return chunk
        vtype, element = self.VECTOR_TYPES[dname]
        return vtype, 4, element

    def vector_load(self, op: Op, a: list[str], depth: int) -> None:
        dname, width = op.results[0].type.dtype.name, len(op.results)
        vtype, per, element = self.vector_chunk(dname, width)
        form = self.SHARED_VECTOR_LOAD if op.attrs.get("space") == "threadgroup" \
            else self.ALIGNED_VECTOR_LOAD if op.attrs.get("aligned") else self.VECTOR_LOAD
        if form is self.VECTOR_LOAD and self.VECTOR_LOAD_HELPER:
            self.helpers_used.add(self.VECTOR_LOAD_HELPER)
        for first in range(0, width, per):
            self.count += 1
            name = f"_w{self.count}"
            index = a[0] if first == 0 else f"{a[0]} + {first}"
            self.emit(form.format(vtype=vtype, name=name, root=op.attrs["root"], index=index),
                      depth)
            for i, r in enumerate(op.results[first:first + per]):
                # {h}/{shift}: the 32-bit word and bit offset of 16-bit element i
                self.names[r.id] = element.format(v=name, i=i, c="xyzw"[i % 4],
                                                  h="xyzw"[i // 2], shift=16 * (i % 2))

    # 2-element stores (vec_store): element dtype name -> statement over {root}, {index}, {a},
    # {b}; a dtype or emitter without one has no paired stores (the pass only emits them
    # for a warpgroup unit, which only the CUDA emitter has).
    PAIR_STORES: dict[str, str] = {}
    # Wider stores (vectorize_rows.py): (dtype name, width) -> (statement over {root},
    # {index} and {values}, elements per statement, element format over {x} joined by ", "
    # into {values}, or a pair format over {a}, {b} when PACKED).
    VECTOR_STORES: dict[tuple[str, int], tuple[str, int, str]] = {}
    PACKED_STORES: frozenset = frozenset()

    def vector_store(self, op: Op, a: list[str], depth: int) -> None:
        dname, width = op.operands[1].type.dtype.name, len(a) - 1
        if width == 2 and dname in self.PAIR_STORES:
            self.emit(self.PAIR_STORES[dname].format(root=op.attrs["root"], index=a[0], a=a[1],
                                                     b=a[2]), depth)
            return
        form = self.VECTOR_STORES.get((dname, width))
        if form is None:
            raise NotImplementedError(f"{type(self).__name__} has no {width}-wide {dname} store")
        statement, per, element = form
        for first in range(0, width, per):
            xs = a[1 + first:1 + first + per]
            if (dname, width) in self.PACKED_STORES:
                parts = [element.format(a=xs[k], b=xs[k + 1]) for k in range(0, per, 2)]
            else:
                parts = [element.format(x=x) for x in xs]
            index = a[0] if first == 0 else f"{a[0]} + {first}"
            self.emit(statement.format(root=op.attrs["root"], index=index,
                                       values=", ".join(parts)), depth)

    # A value's bits read as another type of its width: {type}, {x}.
    BITCAST = "as_type<{type}>({x})"

    def bitcast(self, x: str, rt) -> str:
        return self.BITCAST.format(type=self.type(rt), x=x)

    def fragment_type(self, role: str, dtype, shape) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no matrix fragments")

    def fragment_op(self, op: Op, a: list[str], depth: int) -> None:
        at = op.attrs
        fmt = self.FRAGMENT[op.name[len("frag_"):]]
        if op.name == "frag_mma":
            fields = {k: f"{at[k][0]}[{at[k][1]}]" for k in "dabc"}
        elif op.name == "frag_store":
            fields = {"frag": f"{at['name']}[{a[0]}]", "root": at["root"], "offset": a[1],
                      "ld": at["ld"]}
            if at.get("transpose"):
                fmt = self.FRAGMENT["store_t"]
        elif op.name == "frag_set":
            fields = {"frag": f"{at['name']}[{at['index']}]", "e": a[0], "value": a[1]}
        elif op.name == "frag_set_pair":
            fields = {"frag": f"{at['name']}[{at['index']}]", "i": at["pair"], "lo": a[0],
                      "hi": a[1]}
        elif op.name == "frag_load":
            fields = {"frag": f"{at['name']}[{at['index']}]", "root": at["root"], "offset": a[0],
                      "ld": at["ld"]}
            kind = "load_t" if at.get("transpose") else "load"
            if at.get("convert"):
                fmt = self.FRAGMENT[f"load_{at['convert']}"]
            elif at.get("aligned") and f"{kind}_aligned" in self.FRAGMENT:
                fmt = self.FRAGMENT[f"{kind}_aligned"]
            else:
                fmt = self.FRAGMENT[kind]
        else:
            fields = {"frag": f"{at['name']}[{at['index']}]", "value": self.literal(
                at["value"], dt.float32)}
        for line in fmt.format(**fields).split("\n"):
            self.emit(line, depth)

    def shared_decl(self, t: str, name: str, size: int, align: int) -> str:
        return self.SHARED_DECL.format(type=t, name=name, size=size)

    # 16-bit values two to a 32-bit word (vectorize_rows.py holds a run's loaded words
    # as words): dtype name -> (word from {a} (low) and {b}; element at bit {shift} of
    # word {w}).  Emitters without them hold elements.
    PACKED_PAIRS: dict[str, tuple[str, str]] = {}
    PAIR_FMA: dict[str, str] = {}   # pair dtype -> the call (HELPERS["pair_<dtype>"] defines it)

    # Register arrays of 16-bit elements held two to a 32-bit word: dtype name ->
    # (declaration over {name}, {words}; read over {name}, {s}; write over {name}, {s}, {v});
    # a pair of slots is written as one word of PACKED_PAIRS.
    PACKED_LOCALS: dict[str, tuple[str, str, str]] = {}

    def declare(self, op: Op, depth: int) -> None:
        if op.attrs["storage"] == "fragment":
            at = op.attrs
            t = self.fragment_type(at["role"], at["dtype"], at["shape"])
            self.emit(self.FRAGMENT["decl"].format(type=t, name=at["name"], size=at["size"]), depth)
            return
        t, name, size = self.TYPES[op.attrs["dtype"].name], op.attrs["name"], op.attrs["size"]
        if op.attrs["storage"] == "shared":
            self.emit(self.shared_decl(t, name, size, op.attrs.get("align", 0)), depth)
        elif op.attrs["storage"] == "local" and op.attrs["dtype"].name in self.PACKED_LOCALS:
            form = self.PACKED_LOCALS[op.attrs["dtype"].name]
            self.packed_locals[name] = form
            self.emit(form[0].format(name=name, words=(size + 1) // 2), depth)
        elif op.attrs["storage"] == "local":
            self.emit(f"{t} {name}[{size}];", depth)
        else:
            self.emit(f"{t} {name};", depth)

    def lane_loop(self, op: Op, depth: int) -> None:
        numel, slots, threads = op.attrs["numel"], op.attrs["slots"], op.attrs["threads"]
        block = op.regions[0]
        i, s = self.bind(block.args[0], "_i"), self.bind(block.args[1], "_s")
        tid = self.GEOMETRY["thread_id"]
        if slots == 1:
            self.emit(f"{{ const int {s} = 0; const int {i} = {tid};", depth)
        else:
            if op.attrs.get("run", 1) > 1 and slots <= MAX_UNROLLED_SLOTS and \
                    op.attrs.get("unroll", True):
                # a register tile's slot must be a constant after unrolling, or the
                # compiler moves the whole array to (local) memory
                self.emit("#pragma unroll", depth)
            self.emit(f"for (int {s} = 0; {s} < {slots}; ++{s}) {{ "
                      f"const int {i} = {tid} + {s} * {threads};", depth)
        if numel < slots * threads:
            self.emit(f"  if ({i} < {numel}) {{", depth)
            self.block(block, depth + 2)
            self.emit("  }", depth)
        else:
            self.block(block, depth + 1)
        self.emit("}", depth)

    def render(self) -> tuple[str, str]:
        """(header, body)"""
        self.block(self.fn.body, 0)
        # The launch layer pastes the header straight before its own code.
        header = "".join(self.HELPERS[h] + "\n" for h in sorted(self.helpers_used))
        return header, "\n".join(self.lines) + "\n"
