"""The plug-in API: everything a plug-in action package imports, and the only module of devsched it may import.

A plug-in declares an `ActionPlugin` under the `devsched.actions` entry-point group:

```toml
[project.entry-points."devsched.actions"]
my-action = "my_package:plugin"
```

```python
from devsched.agent.plugin import ActionPlugin, ActionResult, ArgsModel, StepContext, parse_args, shell


class MyArgs(ArgsModel):
    target: str


async def run(ctx: StepContext) -> ActionResult:
    args = parse_args(MyArgs, "my-action", ctx.args)
    return await shell(replace(ctx, args={"command": f"flash {shlex.quote(args.target)}"}))


plugin = ActionPlugin(run=run, args=MyArgs)
```

The agent's other modules can change from one release to the next; what this module names is the contract
(an import-linter contract in the root pyproject.toml keeps `plugins/` to it).
"""

from __future__ import annotations

from devsched.agent.actions import PLUGIN_GROUP
from devsched.agent.shell import shell
from devsched.agent.steps import (
    Action,
    ActionError,
    ActionPlugin,
    ActionResult,
    Interrupt,
    RunIdentity,
    StepContext,
    parse_args,
)
from devsched.protocol.base import RequestModel as ArgsModel
from devsched.protocol.plans import StepStatus

__all__ = [
    "PLUGIN_GROUP",
    "Action",
    "ActionError",
    "ActionPlugin",
    "ActionResult",
    "ArgsModel",
    "Interrupt",
    "RunIdentity",
    "StepContext",
    "StepStatus",
    "parse_args",
    "shell",
]
