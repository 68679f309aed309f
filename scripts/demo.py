"""specctl demo: controller + patched vLLM (CPU, n-gram k=4) + a mixed workload, then the stack stays up.

Steps: make tokens (``.cache/demo/tokens.env``), start ``specctl serve`` on 127.0.0.1:8081 with the SQLite file
``.cache/demo/specctl.db``, start vLLM's OpenAI server on 127.0.0.1:8000 with the engine patch
(``--scheduler-cls``, ``--middleware``, the plugin), send a mixed workload through the OpenAI endpoint (prose,
JSON with and without response_format, code, code edits, tool calls, summaries, multi-turn), print per category
the acceptance histogram, the k and method chosen and why, then wait for Ctrl-C and stop both cleanly.

Usage: ``python scripts/demo.py --model .cache/models/SmolLM2-135M-Instruct [--once]``
(``--once``: exit after the report instead of staying up; used to check the demo itself).
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.support import controller_api
from bench.support.specctl_serve import SpecctlServe
from bench.support.stack import wait_attached
from bench.support.vllm_server import NGRAM, SERVED_MODEL, VllmServer, spec_counters
from bench.support.workload import CATEGORIES, build_workload, run_workload

ENGINE_ID = "demo-cpu-0"
#: The demo's workload is a few hundred drafts per category; the controller's default evidence threshold
#: (200 decayed drafts) would keep most categories on the engine's static config, so the demo lowers it.
DEMO_CONTROLLER_ENV = {"SPECCTL_POLICY_MIN_EVIDENCE": "40"}


def tokens(workdir: Path) -> tuple[str, str]:
    """Admin and ingest tokens, created once and kept (mode 0600) so the CLI can reuse them."""
    path = workdir / "tokens.env"
    if not path.exists():
        path.write_text(f"export SPECCTL_ADMIN_TOKEN={secrets.token_urlsafe(24)}\n"
                        f"export SPECCTL_INGEST_TOKEN={secrets.token_urlsafe(24)}\n")
        path.chmod(0o600)
    values = dict(line.removeprefix("export ").split("=", 1) for line in path.read_text().splitlines() if line.strip())
    return values["SPECCTL_ADMIN_TOKEN"], values["SPECCTL_INGEST_TOKEN"]


def histogram_bar(shares: list[float], width: int = 24) -> str:
    return "  ".join(f"{j}:{'#' * round(s * width):<{width}s}{100 * s:5.1f}%" for j, s in enumerate(shares))


def report(controller_url: str, vllm_delta: Any, results: list) -> None:
    print("\n=== per category (controller's view) ===")
    views = {v["category"]: v for v in controller_api.categories(controller_url) if v.get("model") == SERVED_MODEL}
    for name in sorted(views):
        v = views[name]
        d = v.get("decision") or {}
        dist = v.get("acceptance_length_distribution") or []
        print(f"\n[{name}]  request-steps={v.get('request_steps', 0):.0f}  committed={v.get('committed_tokens', 0):.0f}"
              f"  mean acceptance length={v.get('mean_acceptance_length') or 0:.2f}"
              f"  entropy={((v.get('entropy') or {}).get('class'))}")
        if dist:
            print(f"  accepted drafts per step (share of drafts): {histogram_bar(dist, 12)}")
        cond = [f"{p['beta']:.2f}" for p in v.get("positions", [])]
        if cond:
            print(f"  conditional acceptance by position: {' '.join(cond)}")
        print(f"  -> k={d.get('k')} method={d.get('method')} adapt=[{d.get('adapt_k_min')}, {d.get('adapt_k_max')}]"
              f" source={d.get('source')} est. speedup={d.get('estimated_speedup')}")
        print(f"     why: {d.get('reason', '')}")
    ok = sum(r.ok for r in results)
    print(f"\n=== vLLM's own counters over the workload: drafts={vllm_delta.drafts:.0f} "
          f"draft tokens={vllm_delta.draft_tokens:.0f} accepted={vllm_delta.accepted_tokens:.0f}; "
          f"requests ok {ok}/{len(results)} ===")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="HF model folder (scripts/prepare_model.py)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".cache" / "demo")
    parser.add_argument("--port", type=int, default=8000, help="OpenAI endpoint port")
    parser.add_argument("--controller-port", type=int, default=8081)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the mixed workload")
    parser.add_argument("--once", action="store_true", help="stop after the report")
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if not (args.model / "config.json").exists():
        print(f"demo: no model at {args.model}; run scripts/prepare_model.py --out {args.model}", file=sys.stderr)
        return 2
    admin, ingest = tokens(workdir)

    controller = SpecctlServe(workdir / "controller", port=args.controller_port, admin_token=admin,
                              ingest_token=ingest, db=workdir / "specctl.db", env=DEMO_CONTROLLER_ENV)
    engine = VllmServer(args.model.resolve(), workdir / "vllm", port=args.port, speculative=dict(NGRAM),
                        controller_url=controller.url, ingest_token=ingest, engine_id=ENGINE_ID)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"starting the controller on {controller.url} (log: {controller.log_path}) ...", flush=True)
        controller.start()
        started = time.monotonic()
        print(f"starting vLLM on {engine.url} (CPU, n-gram k=4, engine patch; log: {engine.log_path}) ...", flush=True)
        engine.start()
        wait_attached(controller.url, ENGINE_ID)
        print(f"vLLM ready and attached to the controller in {time.monotonic() - started:.0f} s", flush=True)

        prompts = build_workload(per_category=3, max_tokens=96)
        before = spec_counters(engine.metrics())
        results = []
        for i in range(args.rounds):
            t = time.monotonic()
            results += run_workload(engine.url, prompts, concurrency=8)
            print(f"workload round {i + 1}/{args.rounds}: {len(prompts)} requests over {len(CATEGORIES)} "
                  f"categories in {time.monotonic() - t:.0f} s", flush=True)
            time.sleep(2.5)  # one decision interval: the next round runs under the updated policy
        controller_api.wait_stable(controller.url)
        report(controller.url, spec_counters(engine.metrics()) - before, results)

        print(f"""
=== the stack is up ===
  OpenAI endpoint : {engine.url}/v1   (model "{SERVED_MODEL}")
  controller      : {controller.url}   (/v1/categories, /v1/policy, /v1/overrides, /metrics, /docs)
  vLLM metrics    : {engine.url}/metrics
  try:  source {workdir / 'tokens.env'} && specctl status
        specctl override set code --k 1 --reason "try it"
        curl {engine.url}/v1/chat/completions -H 'content-type: application/json' \\
          -d '{{"model": "{SERVED_MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "vllm_xargs": {{"specctl_category": "chat"}}}}'
""", flush=True)
        if args.once:
            return 0 if all(r.ok for r in results) else 1
        print("Ctrl-C stops both.", flush=True)
        while not stop.is_set():
            for name, server in (("vLLM", engine), ("controller", controller)):
                if server.proc is not None and server.proc.poll() is not None:
                    print(f"demo: {name} exited with {server.proc.returncode}; stopping", file=sys.stderr)
                    return 1
            stop.wait(1.0)
        return 0
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping vLLM and the controller ...", flush=True)
        engine.stop()
        controller.stop()
        print("stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
