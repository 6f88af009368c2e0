"""aioqueue: an asyncio-native job queue for Redis and Valkey.

Every exception it raises derives from ``AioQueueError``, in three families: ``UsageError``
(the call cannot work as made), ``ServerError`` (the server failed; retrying may help) and
``JobError`` (the job, batch or lease is not what was asked for). The whole tree is in the API
reference, under "Exceptions".
"""

import types as _types

from ._app.app import App as App
from ._app.batch import Batch as Batch
from ._app.context import JobContext as JobContext
from ._app.context import current_job as current_job
from ._app.logs import JobContextFilter as JobContextFilter
from ._app.logs import JsonLogFormatter as JsonLogFormatter
from ._app.schedules import ScheduleInfo as ScheduleInfo
from ._app.schedules import Schedules as Schedules
from ._app.sync import SyncClient as SyncClient
from ._app.sync import SyncJob as SyncJob
from ._app.task import Backoff as Backoff
from ._app.task import BoundTask as BoundTask
from ._app.task import Call as Call
from ._app.task import Chain as Chain
from ._app.task import Task as Task
from ._app.workflow import Workflow as Workflow
from ._app.workflow import WorkflowHandle as WorkflowHandle
from ._app.workflow import WorkflowState as WorkflowState
from ._model.batchinfo import BatchInfo as BatchInfo
from ._model.batchinfo import BatchItem as BatchItem
from ._model.batchinfo import BatchState as BatchState
from ._model.claimcheck import ClaimCheck as ClaimCheck
from ._model.claimcheck import PayloadStore as PayloadStore
from ._model.compress import Compression as Compression
from ._model.exceptions import AioQueueError as AioQueueError
from ._model.exceptions import BadSignature as BadSignature
from ._model.exceptions import BatchCancelled as BatchCancelled
from ._model.exceptions import BatchFailed as BatchFailed
from ._model.exceptions import BatchNotFound as BatchNotFound
from ._model.exceptions import ClosedError as ClosedError
from ._model.exceptions import ConfigurationError as ConfigurationError
from ._model.exceptions import CorruptRecord as CorruptRecord
from ._model.exceptions import DecryptionFailed as DecryptionFailed
from ._model.exceptions import DuplicateStep as DuplicateStep
from ._model.exceptions import EmbeddedServerError as EmbeddedServerError
from ._model.exceptions import InvalidHandle as InvalidHandle
from ._model.exceptions import JobCancelled as JobCancelled
from ._model.exceptions import JobError as JobError
from ._model.exceptions import JobFailed as JobFailed
from ._model.exceptions import JobNotChangeable as JobNotChangeable
from ._model.exceptions import JobNotFound as JobNotFound
from ._model.exceptions import LeaseLost as LeaseLost
from ._model.exceptions import NonRetryable as NonRetryable
from ._model.exceptions import NotReplicated as NotReplicated
from ._model.exceptions import PayloadTooLarge as PayloadTooLarge
from ._model.exceptions import QueueFull as QueueFull
from ._model.exceptions import RateLimited as RateLimited
from ._model.exceptions import ResultTimeout as ResultTimeout
from ._model.exceptions import Retry as Retry
from ._model.exceptions import SerializationError as SerializationError
from ._model.exceptions import ServerError as ServerError
from ._model.exceptions import ServerRefused as ServerRefused
from ._model.exceptions import ServerUnavailable as ServerUnavailable
from ._model.exceptions import StartupFailed as StartupFailed
from ._model.exceptions import SyncTimeoutWarning as SyncTimeoutWarning
from ._model.exceptions import UnknownDependency as UnknownDependency
from ._model.exceptions import UnknownTask as UnknownTask
from ._model.exceptions import UsageError as UsageError
from ._model.exceptions import WaitTimedOut as WaitTimedOut
from ._model.exceptions import WorkflowError as WorkflowError
from ._model.hooks import CallNext as CallNext
from ._model.hooks import EnqueueEvent as EnqueueEvent
from ._model.hooks import State as State
from ._model.job import ErrorInfo as ErrorInfo
from ._model.job import Job as Job
from ._model.job import JobInfo as JobInfo
from ._model.job import JobState as JobState
from ._model.job import JobWhy as JobWhy
from ._model.serialize import JsonSerializer as JsonSerializer
from ._model.serialize import PickleSerializer as PickleSerializer
from ._model.serialize import Serializer as Serializer
from ._model.why import WhyReason as WhyReason
from ._model.why import WhyRow as WhyRow
from ._queue.events import JobEvent as JobEvent
from ._queue.events import JobEventKind as JobEventKind
from ._queue.inspect import AttemptInfo as AttemptInfo
from ._queue.inspect import GroupInfo as GroupInfo
from ._queue.inspect import JobDetail as JobDetail
from ._queue.inspect import JobPage as JobPage
from ._queue.inspect import JobSummary as JobSummary
from ._queue.inspect import ResultState as ResultState
from ._queue.inspect import Throughput as Throughput
from ._queue.inspect import ThroughputMinute as ThroughputMinute
from ._queue.payloads import sweep_payloads as sweep_payloads
from ._queue.pull import Reservation as Reservation
from ._queue.queue import Queue as Queue
from ._queue.registry import WorkerInfo as WorkerInfo
from ._queue.rekey import RekeyReport as RekeyReport
from ._queue.sharded import ShardedQueue as ShardedQueue
from ._store.embedded import EmbeddedServer as EmbeddedServer
from ._version import __version__ as __version__
from ._worker.isolation import ProcessIsolation as ProcessIsolation
from ._worker.worker import Worker as Worker

