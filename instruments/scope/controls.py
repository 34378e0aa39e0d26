"""Declarative SCPI controls: each instrument setting is declared once, by name, on its driver.

A driver class declares its settings as class attributes::

    class Scope(ScpiDriver):
        timebase_scale = Control(":TIMebase:SCALe", "Horizontal scale.", Numeric(1e-9, 50.0),
                                 unit="s/div")
        channel_scale = Control(":CHANnel{channel}:SCALe", "Vertical scale of one channel.",
                                Numeric(1e-3, 10.0), unit="V/div", index=range(1, 5))

and uses them as attributes: ``scope.timebase_scale = 1e-4`` writes
``:TIMebase:SCALe 0.0001``; ``scope.timebase_scale`` sends ``:TIMebase:SCALe?`` and parses
the reply; an indexed control is used as ``scope.channel_scale[2] = 0.5``. The attribute
name is the control's only name (taken with ``__set_name__``), so a bad value raises a
``ValueError`` naming the control, the value and what is allowed.

Commands without a setting (``:SINGle``) are :class:`Command`; read-only queries with
arguments (``:MEASure:DELay? CHANnel1,CHANnel2``) are :class:`Query`. Every SCPI string a
driver sends is thereby one declaration with a one-line doc.

Commands are written in the programming guides' notation (``:TRIGger:EDGe:SLOPe
POSitive``): SCPI headers and mnemonics are case-insensitive and the long form is always
accepted, so the bytes on the wire read like the guide.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Transport(Protocol):
    """A message-based instrument connection (a pyvisa resource, or a test fake)."""

    def write(self, command: str) -> object:
        """Send one command; the termination is the transport's business."""
        ...

    def query(self, command: str) -> str:
        """Send one query and return the reply."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


class ScpiDriver:
    """Base of drivers whose controls talk through an injected :class:`Transport`."""

    def __init__(self, transport: Transport):
        self.transport = transport


def scpi_number(value: float) -> str:
    """Format a number as SCPI ``<NRf>`` text with six significant digits (``0.0001``)."""
    return f"{value:.6G}"


def scpi_short_form(mnemonic: str) -> str:
    """The short form of a guide mnemonic: its capitals plus any numeric suffix
    (``POSitive`` -> ``POS``, ``CHANnel2`` -> ``CHAN2``)."""
    match = re.fullmatch(r"([A-Z0-9]*)[a-z]*(\d*)", mnemonic)
    if match is None or not match.group(1):
        return mnemonic.upper()
    return match.group(1) + match.group(2)


class Validator(Protocol):
    """What a control accepts, how it is written to the instrument and read back."""

    def check(self, value: Any) -> Any:
        """Return the canonical value; raise ValueError with the reason if not allowed."""
        ...

    def to_scpi(self, value: Any) -> str:
        """Format a checked value as the command argument."""
        ...

    def from_scpi(self, reply: str) -> Any:
        """Parse the instrument's reply to the query form."""
        ...

    def describe(self, unit: str) -> str:
        """Say what is allowed, for error messages (``0.001 to 10 V/div``)."""
        ...


class Numeric:
    """A real number within ``[minimum, maximum]`` (inclusive), in the control's unit."""

    def __init__(self, minimum: float, maximum: float):
        if minimum > maximum:
            raise ValueError(f"empty range {minimum} to {maximum}")
        self.minimum = minimum
        self.maximum = maximum

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("not a number")
        number = float(value)
        if not self.minimum <= number <= self.maximum:  # also rejects NaN
            raise ValueError("out of range")
        return number

    def to_scpi(self, value: float) -> str:
        return scpi_number(value)

    def from_scpi(self, reply: str) -> float:
        return float(reply)

    def describe(self, unit: str) -> str:
        suffix = f" {unit}" if unit else ""
        return f"{scpi_number(self.minimum)} to {scpi_number(self.maximum)}{suffix}"


class Choice:
    """One of a set of SCPI mnemonics, given in the guide's notation (``POSitive``).

    A value is accepted in its short or long form, any case (``pos``, ``POSITIVE``), and
    written in the guide's notation; the instrument's reply (usually the short form,
    ``POS``) is read back as the guide's notation.
    """

    def __init__(self, *mnemonics: str):
        if not mnemonics:
            raise ValueError("a Choice needs at least one mnemonic")
        self.mnemonics = mnemonics
        self._by_form: dict[str, str] = {}
        for mnemonic in mnemonics:
            self._by_form[mnemonic.upper()] = mnemonic
            self._by_form[scpi_short_form(mnemonic)] = mnemonic

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or value.strip().upper() not in self._by_form:
            raise ValueError("not one of the allowed values")
        return self._by_form[value.strip().upper()]

    def to_scpi(self, value: str) -> str:
        return value

    def from_scpi(self, reply: str) -> str:
        return self.check(reply.strip().strip('"'))

    def describe(self, unit: str) -> str:
        return "one of " + ", ".join(self.mnemonics)


