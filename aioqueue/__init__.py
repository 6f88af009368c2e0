"""aioqueue: an asyncio-native job queue for Redis and Valkey.

Every exception it raises derives from ``AioQueueError``, in three families: ``UsageError``
(the call cannot work as made), ``ServerError`` (the server failed; retrying may help) and
``JobError`` (the job, batch or lease is not what was asked for). The whole tree is in the API
reference, under "Exceptions".
"""

from ._app import App as App
from ._batch import Batch as Batch
from ._batch import Call as Call
from ._batch import Chain as Chain
from ._batchinfo import BatchInfo as BatchInfo
from ._batchinfo import BatchItem as BatchItem
from ._batchinfo import BatchState as BatchState
from ._claimcheck import ClaimCheck as ClaimCheck
from ._claimcheck import PayloadStore as PayloadStore
from ._claimcheck import sweep_payloads as sweep_payloads
from ._compress import Compression as Compression
from ._context import JobContext as JobContext
from ._context import current_job as current_job
from ._embedded import EmbeddedServer as EmbeddedServer
from ._events import JobEvent as JobEvent
from ._events import JobEventKind as JobEventKind
from ._exceptions import AioQueueError as AioQueueError
from ._exceptions import BadSignature as BadSignature
from ._exceptions import BatchCancelled as BatchCancelled
from ._exceptions import BatchFailed as BatchFailed
from ._exceptions import BatchNotFound as BatchNotFound
from ._exceptions import ClosedError as ClosedError
from ._exceptions import ConfigurationError as ConfigurationError
from ._exceptions import CorruptRecord as CorruptRecord
from ._exceptions import DecryptionFailed as DecryptionFailed
from ._exceptions import EmbeddedServerError as EmbeddedServerError
from ._exceptions import InvalidHandle as InvalidHandle
from ._exceptions import JobCancelled as JobCancelled
from ._exceptions import JobError as JobError
from ._exceptions import JobFailed as JobFailed
from ._exceptions import JobNotFound as JobNotFound
from ._exceptions import LeaseLost as LeaseLost
from ._exceptions import NotReplicated as NotReplicated
from ._exceptions import PayloadTooLarge as PayloadTooLarge
from ._exceptions import ResultTimeout as ResultTimeout
from ._exceptions import Retry as Retry
from ._exceptions import SerializationError as SerializationError
from ._exceptions import ServerError as ServerError
from ._exceptions import ServerRefused as ServerRefused
from ._exceptions import ServerUnavailable as ServerUnavailable
from ._exceptions import StartupFailed as StartupFailed
from ._exceptions import UnknownTask as UnknownTask
from ._exceptions import UsageError as UsageError
from ._hooks import CallNext as CallNext
from ._hooks import EnqueueEvent as EnqueueEvent
from ._hooks import State as State
from ._inspect import AttemptInfo as AttemptInfo
from ._inspect import GroupInfo as GroupInfo
from ._inspect import JobDetail as JobDetail
from ._inspect import JobPage as JobPage
from ._inspect import JobSummary as JobSummary
from ._inspect import ResultState as ResultState
from ._inspect import Throughput as Throughput
from ._inspect import ThroughputMinute as ThroughputMinute
from ._job import ErrorInfo as ErrorInfo
from ._job import Job as Job
from ._job import JobInfo as JobInfo
from ._job import JobState as JobState
from ._logs import JobContextFilter as JobContextFilter
from ._logs import JsonLogFormatter as JsonLogFormatter
from ._pull import Reservation as Reservation
from ._queue import Queue as Queue
from ._registry import WorkerInfo as WorkerInfo
from ._rekey import RekeyReport as RekeyReport
from ._schedules import ScheduleInfo as ScheduleInfo
from ._schedules import Schedules as Schedules
from ._serialize import JsonSerializer as JsonSerializer
from ._serialize import PickleSerializer as PickleSerializer
from ._serialize import Serializer as Serializer
from ._sharded import ShardedQueue as ShardedQueue
from ._sync import SyncClient as SyncClient
from ._sync import SyncJob as SyncJob
from ._task import Backoff as Backoff
from ._task import BoundTask as BoundTask
from ._task import Task as Task
from ._version import __version__ as __version__
from ._why import JobWhy as JobWhy
from ._why import WhyReason as WhyReason
from ._why import WhyRow as WhyRow
from ._worker import Worker as Worker

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
    "JobNotFound",
    "JobPage",
    "JobState",
    "JobSummary",
    "JobWhy",
    "JsonLogFormatter",
    "JsonSerializer",
    "LeaseLost",
    "NotReplicated",
    "PayloadStore",
    "PayloadTooLarge",
    "PickleSerializer",
    "Queue",
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
    "Task",
    "Throughput",
    "ThroughputMinute",
    "UnknownTask",
    "UsageError",
    "WhyReason",
    "WhyRow",
    "Worker",
    "WorkerInfo",
    "__version__",
    "current_job",
    "sweep_payloads",
]
