"""Auto-commissioning in lock-step (issue 21 item 2: the matrix's **commissioned** column).

`commission` runs valvey's own tick (`harness.lockstep_valvey.run.run_valvey`) on a plant
variant at a steady load and acts as the operator through the daemon's command handlers
(`valvey.commands.register_valvey_commands`, with their argument models and config bounds; the
router's transport, envelope and roles are not part of a lock-step run): ``start_commissioning
{step_pct}`` once the loop has been steady, ``accept_commissioning`` when the proposal is
published. What the core then holds of its plant is saved as the daemon saves it
(`valvey.persist.LearnedState` through its JSON ``data``) and `commissioned_run` lays it over a
fresh core at the start of the scenario run (`valvey.persist.apply_learned`, as at a daemon
restart), so the scenario runs on the accepted values and nothing else is carried over:
the state saved keeps the accepted gains, feedforward gain and strokes, and drops what the
online learners picked up during the commissioning run (the feedforward map learned at its
one steady load, the valves' rest characteristic) — the column measures the commissioning, the
cold column starts with the learners empty too. Measured (issue 21): the online map learner's
move of the one map point beside that load during the 900 s run, carried over, took S1 on
``facility_starved`` from 0.45 to 0.63 K and S2sync's RMS on ``rangeability_15`` from 0.09 to
0.16 K (the slopes beside the moved point change; see the report of this change).

The operator's choices are fixed, never per variant: the load is the scenario plant's
``COMMISSION_LOAD_FRACTION`` of its rack maximum (constant), the start ``COMMISSION_START_S``
after the (warm) start, the step ``COMMISSION_STEP_PCT`` (opening), the run
``COMMISSION_DURATION_S`` long.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from harness.lockstep_valvey.run import LockstepResult, run_valvey
from rackplane.clock import FakeClock
from rackplane.core.envelope import CommandContext
from rackplane.errors import CommandError
from sims.scenario import Scenario, ScenarioRun
from valvey.commands import register_valvey_commands
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.persist import LearnedState, apply_learned

__all__ = ["COMMISSION_DURATION_S", "COMMISSION_LOAD_FRACTION", "COMMISSION_START_S",
           "COMMISSION_STEP_PCT", "CommandPath", "Commissioned", "commission",
           "commissioned_run"]

COMMISSION_LOAD_FRACTION = 0.3
"""Steady load of the commissioning run, share of the scenario plant's rack maximum."""
COMMISSION_START_S = 120.0
"""``start_commissioning`` this long after the start (the loop steady for ``steady_s``)."""
COMMISSION_STEP_PCT = 4.0
"""The operator's step: 4 % opening (about 0.2–1 K of supply on the plant family)."""
COMMISSION_DURATION_S = 900.0
"""Plant time of the commissioning run (the step, the return and the proposal fit in it)."""


class CommandPath:
    """valvey's command handlers as the daemon registers them (`register_valvey_commands`:
    args model, config bounds, handler), called synchronously between ticks.

    Args:
        core: the core the handlers act on.
        user: the operator named in the context.
    """

    def __init__(self, core: ValveyCore, user: str = "commissioning"):
        self._verbs: dict[str, tuple[type[BaseModel], Callable[[Any, CommandContext], Any]]] = {}
        self.user = user
        register_valvey_commands(self, core)  # type: ignore[arg-type]
        self.log: list[tuple[float, str, dict[str, Any]]] = []

    def register(self, verb: str, args_model: type[BaseModel],
                 handler: Callable[[Any, CommandContext], Any], role: str = "operator",
                 arg_check: Any = None) -> None:
        """`rackplane.commands.CommandRouter.register`'s signature: keep the handler (the
        bounds are checked by the handler itself; ``arg_check`` only adds them to a refusal
        the args model already made, which these replies report as ``invalid_args``)."""
        self._verbs[verb] = (args_model, handler)

    def call(self, verb: str, args: dict[str, Any], now_mono: float) -> dict[str, Any]:
        """Apply ``verb``: ``{"ok", "error": {"code", "message"} | None, "state"}`` as the
        router's reply would carry them (args refused by their model: ``invalid_args``)."""
        model, handler = self._verbs[verb]
        ctx = CommandContext(self.user, "operator", verb, f"c-{len(self.log)}",
                             FakeClock().wall_ns(), now_mono, 0, now_mono)
        try:
            state = handler(model.model_validate(args), ctx)
            reply: dict[str, Any] = {"ok": True, "error": None, "state": state}
        except ValidationError as err:
            reply = {"ok": False, "error": {"code": "invalid_args", "message": str(err)},
                     "state": None}
        except CommandError as err:
            reply = {"ok": False, "error": {"code": err.code, "message": str(err)},
                     "state": None}
        self.log.append((now_mono, verb, reply))
        return reply


