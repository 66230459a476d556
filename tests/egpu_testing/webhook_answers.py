"""A review's outcome as the tests read it: (HTTP status, body, verdict), the verdict of a
refusal written `refused:<rule>,<rule>` so one string says what was refused and why."""

from __future__ import annotations

from elastic_gpu.webhook.review import Outcome
from elastic_gpu.webhook.server import http_answer


def answered(outcome: Outcome) -> tuple[int, bytes, str]:
    answer = http_answer(outcome)
    verdict = answer.verdict
    if verdict == "refused" and answer.rules:
        verdict = f"refused:{','.join(answer.rules)}"
    return answer.status, answer.body, verdict
