"""The job's keys in etcd as one launcher last heard them (a range read, then its watch's events, in revision order),
and what they say: the launchers alive (their node keys), their reports, and why one whose key went is gone
(``departures``). Each key's version is parsed once: every turn reads every key."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from launcher.nodes.elastic.etcd import departures, paces, keys as ek, state as es
from launcher.nodes.elastic.etcd.client import Entry


class Mirror:
    def __init__(self, prefix: str, token: Optional[str], job_id: str) -> None:
        self.prefix, self.token, self.job_id = prefix, token, job_id
        self.keys: dict = {}  # key -> Entry
        self.parsed: dict = {}  # a key's version -> its value as read (``_parsed``)

    def reset(self, entries: Iterable[Entry]) -> None:
        self.keys = {e.key: e for e in entries}

    def apply(self, events: Iterable[Entry]) -> None:
        for e in events:
            if e.deleted:
                self.keys.pop(e.key, None)
            else:
                self.keys[e.key] = e

    def get(self, key: str) -> Optional[Entry]:
        return self.keys.get(key)

    def put(self, entry: Entry) -> None:
        self.keys[entry.key] = entry

    def alive(self) -> es.Alive:
        alive = {}
        for key, e in self.keys.items():
            if key.startswith(self.prefix + "nodes/"):
                joiner = self._parsed(e, lambda: ek.read_node(e.value, e.lease, e.create_revision, self.token,
                                                               self.job_id, e.mod_revision))
                if joiner is not None:
                    alive[joiner.node.node_id] = joiner
        return alive

    def reports(self, alive: es.Alive) -> es.Reports:
        reports = []
        for key, e in self.keys.items():
            if not key.startswith(self.prefix + "report/"):
                continue
            node = alive.get(ek.read_node_id(key, self.prefix))
            node_lease = node.lease if node else -1
            event = self._parsed((e, node_lease), lambda: ek.read_report(e.value, e.lease, node_lease, self.token,
                                                                          self.job_id))
            if event is not None:
                reports.append(((key, e.mod_revision), event))
        return reports

    def paces(self, alive: es.Alive) -> dict:
        """node id -> its speed entry (``paces.read_pace``), of the launchers alive."""
        found = {}
        for key, e in self.keys.items():
            if not key.startswith(self.prefix + "pace/"):
                continue
            node_id = paces.node_id_of(key, self.prefix)
            node = alive.get(node_id)
            node_lease = node.lease if node else -1
            pace = self._parsed((e, node_lease), lambda: paces.read_pace(e.value, e.lease, node_lease, self.token,
                                                                       self.job_id))
            if pace is not None and pace[0] == node_id:  # a launcher speaks for itself only
                found[node_id] = pace[1]
        return found

    def why_gone(self, heartbeat_timeout: float) -> Callable[[str], str]:
        """node id -> why its launcher is gone (the keeper reads every key: the markers are in its mirror)."""
        def why(node_id: str) -> str:
            e = self.keys.get(departures.gone_key(self.prefix, node_id))
            marker = self._parsed(e, lambda: departures.read_gone(e.value, self.token, self.job_id)) if e else None
            return departures.why_gone(marker, heartbeat_timeout)
        return why

    def _parsed(self, key, read):
        if key not in self.parsed:
            if len(self.parsed) > 4 * len(self.keys) + 64:  # versions long gone
                self.parsed.clear()
            self.parsed[key] = read()
        return self.parsed[key]
