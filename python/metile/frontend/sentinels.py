"""Names and values the control-flow desugaring (desugar_control.py) and the lowering of
structured control flow (control.py) share: kept apart so each can import the other's
needs without a cycle."""

# desugar_control's name for a helper's return value (not a Python identifier).
RETURN_VALUE = "<return value>"


class _Unset:
    """A helper's return value on a path that has not returned yet: nothing will read
    it there, so a runtime if merges it with whatever the other branch holds."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()
