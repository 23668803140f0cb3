"""Every NATS server list (``[leadership] servers``, racky's and rlc's ``[fleet] servers``) is
checked the same way: ``nats://host:port`` / ``tls://host:port``, a port in 1..65535, no node
named twice. A port such as 99999 or 0 used to pass (the pattern took any 1-5 digits) and
only failed at connect time, after ``--check-config`` had said OK. A pair (``[leadership]
enabled``) whose servers are all loopback addresses (the default ``nats://127.0.0.1:4222``
included) is warned by valvey's, racky's and rlc's ``--check-config``: two hosts reaching two
separate servers would each hold a lease."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rackplane.leadership_settings import LeadershipSettings
from racky.fleet_settings import FleetSettings
from rlc.config import FleetKvSettings

MODELS: list[Any] = [LeadershipSettings, FleetSettings, FleetKvSettings]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("servers", "named"), [
    (["nats://h:99999"], "outside 1..65535"),
    (["nats://h:0"], "outside 1..65535"),
    (["nats://h:65536"], "outside 1..65535"),
    (["nats://h:4222", "nats://h:4222"], "listed twice"),
    (["nats://h"], "is not nats://host:port"),
    (["http://h:4222"], "is not nats://host:port"),
])
def test_bad_server_lists_are_refused_naming_the_entry(model: Any, servers: list[str],
                                                       named: str) -> None:
    with pytest.raises(ValidationError) as err:
        model(servers=servers)
    assert named in str(err.value)


@pytest.mark.parametrize("model", MODELS)
def test_good_server_lists_pass(model: Any) -> None:
    servers = ["nats://n1:1", "tls://n2.example:65535", "nats://[::1]:4222"]
    assert model(servers=servers).servers == servers


def _pair_warnings(daemon: str, leadership: dict[str, Any]) -> list[str]:
    from racky.config import RackyConfig
    from racky.config import config_warnings as racky_warnings
    from rlc.config import RlcConfig, example_topology
    from valvey.config import ValveyConfig
    from valvey.config import config_warnings as valvey_warnings

    if daemon == "valvey":
        return valvey_warnings(ValveyConfig(cdu={"watchdog_timeout_s": 30.0},
                                            leadership=leadership))
    if daemon == "racky":
        return racky_warnings(RackyConfig(leadership=leadership))
    return RlcConfig(leadership=leadership, topology=example_topology()).leadership.warnings()


@pytest.mark.parametrize("daemon", ["valvey", "racky", "rlc"])
@pytest.mark.parametrize(("servers", "warned"), [
    (None, True),                                             # the default 127.0.0.1:4222
    (["nats://localhost:4222", "nats://127.0.0.2:4223", "nats://[::1]:4224"], True),
    (["nats://10.0.0.1:4222", "nats://10.0.0.2:4222", "nats://10.0.0.3:4222"], False),
    (["nats://127.0.0.1:4222", "nats://nats-2.example:4222"], False),
])
def test_a_pair_on_loopback_servers_only_is_warned(daemon: str, servers: list[str] | None,
                                                  warned: bool) -> None:
    ls: dict[str, Any] = {"enabled": True}
    if servers is not None:
        ls["servers"] = servers
    got = [w for w in _pair_warnings(daemon, ls) if w.startswith("leadership.servers")]
    assert bool(got) == warned, got
    if warned:
        assert "only loopback addresses" in got[0] and "same NATS cluster" in got[0]
        assert ("left at its default" in got[0]) == (servers is None)
    # a single instance (the default everywhere) is never warned
    off = [w for w in _pair_warnings(daemon, {"enabled": False} | (
        {"servers": servers} if servers else {})) if w.startswith("leadership.servers")]
    assert off == []


def test_every_nats_connection_has_the_same_settings_and_checks() -> None:
    """[leadership] and racky's and rlc's [fleet] are one shape (NatsKvSettings): a fleet
    connection logs in as a NATS user too, and a bad server list is refused in each."""
    import pytest
    from pydantic import ValidationError

    from rackplane.leadership_settings import LeadershipSettings, NatsKvSettings
    from racky.fleet_settings import FleetSettings
    from rlc.config import FleetKvSettings

    for model in (LeadershipSettings, FleetSettings, FleetKvSettings):
        assert issubclass(model, NatsKvSettings)
        s = model(username="racky", password_env="RACKPLANE_TEST_UNSET_PW")
        assert s.password_env_check("x") == {"x.password_env": "RACKPLANE_TEST_UNSET_PW"}
        assert s.password() == ""  # unset: check_environment refuses it at start
        with pytest.raises(ValidationError, match="listed twice"):
            model(servers=["nats://a:4222", "nats://a:4222"])
