"""The GPUBudget CRD: the file equals the code; objects are read strictly into Budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_gpu.api import budget as api
from elastic_gpu.core.budget.allowance import Budget, BudgetState
from elastic_gpu.core.budget.settle import Settled

ROOT = Path(__file__).resolve().parents[3]


def test_crd_file_matches_the_code() -> None:
    on_disk = yaml.safe_load((ROOT / "deploy" / "crds" / api.CRD_FILE).read_text())
    assert on_disk == api.crd_manifest(), "regenerate: python -m elastic_gpu.api.budget --write deploy/crds"


def test_crd_is_namespaced_with_status_and_the_columns() -> None:
    crd = api.crd_manifest()
    assert crd["metadata"]["name"] == "gpubudgets.elasticgpu.io"
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Used"] == ".status.used" and columns["Remaining"] == ".status.remaining"


@pytest.mark.parametrize(("text", "seconds"), [("168h", 604800), ("1h30m", 5400), ("30s", 30),
                                               ("2m5s", 125)])
def test_durations(text: str, seconds: int) -> None:
    assert api.parse_duration(text, "spec.period") == seconds


@pytest.mark.parametrize("text", ["", "0s", "1d", "1.5h", "-1h", 3600, None, "h"])
def test_bad_durations_name_the_field(text: Any) -> None:
    with pytest.raises(api.BudgetObjectError, match=r"spec\.period="):
        api.parse_duration(text, "spec.period")


def _obj(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "b", "namespace": "team-a",
                         "creationTimestamp": "2026-11-24T00:00:00Z"}, "spec": spec}


def test_object_to_budget() -> None:
    assert api.budget_from_object(_obj(gpuHours=1.5, period="1h")) == \
        Budget(5400, 3600, 1795478400)
    assert api.budget_from_object(_obj(gpuHours=2, period="24h", halfLife="6h",
                                       periodStart="2026-11-23T00:00:00Z")) == \
        Budget(7200, 86400, 1795478400 - 86400, 21600)


@pytest.mark.parametrize(("spec", "words"), [
    ({"period": "1h"}, "spec.gpuHours=None"),
    ({"gpuHours": -1, "period": "1h"}, "spec.gpuHours=-1"),
    ({"gpuHours": True, "period": "1h"}, "spec.gpuHours=True"),
    ({"gpuHours": 1}, "spec.period=None"),
    ({"gpuHours": 1, "period": "1h", "halfLife": "soon"}, "spec.halfLife='soon'"),
    ({"gpuHours": 1, "period": "1h", "periodStart": "monday"}, "spec.periodStart='monday'"),
    ({"gpuHours": 1, "period": "1s"}, "spec.period='1s' must be at least 60s"),
    ({"gpuHours": 1, "period": "59s"}, "spec.period='59s' must be at least 60s"),
])
def test_bad_objects_name_object_and_field(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(api.BudgetObjectError) as err:
        api.budget_from_object(_obj(**spec))
    assert "GPUBudget team-a/b" in str(err.value) and words in str(err.value)


def test_status_round_trip_and_condition() -> None:
    from fractions import Fraction


    obj = _obj(gpuHours=1, period="1h")
    budget = api.budget_from_object(obj)
    settled = Settled(budget.anchor, Fraction(1, 7) + 1800, frozenset({"u2", "u1"}))
    state = BudgetState(Fraction(2700), Fraction(900), budget.anchor, budget.anchor + 3600,
                             False)
    status = api.budget_status(obj, budget, state, settled, budget.anchor + 10)
    assert (status["used"], status["remaining"]) == (0.75, 0.25)
    assert (status["periodStart"], status["periodEnd"]) == ("2026-11-24T00:00:00Z",
                                                          "2026-11-24T01:00:00Z")
    (cond,) = status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("OverBudget", "False", "InBudget")
    assert "0.75 of 1 GPU-hours" in cond["message"]
    assert status["settled"] == {"periodStart": "2026-11-24T00:00:00Z",
                                 "gpuSeconds": "12601/7", "uids": ["u1", "u2"]}
    # the settled part reads back exactly
    assert api.settled_from_status({**obj, "status": status}, budget) == settled
    # over budget: the condition flips and keeps its own transition time later
    over = BudgetState(Fraction(3600), Fraction(0), budget.anchor, budget.anchor + 3600, True)
    again = api.budget_status({**obj, "status": status}, budget, over, settled, budget.anchor + 20)
    (cond,) = again["conditions"]
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == \
        ("True", "OverBudget", "2026-11-24T00:00:20Z")
    assert "lower PriorityClass" in cond["message"] and again["remaining"] == 0


def test_the_schema_floor_is_the_core_floor() -> None:
    """Issue #26 item 7: the CRD refuses what the keeper would refuse, and says so."""
    from elastic_gpu.core.budget.allowance import MIN_PERIOD_S

    period = api.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]["period"]
    assert api.parse_duration(api.MIN_PERIOD, "min") == MIN_PERIOD_S
    (rule,) = period["x-kubernetes-validations"]
    assert rule["rule"] == f"duration(self) >= duration('{api.MIN_PERIOD}')"
    assert "at least 1m" in rule["message"] and "at least 1m" in period["description"]


def test_an_equal_status_is_not_a_change() -> None:
    from fractions import Fraction


    obj = _obj(gpuHours=1, period="1h")
    budget = api.budget_from_object(obj)
    settled = Settled(budget.anchor)
    state = BudgetState(Fraction(0), Fraction(3600), budget.anchor, budget.anchor + 3600,
                             False)
    status = api.budget_status(obj, budget, state, settled, budget.anchor + 10)
    assert api.status_changed(obj, status)
    written = {**obj, "status": status}
    # looked at again later in the same period with nothing new: the same status
    again = api.budget_status(written, budget, state, settled, budget.anchor + 500)
    assert not api.status_changed(written, again)
    # the next period is news
    later = BudgetState(Fraction(0), Fraction(3600), budget.anchor + 3600,
                             budget.anchor + 7200, False)
    assert api.status_changed(written, api.budget_status(written, budget, later,
                                                         Settled(budget.anchor + 3600),
                                                         budget.anchor + 3610))


def test_no_settled_status_is_an_empty_one_and_bad_is_refused() -> None:

    obj = _obj(gpuHours=1, period="1h")
    budget = api.budget_from_object(obj)
    assert api.settled_from_status(obj, budget) == Settled(budget.anchor)
    bad = {**obj, "status": {"settled": {"periodStart": "2026-11-24T00:00:00Z",
                                         "gpuSeconds": "1.5"}}}
    with pytest.raises(api.BudgetObjectError, match=r"status\.settled\.gpuSeconds='1\.5'"):
        api.settled_from_status(bad, budget)


def test_the_chart_creates_the_priority_class_the_code_and_the_webhook_name() -> None:
    from pathlib import Path

    import yaml

    from elastic_gpu.api.budget import priority_class_manifest
    from elastic_gpu.webhook.config import WebhookConfig

    values = yaml.safe_load((Path(__file__).parents[3] / "charts/elastic-gpu/values.yaml")
                            .read_text())["budgets"]["overBudgetPriorityClass"]
    manifest = priority_class_manifest()
    assert (values["name"], values["value"], values["preemptionPolicy"]) == (
        manifest["metadata"]["name"], manifest["value"], manifest["preemptionPolicy"])
    assert manifest["value"] < 0  # below pods without a class: preempted first
    assert WebhookConfig().over_budget_priority_class == manifest["metadata"]["name"]