@dataclass
class Commissioned:
    """The outcome of `commission`: the final phase, the proposal, the saved learned state
    (None when nothing was accepted), the replies, and the run's CPU time."""

    phase: str
    proposal: dict[str, Any] | None
    error: str | None
    learned: dict[str, Any] | None
    replies: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    cpu_s: float = 0.0

    def summary(self) -> str:
        """One line for a figure's detail."""
        p = self.proposal or {}
        m, pi, ff = p.get("model", {}), p.get("pi", {}), p.get("feedforward", {})
        strokes = {k: v.get("stroke_time_s") for k, v in p.get("valves", {}).items()}
        if self.learned is None:
            return f"commissioning {self.phase}: {self.error}; ran cold"
        return (f"commissioned: K {m.get('k_k_per_pct')} K/%, τ {m.get('tau_s')} s, θ "
                f"{m.get('theta_s')} s (fit {m.get('fit_quality')}); accepted Kc "
                f"{pi.get('kc_pct_per_k')} %/K, Ti {pi.get('ti_s')} s, FF gain "
                f"{ff.get('gain')}, stroke {strokes}")


def _steady(scenario: Scenario, fraction: float, duration_s: float) -> Scenario:
    load = type(scenario.load).model_validate(
        {"kind": "constant", "power_w": fraction * scenario.plant.rack_max_power_w})
    return scenario.model_copy(update={"load": load, "faults": [], "duration_s": duration_s})


def commission(scenario: Scenario, variant: str | None, model: Literal["rack", "cdu"],
               cfg: ValveyConfig | None = None, *, step_pct: float = COMMISSION_STEP_PCT,
               start_s: float = COMMISSION_START_S, duration_s: float = COMMISSION_DURATION_S,
               accept: bool = True, seed: int | None = 1) -> Commissioned:
    """Auto-commission valvey on ``scenario``'s plant (``variant``, ``model``) at a steady
    load (module docstring); accept the proposal when it is acceptable (``accept``)."""
    t0 = time.process_time()
    box: dict[str, Any] = {}

    def act(run: ScenarioRun, core: ValveyCore, t_s: float, now: float) -> None:
        path = box.get("path")
        if path is None:
            path = box["path"] = CommandPath(core)
        c = core.commissioning
        if "started" not in box and t_s >= start_s - 1e-6:
            box["started"] = path.call("start_commissioning", {"step_pct": step_pct}, now)
        if accept and "accepted" not in box and c.phase in ("proposed", "failed"):
            box["proposal"] = c.proposal
            box["accepted"] = path.call("accept_commissioning", {}, now)
        box["core"] = core

    res = run_valvey(_steady(scenario, COMMISSION_LOAD_FRACTION, duration_s), cfg, model=model,
                     variant=variant, seed=seed, on_tick=act)
    del res
    core: ValveyCore = box["core"]
    c = core.commissioning
    learned = None
    if c.accepted is not None:  # through the state file's JSON, as the daemon saves it
        learned = json.loads(json.dumps(LearnedState.of(core).data()))
        # only what was accepted (module docstring): the online learners' own picks dropped
        accepted = box["accepted"]["state"]["changed"]["commissioning"]["applied"]
        learned.update(ff_map_pct=None, valve_rest_pct={},
                       valve_stroke_s=accepted["valve_stroke_s"])
    path = box.get("path")
    return Commissioned(c.phase, box.get("proposal", c.proposal), c.error, learned,
                        [] if path is None else path.log, time.process_time() - t0)


def commissioned_run(scenario: Scenario, learned: dict[str, Any] | None,
                     cfg: ValveyConfig | None = None, **kw: Any) -> LockstepResult:
    """`run_valvey` with the saved ``learned`` state laid over the fresh core at the start
    (`valvey.persist.apply_learned`, as at a daemon restart, without its age rule: the values
    were learned by a simulation of this same session); None: cold."""
    done: list[bool] = []

    def restore(run: ScenarioRun, core: ValveyCore, t_s: float, now: float) -> None:
        if not done:
            done.append(True)
            if learned is not None:
                _got, dropped = apply_learned(core, LearnedState.from_data(learned))
                if dropped:
                    raise RuntimeError(f"learned state not restored: {dropped}")

    return run_valvey(scenario, cfg, on_tick=restore, **kw)
