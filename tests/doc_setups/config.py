"""Blocks that configure an App (docs/security.md, scaling.md, tasks.md) run after this: the
URL, the environment and the keys the pages name."""

import os

from aioqueue import App

__all__ = ["NEW_KEY", "NEW_SIG", "OLD_KEY", "OLD_SIG", "App", "app", "os", "url"]

url = os.environ["AIOQUEUE_REDIS_URL"]
os.environ.setdefault("AIOQUEUE_SIGNING_KEY", "doc-snippets-signing-key")
os.environ.setdefault("AIOQUEUE_ENCRYPTION_KEY", "doc-snippets-encryption-key-32-b")
NEW_KEY, OLD_KEY = "a new key of 32 bytes, at least..", "the old key of 32 bytes, at least"
NEW_SIG, OLD_SIG = "a new signing key, 16 bytes+", "the old signing key, 16 bytes+"
app = App(url)
