"""Smoke test of a Python client generated from Settle's /openapi.json by
openapi-python-client: the generated package is imported and drives the served example
machines (create, read, raise, follow the operation, list) as any integrator would.

Usage: smoke.py BASE_URL TOKEN (the generated package on PYTHONPATH)."""

import sys

from settle_client import AuthenticatedClient
from settle_client.api.entities import create_entity, get_entity, list_entities, get_entity_history
from settle_client.api.events import raise_event
from settle_client.api.machines import list_machines
from settle_client.api.operations import get_operation
from settle_client.api.system import healthz
from settle_client.models import CreateEntity, Entity, EntityPage, MachineList, RaiseAccepted, RaiseEventBody


def main() -> None:
    base, token = sys.argv[1], sys.argv[2]
    client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)

    assert healthz.sync(client=client).status == "ok"
    machines = list_machines.sync(client=client)
    assert isinstance(machines, MachineList), machines
    names = {m.name for m in machines.items}
    assert "server" in names, names

    created = create_entity.sync_detailed(
        machine="server", client=client, body=CreateEntity(key="smoke-1"), idempotency_key="smoke-create-1"
    )
    assert created.status_code == 201, created
    assert isinstance(created.parsed, Entity) and created.parsed.state == "new", created.parsed

    # A replay of the same request is answered as the first time (200, nothing created).
    again = create_entity.sync_detailed(
        machine="server", client=client, body=CreateEntity(key="smoke-1"), idempotency_key="smoke-create-1"
    )
    assert again.status_code == 200, again

    # A problem comes back typed, with its `type`.
    missing = get_entity.sync_detailed(machine="server", key="nobody", client=client)
    assert missing.status_code == 404, missing
    assert missing.parsed.type_ == "https://settle.dev/problems/unknown-entity", missing.parsed

    params = RaiseEventBody.from_dict({"region": "eu-west", "size": "small"})
    raised = raise_event.sync_detailed(
        machine="server", key="smoke-1", event="create", client=client, body=params, idempotency_key="smoke-raise-1"
    )
    assert raised.status_code == 202, raised
    assert isinstance(raised.parsed, RaiseAccepted) and raised.parsed.request_id == "smoke-raise-1", raised.parsed
    op = get_operation.sync(id="smoke-raise-1", client=client)
    assert op.name == "server.create" and op.key == "smoke-1", op

    # An event without parameters, with the default call: no body at all.
    create_entity.sync_detailed(machine="server", client=client, body=CreateEntity(key="smoke-2"))
    deleted = raise_event.sync_detailed(machine="server", key="smoke-2", event="delete", client=client)
    assert deleted.status_code == 202, deleted

    page = list_entities.sync(client=client, machine="server", prefix="smoke-", limit=10)
    assert isinstance(page, EntityPage) and any(e.key == "smoke-1" for e in page.items), page
    history = get_entity_history.sync(machine="server", key="smoke-1", client=client)
    assert history[0].kind == "create", history
    print("generated client smoke test: ok")


if __name__ == "__main__":
    main()
