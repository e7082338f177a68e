"""One active instance: a lease in the control service (issue 17 items 3 and 4).

Capture holds `capture::<source_id>`, delivery `delivery::<pipeline>`. While another
instance holds it this one is a standby: healthy, not ready (`/ready` says who holds it),
asking again every TTL/3. Once it holds the lease it renews it every TTL/3 from a thread.
What fences an instance that lost it (paused or cut off longer than the TTL) before its
own renewal can tell it is the service's: capture stamps the lease's generation on every
epoch it records (`ControlClient.capture_generation`, refused once older), delivery's
commits carry its owner generation (`owners.py`). A renewal that finds another holder
calls `on_lost`.

A standby on the same host as the holder takes the lease at once when the holder's process
is gone (a kill -9), instead of waiting out its TTL; a clean stop releases it.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tailrace.control_client import ControlClient
from tailrace.errors import NonRetryableError, RetryableError
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb

__all__ = ["DEFAULT_TTL_S", "Lease", "instance_name", "process_gone"]

log = get_logger(__name__)

DEFAULT_TTL_S = 15.0


def instance_name() -> str:
    """`host:pid:nonce`: unique per process, and tells a standby on the same host whether
    the holder's process still exists."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def process_gone(owner: str) -> bool:
    """Whether `owner` (an `instance_name`) is a process of this host that no longer runs
    (or is a zombie: killed, not yet reaped)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "Z"


class Lease:
    """`service` (capture, delivery) holds `name` for `subject` (its source or pipeline);
    `on_lost(reason)` runs in the renewing thread when another instance holds it."""

    def __init__(self, control: ControlClient, service: str, subject: str,
                 ttl_s: float = DEFAULT_TTL_S, owner: str | None = None) -> None:
        self.control = control
        self.service = service
        self.subject = subject
        self.name = f"{service}::{subject}"
        self.owner = owner or instance_name()
        self.ttl_s = ttl_s
        self.generation = 0
        self.lost = ""  # why this instance no longer holds it
        self.on_lost: Callable[[str], None] = lambda reason: None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"{service}-lease", daemon=True)

    def wait(self, stopping: Callable[[], bool], standby: Callable[[str], None],
             take_over: bool = False) -> bool:
        """Block until this instance holds the lease (True) or `stopping()` (False); while
        another holds it, `standby(reason)` says who. `take_over`: take it from whoever holds
        it now (an operator's explicit take-over; the holder is fenced)."""
        take_over_from = ""
        said = ""
        while not stopping():
            try:
                lease = self.control.acquire_lease(self.name, self.owner, self.ttl_s,
                                                   take_over_from)
            except (RetryableError, NonRetryableError) as e:
                standby(f"standby: cannot ask the control service for the {self.service} "
                        f"lease: {e}")
                self._sleep(stopping, self.ttl_s / 3)
                continue
            if lease.held:
                self.generation = lease.generation
                log.info(f"{self.service} lease held: this instance is the active one",
                         lease=self.name, instance=self.owner, generation=lease.generation,
                         ttl_s=self.ttl_s)
                self._thread.start()
                return True
            if take_over:
                log.warning(f"taking the {self.service} lease over (asked for): the holder "
                            "is fenced", holder=lease.owner, lease=self.name)
                take_over_from = lease.owner
                continue
            take_over_from = lease.owner if process_gone(lease.owner) else ""
            if take_over_from:
                log.warning(f"the {self.service} instance holding the lease is gone from this "
                            "host; taking it over", holder=lease.owner, lease=self.name)
                continue
            reason = (f"standby: {self.service} instance {lease.owner} holds {self.subject} "
                      f"(lease generation {lease.generation}); this one takes over if its "
                      f"lease lapses ({self.ttl_s:g} s without renewal)")
            if lease.owner != said:
                log.info("standby", holder=lease.owner, lease=self.name, instance=self.owner)
                said = lease.owner
            standby(reason)
            self._sleep(stopping, self.ttl_s / 3)
        return False

    def fenced(self, reason: str) -> bool:
        """Whether `reason` (a refusal of the control service) says another instance holds
        the lease now; if so this instance has lost it."""
        if self.generation and f"{self.service} lease generation" in reason and \
                "is fenced" in reason:
            self.lost = self.lost or reason
        return bool(self.lost)

    def release(self) -> None:
        """After a clean stop: a standby takes over at once."""
        self._stopped.set()
        if self._thread.ident is not None:
            self._thread.join(5.0)
        if self.generation and not self.lost:
            try:
                self.control.release_lease(self.name, self.owner)
            except (RetryableError, NonRetryableError) as e:
                log.warning(f"cannot release the {self.service} lease; a standby waits for "
                            "it to lapse", error=str(e))

    def confirm(self) -> bool:
        """Renew now: whether this instance still holds the lease (before taking something
        only the holder may take, such as a replication slot another session streams from).
        Raises RetryableError when the control service cannot say."""
        lease = self.control.acquire_lease(self.name, self.owner, self.ttl_s)
        if lease.held and lease.generation == self.generation:
            return True
        self._lose(lease)
        return False

    def _lose(self, lease: pb.Lease) -> None:
        if self.lost:
            return
        self.lost = (f"{self.service} lease of {self.subject} lost: instance {lease.owner} "
                     f"holds it now (generation {lease.generation})")
        log.error(f"{self.service} lease lost", holder=lease.owner, lease=self.name)
        self.on_lost(self.lost)

    def _renew(self) -> None:
        while not self._stopped.wait(self.ttl_s / 3):
            try:
                if not self.confirm():
                    return
            except (RetryableError, NonRetryableError) as e:  # its epochs are fenced anyway
                log.warning(f"cannot renew the {self.service} lease; trying again",
                            error=str(e))

    @staticmethod
    def _sleep(stopping: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not stopping() and time.monotonic() < deadline:
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
