"""A tiny name -> object registry, so adding a variant is one file plus one decorator."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

from mtl_cog.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice.")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:
            close = difflib.get_close_matches(name, list(self._items), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UnknownNameError(f"unknown {self.kind} {name!r}.{hint} Available: {', '.join(sorted(self._items))}.")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def in_order(self) -> list[str]:
        """The names in the order they were registered (where that order is shown, e.g. table rows)."""
        return list(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
