"""A task's policy for failures and logs: which exceptions are retried (``retry_on``,
``dont_retry_on``) and which of its own logging records are kept with the job
(``capture_logs``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .exceptions import ConfigurationError, NonRetryable

#: exception types, as ``retry_on=`` and ``dont_retry_on=`` take them
ExcTypes = tuple[type[BaseException], ...]


def _types(value: type[BaseException] | ExcTypes | None, name: str) -> ExcTypes | None:
    if value is None:
        return None
    kinds = (value,) if isinstance(value, type) else value
    if not isinstance(kinds, tuple) or not all(
        isinstance(k, type) and issubclass(k, BaseException) for k in kinds
    ):
        raise ConfigurationError(f"{name}= takes an exception type or a tuple of them: {value!r}")
    return kinds


@dataclass(frozen=True, slots=True)
class TaskPolicy:
    """A task's failure and log policy.

    Attributes:
        retry_on: only these exceptions are retried (None: every one).
        dont_retry_on: these exceptions dead-letter the job at once (checked first).
        capture_logs: the level from which the task's own ``logging`` records are kept with
            the job (None: none are).
    """

    retry_on: ExcTypes | None = None
    dont_retry_on: ExcTypes = ()
    capture_logs: int | None = None

    @classmethod
    def of(
        cls,
        retry_on: type[BaseException] | ExcTypes | None,
        dont_retry_on: type[BaseException] | ExcTypes | None,
        capture_logs: int | str | None,
    ) -> TaskPolicy:
        """A policy from ``@app.task``'s arguments, checked.

        Raises:
            ConfigurationError: not exception types, or not a logging level.
        """
        level = capture_logs
        if isinstance(level, str):
            named = logging.getLevelName(level.upper())
            level = named if isinstance(named, int) else None
            if level is None:
                raise ConfigurationError(f"capture_logs: no logging level {capture_logs!r}")
        elif level is not None and (isinstance(level, bool) or not isinstance(level, int)):
            raise ConfigurationError(f"capture_logs= takes a logging level: {capture_logs!r}")
        return cls(
            _types(retry_on, "retry_on"), _types(dont_retry_on, "dont_retry_on") or (), level
        )

    def retries(self, error: BaseException) -> bool:
        """Whether a run that raised ``error`` may be retried (attempts permitting)."""
        if isinstance(error, (NonRetryable, *self.dont_retry_on)):
            return False
        return self.retry_on is None or isinstance(error, self.retry_on)


#: the policy of a task that sets none: retry every exception, keep no logging records
DEFAULT_POLICY = TaskPolicy()
