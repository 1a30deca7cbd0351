"""Names that are plain strings on the wire and enum members in the code (EffectKind, EventType)."""

from __future__ import annotations

import enum


class Name(enum.StrEnum):
    """A name that is a plain string on the wire, in the stores and in messages (its repr too, so an
    error that quotes one reads as before), and an enum member in the code: a misspelt one is an
    AttributeError when its module loads."""

    def __repr__(self) -> str:
        return repr(self._value_)
