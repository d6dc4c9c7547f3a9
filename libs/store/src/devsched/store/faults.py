"""Named fault points: places where a chaos test can have a service process die on the spot.

`point("assign.after_reserve")` SIGKILLs the calling process when the environment variable
`DEVSCHED_FAULT_POINT` names that point, and does nothing otherwise. The variable is read once, at import:
unarmed, a point is a call to a function that returns at once. A killed process gets no chance to roll
back, flush or log (one line to stderr first says where it died), as in a crash; the database rolls back its
open transaction when the connection drops. Only tests set the variable.
"""

from __future__ import annotations

import os
import signal

#: The environment variable that names the point at which the process dies.
FAULT_POINT_ENV = "DEVSCHED_FAULT_POINT"

#: Every point, by name: where it is and what a death there leaves behind.
POINTS = {
    "assign.after_reserve": "assignment: attempts (the reservations) inserted, the transaction not committed",
    "handover.after_reserve": "a report's hand-over: the report and the freed device's next attempt written, "
    "the transaction not committed",
    "placement.after_reserve": "a submit's placement: the task and its attempt and reservation written, the "
    "transaction not committed",
    "sweep.after_expire": "lease sweep: a batch of attempts marked expired, their tasks not yet decided",
    "relay.after_publish": "outbox relay: a batch published to JetStream (at once or from the table), not marked sent",
}

_ARMED = os.environ.get(FAULT_POINT_ENV) or None


def point(name: str) -> None:
    """Die here (SIGKILL) if `DEVSCHED_FAULT_POINT` is `name`; otherwise return at once."""
    if _ARMED is not None and name == _ARMED:
        os.write(2, f"fault point {name}: killing process {os.getpid()}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
