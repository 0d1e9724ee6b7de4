"""The scalar element types a kernel can name (`metile.float32`, ...).

A dtype is a plain value object: the IR stores it in types, the frontend
compares it, each backend spells it.  MLX dtypes and short strings ("f32")
are accepted wherever a kernel or a launch names a dtype.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    kind: str  # "f" float, "i" signed int, "u" unsigned int, "b" bool, "q" fp8 (storage)
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def is_fp8(self) -> bool:
        """An 8-bit float held as its bits: converted to and from other types, never computed
        in (its own kind, so no float path takes it by accident)."""
        return self.kind == "q"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def element_ty(self) -> "DType":
        """Triton's `ptr.dtype.element_ty`: a pointer's `.dtype` in metile is already its
        element type, so this is the dtype itself."""
        return self

    @property
    def primitive_bitwidth(self) -> int:
        return self.bits

    def __repr__(self) -> str:
        return f"metile.{self.name}"

    def __str__(self) -> str:
        return self.name


float32 = DType("float32", "f", 32)
float16 = DType("float16", "f", 16)
bfloat16 = DType("bfloat16", "f", 16)
int32 = DType("int32", "i", 32)
uint32 = DType("uint32", "u", 32)
int64 = DType("int64", "i", 64)
uint64 = DType("uint64", "u", 64)
int8 = DType("int8", "i", 8)
uint8 = DType("uint8", "u", 8)
int16 = DType("int16", "i", 16)
uint16 = DType("uint16", "u", 16)
bool_ = DType("bool", "b", 8)
int1 = bool_  # Triton's name for the bool type
# OCP fp8: e4m3 "fn" (no infinities, max 448, NaN S.1111.111) and e5m2 (IEEE-like, max 57344).
# MLX has no fp8 arrays: the bytes live in uint8 arrays (`.to(metile.float8e4nv, bitcast=True)`).
float8e4nv = DType("float8e4nv", "q", 8)
float8e5 = DType("float8e5", "q", 8)
FP8 = (float8e4nv, float8e5)

ALL = (float32, float16, bfloat16, int32, uint32, int64, uint64, int8, uint8, int16, uint16,
       bool_)

_ALIASES = {
    "f32": float32, "float32": float32, "float": float32,
    "f16": float16, "float16": float16, "half": float16,
    "bf16": bfloat16, "bfloat16": bfloat16,
    "i32": int32, "int32": int32, "int": int32,
    "u32": uint32, "uint32": uint32,
    "i64": int64, "int64": int64, "u64": uint64, "uint64": uint64,
    "i8": int8, "int8": int8, "u8": uint8, "uint8": uint8,
    "i16": int16, "int16": int16, "u16": uint16, "uint16": uint16,
    "bool": bool_, "i1": bool_, "int1": bool_,
}


_FROM_MLX: dict = {}


def to_dtype(value) -> DType | None:
    """A metile DType for a DType, an alias string or an mx.Dtype; None if unsupported."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        return _ALIASES.get(value)
    try:
        return _FROM_MLX[value]
    except (KeyError, TypeError):
        pass
    name = str(value)  # mx.Dtype prints as "mlx.core.float32"
    out = _ALIASES.get(name[len("mlx.core."):]) if name.startswith("mlx.core.") else None
    try:
        _FROM_MLX[value] = out
    except TypeError:
        pass
    return out


def to_mlx(dtype: DType):
    import mlx.core as mx

    return {"bool": mx.bool_}.get(dtype.name) or getattr(mx, dtype.name)
