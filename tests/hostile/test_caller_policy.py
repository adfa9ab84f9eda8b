"""A second real user against the root agent: metrics yes; root's stacks and exception text no."""

from __future__ import annotations

import json

from hostile.conftest import CLIENT, PYTHON
from testkit.namespaces import Namespace

ROOT_SECRET = "root-secret-7f3a"
HOSTILE_SECRET = "hostile-own-91c2"


def test_a_user_sees_roots_rank_metrics_but_not_its_exception_text(agent_in_namespace, start_rank, hostile_user):
    agent = agent_in_namespace()
    rank = start_rank(None, ROOT_SECRET)
    as_root = agent.client("snapshot", "--rank-pid", str(rank.pid), "--with-exception")
    assert as_root["code"] == "OK", as_root
    (root_view,) = [r for r in as_root["reply"]["ranks"] if r["pid"] == rank.pid]
    assert ROOT_SECRET in root_view["exception"] and root_view["uid"] == 0

    as_user = agent.client("snapshot", "--rank-pid", str(rank.pid), user=hostile_user)
    assert as_user["code"] == "OK", as_user
    (user_view,) = [r for r in as_user["reply"]["ranks"] if r["pid"] == rank.pid]
    assert int(user_view["stepCount"]) >= int(root_view["stepCount"]) >= 1  # the metrics are everyone's
    assert "exception" not in user_view
    assert user_view["unavailable"]["exception"].startswith("private: shown only to the rank's owner")
    assert ROOT_SECRET not in json.dumps(as_user)
    agent.assert_healthy(user=hostile_user)


def test_a_user_gets_stacks_of_their_own_ranks_only(agent_in_namespace, start_rank, hostile_user):
    agent = agent_in_namespace()
    roots = start_rank(None, ROOT_SECRET)
    theirs = start_rank(hostile_user, HOSTILE_SECRET)
    assert agent.client("snapshot", "--rank-pid", str(theirs.pid))["code"] == "OK"
    assert agent.client("snapshot", "--rank-pid", str(roots.pid))["code"] == "OK"

    refused = agent.client("stacks", "--pids", str(roots.pid), user=hostile_user)
    assert refused["code"] == "PERMISSION_DENIED", refused
    assert f"pid {roots.pid} is not yours (uid {hostile_user.uid})" in refused["details"]

    everything_theirs = agent.client("stacks", user=hostile_user)
    assert everything_theirs["code"] == "OK", everything_theirs
    assert [r["pid"] for r in everything_theirs["reply"]["ranks"]] == [theirs.pid]
    assert any(f["function"] == "parked_in_rank_main"
               for t in everything_theirs["reply"]["ranks"][0]["threads"] for f in t["frames"])

    as_root = agent.client("stacks")
    assert sorted(r["pid"] for r in as_root["reply"]["ranks"]) == sorted([roots.pid, theirs.pid])
    agent.assert_healthy(user=hostile_user)


def test_without_a_token_only_local_users_are_served(namespace, agent_in_namespace, hostile_user, tmp_path):
    """Agent on every address with a token; a caller on another host (namespace) and one on this host."""
    token = "0f4c2d9e8b7a65413f2e1d0c9b8a7f6e"
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    agent = agent_in_namespace("--host", "0.0.0.0", "--token-file", str(token_file), "--allow-plaintext-token")
    with Namespace.create() as remote:
        address, _ = namespace.link(remote)
        ask = [PYTHON, CLIENT, "--host", address, "--port", str(agent.port)]
        refused = json.loads(remote.run([*ask, "info"]).stdout)
        assert refused["code"] == "UNAUTHENTICATED" and "missing or wrong token" in refused["details"]
        wrong = json.loads(remote.run([*ask, "--token", "not-it", "info"]).stdout)
        assert wrong["code"] == "UNAUTHENTICATED"
        served = json.loads(remote.run([*ask, "--token", token, "info"]).stdout)
        assert served["code"] == "OK"
    assert agent.client("info", user=hostile_user)["code"] == "OK"  # a local user, no token
    theirs = agent.client("stacks", user=hostile_user)  # served as that user: no ranks of theirs here
    assert theirs["code"] == "OK" and not theirs["reply"].get("ranks"), theirs
    agent.assert_healthy(user=hostile_user)
