"""The image's HEALTHCHECK: GET /healthz on this container's gateway; exit 0 when it answers 200.

Standard library only (the slim image has no curl). The port is the gateway's own,
`GATEWAY_HTTP__PORT` (8765 by default).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    port = os.environ.get("GATEWAY_HTTP__PORT", "8765")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=4) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
