"""Names that become MQTT topic levels: one rule, one checker, one alarm-id builder. Pure.

A topic level rackplane builds or accepts in config (site, rack, daemon names, the broker
username of ``cmd/<user>``, thing names, verbs, alarm ids, the levels of a configured topic)
is 1 to 64 characters of ``A-Z a-z 0-9 _ : -``, starting with a letter or a digit. So it has:

- no MQTT wildcard (``+`` ``#``) and no level separator (``/``): a name cannot widen a
  subscription or an ACL grant, nor add levels;
- no leading ``$`` (broker-internal topics such as ``$SYS``);
- no ``.``, no space and no other whitespace: NATS's MQTT listener (the fleet bus) maps
  ``/`` to ``.`` and disconnects a client that publishes a level holding one; its wildcards
  ``*`` and ``>`` are outside the alphabet too;
- no NUL or other control character, no empty level, at most 64 characters (it is also a
  time-series tag value and part of a file name).

Alarm ids are ``<kind>`` or ``<kind>:<subject>`` (`alarm_id`), lowercase
(docs/CONTRACTS.md "Alarm ids").
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "ALARM_ID_PATTERN",
    "ALARM_SUBJECT_SEPARATOR",
    "CLIENT_ID_MAX",
    "PAIR_INSTANCE_PATTERN",
    "TOPIC_LEVEL_MAX",
    "TOPIC_LEVEL_PATTERN",
    "alarm_id",
    "check_client_id",
    "check_topic_level",
    "check_topic_levels",
]

TOPIC_LEVEL_MAX: Final = 64
"""Longest topic level (characters) rackplane builds or accepts."""

TOPIC_LEVEL_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_:-]{0,63}$"
"""The one rule of a topic level (the module docstring says why each character is out)."""

ALARM_ID_PATTERN: Final = r"^[a-z0-9][a-z0-9_:-]{0,63}$"
"""An alarm id: a lowercase topic level (``kind`` or ``kind:subject``)."""

PAIR_INSTANCE_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,31}$"
"""An instance's name in a redundant pair (``[leadership] instance``: ``a``, ``b``), 1-32
characters; part of a lease owner, a client id and an alarm id."""

ALARM_SUBJECT_SEPARATOR: Final = ":"
"""Between an alarm's kind and its subject (``link_flapping:gpu07-nic1``)."""

CLIENT_ID_MAX: Final = 200
"""Longest MQTT client id accepted (the default ``<daemon>-<site>-<rack>`` of three
64-character levels fits)."""

_LEVEL_RE: Final = re.compile(TOPIC_LEVEL_PATTERN)
_ALARM_RE: Final = re.compile(ALARM_ID_PATTERN)
_CLIENT_ID_RE: Final = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_:-]{{0,{CLIENT_ID_MAX - 1}}}$")
_SUBJECT_BAD: Final = re.compile(r"[^a-z0-9_-]")
_KIND_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

_RULE: Final = ("1-64 characters of letters, digits, '_', ':' or '-', starting with a letter "
                "or digit (no '/', '+', '#', '$', '.', spaces or control characters)")


def check_topic_level(value: object, what: str = "topic level") -> str:
    """``value`` if it is one valid topic level (module docstring).

    Raises:
        ValueError: naming ``what``, the value and the rule.
    """
    if not isinstance(value, str) or not _LEVEL_RE.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be {_RULE}: it is an MQTT topic level")
    return value


def check_topic_levels(topic: str, what: str = "topic", *,
                       placeholders: frozenset[str] = frozenset()) -> str:
    """``topic`` if each of its ``/``-separated levels is a valid topic level, or one of
    ``placeholders`` written as ``{name}`` (e.g. ``{root}``, which stands for several).

    Raises:
        ValueError: naming ``what`` and the first bad level.
    """
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"{what} must be a non-empty topic")
    for level in topic.split("/"):
        if level.startswith("{") and level.endswith("}") and level[1:-1] in placeholders:
            continue
        check_topic_level(level, f"{what} {topic!r}: level")
    return topic


def check_client_id(value: str) -> str:
    """An MQTT client id: the topic-level alphabet, 1 to `CLIENT_ID_MAX` characters (a client
    id appears in broker logs, ``%c`` ACL patterns and ``$SYS`` topics).

    Raises:
        ValueError: naming the value and the rule.
    """
    if not isinstance(value, str) or not _CLIENT_ID_RE.fullmatch(value):
        raise ValueError(
            f"client id {value!r} must be 1-{CLIENT_ID_MAX} characters of letters, digits, "
            "'_', ':' or '-', starting with a letter or digit (no '/', '+', '#', '$', '.', "
            "spaces or control characters)"
        )
    return value


def alarm_id(kind: str, subject: str = "") -> str:
    """The alarm id of ``kind`` about ``subject``: ``<kind>:<subject>``, or ``<kind>`` for a
    rack-wide alarm (empty subject). The subject is lowercased, ``/`` and ``.`` become ``-``
    and any other character outside ``a-z 0-9 _ -`` becomes ``_``; the id is cut at 64
    characters. The one builder of alarm ids with a subject (docs/CONTRACTS.md).

    Examples: ``alarm_id("link_flapping", "gpu07/nic1") == "link_flapping:gpu07-nic1"``.

    Raises:
        ValueError: ``kind`` is not 1-63 of ``a-z 0-9 _ -`` starting with a letter or digit.
    """
    if not _KIND_RE.fullmatch(kind):
        raise ValueError(f"alarm kind {kind!r} must be 1-63 of a-z, 0-9, '_', '-' starting "
                         "with a letter or digit")
    if not subject:
        return kind
    slug = _SUBJECT_BAD.sub("_", subject.lower().replace("/", "-").replace(".", "-"))
    out = f"{kind}{ALARM_SUBJECT_SEPARATOR}{slug}"[:TOPIC_LEVEL_MAX]
    assert _ALARM_RE.fullmatch(out), out
    return out


def is_alarm_id(value: str) -> bool:
    """True when ``value`` matches `ALARM_ID_PATTERN`."""
    return bool(_ALARM_RE.fullmatch(value))
