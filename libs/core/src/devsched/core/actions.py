"""Which actions a plan needs and which a device offers, matched as reserved labels.

Every agent runs the built-in actions; any other action is a plug-in that only some hosts have. A host
advertises its plug-ins when it registers, and each of its devices then carries one reserved label per
plug-in (`devsched.action.<name>` = `"true"`); a task whose plan uses plug-ins carries the same labels in
its selector. So a task goes only to a device whose host has every plug-in its plan uses, by the one
matching rule there is (a device's labels contain the selector's), in every path that places work, and
needs nothing new in the queries. Like Kubernetes' node feature labels, they are derived, never written
by hand: registrations and selectors that name the reserved prefix are refused, and views leave them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Actions every agent runs; their arguments are checked by the protocol's own models.
BUILTIN_ACTIONS: frozenset[str] = frozenset({"shell", "sleep", "noop"})
#: Label keys that say "this device's host has the plug-in action named after the prefix".
ACTION_LABEL_PREFIX = "devsched.action."
#: The value of an action label.
ACTION_LABEL_VALUE = "true"


def plugin_actions(actions: Iterable[str]) -> list[str]:
    """The plug-in actions among `actions` (built-ins left out), sorted, without repeats."""
    return sorted(set(actions) - BUILTIN_ACTIONS)


def action_labels(actions: Iterable[str]) -> dict[str, str]:
    """The reserved labels standing for the plug-ins among `actions`."""
    return {ACTION_LABEL_PREFIX + name: ACTION_LABEL_VALUE for name in plugin_actions(actions)}


def is_reserved(key: str) -> bool:
    """Whether a label key is one of the derived action labels (never given by a user or a host)."""
    return key.startswith(ACTION_LABEL_PREFIX)


def visible_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """`labels` without the derived action labels: what a user or a host wrote."""
    return {k: v for k, v in labels.items() if not is_reserved(k)}


def actions_of_labels(labels: Mapping[str, str]) -> list[str]:
    """The plug-in actions a set of labels stands for, sorted."""
    return sorted(k.removeprefix(ACTION_LABEL_PREFIX) for k in labels if is_reserved(k))
