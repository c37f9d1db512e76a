"""Fast answers to "can the Hugging Face hub be used right now?".

Without them an offline machine either fails deep inside `datasets` or, depending on its network,
waits through about 23 s of retries before failing. Environment ids whose GEM env downloads a
dataset (`math:*`, `eval:*`, ...) check here first.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from urllib.parse import urlparse

_TRUE = {"1", "on", "yes", "true"}
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def hub_offline() -> bool:
    """True when offline mode is on (`HF_HUB_OFFLINE` / `HF_DATASETS_OFFLINE`, or set in code)."""
    if any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    # Only consult the libraries if they are already imported (importing them costs time).
    hh = sys.modules.get("huggingface_hub.constants")
    if hh is not None and getattr(hh, "HF_HUB_OFFLINE", False):
        return True
    dc = sys.modules.get("datasets.config")
    return dc is not None and bool(getattr(dc, "HF_DATASETS_OFFLINE", False))


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub endpoint opens within `timeout` seconds.

    Behind a proxy a direct connection says nothing, so the answer is then True (let the real
    request decide)."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    # The DNS lookup inside create_connection ignores `timeout`; a daemon thread bounds it.
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout + 0.5)
    return bool(result and result[0])
