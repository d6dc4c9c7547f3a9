"""The wire as it was before the endpoint table: subjects, micro names, schemas and a host's permissions.

Pinned literally (values taken from the hand-written lists the table replaced), so that a change to how these
are derived is proven to change nothing on the wire.
"""

from __future__ import annotations

import hashlib
import json
from typing import get_type_hints

import pytest

from devsched.protocol.endpoints import ENDPOINTS, HOST_ENDPOINT_VERBS, handlers
from devsched.protocol.schemas import endpoint_schemas
from devsched.protocol.subjects import HostVerb, Subjects
from devsched.scheduler.api import Api
from support.secured_nats import host_user_module

pytestmark = pytest.mark.unit

#: (micro endpoint name, subject served, whether the host id comes from the subject), in `nats micro info` order.
SERVED = [
    ("tasks-submit", "devsched.api.tasks.submit", False),
    ("tasks-get", "devsched.api.tasks.get", False),
    ("tasks-list", "devsched.api.tasks.list", False),
    ("tasks-cancel", "devsched.api.tasks.cancel", False),
    ("hosts-list", "devsched.api.hosts.list", False),
    ("devices-drain", "devsched.api.devices.drain", False),
    ("hosts-drain", "devsched.api.hosts.drain", False),
    ("devices-forget", "devsched.api.devices.forget", False),
    ("devices-label", "devsched.api.devices.label", False),
    ("tasks-artifacts", "devsched.api.tasks.artifacts", False),
    ("health-set", "devsched.api.health.set", False),
    ("health-list", "devsched.api.health.list", False),
    ("health-delete", "devsched.api.health.delete", False),
    ("host-register", "devsched.host.*.register", True),
    ("host-heartbeat", "devsched.host.*.heartbeat", True),
    ("host-claim", "devsched.host.*.claim", True),
    ("host-renew", "devsched.host.*.renew", True),
    ("host-report", "devsched.host.*.report", True),
    ("host-release", "devsched.host.*.release", True),
    ("host-artifact", "devsched.host.*.artifact", True),
    ("host-renewals", "devsched.host.*.renewals", True),
    ("host-reports", "devsched.host.*.reports", True),
]

#: sha256 of each endpoint's `$SRV.INFO` metadata (its request and reply JSON Schemas, as sent).
SCHEMAS = {
    "tasks-submit": "1da4a5d4e5f4cf3ffe670c0517732e9b60c2231016596fb3051ef14e5f5ed085",
    "tasks-get": "7a67941e1c867b811d983203ca85d87cfb72c93184ecf76b4ab3529a236a10d4",
    "tasks-list": "db4e622d243f6bedd021912bca15366d2970bff3e516f7e2ce046baa5540cc96",
    "tasks-cancel": "16668aa561c58a0ed6801ec05cf15558460d2b5fd7ff6070d9095ebba808b3ec",
    "hosts-list": "4b4605df26ecf7d2087d4a151e2ac3b229eb63b543c7765a0d09a7294ba3747a",
    "devices-drain": "14e001bcccead702c7026cee4d4e72a268595a303c98271aa9591632388e89cd",
    "hosts-drain": "fc660586ea475a5436289dc1f17ca323bc7150510b3568ff69fb396ce0233903",
    "devices-forget": "6a574f18a332217d56a9d655fe2215bbc992e23c94dad03a9839bffbdc1be5e8",
    "devices-label": "599b74680b7fc7f3a4c849b72a945cd57bc39950fffdd57bc77a02ee7e44e8d0",
    "tasks-artifacts": "bbc97fe0ae9f5e649cd5b0912570285d8f2b08500c350d5807a5b53871600276",
    "health-set": "97a136f0cf83edee865acf152f5dccb3cbed60c876085382556eeb47fce47a0b",
    "health-list": "e6008ecf034095e7585c59fde29ca9e4d0cacbe15358f27e80a97de7e7327f42",
    "health-delete": "dcd2d9e40a2f542f465622f62e7b46277a2dccddebe945003e48569fd0883a18",
    "host-register": "028cdcd2ab08d453178be5d460a15bafa8f5ec62b7f4d9ea94c7111ca422e870",
    "host-heartbeat": "a84647e2b20be835fe2c81bf10bf02f84ef3c2a75acdd74ed5a56362daf36dc6",
    "host-claim": "8455013c4f165080b81deabb03006bff3e094685a2ec4e0e6e12c9ed8b864163",
    "host-renew": "97b1a89acdc63c33a6a29ca30a641ceb0d8644165c3e0fe89a09ba895b0de8d9",
    "host-report": "cc7e5b4fc173ffdd7de48266889079c28720d0a19be77acfb123736cbff98d5b",
    "host-release": "0bb24240a54e9b163b2254e10d4160a9fa848a517992403a53be0151d03fe250",
    "host-artifact": "af220d4541a319a891ce95371395e8fd8966b1184af61ab291fd1eabaa090997",
    "host-renewals": "0b2b2b894903162288d99452d7f6033bc83f21dcf6fb11a80395ab45c9d4b90e",
    "host-reports": "707027e4f52df111a84c9422dd28e156c11b88662b7c4908db134c670d6412dc",
}

