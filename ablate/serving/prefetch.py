"""Asking a server ahead of training: rows training will need soon are scored in a background thread, so the
server's latency hides behind the trainer's own work. Training's values never depend on it: a row is looked up by
its content, and one that was not asked ahead (or was asked for another order than training's) is asked for when
training needs it. A failure in the background (the server down) is raised where training takes that row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

_FAILED = object()


class Prefetcher:
    """One background thread scoring rows with ``score(row)`` in the order they were submitted, at most
    ``lookahead`` groups past the last group training has taken from."""

    def __init__(self, score: Callable[[Hashable], Any], lookahead: int):
        self.score, self.lookahead = score, lookahead
        self._cv = threading.Condition()
        self._queue: list[tuple[int, Hashable]] = []  # (group, row) in submission order
        self._group_of: dict[Hashable, int] = {}
        self._done: dict[Hashable, Any] = {}
        self._errors: dict[Hashable, BaseException] = {}
        self._groups = 0  # groups submitted
        self._taken = 0  # training has reached this group (exclusive bound of what it took from)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ablate-prefetch", daemon=True)
        self._thread.start()

    def submit(self, groups: Iterable[Iterable[Hashable]]) -> None:
        """Rows to score ahead, in the order training will take them, grouped by training call."""
        with self._cv:
            for rows in groups:
                for row in rows:
                    if row not in self._group_of:
                        self._group_of[row] = self._groups
                        self._queue.append((self._groups, row))
                self._groups += 1
            self._cv.notify_all()

    def take(self, row: Hashable) -> tuple[bool, Any]:
        """``(True, value)`` for a row submitted ahead (waiting while it is being scored), ``(False, None)`` for
        one that was not; re-raises what scoring it raised."""
        with self._cv:
            group = self._group_of.get(row)
            if group is None:
                return False, None
            self._taken = max(self._taken, group + 1)
            self._cv.notify_all()
            while row not in self._done and row not in self._errors and not self._closed:
                self._cv.wait()
            if row in self._errors:
                raise self._errors[row]
            return (row in self._done), self._done.get(row)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not (self._queue and self._queue[0][0] < self._taken + self.lookahead):
                    self._cv.wait()
                if self._closed:
                    return
                _, row = self._queue.pop(0)
            try:
                value, error = self.score(row), None
            except BaseException as e:  # raised in training's thread, where it takes the row
                value, error = _FAILED, e
            with self._cv:
                if error is None:
                    self._done[row] = value
                else:
                    self._errors[row] = error
                self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
