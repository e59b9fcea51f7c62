"""Why a launcher left an etcd job (launcher.nodes.elastic.etcd.departures): the marker read back as written, proven
with the job token where there is one, junk and forgeries read as no marker, and each kind read back by the
membership's rules as left, lost or silent."""

import json

import pytest

from launcher.nodes.elastic.etcd import departures as dp
from launcher.nodes.elastic.etcd import keys as ek
from launcher.nodes.elastic.model import change_kind


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_a_marker_reads_back_as_written(token):
    value = dp.gone_value(dp.LEFT, "node 2 received SIGTERM", "n2", token, "job")
    assert dp.read_gone(value, token, "job") == (dp.LEFT, "node 2 received SIGTERM")


def test_with_a_token_a_marker_without_its_proof_or_of_another_job_is_none():
    assert dp.read_gone(dp.gone_value(dp.LOST, "x", "n1", None, "job"), "s3cret", "job") is None
    assert dp.read_gone(dp.gone_value(dp.LOST, "x", "n1", "other", "job"), "s3cret", "job") is None
    assert dp.read_gone(dp.gone_value(dp.LOST, "x", "n1", "s3cret", "job2"), "s3cret", "job") is None
    forged = json.loads(dp.gone_value(dp.LOST, "x", "n1", "s3cret", "job"))
    forged["kind"] = dp.LEFT  # the proof covers the kind, the reason and who wrote it
    assert dp.read_gone(json.dumps(forged), "s3cret", "job") is None


@pytest.mark.parametrize("value", [
    "", "null", "[]", "{", "[" * 100_000, '{"kind": "gone", "reason": "x", "by": "n"}',
    '{"kind": "left", "reason": 3, "by": "n"}', '{"kind": "left", "reason": "x", "by": null}',
    '{"kind": "left", "reason": "x", "by": "n", "n": ' + "9" * 5000 + "}",
])
def test_what_is_not_a_marker_is_none(value):
    assert dp.read_gone(value, None, "job") is None


def test_a_long_reason_is_cut():
    assert len(dp.read_gone(dp.gone_value(dp.LEFT, "x" * 10_000, "n", None, "j"), None, "j")[1]) == dp.REASON_WIDTH


@pytest.mark.parametrize("marker, kind", [
    ((dp.LEFT, "node 2 received SIGTERM"), "left"), ((dp.LOST, "its connection in the liveness ring closed"), "lost"),
    (None, "silent"),
])
def test_each_marker_is_read_back_by_the_rules_as_its_kind(marker, kind):
    assert change_kind(dp.why_gone(marker, 30.0)) == kind


def test_the_markers_are_outside_what_a_launcher_that_does_not_keep_the_membership_reads():
    prefix = ek.job_prefix("job")
    start, end = ek.orders_span(prefix)
    assert not start <= dp.gone_key(prefix, "n1") < end
