"""Container health probe: exit 0 when the service answers 200 on ``/ready``, else 1.

Used by the images' ``HEALTHCHECK`` and by docker-compose. Standard library only, because the slim
and CUDA runtime images ship no curl. It reads the same ``DISAN_*`` variables as the service (port,
API key) so a changed port or an enabled API key never turns a healthy container "unhealthy".
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

# /ready is 503 until the bundle is loaded and warmed up, so the probe also covers start-up.
READY_PATH = "/ready"
TIMEOUT_S = 3.0


def main() -> int:
    """Probe http://127.0.0.1:$DISAN_PORT/ready once; print one line on failure."""
    port = os.environ.get("DISAN_PORT", "8000")
    request = urllib.request.Request(f"http://127.0.0.1:{port}{READY_PATH}")
    api_key = os.environ.get("DISAN_API_KEY")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:  # HTTPError (e.g. 503) is a URLError
        print(f"healthcheck: {READY_PATH} not ready: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
