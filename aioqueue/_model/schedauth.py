"""Who wrote a stored schedule (I12), and what is garbage in the schedule keys (I9).

A worker turns a stored schedule definition into jobs signed with its own key, so with
``App(signing_key=...)`` a definition must come from a key holder: ``app.schedules.add`` (and a
worker storing the schedules declared in code) stores it with a MAC (the field ``mac``: HMAC
over the canonical JSON of the rest, bound to the queue and the schedule's name, see
``Signer.sign_schedule``). A scheduler fires a schedule declared in its own code as declared,
whatever is stored under that name; any other definition it fires only once its MAC verifies.
A definition that fails the check, or cannot be read, is set aside with its reason (listed in
the queue's ``garbled`` hash, like other garbage) and never fires.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .cron import Spec
from .signing import Signer

#: the field of a stored definition that holds its MAC
MAC_FIELD = "mac"
#: the largest stored tick (ms): integers up to 2^53 are exact in Lua and in a JSON double
MAX_TICK = 2**53


def _canonical(rec: Mapping[str, Any]) -> bytes:
    return json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()


def stored_form(spec: Spec, signer: Signer | None) -> str:
    """A schedule's definition as stored: its JSON, with a MAC when the App signs."""
    text = spec.to_json()
    if signer is None:
        return text
    rec = json.loads(text)
    rec[MAC_FIELD] = signer.sign_schedule(spec.queue, spec.name, text.encode())
    return _canonical(rec).decode()


def read_spec(
    queue: str,
    name: str,
    raw: bytes,
    signer: Signer | None,
    declared: Mapping[tuple[str, str], Spec],
) -> Spec:
    """The schedule a scheduler fires for a stored definition: the one declared in code under
    that name if there is one (the declaration wins over what is stored), else the stored one,
    once its MAC verifies (when the App signs).

    Raises:
        ValueError: the definition is garbled, or not made by a key holder (the message says
            which).
    """
    mine = declared.get((queue, name))
    if mine is not None:
        return mine
    if signer is not None:
        try:
            rec = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"schedule {name!r}: garbled definition: {exc}") from exc
        mac = rec.pop(MAC_FIELD, None) if isinstance(rec, dict) else None
        if not isinstance(mac, str) or not signer.verify_schedule(
            queue, name, _canonical(rec), mac
        ):
            raise ValueError(
                f"schedule {name!r}: BadSignature: the definition is not signed by a key "
                "holder of this App (planted, changed, or signed with a key not accepted here)"
            )
    return Spec.from_json(name, queue, raw)


def valid_tick(score: float) -> bool:
    """Whether a stored tick is a time a schedule can have (an integer in [0, 2^53])."""
    return math.isfinite(score) and 0 <= score <= MAX_TICK and score == int(score)
