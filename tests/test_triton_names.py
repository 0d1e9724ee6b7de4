"""docs/triton-names.md (Triton's `tl` names and metile's status for each) agrees with
the package: every "same" name exists on `metile`, every "renamed" target exists, and no
"not supported" name does (so building one forces its row to change)."""

import pathlib
import re

import pytest

import metile

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "triton-names.md"
ROWS = [m.groups() for m in re.finditer(r"^\| `(\w+)` \| ([^|]+?) \|", DOC.read_text(), re.M)]
TL_MATH = ("umulhi exp exp2 fma log log2 cos rsqrt sin sqrt sqrt_rn abs fdiv div_rn erf floor "
           "ceil").split()


def test_the_table_is_read():
    assert len(ROWS) == 144 and len({n for n, _ in ROWS}) == len(ROWS)


@pytest.mark.parametrize("name,status", ROWS, ids=[n for n, _ in ROWS])
def test_status_matches_the_package(name, status):
    if status == "same":
        assert hasattr(metile, name)
    elif status.startswith("renamed"):
        assert not hasattr(metile, name)
        target = re.search(r"`([^`]+)`", status).group(1)
        if not re.fullmatch(r"a [-+*] b", target):  # an operator needs no lookup
            assert hasattr(metile, target.removeprefix("metile.")), target
    else:
        assert status == "not supported", status
        # metile.tensor exists but is not Triton's tensor type (see its row)
        assert name == "tensor" or not hasattr(metile, name)


def test_every_tl_math_name_is_in_metile_math():
    assert [n for n in TL_MATH if not hasattr(metile.math, n)] == []
