"""Node 0's verdict on a node's health checkup (``launcher.plan.admission``), pure: what is refused and in what words,
and a checkup off the wire that is not one (wrong types, nesting, a clock that is not a number) read as a refusal,
never an exception."""

import pytest

from launcher.plan import admission
from launcher.plan.health import FAILED, OK, Checkup, Facts, Finding, HealthSettings

NODE0 = Facts("3.11.9", "1.0", "2.13.0", "abc", 1000.0)


def wire(**facts):
    return Checkup(Facts(**{**NODE0.__dict__, **facts})).to_wire()


def test_a_node_like_node_0_is_fit():
    verdict = admission.judge("node 1 (10.0.0.2)", wire(clock=1001.0), NODE0, 1000.5, HealthSettings())
    assert verdict.fit and admission.states(verdict) == {"versions": (OK, ""), "script": (OK, ""), "clock": (OK, "")}


@pytest.mark.parametrize("facts, check, reason", [
    ({"script": "def"}, "script", "its training script differs from node 0's (another copy of the code)"),
    ({"torch": "2.12.0"}, "versions", "it runs torch 2.12.0 where node 0 has 2.13.0"),
    ({"clock": 1060.0}, "clock", "its clock stands +60.0 s from node 0's (the bound is 5 s)"),
])
def test_a_fact_that_differs_from_node_0_s_is_one_sentence(facts, check, reason):
    verdict = admission.judge("node 1 (10.0.0.2)", wire(**facts), NODE0, 1000.0, HealthSettings())
    assert verdict.refusal == (f"node 1 (10.0.0.2) failed the health check {check}: {reason}; mend the node, or skip "
                               f"the check with --skip_health_checks {check}")


def test_a_check_turned_off_is_not_judged():
    settings = HealthSettings(off=frozenset({"script"}))
    verdict = admission.judge("node 1 (h)", wire(script="def"), NODE0, 1000.0, settings)
    assert verdict.fit


def test_the_node_s_own_failed_finding_is_its_refusal():
    sick = Checkup(NODE0, (Finding("shm", FAILED, "/dev/shm has 1 MiB free, below 256 MiB"),)).to_wire()
    verdict = admission.judge("node 2 (h)", sick, NODE0, 1000.0, HealthSettings())
    assert verdict.refusal.startswith("node 2 (h) failed the health check shm: /dev/shm has 1 MiB free")
    assert admission.own("node 0 (h)", Checkup(NODE0, (Finding("disk", FAILED, "full"),))).refusal.startswith(
        "node 0 (h) failed the health check disk: full")


@pytest.mark.parametrize("offered", [
    [], "facts", 7, {"facts": []}, {"facts": {}}, {"facts": {**wire()["facts"], "clock": "now"}},
    {"facts": {**wire()["facts"], "clock": float("nan")}}, {"facts": {**wire()["facts"], "clock": True}},
    {"facts": {**wire()["facts"], "python": ["3"]}}, {**wire(), "findings": {"a": 1}},
    {**wire(), "findings": [["disk", "failed"]]}, {**wire(), "findings": [[["disk"], "failed", "x"]]},
    {**wire(), "findings": [["disk", "sick", "x"]]}, {**wire(), "findings": [["disk", "failed", {"x": [[[]]]}]]},
])
def test_what_is_not_a_checkup_is_a_refusal_never_an_exception(offered):
    verdict = admission.judge("node 1 (h)", offered, NODE0, 1000.0, HealthSettings())
    assert verdict.refusal == ("node 1 (h) sent a health checkup that is not one (a field missing or of a wrong type): "
                               "run the same launcher version on every node")


def test_no_checkup_at_all_names_an_older_launcher():
    assert "sent no health checkup" in admission.judge("node 1 (h)", None, NODE0, 1000.0, HealthSettings()).refusal
