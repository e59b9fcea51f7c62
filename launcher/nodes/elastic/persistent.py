"""Containers that never change, for the membership's state at 10,000 nodes (``PMap``, ``PSet``, ``Row``): each
change makes a new version in O(1) and leaves every older one as it was, so that ``membership.decide`` stays a pure
function of states a caller may keep."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from itertools import islice
from typing import Iterable, Optional

_NONE = object()  # no value: a key absent (in a change), a least value not known yet


class PMap(Mapping):
    """A mapping that never changes: ``update`` returns a new version in O(1) per key changed, whatever its
    size, and every older version reads as it did. Baker's trick: the newest version holds the dict; each
    older one holds what it had of the keys changed since (``_back``) and the version after it; reading an
    older one moves the dict back to it (O(changes since)). A dict given is copied. Reading moves the dict:
    the versions of one map are for one thread at a time (the rules' states are). ``low``: the least value,
    kept from version to version while the changes allow, else found again once (O(N), when asked)."""

    __slots__ = ("_data", "_back", "_next", "_low")

    def __init__(self, items=()) -> None:
        self._data, self._back, self._next, self._low = dict(items), None, None, _NONE

    def _dict(self) -> dict:
        if self._data is None:
            path, root = [], self
            while root._data is None:
                path.append(root)
                root = root._next
            data = root._data
            for older in reversed(path):  # the version before ``root`` takes the dict; ``root`` keeps the way back
                back = older._back
                root._data, root._back, root._next = None, {k: data.get(k, _NONE) for k in back}, older
                for key, value in back.items():
                    if value is _NONE:
                        data.pop(key, None)
                    else:
                        data[key] = value
                older._data, older._back, older._next, root = data, None, None, older
        return self._data

    def update(self, changes: Optional[Mapping] = None, gone: Iterable = (), known_only: bool = False) -> "PMap":
        """This map with the keys of ``changes`` set to their values (``known_only``: of the keys it has only)
        and the keys in ``gone`` removed; this very map when that changes no key."""
        data, changes = self._dict(), changes or {}
        if known_only:
            changes = {k: v for k, v in changes.items() if k in data}
        gone = [k for k in gone if k in data and k not in changes]
        if not changes and not gone:
            return self
        back = {k: data.get(k, _NONE) for k in changes}
        back.update((k, data.pop(k)) for k in gone)
        data.update(changes)
        new = PMap.__new__(PMap)
        new._data, new._back, new._next, new._low = data, None, None, _NONE
        low = self._low  # the least value again, unless a key that held it changed: then found when asked
        if low is not _NONE and not any(v is not _NONE and v <= low for v in back.values()):
            new._low = min([*changes.values(), *([] if low is None else [low])], default=None)
        self._data, self._back, self._next = None, back, new
        return new

    def low(self):
        """The least value (None: the map is empty)."""
        if self._low is _NONE:
            self._low = min(self._dict().values(), default=None)
        return self._low

    def where(self, test) -> list:
        """The (key, value) pairs whose value passes ``test``, a test the least value passes whenever any value
        does (such as ``value + timeout <= now``): none at O(1) while the least value is known."""
        low = self.low()
        return [] if low is None or not test(low) else [(k, v) for k, v in self._dict().items() if test(v)]

    def __getitem__(self, key):
        return self._dict()[key]

    def get(self, key, default=None):
        return self._dict().get(key, default)

    def __contains__(self, key) -> bool:
        return key in self._dict()

    def __iter__(self):
        return iter(list(self._dict()))  # its keys as they are now, whatever another version reads meanwhile

    def __len__(self) -> int:
        return len(self._dict())

    def __repr__(self) -> str:
        return f"PMap({self._dict()!r})"


class PSet(Set):
    """A set that never changes (the keys of a ``PMap``): ``plus`` and ``minus`` in O(1)."""

    __slots__ = ("_map",)

    def __init__(self, items: Iterable = ()) -> None:
        self._map = PMap(dict.fromkeys(items, True))

    def _with(self, mapping: PMap) -> "PSet":
        new = PSet.__new__(PSet)
        new._map = mapping
        return new

    def plus(self, item) -> "PSet":
        return self if item in self._map else self._with(self._map.update({item: True}))

    def minus(self, item) -> "PSet":
        mapping = self._map.update(gone=(item,))
        return self if mapping is self._map else self._with(mapping)

    def __contains__(self, item) -> bool:
        return item in self._map

    def __iter__(self):
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __repr__(self) -> str:
        return f"PSet({set(self)!r})"


class Row(Sequence):
    """A tuple that grows at its end in O(1): its versions share one list, each its own length of it (a version
    that grows a list another version grew already copies its part first). It equals the tuple of its items and
    adds to a tuple as a tuple does (the result: a tuple)."""

    __slots__ = ("_items", "_len")

    def __init__(self, items: Iterable = ()) -> None:
        self._items = list(items)
        self._len = len(self._items)

    def plus(self, item) -> "Row":
        items = self._items if len(self._items) == self._len else self._items[:self._len]
        items.append(item)
        new = Row.__new__(Row)
        new._items, new._len = items, self._len + 1
        return new

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        return self._items[range(self._len)[index]]

    def __iter__(self):
        return islice(self._items, self._len)

    def __len__(self) -> int:
        return self._len

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, (tuple, Row)) else NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other):
        return tuple(self) + tuple(other) if isinstance(other, (tuple, Row)) else NotImplemented

    def __radd__(self, other):
        return tuple(other) + tuple(self) if isinstance(other, (tuple, Row)) else NotImplemented

    def __repr__(self) -> str:
        return f"Row({tuple(self)!r})"
