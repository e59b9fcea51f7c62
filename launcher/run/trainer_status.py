"""Kubeflow Trainer's TrainJob status (KEP-2779): where the pod was given ``KUBEFLOW_TRAINER_SERVER_URL`` (with
``..._CA_CERT`` and ``..._TOKEN``, files), node 0's launcher posts what ``launcher.runtime.report`` gives it there, as
``trainerStatus``: the progress in percent and the time left (with a ``total_steps`` scalar), the other scalars as
metrics, and when. One thread of its own, at most every PUSH_EVERY seconds and only when something changed; a push
that fails is one warning (then quiet), and never fails the job nor holds its loop."""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from typing import Mapping, Optional

from launcher.output.messages import log

PUSH_EVERY = 10.0  # seconds between two posts at most (a job of many nodes must not flood the control plane)
TIMEOUT = 10.0
CLOSE_WAIT = 2.0  # seconds the launcher's end waits for the last post
# KEP-2779 names them KUBEFLOW_TRAINER_STATUS_*; the Trainer's injected variables are taken under either name
URL_VARS = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_STATUS_URL")
CA_VARS = ("KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_STATUS_CA_CERT")
TOKEN_VARS = ("KUBEFLOW_TRAINER_SERVER_TOKEN", "KUBEFLOW_TRAINER_STATUS_TOKEN")
TOTAL = "total_steps"  # the scalar that gives the progress in percent


def _first(env: Mapping[str, str], names: tuple) -> Optional[str]:
    return next((env[n] for n in names if env.get(n)), None)


def wanted(env: Mapping[str, str], node_rank: int) -> bool:
    return node_rank == 0 and _first(env, URL_VARS) is not None


def status_of(view, now: float) -> Optional[dict]:
    """The ``trainerStatus`` of a node's view (monitor_view.NodeView): from its slowest reporting worker; None before any
    worker reported."""
    reports = [w for w in view.workers if w.step is not None]
    if not reports:
        return None
    slowest = min(reports, key=lambda w: w.step)
    status: dict = {}
    total = slowest.scalars.get(TOTAL)
    if total and total > 0:
        status["progressPercentage"] = max(0, min(100, int(100 * slowest.step / total)))
        if slowest.step_seconds is not None:
            status["estimatedRemainingSeconds"] = max(0, int((total - slowest.step) * slowest.step_seconds))
    metrics = [{"name": "step", "value": str(slowest.step)}]
    metrics += [{"name": k, "value": repr(v)} for k, v in sorted(slowest.scalars.items()) if k != TOTAL]
    status["metrics"] = metrics
    status["lastUpdatedTime"] = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return status


class TrainerStatusPush:
    def __init__(self, env: Mapping[str, str], wall=time.time) -> None:
        self.url = _first(env, URL_VARS)
        self.ca, self.token = _first(env, CA_VARS), _first(env, TOKEN_VARS)
        self.wall = wall
        self.view = None
        self.sent: Optional[dict] = None  # the last status sent (its metrics and progress)
        self.failed = False
        self.stopping = threading.Event()
        self.changed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="launcher-trainer-status", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def publish(self, view) -> None:
        self.view = view
        self.changed.set()

    def close(self) -> None:
        """The last status is sent unless the server failed the last time; the launcher's end waits CLOSE_WAIT for it
        at most (the thread is a daemon: a server that does not answer never holds the exit)."""
        self.stopping.set()
        self.changed.set()
        if self.thread.is_alive():
            self.thread.join(timeout=CLOSE_WAIT)

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.changed.wait()
            self.changed.clear()
            self._push()
            self.stopping.wait(PUSH_EVERY)
        if not self.failed:
            self._push()

    def _push(self) -> None:
        view = self.view
        status = status_of(view, self.wall()) if view is not None else None
        if status is None or (self.sent is not None and _same(status, self.sent)):
            return
        try:
            self._post({"trainerStatus": status})
            self.sent = status
            if self.failed:
                log.info("Kubeflow Trainer status: posted again to %s", self.url)
            self.failed = False
        except Exception as e:  # noqa: BLE001 - a push never fails the job
            log.log(logging.DEBUG if self.failed else logging.WARNING,
                    "Kubeflow Trainer status: could not post to %s (%s); the job goes on", self.url, e)
            self.failed = True

    def _post(self, body: dict) -> None:
        import ssl  # here, not at the module's import: every job's launcher imports this module, few post
        import urllib.request

        headers = {"Content-Type": "application/json"}
        if self.token:
            with open(self.token) as f:  # a projected token is rotated: read at each push
                headers["Authorization"] = f"Bearer {f.read().strip()}"
        context = ssl.create_default_context(cafile=self.ca) if self.ca else None
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as answer:
            answer.read(65536)


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "lastUpdatedTime"} == {k: v for k, v in b.items() if k != "lastUpdatedTime"}
