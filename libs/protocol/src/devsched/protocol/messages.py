"""Every message of the wire protocol, in one namespace.

The models live in small modules by topic (`plans`, `tasks`, `hosts`, `health`, `leases`, `events`, `logs`, ...),
each saying what it makes public in its `__all__`; import them from here so callers need not know the split.
The request and reply of each endpoint are also on its entry of `devsched.protocol.endpoints`.
"""

from devsched.protocol.artifacts import *  # noqa: F403
from devsched.protocol.base import *  # noqa: F403
from devsched.protocol.events import *  # noqa: F403
from devsched.protocol.health import *  # noqa: F403
from devsched.protocol.hosts import *  # noqa: F403
from devsched.protocol.leases import *  # noqa: F403
from devsched.protocol.logs import *  # noqa: F403
from devsched.protocol.plans import *  # noqa: F403
from devsched.protocol.policies import *  # noqa: F403
from devsched.protocol.tasks import *  # noqa: F403