class Boolean:
    """On or off: written ``ON``/``OFF``, read back from ``1``/``0`` or ``ON``/``OFF``."""

    _TRUE = {"1", "ON"}
    _FALSE = {"0", "OFF"}

    def check(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().upper() in self._TRUE | self._FALSE:
            return value.strip().upper() in self._TRUE
        raise ValueError("not a boolean")

    def to_scpi(self, value: bool) -> str:
        return "ON" if value else "OFF"

    def from_scpi(self, reply: str) -> bool:
        return self.check(reply)

    def describe(self, unit: str) -> str:
        return "True/False (ON/OFF)"


def _template_fields(template: str) -> list[str]:
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


class Declaration:
    """Common part of the descriptors: the template, the doc and the attribute name."""

    def __init__(self, template: str, doc: str):
        if not doc or not doc.strip():
            raise ValueError(f"{template}: a declaration needs a one-line doc")
        self.template = template
        self.doc = doc.strip()
        self.__doc__ = self.doc
        self.name = "?"
        self.owner_name = "?"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner_name = owner.__name__

    @property
    def qualified_name(self) -> str:
        return f"{self.owner_name}.{self.name}"

    def _transport(self, instance: Any) -> Transport:
        return instance.transport


class Control(Declaration):
    """A setting the instrument can be told and asked: ``<command> <value>`` / ``<command>?``.

    ``command`` may hold one ``{field}`` placeholder (``:CHANnel{channel}:SCALe``); the
    control is then indexed, and ``index`` lists the allowed values of the field.
    """

    def __init__(self, command: str, doc: str, validator: Validator, *, unit: str = "",
                 index: range | None = None):
        super().__init__(command, doc)
        fields = _template_fields(command)
        if len(fields) > 1:
            raise ValueError(f"{command}: at most one placeholder")
        if bool(fields) != (index is not None):
            raise ValueError(f"{command}: an index range goes with exactly one placeholder")
        self.field = fields[0] if fields else None
        self.validator = validator
        self.unit = unit
        self.index = index

    # -- the SCPI text --------------------------------------------------------------------

    def header(self, index: int | None = None) -> str:
        """The command header, with the index filled in (``:CHANnel2:SCALe``)."""
        if self.field is None:
            return self.template
        return self.template.format(**{self.field: self._checked_index(index)})

    def set_command(self, value: Any, index: int | None = None) -> str:
        """The exact command that sets ``value``; raises ValueError if it is not allowed."""
        return f"{self.header(index)} {self.validator.to_scpi(self.check(value))}"

    def query_command(self, index: int | None = None) -> str:
        """The exact query that reads the setting back."""
        return f"{self.header(index)}?"

    def check(self, value: Any) -> Any:
        """The canonical value, or ValueError naming this control, the value and the range."""
        try:
            return self.validator.check(value)
        except ValueError as reason:
            raise ValueError(
                f"{self.qualified_name} ({self.template}): {value!r} is not allowed ({reason});"
                f" allowed: {self.validator.describe(self.unit)}") from None

    def _checked_index(self, index: int | None) -> int:
        assert self.index is not None
        if isinstance(index, bool) or not isinstance(index, int) or index not in self.index:
            raise ValueError(
                f"{self.qualified_name} ({self.template}): {self.field} {index!r} is not"
                f" allowed; allowed: {self.index.start} to {self.index.stop - 1}")
        return index

    # -- through the transport ------------------------------------------------------------

    def set(self, instance: Any, value: Any, index: int | None = None) -> None:
        """Write the setting through ``instance.transport``."""
        self._transport(instance).write(self.set_command(value, index))

    def get(self, instance: Any, index: int | None = None) -> Any:
        """Query the setting through ``instance.transport`` and parse the reply."""
        reply = self._transport(instance).query(self.query_command(index)).strip()
        try:
            return self.validator.from_scpi(reply)
        except ValueError:
            raise ValueError(
                f"{self.qualified_name}: the instrument replied {reply!r} to"
                f" {self.query_command(index)!r}, which is not"
                f" {self.validator.describe(self.unit)}") from None

    # -- descriptor protocol --------------------------------------------------------------

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if self.field is not None:
            return _IndexedControl(self, instance)
        return self.get(instance)

    def __set__(self, instance: Any, value: Any) -> None:
        if self.field is not None:
            raise AttributeError(
                f"{self.qualified_name} is indexed by {self.field}: use"
                f" {self.name}[<{self.field}>] = value")
        self.set(instance, value)


class _IndexedControl:
    """An indexed control bound to one driver: ``driver.channel_scale[2] = 0.5``."""

    def __init__(self, control: Control, instance: Any):
        self._control = control
        self._instance = instance

    def __getitem__(self, index: int) -> Any:
        return self._control.get(self._instance, index)

    def __setitem__(self, index: int, value: Any) -> None:
        self._control.set(self._instance, value, index)


class Command(Declaration):
    """A command without a reply (``:SINGle``); the template's fields are keyword arguments."""

    def command(self, **fields: Any) -> str:
        """The exact text written for these fields."""
        return self.template.format(**fields)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self

        def send(**fields: Any) -> None:
            self._transport(instance).write(self.command(**fields))

        send.__doc__ = self.doc
        return send


class Query(Declaration):
    """A read-only query (``:TRIGger:STATus?``); returns the reply, stripped, parsed by
    ``parse``."""

    def __init__(self, template: str, doc: str, parse: Callable[[str], Any] = str):
        super().__init__(template, doc)
        if "?" not in template:
            raise ValueError(f"{template}: a query's header ends with '?'")
        self.parse = parse

    def command(self, **fields: Any) -> str:
        """The exact text written for these fields."""
        return self.template.format(**fields)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self

        def ask(**fields: Any) -> Any:
            return self.parse(self._transport(instance).query(self.command(**fields)).strip())

        ask.__doc__ = self.doc
        return ask
