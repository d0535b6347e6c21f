"""Reading the broker: how many messages wait on a queue (the sweeper and the metrics exporter)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

REDIS_SCHEMES = ("redis://", "rediss://")

QueueDepth = Callable[[str], "int | None"]  # messages waiting on a queue, None when it cannot be read


def queue_depth_reader(broker_url: str | None, timeout_s: float = 2.0) -> QueueDepth:
    """A function giving the number of messages waiting on a queue: Redis LLEN of kombu's list for a direct
    queue at priority 0, over one client made on first use. None for another broker, or when Redis cannot
    be reached (logged)."""
    state: dict[str, Any] = {}
    lock = threading.Lock()

    def depth(queue: str) -> int | None:
        if not broker_url or not broker_url.startswith(REDIS_SCHEMES):
            return None
        try:
            with lock:
                if "client" not in state:
                    import redis

                    state["client"] = redis.Redis.from_url(
                        broker_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
                    )
                client = state["client"]
            return int(client.llen(queue))
        except Exception:
            logger.warning("could not read the depth of queue %s", queue, exc_info=True)
            return None

    return depth
