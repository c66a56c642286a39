"""A tiny name -> object registry, so adding a variant is one file plus one decorator.

A registry may name the package whose modules register into it (``plugins``): that package is
imported on the first lookup, not by every caller. This is how the data sets in the top-level
``tasks/`` package register in one place although ``mtl_cog.data`` sits below them, the same idea
as mmengine's ``Registry(locations=...)`` (imported when the registry is first used).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from mtl_cog.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, plugins: str | None = None) -> None:
        self.kind = kind
        self.plugins = plugins  # a package whose import registers the built-in entries, loaded on first lookup
        self._items: dict[str, T] = {}
        self._plugins_loaded = plugins is None

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice.")
            self._items[name] = obj
            return obj

        return decorator

    def _load_plugins(self) -> None:
        if not self._plugins_loaded:
            self._plugins_loaded = True  # first, so a plugin that looks itself up does not recurse
            importlib.import_module(self.plugins)

    def get(self, name: str) -> T:
        self._load_plugins()
        if name not in self._items:
            close = difflib.get_close_matches(name, list(self._items), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UnknownNameError(f"unknown {self.kind} {name!r}.{hint} Available: {', '.join(sorted(self._items))}.")
        return self._items[name]

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._items)

    def in_order(self) -> list[str]:
        """The names in the order they were registered (where that order is shown, e.g. table rows)."""
        return list(self._items)

    def __contains__(self, name: str) -> bool:
        self._load_plugins()
        return name in self._items
