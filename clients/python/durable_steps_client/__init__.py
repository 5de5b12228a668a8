"""durable_steps for Python: typed calls of the extension's functions over psycopg2, an
exception class per documented SQLSTATE, a worker that runs tasks (steps whose body is
application code) in threads, and (durable_steps_client.flask) a decorator for idempotent requests.
See clients/python/README.md."""
from .calls import (EventEmitted, IdempotentBegin, IdempotentResponse, RunResult, RunStart,
                    StepResult, cancel_step, emit_event, http_step, idempotent, idempotent_abandon,
                    idempotent_begin, idempotent_finish, idempotent_renew, retry_step, run_step,
                    start_run, task_step, wait_run, wait_step)
from .errors import *  # noqa: F401,F403 -- every exception class
from .errors import BY_SQLSTATE, DurableStepsError, from_exception
from .worker import TaskContext, Worker
from .workflows import (StepContext, StepFailed, Workflow, WorkflowContext, WorkflowMismatch,
                        workflow)

__version__ = "0.1.0"
