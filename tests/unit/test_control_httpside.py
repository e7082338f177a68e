"""The HTTP side port every service serves: /health, /ready, /metrics on a free port."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client import Counter

from tailrace.httpside import Health, start_http_side

PROBES = Counter("tailrace_test_httpside_probes", "a counter only this test increments")


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_health_ready_metrics():
    state = {"health": (True, "ok"), "ready": False}

    def health() -> tuple[bool, str]:
        if state["health"] is None:
            raise RuntimeError("storage gone: postgresql://u:pw@h/db")
        return state["health"]

    side = start_http_side(0, health, lambda: state["ready"])
    try:
        assert side.port > 0 and side.url == f"http://127.0.0.1:{side.port}"
        assert get(f"{side.url}/health")[::2] == (200, "ok\n")
        assert get(f"{side.url}/ready")[::2] == (503, "not ready\n")
        state["ready"] = True
        assert get(f"{side.url}/ready")[::2] == (200, "ready\n")

        state["health"] = (False, "position lost: slot dropped. Re-snapshot required.")
        status, kind, body = get(f"{side.url}/health")
        assert (status, kind) == (503, "application/json")
        assert json.loads(body) == {"status": "unhealthy",
                                    "reason": "position lost: slot dropped. Re-snapshot required."}
        state["health"] = None  # the check itself fails: unhealthy, and no password shown
        status, _, body = get(f"{side.url}/health")
        assert status == 503 and "storage gone" in body and "pw@" not in body

        PROBES.inc()
        status, kind, body = get(f"{side.url}/metrics?x=1")
        assert status == 200 and kind.startswith("text/plain")
        assert "tailrace_test_httpside_probes_total 1.0" in body
        assert get(f"{side.url}/nope")[0] == 404
    finally:
        side.stop()


def test_a_health_answer_may_carry_its_own_status():
    answer = {"health": Health(False, "5 restarts in a row without a checkpoint advancing: x",
                               "degraded")}
    side = start_http_side(0, lambda: answer["health"], lambda: True)
    try:
        status, kind, body = get(f"{side.url}/health")
        assert (status, kind) == (503, "application/json")
        assert json.loads(body) == {"status": "degraded", "reason": answer["health"].reason}
        answer["health"] = Health(True, "ok")
        assert get(f"{side.url}/health")[::2] == (200, "ok\n")
    finally:
        side.stop()


def test_ready_names_why_not_when_the_check_says():
    answer: dict[str, bool | tuple[bool, str]] = {
        "ready": (False, "control service at 127.0.0.1:1 failing for 3 s: record epoch: "
                         "UNAVAILABLE: postgresql://u:pw@h/db")}
    side = start_http_side(0, lambda: (True, "ok"), lambda: answer["ready"])
    try:
        status, kind, body = get(f"{side.url}/ready")
        assert (status, kind) == (503, "application/json")
        assert json.loads(body) == {"status": "not ready", "reason": (
            "control service at 127.0.0.1:1 failing for 3 s: record epoch: UNAVAILABLE: "
            "postgresql://u:***@h/db")}
        answer["ready"] = (True, "")
        assert get(f"{side.url}/ready")[::2] == (200, "ready\n")
    finally:
        side.stop()
