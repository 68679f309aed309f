"""``specctl bench``'s edge to the controller's overrides: what is in force, what the bench may pin, pinning and
putting back (:class:`specctl_vllm.controller.bench.OverrideLedger` decides which writes; this module sends them).

No operator's override is ever replaced unless ``--replace-overrides`` says so, and what the bench replaced or
set is put back exactly as it was found when the run ends, also when it fails.

Kept free of heavy imports (httpx and the bench model are imported where used): ``specctl --help`` loads it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specctl_vllm.controller.bench import Action, Config, OverrideLedger


class Unreachable(RuntimeError):
    """An endpoint or the controller could not be reached, or refused (exit 3)."""


class Refused(RuntimeError):
    """The run would replace an operator's override and ``--replace-overrides`` was not given (exit 2)."""


def _admin_headers() -> dict[str, str]:
    token = os.environ.get("SPECCTL_ADMIN_TOKEN", "")
    return {"Authorization": f"Bearer {token}"} if token else {}


def current_overrides(controller: str) -> list[dict[str, Any]]:
    """GET /v1/overrides: the overrides in force now."""
    import httpx

    url = f"{controller.rstrip('/')}/v1/overrides"
    try:
        response = httpx.get(url, headers=_admin_headers(), timeout=10.0)
    except httpx.HTTPError as exc:
        raise Unreachable(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        raise Unreachable(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
    return list(response.json())


def apply_overrides(controller: str, actions: list[Action]) -> None:
    """PUT or DELETE each (category, body) action (:class:`OverrideLedger` says which)."""
    import httpx

    from specctl_vllm.controller.bench import BENCH_ACTOR

    headers = _admin_headers()
    for category, body in actions:
        url = f"{controller.rstrip('/')}/v1/overrides/{category}"
        try:
            if body is None:
                response = httpx.delete(url, params={"reason": "specctl bench: restored", "actor": BENCH_ACTOR},
                                        headers=headers, timeout=10.0)
                if response.status_code == 404:
                    continue
            else:
                response = httpx.put(url, json=body, headers=headers, timeout=10.0)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            hint = " (set SPECCTL_ADMIN_TOKEN)" if response.status_code in (401, 403) else ""
            raise Unreachable(f"{url}: HTTP {response.status_code}: {response.text[:200]}{hint}")


def claim(controller: str | None, configs: Sequence[Config], categories: Sequence[str],
          replace: bool) -> OverrideLedger:
    """The ledger of a run: the overrides found before it, once the run may pin what its configurations pin.

    Raises :class:`Refused` when a category it would pin carries an operator's override and ``replace`` is
    false (nothing written), :class:`Unreachable` when the controller cannot be read."""
    from specctl_vllm.controller.bench import BENCH_ACTOR, OverrideLedger, operator_overrides, pinned_categories

    if controller is None or not any(c.kind == "override" for c in configs):
        return OverrideLedger(found={})
    found = current_overrides(controller)
    taken = operator_overrides(found, pinned_categories(configs, categories))
    if taken and not replace:
        raise Refused(f"categories {', '.join(taken)} have an operator's override the run would replace; clear "
                      "them, or pass --replace-overrides (they are put back after the run)")
    return OverrideLedger(found={o["category"]: o for o in found if o.get("actor") != BENCH_ACTOR})


def put_back(controller: str | None, ledger: OverrideLedger) -> None:
    """Leave the controller as it was found: what the bench pinned is put back, nothing else (never raises)."""
    if not controller or not ledger.pinned:
        return
    try:
        apply_overrides(controller, ledger.restore())
    except Unreachable as exc:
        print(f"specctl bench: could not restore the overrides it changed: {exc}", file=sys.stderr)
