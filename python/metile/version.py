"""metile's version (its own module, so that any layer can read it)."""

__version__ = "0.1.0"
