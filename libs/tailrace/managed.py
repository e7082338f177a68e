"""Managed mode (`tailrace-capture --managed NAME`, `tailrace-delivery --managed NAME`): run
the pipeline spec the control service keeps (`tailrace apply`), and follow it.

The service reads the current version, expands its `${VAR}`s with its own environment and
runs it. A thread looks at the control service every `poll_s`; when a newer version is
applied it stops the run gracefully, which is lossless (what was read is published and
acknowledged, the checkpoints are where the next run starts), and the process runs the
new version: added tables, added or removed sinks, without a restart of the process. When
the spec is deleted the run stops and the process exits 0.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable

from tailrace.config import ControlSpec, PipelineSpec, parse_pipeline
from tailrace.control_access import service_client
from tailrace.control_client import ControlClient, ControlRefused, ControlUnavailable
from tailrace.errors import ConfigError
from tailrace.logs import get_logger

log = get_logger(__name__)

DEFAULT_POLL_S = 5.0


def bootstrap_control(address: str, token_file: str | None, ca: str | None) -> ControlSpec:
    """The control service a managed process asks for its spec (`--control`,
    `--token-file` or $TAILRACE_SERVICE_TOKEN, `--control-ca`)."""
    tls = {"ca": ca} if ca else None
    try:
        return ControlSpec.model_validate({"address": address, "token_file": token_file,
                                           "tls": tls})
    except ValueError as e:
        raise ConfigError(f"--control {address}: {e}") from None


class ManagedSpec:
    """One pipeline's spec as the control service keeps it, and a watch on its version."""

    def __init__(self, control: ControlSpec, name: str, poll_s: float = DEFAULT_POLL_S) -> None:
        self.name = name
        self.version = 0
        self._client: ControlClient = service_client(control, retry_for=60)
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.changed = threading.Event()  # a newer version (or a delete) is there
        self.deleted = False

    def load(self) -> PipelineSpec | None:
        """The current version, parsed with this process's environment; None once deleted.
        Raises `ConfigError` when it does not validate here (an unset variable, say)."""
        self.changed.clear()
        try:
            record = self._client.get_spec(self.name)
        except ControlRefused as e:
            if "was deleted" in e.details:
                self.deleted = True
                return None
            raise ConfigError(f"--managed {self.name}: {e.details}") from None
        self.version = record.version
        spec = parse_pipeline(record.text, source=f"{self.name} v{record.version}")
        if spec.name != self.name:
            raise ConfigError(f"--managed {self.name}: the stored spec names pipeline "
                              f"{spec.name}")
        log.info("managed pipeline spec loaded", pipeline=self.name, version=self.version)
        return spec

    def watch(self, on_change: Callable[[], None]) -> None:
        """Call `on_change` (once) when a newer version is applied or the spec deleted."""
        self.unwatch()
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, args=(on_change,),
                                        name="managed-spec", daemon=True)
        self._thread.start()

    def unwatch(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _poll(self, on_change: Callable[[], None]) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                versions = self._client.spec_history(self.name)
            except (ControlUnavailable, ControlRefused) as e:
                log.warning("cannot look at the managed spec; the run goes on", pipeline=self.name,
                            reason=str(e))
                continue
            latest = versions[-1] if versions else None
            if latest is not None and latest.version != self.version:
                self.deleted = latest.deleted
                log.info("managed pipeline spec changed; stopping this run to load it",
                         pipeline=self.name, running=self.version, latest=latest.version,
                         deleted=latest.deleted)
                self.changed.set()
                on_change()
                return

    def close(self) -> None:
        self.unwatch()
        self._client.close()


def add_managed_options(parser: argparse.ArgumentParser) -> None:
    """`--managed NAME` and how to reach the control service that keeps the spec."""
    group = parser.add_argument_group("managed mode (the spec kept by the control service)")
    group.add_argument("--managed", metavar="PIPELINE",
                       help="run the spec the control service keeps for PIPELINE (`tailrace "
                            "apply`) instead of a file, and load each new version as it is "
                            "applied; exit 0 when it is deleted")
    group.add_argument("--control", default=os.environ.get("TAILRACE_CONTROL",
                                                           "127.0.0.1:50051"),
                       help="--managed: the control service (default $TAILRACE_CONTROL or "
                            "127.0.0.1:50051; replicas as host1:port,host2:port)")
    group.add_argument("--token-file", default=None,
                       help="--managed: the service token's file (default "
                            "$TAILRACE_SERVICE_TOKEN)")
    group.add_argument("--control-ca", default=None,
                       help="--managed: talk TLS to the control service, trusting this CA")
    group.add_argument("--poll-s", type=float, default=DEFAULT_POLL_S,
                       help="--managed: look for a new version this often (default %(default)s)")


def managed_spec(args: argparse.Namespace, prog: str) -> ManagedSpec | None:
    """The `ManagedSpec` the arguments ask for; None for a spec file. Raises `ConfigError`
    naming the argument to fix."""
    if (args.pipeline is None) == (args.managed is None):
        raise ConfigError(f"{prog}: give a pipeline spec file or --managed PIPELINE (one)")
    if args.managed is None:
        return None
    if args.poll_s <= 0:
        raise ConfigError(f"{prog}: --poll-s must be more than 0")
    return ManagedSpec(bootstrap_control(args.control, args.token_file, args.control_ca),
                       args.managed, args.poll_s)


def wait_until_stopped_or_changed(stopped: threading.Event, managed: ManagedSpec | None) -> None:
    """After a fatal error: keep serving /health until stopped, or until a new version of a
    managed spec is there to try."""
    while not stopped.wait(1.0):
        if managed is not None and managed.changed.is_set():
            return


def run_versions(managed: ManagedSpec, stopped: threading.Event,
                 run: Callable[[PipelineSpec], int], on_change: Callable[[], None],
                 service: str) -> int:
    """`run` each version of the managed spec in turn (`on_change` ends a run when a newer
    one is applied), until the spec is deleted (0) or `stopped`; the last run's exit code."""
    try:
        while not stopped.is_set():
            try:
                spec = managed.load()
            except ConfigError as e:
                log.error("managed pipeline spec cannot run here", reason=str(e))
                return 2
            if spec is None:
                log.info(f"managed pipeline spec deleted; {service} stops", pipeline=managed.name)
                return 0
            managed.watch(on_change)
            code = run(spec)
            managed.unwatch()
            if stopped.is_set() or not managed.changed.is_set():
                return code
            log.info("loading the new version of the managed spec", pipeline=managed.name)
        return 0
    finally:
        managed.close()