#: What host `bench-07` may publish to and subscribe to, and what its account imports (deploy/nats/host_user.py).
#: Its requests are one subject with the verb a wildcard (any host endpoint, those added later included).
HOST_PUBLISH = [
    "devsched.host.bench-07.*",
    "devsched.js.API.CONSUMER.INFO.DEVSCHED_ASSIGNMENTS.host-bench-07",
    "devsched.js.API.CONSUMER.MSG.NEXT.DEVSCHED_ASSIGNMENTS.host-bench-07",
    "$JS.ACK.DEVSCHED_ASSIGNMENTS.host-bench-07.>",
    "devsched.host.bench-07.log.>",
    "devsched.host.bench-07.upload.>",
]
HOST_PUBLISH_DENY = ["devsched.host.bench-07.nudge"]
HOST_SUBSCRIBE = ["devsched.host.bench-07.nudge", "_INBOX.bench-07.>"]
HOST_IMPORTS = [
    ("service", "devsched.host.bench-07.*", ""),
    (
        "service",
        "$JS.API.CONSUMER.INFO.DEVSCHED_ASSIGNMENTS.host-bench-07",
        "devsched.js.API.CONSUMER.INFO.DEVSCHED_ASSIGNMENTS.host-bench-07",
    ),
    (
        "service",
        "$JS.API.CONSUMER.MSG.NEXT.DEVSCHED_ASSIGNMENTS.host-bench-07",
        "devsched.js.API.CONSUMER.MSG.NEXT.DEVSCHED_ASSIGNMENTS.host-bench-07",
    ),
    ("service", "$JS.ACK.DEVSCHED_ASSIGNMENTS.host-bench-07.>", ""),
    ("service", "devsched.host.bench-07.log.>", ""),
    ("service", "devsched.host.bench-07.upload.>", ""),
    ("stream", "devsched.host.bench-07.nudge", ""),
]


def _digest(metadata: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(metadata, sort_keys=True).encode()).hexdigest()


def test_every_endpoint_keeps_its_name_subject_and_order() -> None:
    subjects = Subjects("devsched")
    assert [(e.name, subjects.served(e), e.host) for e in ENDPOINTS] == SERVED


def test_every_endpoint_keeps_its_request_and_reply_schemas() -> None:
    digests = {e.name: _digest(endpoint_schemas(e.request, e.reply)) for e in ENDPOINTS}
    assert digests == SCHEMAS


def test_the_scheduler_handles_every_endpoint_with_its_entrys_types() -> None:
    bound = handlers(Api.__new__(Api))
    assert [endpoint for endpoint, _ in bound] == list(ENDPOINTS)
    for endpoint, handler in bound:
        hints = get_type_hints(handler)
        assert (hints["req"], hints["return"]) == (endpoint.request, endpoint.reply), endpoint.name


def test_a_host_sends_on_every_host_verb_but_the_nudge() -> None:
    assert set(HOST_ENDPOINT_VERBS) == set(HostVerb) - {HostVerb.NUDGE}


def test_the_service_keeps_its_name_and_queue_group() -> None:
    subjects = Subjects("devsched")
    assert (subjects.service_name, subjects.queue_group) == ("devsched-scheduler", "devsched-scheduler")
    assert subjects.internal_wake == "devsched.internal.wake"


def test_a_hosts_permissions_and_imports_stay_as_they_were() -> None:
    host_user = host_user_module()
    assert host_user.host_permissions("bench-07") == {
        "publish": HOST_PUBLISH,
        "publish_deny": HOST_PUBLISH_DENY,
        "subscribe": HOST_SUBSCRIBE,
    }
    assert host_user.host_imports("bench-07") == HOST_IMPORTS
    assert host_user.host_permissions("h1", "lab-2")["publish"][0] == "lab-2.host.h1.*"
