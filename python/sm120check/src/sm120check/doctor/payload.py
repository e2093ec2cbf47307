"""One type per probe answer: the probe that prints it and the check that judges it import the same dataclass.

Each payload has `to_json()` (what the probe prints, through `child.emit`) and a strict `from_json()` that raises
PayloadError naming the probe and the field (`nvml_info: info.gpus[1].cc: expected [major, minor], got "12.0"`), so
a probe and its judge cannot drift apart silently: mypy checks the fields on both sides. These modules import only
the standard library and the doctor's ctypes readers, never torch: a judge in the doctor may import them.
"""

from __future__ import annotations

from collections.abc import Mapping


class PayloadError(ValueError):
    """A probe printed JSON that does not fit its payload type; `field` is the path of the bad field."""

    def __init__(self, probe: str, field: str, problem: str) -> None:
        super().__init__(f"{probe}: {field}: {problem}")
        self.probe, self.field, self.problem = probe, field, problem


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """Strict reads from one JSON object of a probe's answer; every failure names the field's path."""

    def __init__(self, probe: str, value: object, where: str = "") -> None:
        if not isinstance(value, Mapping):
            raise PayloadError(probe, where or "(answer)", f"expected an object, got {_shown(value)}")
        self.probe, self.where, self.data = probe, where, value

    def at(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return name in self.data

    def _bad(self, name: str, expected: str, value: object) -> PayloadError:
        return PayloadError(self.probe, self.at(name), f"expected {expected}, got {_shown(value)}")

    def _value(self, name: str) -> object:
        if name not in self.data:
            raise PayloadError(self.probe, self.at(name), "missing")
        return self.data[name]

    def text(self, name: str) -> str:
        value = self._value(name)
        if not isinstance(value, str):
            raise self._bad(name, "a string", value)
        return value

    def maybe_text(self, name: str) -> str | None:
        """A string, or None when the field is absent or null."""
        return None if self.data.get(name) is None else self.text(name)

    def integer(self, name: str) -> int:
        value = self._value(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(name, "an integer", value)
        return value

    def maybe_integer(self, name: str) -> int | None:
        return None if self.data.get(name) is None else self.integer(name)

    def number(self, name: str) -> float:
        value = self._value(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._bad(name, "a number", value)
        return float(value)

    def maybe_number(self, name: str) -> float | None:
        return None if self.data.get(name) is None else self.number(name)

    def flag(self, name: str) -> bool:
        value = self._value(name)
        if not isinstance(value, bool):
            raise self._bad(name, "true or false", value)
        return value

    def maybe_flag(self, name: str) -> bool | None:
        return None if self.data.get(name) is None else self.flag(name)

    def _list(self, name: str) -> list[object]:
        value = self._value(name)
        if not isinstance(value, list):
            raise self._bad(name, "a list", value)
        return value

    def texts(self, name: str) -> tuple[str, ...]:
        found: list[str] = []
        for index, value in enumerate(self._list(name)):
            if not isinstance(value, str):
                raise self._bad(f"{name}[{index}]", "a string", value)
            found.append(value)
        return tuple(found)

    def integers(self, name: str) -> tuple[int, ...]:
        found: list[int] = []
        for index, value in enumerate(self._list(name)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise self._bad(f"{name}[{index}]", "an integer", value)
            found.append(value)
        return tuple(found)

    def objects(self, name: str) -> tuple[Fields, ...]:
        return tuple(Fields(self.probe, v, f"{self.at(name)}[{i}]") for i, v in enumerate(self._list(name)))

    def object(self, name: str) -> Fields:
        return Fields(self.probe, self._value(name), self.at(name))

    def text_lists(self, name: str) -> dict[str, tuple[str, ...]]:
        """An object whose values are lists of strings ({"libcudart": ["/usr/.../libcudart.so.13"]})."""
        inner = self.object(name)
        return {key: inner.texts(key) for key in inner.data}
