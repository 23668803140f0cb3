"""The command side of the node-agent contract v1 as tray-agent reads it.

`SetPowerLimitsArgs` is the contract's ``set_power_limits`` args
(`rackplane.core.tray_contract.SetPowerLimitsArgs`, docs/CONTRACTS.md) under tray-agent's own
title: the one definition the simulator's agents (`sims.telemetry`) also read, so the fields,
types and bounds cannot drift apart (tests/unit/test_trayagent_core.py compares the schemas).
"""

from __future__ import annotations

from pydantic import ConfigDict

from rackplane.core.tray_contract import SetPowerLimitsArgs as ContractSetPowerLimitsArgs
from rackplane.core.tray_contract import no_null_defaults

__all__ = ["SetPowerLimitsArgs"]


class SetPowerLimitsArgs(ContractSetPowerLimitsArgs):
    """``set_power_limits`` args (node-agent contract v1): a field left out keeps its value;
    ``null`` is never a value; a cap is removed by naming it in ``release``; ``epoch`` is the
    sender's; a cap needs ``ttl_s``."""

    model_config = ConfigDict(strict=True, title="tray-agent set_power_limits args (node-agent "
                              "contract v1)", json_schema_extra=no_null_defaults,
                              validate_default=False)
