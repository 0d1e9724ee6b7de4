"""Where METILE_CACHE_DIR (else XDG_CACHE_HOME) puts metile's caches, for values a shell
would have expanded or that hold only blanks."""

import os
from pathlib import Path

from metile import settings


def test_a_home_relative_cache_dir_is_expanded(monkeypatch, tmp_path):
    # (a "~" written in a .env file or service unit made a folder named "~" in the cwd)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("METILE_CACHE_DIR", "~/metile-cache")
    assert settings.cache_root() == tmp_path / "metile-cache"
    monkeypatch.delenv("METILE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert settings.cache_root() == tmp_path / "xdg" / "metile"


def test_a_blank_cache_dir_is_unset(monkeypatch, tmp_path):
    # (" " was a folder named " " in the working directory)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "  ")
    for blank in ("", " ", "\t"):
        monkeypatch.setenv("METILE_CACHE_DIR", blank)
        assert settings.cache_root() == Path(os.path.expanduser("~/.cache")) / "metile"
