#!/bin/sh
# Two worker processes for the quick start's tasks (examples/tasks.py), each serving a
# Kubernetes liveness endpoint: GET /healthz on $HEALTH_PORT and the next port (default 8081
# and 8082). SIGTERM (what Kubernetes sends) stops both gracefully; a worker that dies is
# restarted. Extra arguments go to the worker command, e.g. --url redis://host:6379/0.
# Check from outside: python -m aioqueue health (exit 0 while a live worker is registered).
# $PYTHON: the interpreter to run (default python3).
exec "${PYTHON:-python3}" -m aioqueue worker examples.tasks:app --processes 2 \
    --health-port "${HEALTH_PORT:-8081}" --health-host 127.0.0.1 "$@"
