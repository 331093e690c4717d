"""``LRU``: the one bounded cache of cdmpp (features by program hash, features and answers by request item)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable


class LRU:
    """A mapping of at most ``size`` entries that forgets the least recently used one. Not locked: its
    owners hold their own lock around a batch of lookups."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable) -> Any:
        """The value (now the most recently used), or None."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