__all__ = [
    "AioQueueError",
    "App",
    "AttemptInfo",
    "Backoff",
    "BadSignature",
    "Batch",
    "BatchCancelled",
    "BatchFailed",
    "BatchInfo",
    "BatchItem",
    "BatchNotFound",
    "BatchState",
    "BoundTask",
    "Call",
    "CallNext",
    "Chain",
    "ClaimCheck",
    "ClosedError",
    "Compression",
    "ConfigurationError",
    "CorruptRecord",
    "DecryptionFailed",
    "DuplicateStep",
    "EmbeddedServer",
    "EmbeddedServerError",
    "EnqueueEvent",
    "ErrorInfo",
    "GroupInfo",
    "InvalidHandle",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobContextFilter",
    "JobDetail",
    "JobError",
    "JobEvent",
    "JobEventKind",
    "JobFailed",
    "JobInfo",
    "JobNotChangeable",
    "JobNotFound",
    "JobPage",
    "JobState",
    "JobSummary",
    "JobWhy",
    "JsonLogFormatter",
    "JsonSerializer",
    "LeaseLost",
    "NonRetryable",
    "NotReplicated",
    "PayloadStore",
    "PayloadTooLarge",
    "PickleSerializer",
    "ProcessIsolation",
    "Queue",
    "QueueFull",
    "RateLimited",
    "RekeyReport",
    "Reservation",
    "ResultState",
    "ResultTimeout",
    "Retry",
    "ScheduleInfo",
    "Schedules",
    "SerializationError",
    "Serializer",
    "ServerError",
    "ServerRefused",
    "ServerUnavailable",
    "ShardedQueue",
    "StartupFailed",
    "State",
    "SyncClient",
    "SyncJob",
    "SyncTimeoutWarning",
    "Task",
    "Throughput",
    "ThroughputMinute",
    "UnknownDependency",
    "UnknownTask",
    "UsageError",
    "WaitTimedOut",
    "WhyReason",
    "WhyRow",
    "Worker",
    "WorkerInfo",
    "Workflow",
    "WorkflowError",
    "WorkflowHandle",
    "WorkflowState",
    "__version__",
    "current_job",
    "sweep_payloads",
]


def _home_public_names() -> None:
    """Every public class and function says it comes from ``aioqueue`` (its ``__module__``),
    not from the private module that defines it: reprs, tracebacks, pickles and the API
    reference show the import path users have, and the layout stays free to move."""
    for name in __all__:
        value = globals()[name]
        homed = isinstance(value, type | _types.FunctionType)
        if homed and value.__module__.startswith("aioqueue._"):
            value.__module__ = __name__


_home_public_names()
