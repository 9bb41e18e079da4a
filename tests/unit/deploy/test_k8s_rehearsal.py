"""The Kubernetes $(VAR) expansion the multi-node rehearsal applies to a pod's command and environment (the
rehearsal itself: tests/infra/test_k8s_rehearsal.py)."""

from __future__ import annotations

from tests.helpers.k8s import expand


def test_expansion_follows_kubernetes_rules():
    assert expand("$(A)-0.$(A)", {"A": "job"}) == "job-0.job"
    assert expand("$(UNSET) $$(A) $(A", {"A": "x"}) == "$(UNSET) $(A) $(A"
