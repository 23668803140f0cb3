"""Topic names of a peer daemon on the same rack (DESIGN §3), built in one place.

A daemon talks to its peers through their topics: valvey sends requests to racky's
``cmd/<user>/<verb>`` and reads the replies on ``.../result``; racky reads valvey's
``state/<thing>`` and commands the node agents (``<agents>/cmd/<user>/<verb>``, telemetry on
``<agents>/telemetry/<thing>``). Every topic is ``<root>/<site>/<rack>/<daemon>/...`` as the
peer's own `rackplane.io.mqtt.Topics` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rackplane.settings import Identity

__all__ = ["PeerTopics"]


@dataclass(frozen=True, slots=True)
class PeerTopics:
    """The topics of daemon ``daemon`` at ``identity``'s site and rack under ``root``.

    Attributes:
        base: ``<root>/<site>/<rack>/<daemon>``.
    """

    base: str

    @classmethod
    def of(cls, root: str, identity: Identity, daemon: str) -> PeerTopics:
        """The peer ``daemon`` on the rack of ``identity`` (topic root ``root``)."""
        return cls(f"{root}/{identity.site}/{identity.rack}/{daemon}")

    def state(self, thing: str) -> str:
        """``<base>/state/<thing>`` (retained JSON)."""
        return f"{self.base}/state/{thing}"

    def telemetry(self, thing: str = "+") -> str:
        """``<base>/telemetry/<thing>``; default ``+``: every telemetry topic."""
        return f"{self.base}/telemetry/{thing}"

    def cmd_base(self, user: str) -> str:
        """``<base>/cmd/<user>``: below it, the requests a client named ``user`` sends."""
        return f"{self.base}/cmd/{user}"

    def cmd(self, user: str, verb: str) -> str:
        """``<base>/cmd/<user>/<verb>``: where a client named ``user`` sends ``verb``."""
        return f"{self.cmd_base(user)}/{verb}"

    def cmd_results(self, user: str) -> str:
        """``<base>/cmd/<user>/+/result``: the replies to every verb ``user`` sent."""
        return f"{self.cmd_base(user)}/+/result"
