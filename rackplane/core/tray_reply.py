"""The reply state of the node-agent contract's ``set_power_limits`` (contract 1.3,
docs/CONTRACTS.md "Reply"): one layout that the simulator's agents (`sims.agent_reply`) and the
real tray agent (`trayagent.app.TrayAgent`) both produce and racky reads
(`parse_reply_state`).

A reply is rackplane's command reply ``{request_id, ok, error, state}``. On success ``state``
is a `SetPowerLimitsReply`: the contract version, the epoch the command carried, whether every
GPU read back the limit the agent set (``confirmed``), and per tray the settings now in force,
the tray's enforced cap and each GPU's enforced limit **as read back from the device** (W).
On a refusal ``ok`` is false, ``state`` null and ``error.code`` one of `REFUSAL_CODES`.

racky may meet agents older than 1.3 during the deprecation window (contract minor 1.3 -> the
next major): their ``state`` has no ``schema_version`` and one of two older layouts (the
simulator's ``{trays: [{tray, enforced_gpu_cap_w, enforced_tray_cap_w, ...}], stale_refused}``
or tray-agent's ``{confirmed, dry_run, trays: {"3": {epoch, gpus: [{gpu, enforced_w}]}}}``);
`parse_reply_state` reads both into the same `ReplyReading`, marked ``legacy``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rackplane.core.tray_contract import SCHEMA_MAJOR, parse_version

__all__ = ["REFUSAL_CODES", "REPLY_SINCE_MINOR", "BmcControlReply", "GpuReply",
           "ReplyReading", "ReplyStateError", "SetPowerLimitsReply", "TrayReply",
           "parse_reply_state"]

#: the contract minor version that defined `SetPowerLimitsReply`
REPLY_SINCE_MINOR = 3

#: ``error.code`` an agent's ``set_power_limits`` handler refuses with (nothing changed);
#: before it, the command router refuses malformed input with its own codes
#: (`rackplane.core.envelope.ROUTER_CODES`: ``wrong_type``, ``non_finite``, ``out_of_range``,
#: ``invalid_args`` ...)
REFUSAL_CODES = ("invalid_args", "unknown_tray", "stale_epoch", "out_of_range",
                 "not_supported")


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GpuReply(_Reply):
    """One GPU of a tray in the reply."""

    gpu: int = Field(ge=0, description="rack-wide GPU index, on this tray")
    enforced_w: float | None = Field(ge=0, allow_inf_nan=False, description="the power limit "
                                     "in force read back from the device, W; null: not read")
    target_w: float | None = Field(None, ge=0, allow_inf_nan=False, description="the limit the "
                                   "agent set, W; null: none set (or the agent sets none)")
    source: str | None = Field(None, max_length=64, description="what set target_w (the "
                               "agent's own terms, e.g. gpu_power_cap_w, safe_cap)")
    clamped: str | None = Field(None, max_length=300, description="why target_w was moved "
                                "into the device's settable range; null: not clamped")


class BmcControlReply(_Reply):
    """A tray capped at its BMC (tray-agent's Redfish power Control), W."""

    wanted_w: float | None = Field(allow_inf_nan=False, description="the tray cap asked, W")
    target_w: float | None = Field(allow_inf_nan=False, description="the SetPoint written, W")
    clamped: str | None = Field(max_length=300, description="why the SetPoint was moved into "
                                "the Control's range; null: not clamped")
    enforced_w: float | None = Field(allow_inf_nan=False, description="SetPoint read back, W")
    confirmed: bool = Field(description="the read-back equals the SetPoint written")
    patches: int = Field(ge=0, description="PATCH attempts")
    error: str | None = Field(description="the last failure; null: none")


class TrayReply(_Reply):
    """One tray of the command, after it was applied."""

    tray: int = Field(ge=0, le=63, description="0-based tray index")
    epoch: int | None = Field(ge=0, le=2**63 - 1, description="the newest epoch the tray has "
                              "seen (the command's, once applied)")
    powered: bool | None = Field(description="tray power on; null: the agent cannot switch "
                                 "tray power and does not report it here")
    power_cap_w: float | None = Field(gt=0, allow_inf_nan=False, description="whole-tray cap "
                                      "set, W; null: none (released or expired)")
    gpu_power_cap_w: float | None = Field(gt=0, allow_inf_nan=False, description="per-GPU cap "
                                          "set, W; null: none")
    cap_expires_in_s: float | None = Field(ge=0, allow_inf_nan=False, description="the caps "
                                           "expire in, s; null: no cap")
    enforced_tray_cap_w: float | None = Field(ge=0, allow_inf_nan=False, description="the "
                                              "tray figure in force, W, as telemetry's "
                                              "agent.enforced_tray_cap_w; null: not known")
    gpus: list[GpuReply] = Field(min_length=1, max_length=16, description="every GPU of the "
                                 "tray, each once")
    bmc_control: BmcControlReply | None = Field(None, description="a tray capped at its BMC")


class SetPowerLimitsReply(_Reply):
    """``state`` of an ok ``set_power_limits`` reply (node-agent contract >= 1.3)."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              title="set_power_limits reply state (node-agent contract v1)")

    schema_version: str = Field(pattern=r"^1\.(0|[1-9][0-9]{0,5})$",
                                description="contract version, MAJOR.MINOR (>= 1.3)")
    epoch: int = Field(ge=0, le=2**63 - 1, description="the epoch the command carried")
    confirmed: bool = Field(description="every GPU (or BMC control) of the command's trays read "
                            "back the limit the agent set before the agent answered")
    dry_run: bool = Field(False, description="the agent computes limits but sets none")
    epoch_persisted: bool | None = Field(None, description="the grown epoch was saved; null: "
                                         "nothing to save, or the agent persists nothing")
    trays: list[TrayReply] = Field(min_length=1, max_length=64, description="the command's "
                                   "trays, ascending, each once")


class ReplyStateError(ValueError):
    """A reply ``state`` that is neither the 1.3 layout nor an older one racky reads."""


class ReplyReading(NamedTuple):
    """What racky keeps of an ok reply: ``confirmed``; per tray the enforced tray figure and
    per-GPU read-backs (W, None: not read); ``legacy``: an older agent's layout."""

    epoch: int | None
    confirmed: bool | None
    enforced_tray_cap_w: dict[int, float | None]
    enforced_gpu_w: dict[int, list[float | None]]
    legacy: bool


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return float(x)


def _legacy(state: Mapping[str, Any]) -> ReplyReading:
    trays = state.get("trays")
    tray_w: dict[int, float | None] = {}
    gpu_w: dict[int, list[float | None]] = {}
    if isinstance(trays, list):  # the simulator's node_agents layout (<= 1.2)
        for t in trays:
            if not isinstance(t, Mapping) or not isinstance(t.get("tray"), int):
                raise ReplyStateError("legacy reply: a tray entry without its index")
            tray_w[t["tray"]] = _num(t.get("enforced_tray_cap_w"))
            gpu_w[t["tray"]] = [_num(t.get("enforced_gpu_cap_w"))]
        return ReplyReading(None, True, tray_w, gpu_w, True)
    if isinstance(trays, Mapping) and isinstance(state.get("confirmed"), bool):  # tray-agent
        for k, t in trays.items():
            if not str(k).isdigit() or not isinstance(t, Mapping):
                raise ReplyStateError(f"legacy reply: tray key {str(k)[:20]!r}")
            gws = [_num(g.get("enforced_w")) if isinstance(g, Mapping) else None
                   for g in t.get("gpus") or []]
            gpu_w[int(k)] = gws
            tray_w[int(k)] = None if not gws or None in gws else sum(
                w for w in gws if w is not None)
        return ReplyReading(None, state["confirmed"], tray_w, gpu_w, True)
    raise ReplyStateError("reply state: no schema_version and no older layout")


def parse_reply_state(state: Any) -> ReplyReading:
    """Read an ok reply's ``state`` (the 1.3 layout, or an older agent's, see the module).

    Raises:
        ReplyStateError: not an object; another major version; a 1.3+ state that fails
            `SetPowerLimitsReply` (missing field, wrong type, negative watts, unknown field
            of the same minor...); an older layout without its tray indices.
    """
    if not isinstance(state, Mapping):
        raise ReplyStateError("reply state: not an object")
    v = state.get("schema_version")
    if v is None:
        return _legacy(state)
    mm = parse_version(v) if isinstance(v, str) else None
    if mm is None or mm[0] != SCHEMA_MAJOR:
        raise ReplyStateError(f"reply state: unsupported schema_version {str(v)[:20]!r}")
    data: Any = state
    if mm[1] > REPLY_SINCE_MINOR:  # a newer minor may add fields: read only the known ones
        data = _known(state, SetPowerLimitsReply)
    try:
        r = SetPowerLimitsReply.model_validate(data)
    except ValidationError as err:
        raise ReplyStateError(f"reply state: {str(err)[:300]}") from None
    return ReplyReading(
        r.epoch, r.confirmed, {t.tray: t.enforced_tray_cap_w for t in r.trays},
        {t.tray: [g.enforced_w for g in t.gpus] for t in r.trays}, False)


def _known(obj: Any, model: type[BaseModel]) -> Any:
    """``obj`` without the keys ``model`` does not define (at every level)."""
    if not isinstance(obj, Mapping):
        return obj
    out = {}
    for k, f in model.model_fields.items():
        if k not in obj:
            continue
        ann = f.annotation
        is_list = getattr(ann, "__origin__", None) is list
        sub = next((a for a in getattr(ann, "__args__", ())
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is None:
            out[k] = obj[k]
        elif is_list and isinstance(obj[k], list):
            out[k] = [_known(x, sub) for x in obj[k]]
        else:
            out[k] = _known(obj[k], sub)
    return out
