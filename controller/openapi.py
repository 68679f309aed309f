"""Export the controller's OpenAPI document to ``controller/openapi.json`` (committed), or check it.

    python -m specctl_vllm.controller.openapi            # write it
    python -m specctl_vllm.controller.openapi --check    # exit 1 if the committed file differs from the code
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).with_name("openapi.json")


def build() -> dict[str, Any]:
    from specctl_vllm.controller.service.app import create_app
    from specctl_vllm.controller.service.settings import AuthSettings, ServerSettings, ServiceSettings, StoreSettings

    # Settings are passed explicitly (no environment): the document must not depend on the machine.
    settings = ServiceSettings(
        server=ServerSettings.model_construct(),
        auth=AuthSettings.model_construct(insecure_dev=True),
        store=StoreSettings.model_construct(),
    )
    return create_app(settings).openapi()


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specctl_vllm.controller.openapi", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed document is stale")
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH, help="path of the document")
    args = parser.parse_args(argv)
    text = render(build())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run `python -m specctl_vllm.controller.openapi`", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
