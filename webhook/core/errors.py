"""Field errors shaped like Kubernetes' `field.ErrorList`: messages read like the API server's."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ErrorType(enum.Enum):
    """The error types of k8s.io/apimachinery/pkg/util/validation/field, with their wording."""

    REQUIRED = ("FieldValueRequired", "Required value")
    INVALID = ("FieldValueInvalid", "Invalid value")
    NOT_FOUND = ("FieldValueNotFound", "Not found")
    DUPLICATE = ("FieldValueDuplicate", "Duplicate value")
    NOT_SUPPORTED = ("FieldValueNotSupported", "Unsupported value")
    FORBIDDEN = ("FieldValueForbidden", "Forbidden")
    TOO_LONG = ("FieldValueTooLong", "Too long")
    TOO_MANY = ("FieldValueTooMany", "Too many")

    @property
    def reason(self) -> str:
        """The `status.details.causes[].reason` the API server uses for this type (the admission
        layer's denials carry it)."""
        return self.value[0]

    @property
    def wording(self) -> str:
        return self.value[1]


# Types whose message shows the offending value, as the API server prints them.
_SHOWS_VALUE = {
    ErrorType.INVALID,
    ErrorType.NOT_FOUND,
    ErrorType.DUPLICATE,
    ErrorType.NOT_SUPPORTED,
}
_NO_VALUE = object()


class Path:
    """A field path such as `spec.scheduling.replicatedJobs[1].targetReplicatedJobs[0]`."""

    __slots__ = ("_text",)

    def __init__(self, *names: str) -> None:
        self._text = ".".join(names)

    @classmethod
    def _raw(cls, text: str) -> Path:
        path = cls()
        path._text = text
        return path

    def child(self, *names: str) -> Path:
        text = self._text
        for name in names:
            text = f"{text}.{name}" if text else name
        return Path._raw(text)

    def index(self, i: int) -> Path:
        return Path._raw(f"{self._text}[{i}]")

    def key(self, k: str) -> Path:
        """A map entry, as the API server names one: `requests[cpu]`."""
        return Path._raw(f"{self._text}[{k}]")

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"Path({self._text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Path) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: what is wrong (type, value) and what to do (detail)."""

    type: ErrorType
    path: str
    detail: str = ""
    value: Any = _NO_VALUE

    def __str__(self) -> str:
        return f"{self.path}: {self.body}"

    @property
    def body(self) -> str:
        """The message without the field path (`status.details.causes[].message`)."""
        parts = [self.type.wording]
        if self.type in _SHOWS_VALUE and self.value is not _NO_VALUE:
            parts.append(_render_value(self.value))
        if self.detail:
            parts.append(self.detail)
        return ": ".join(parts)


MAX_VALUE_TEXT = 200  # a value (a list of every ReplicatedJob, say) is cut to this many characters


def _render_value(value: Any) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= MAX_VALUE_TEXT else text[: MAX_VALUE_TEXT - 3] + "..."


def required(path: Path, detail: str) -> FieldError:
    return FieldError(ErrorType.REQUIRED, str(path), detail)


def invalid(path: Path, value: Any, detail: str) -> FieldError:
    return FieldError(ErrorType.INVALID, str(path), detail, value)


def not_found(path: Path, value: Any, detail: str) -> FieldError:
    return FieldError(ErrorType.NOT_FOUND, str(path), detail, value)


def duplicate(path: Path, value: Any, detail: str) -> FieldError:
    return FieldError(ErrorType.DUPLICATE, str(path), detail, value)


def not_supported(path: Path, value: Any, supported: Sequence[str]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(s) for s in supported)
    return FieldError(ErrorType.NOT_SUPPORTED, str(path), detail, value)


def forbidden(path: Path, detail: str) -> FieldError:
    return FieldError(ErrorType.FORBIDDEN, str(path), detail)


def too_long(path: Path, limit: int, detail: str = "") -> FieldError:
    text = f"may not be more than {limit} characters"
    return FieldError(ErrorType.TOO_LONG, str(path), f"{text}; {detail}" if detail else text)


def too_many(path: Path, count: int, limit: int, detail: str = "") -> FieldError:
    text = f"{count}: must have at most {limit} items"
    return FieldError(ErrorType.TOO_MANY, str(path), f"{text}; {detail}" if detail else text)


def too_many_in(
    path: Path, count: int, what: str, holder: str, limit: int, detail: str
) -> FieldError:
    """Too many of something the object makes (a runtime's PodGroup templates), which is not
    the items of the list at `path`: the message names what is counted and what holds it."""
    text = f"{count} {what}, and {holder} holds at most {limit}"
    return FieldError(ErrorType.TOO_MANY, str(path), f"{text}; {detail}")


MAX_SHOWN = 20  # errors in one message: a hostile object could carry thousands


def shown(errors: Sequence[FieldError]) -> tuple[list[FieldError], int]:
    """The errors a denial shows, and how many more there are."""
    return list(errors[:MAX_SHOWN]), max(len(errors) - MAX_SHOWN, 0)


def render(kind: str, name: str, errors: Sequence[FieldError]) -> str:
    """The API server's message for an invalid object: `Kind "name" is invalid: [e1, e2]`."""
    first, more = shown(errors)
    errs = [str(e) for e in first]
    if more:
        errs.append(f"and {more} more errors")
    body = errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"
    return f'{kind} "{name}" is invalid: {body}'
