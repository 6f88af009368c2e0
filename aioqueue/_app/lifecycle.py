"""An App's lifecycle: ``State``, unopened, open or closed (``App.rebind`` makes a closed or
unopened App unopened again, on a new server and prefix: what the testing kit's ``bind`` lends
a module-level App to one test with)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


class State(enum.Enum):
    UNOPENED = 1
    OPEN = 2
    CLOSED = 3
