"""tray-agent's ``[agents.trays.bmc]`` is checked at load: a URL with no host, spaces or a line
break, a chassis or power Control id of '.' or '..' (which would name another Redfish
resource: /redfish/v1/Chassis/.. is the service root), and a username with a control
character are refused by ``--check-config``; they used to pass and fail only at run time."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trayagent.config import BmcSettings

GOOD: dict[str, Any] = {"url": "https://tray03-bmc", "chassis": "System.Embedded.1",
                        "username": "root", "password_env": "BMC_PW"}


@pytest.mark.parametrize("url", ["https://tray03-bmc", "http://127.0.0.1:8000",
                                 "https://[fe80::1]:443", "https://bmc.example/redfish-proxy"])
def test_good_bmc_settings_pass(url: str) -> None:
    assert BmcSettings(**(GOOD | {"url": url, "power_control": "PowerLimit.1"})).url == url


@pytest.mark.parametrize(("key", "value"), [
    ("url", "https://"), ("url", "https:///redfish"), ("url", "https://bmc host"),
    ("url", "https://bmc\n/x"), ("url", "ftp://bmc"),
    ("chassis", ".."), ("chassis", "."), ("power_control", ".."),
    ("username", "ro\not"), ("username", "root\x00"),
])
def test_bad_bmc_settings_are_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ValidationError) as err:
        BmcSettings(**(GOOD | {key: value}))
    assert err.value.errors()[0]["loc"] == (key,)
