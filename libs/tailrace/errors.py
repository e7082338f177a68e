"""One root for every Tailrace error; subclasses say what the caller should do.

- `ConfigError`: the input is wrong; fix the spec or the setting named in the message.
- `RetryableError`: a transient failure (connection lost, timeout); back off and try again.
- `NonRetryableError`: retrying will not help (auth, message too large); fail now.
- `FatalError`: the pipeline must stop (fenced producer, lost position); health says why.
"""

from __future__ import annotations


class TailraceError(Exception):
    """Root of all Tailrace errors."""


class ConfigError(TailraceError):
    """The pipeline spec or a setting is invalid; the message names what to fix."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class RetryableError(TailraceError):
    """Transient: back off and retry."""


class SourceUnreachableError(RetryableError):
    """A connection to the source's server could not be made (refused, timed out): retried
    with backoff; `/ready` names the source while it lasts."""


class SourceLostError(RetryableError):
    """The connection to the source's log broke; everything read before it is good. Capture
    finishes publishing that, then reconnects and continues after it."""


class NonRetryableError(TailraceError):
    """Permanent for this input: retrying will not help."""


class FatalError(TailraceError):
    """The pipeline cannot go on; it stops and health reports the reason."""


class FencedError(FatalError):
    """A newer delivery instance claimed the pipeline; this one must stop writing. Not a
    failure of the pipeline: the new owner carries on."""


class PositionLostError(FatalError):
    """The source no longer has the history after our checkpoint."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"position lost: {reason}. Re-snapshot required.")


class SourceConfigurationError(ConfigError):
    """The source database is not configured for CDC (e.g. wal_level, binlog_format)."""
