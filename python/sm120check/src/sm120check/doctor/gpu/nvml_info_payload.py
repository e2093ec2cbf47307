"""The answer of gpu/nvml_info_probe.py: what NVML said (`info`), or why it could not be loaded (`error`)."""

from __future__ import annotations

from dataclasses import dataclass

from sm120check.doctor.nvml_api import Gpu, NvmlInfo
from sm120check.doctor.payload import Fields, PayloadError

PROBE = "nvml_info"


@dataclass(frozen=True)
class NvmlAnswer:
    info: NvmlInfo | None  # None: NVML did not load (error says why)
    error: str = ""

    def to_json(self) -> dict[str, object]:
        if self.info is None:
            return {"error": self.error}
        info = self.info
        gpus = [
            {"index": g.index, "name": g.name, "cc": list(g.cc), "persistence": g.persistence, "bus_id": g.bus_id}
            for g in info.gpus
        ]
        return {"info": {"driver": info.driver, "cuda_driver": info.cuda_driver, "gpus": gpus, "backend": info.backend}}

    @classmethod
    def from_json(cls, data: object) -> NvmlAnswer:
        answer = Fields(PROBE, data)
        if not answer.has("info"):
            return cls(None, answer.text("error"))
        info = answer.object("info")
        return cls(
            NvmlInfo(
                info.text("driver"),
                info.integer("cuda_driver"),
                tuple(_gpu(g) for g in info.objects("gpus")),
                info.text("backend"),
            )
        )


def _gpu(g: Fields) -> Gpu:
    cc = g.integers("cc")
    if len(cc) != 2:
        raise PayloadError(PROBE, g.at("cc"), f"expected [major, minor], got {list(cc)}")
    return Gpu(g.integer("index"), g.text("name"), (cc[0], cc[1]), g.maybe_flag("persistence"), g.text("bus_id"))
