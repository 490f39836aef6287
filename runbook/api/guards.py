"""Check helpers every serve step uses: reachability, the early stop, a refusal, and a case guard."""
from __future__ import annotations

from collections.abc import Callable

from ..checks import Check, CheckList, check, not_applicable
from .server_info import ApiClient, Archive, Exchange, archive


def reachable(client: ApiClient, rec: Archive, name: str = "server.reachable") -> Check:
    ex = client.get("/health", timeout=15)
    ev = archive(rec, name, ex, server=client.server.describe())
    return check(name, ex.status is not None, node="head",
                 observed=f"{client.server.base_url}: {ex.summary()}",
                 expected="an HTTP answer from GET /health",
                 fix="start the server (04_launch) or pass the right base_url; a refused connection means "
                     "nothing listens there", evidence=ev, data={"latency_s": round(ex.latency_s, 4),
                                                                 "server": client.server.describe()},
                 cause="server")


def precheck(client: ApiClient | None, dry_run: bool, what: str) -> CheckList | None:
    """Rows that end a step early: N/A in a dry run (no client). None = go on (the caller then checks
    ``server.reachable``)."""
    if client is None or dry_run:
        return CheckList([not_applicable(what, "dry run: no server was launched, no request sent", node="head")])
    return None


def check_refused(name: str, ex: Exchange, *, expect_status: int = 400, max_latency_s: float = 60.0,
                  evidence: list[str] = (), request: str = "", expected_text: str = "") -> Check:
    """The server refuses quickly with ``expect_status`` (not a 200, not a 500, not a hang)."""
    ok = ex.status == expect_status and ex.latency_s <= max_latency_s
    if ex.status is None:
        observed = f"no answer: {ex.error} (a hang, not a refusal)"
    else:
        observed = f"{ex.summary()}: {ex.error_message()[:160]!r}"
    return check(name, ok, node="head", observed=observed,
                 expected=f"HTTP {expect_status} within {max_latency_s:.0f} s" + (f" ({expected_text})" if expected_text else ""),
                 fix=f"the server must reject this request with {expect_status}; a 200 means the limit is not "
                     "enforced, no answer means it hangs",
                 evidence=evidence, data={"request": request, "latency_s": round(ex.latency_s, 4),
                                          "status": ex.status})


def guard(name: str, fn: Callable[[], Check | list[Check]]) -> list[Check]:
    """Run one case; an unexpected exception becomes a FAIL row instead of killing the step."""
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - reported as a row
        return [check(name, False, node="head", observed=f"{type(exc).__name__}: {str(exc)[:300]}",
                      expected="the case runs", fix="see the traceback in the notebook / raw evidence")]
    return [out] if isinstance(out, Check) else list(out)
