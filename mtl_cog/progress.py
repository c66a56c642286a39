"""Progress of long steps (compare, post-hoc fitting, figures, sweeps), readable on a terminal *and* in a log.

A tqdm bar redraws one line with carriage returns: in a Slurm log or a file it becomes one
unreadable line or nothing at all. So: on a terminal (stderr is a TTY) we show tqdm's bar; anywhere
else we print a plain line every ``every`` items (default: about every 10 %) and at the end, e.g.

    compare: scoring runs 12/40 (30%), 8 s elapsed, ~19 s left
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


class Progress:
    """Count finished items of a long step; a bar on a terminal, a line per ``every`` items elsewhere."""

    def __init__(self, total: int, desc: str, every: int | None = None, stream=None) -> None:
        self.total = max(int(total), 0)
        self.desc = desc
        self.every = every or max(1, self.total // 10)
        self.stream = stream or sys.stderr
        self.done = 0
        self.next_line = self.every  # a line each time the count passes a multiple of ``every``, whatever n is
        self.start = time.monotonic()
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.bar = tqdm(total=self.total, desc=desc, file=self.stream, leave=False) if tty and self.total else None

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            if note:
                self.bar.set_postfix_str(note)
            return
        if self.done >= self.next_line or self.done >= self.total:
            print(self.line(note), file=self.stream, flush=True)
            self.next_line = (self.done // self.every + 1) * self.every

    def line(self, note: str = "") -> str:
        elapsed = time.monotonic() - self.start
        text = f"{self.desc} {self.done}/{self.total}"
        if self.total:
            text += f" ({100 * self.done / self.total:.0f}%)"
        text += f", {elapsed:.0f} s elapsed"
        if 0 < self.done < self.total:
            text += f", ~{elapsed / self.done * (self.total - self.done):.0f} s left"
        return text + (f" [{note}]" if note else "")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            print(self.line(), file=self.stream, flush=True)  # the final count stays in the scroll-back

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(items: Iterable[T], desc: str, total: int | None = None, every: int | None = None) -> Iterator[T]:
    """Iterate ``items`` and report progress as ``Progress`` does."""
    items = list(items) if total is None else items
    with Progress(len(items) if total is None else total, desc, every) as progress:
        for item in items:
            yield item
            progress.update()
