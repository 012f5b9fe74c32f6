"""The GPU a plan is made for: its queried resources, and the tuned choices measured on its kind.

A launch plan is a function of the problem and a ``Device`` (docs/kernels.md, "Planning"): multiprocessors,
registers and shared memory an SM, the most shared memory one block may take, L2 bytes, the compute capability,
and the peak rates a cost model weighs (16-bit tensor-core FLOP/s an SM, DRAM bytes/s: from the queried clocks).
``of(device)`` queries them once per device; off CUDA and under the interpreter it gives ``INTERPRETER``, whose few
"SMs" make persistent programs walk several tiles. ``DESCRIPTIONS`` holds datasheet figures of GPUs the tests plan
for without having them.

Choices measured on one kind of GPU with one Triton release (a width band where a variant won, a register cap) are
data, not code: ``reference_kernels/tuned/<arch>.json`` holds them by subject, with the GPU and the Triton release
they were measured with. ``tuning(subject, device, defaults)`` returns the subject's defaults (a frozen dataclass:
the principled choice that runs anywhere) with that file's values over them where the device's compute capability
and this Triton match the file's, and over those the values of the file's ``models`` section for the GPU whose name
holds its key (GPUs of one compute capability differ: the H200 has the H100's SMs and 1.4x its bandwidth); elsewhere
the defaults alone.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Any, TypeVar

import torch
import triton

from ._common import INTERPRETER_SMS, interpreting


@dataclasses.dataclass(frozen=True)
class Device:
    """What a launch plan reads of a GPU. ``arch``: compute capability as 10 * major + minor (0: not a GPU).
    ``concurrent``: a launch's resident programs run at once, so one may wait on another (not so under Triton's
    interpreter, which runs them one after another). ``mma_flops_per_sm``: dense 16-bit tensor-core FLOP/s an SM at
    the boost clock; ``dram_bytes_per_s``: the DRAM's peak (peaks: what a model ranks by, not what a kernel reaches)."""

    name: str
    arch: int
    sms: int
    regs_per_sm: int = 65536
    smem_per_sm: int = 233472
    smem_per_block: int = 232448
    l2_bytes: int = 50 << 20
    threads_per_sm: int = 2048
    concurrent: bool = True
    mma_flops_per_sm: float = 7.5e12
    dram_bytes_per_s: float = 3.35e12

    def __post_init__(self) -> None:
        for field in ("sms", "regs_per_sm", "smem_per_sm", "smem_per_block", "l2_bytes", "threads_per_sm",
                      "mma_flops_per_sm", "dram_bytes_per_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"Device {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.smem_per_block > self.smem_per_sm:
            raise ValueError(f"Device {self.name!r}: a block cannot take more shared memory than its SM has "
                             f"({self.smem_per_block} > {self.smem_per_sm})")

    @property
    def warps_per_sm(self) -> int:
        return self.threads_per_sm // 32


# Datasheet figures (CUDA programming guide, "Compute capabilities"; the vendors' L2 sizes, SXM boards' dense bf16
# tensor-core and HBM peaks). The H200 is the H100's SM with more HBM and L2; the tuned data of either is keyed by
# compute capability, not by name.
DESCRIPTIONS = {
    "A100": Device("A100", 80, 108, smem_per_sm=167936, smem_per_block=166912, l2_bytes=40 << 20,
                   mma_flops_per_sm=312e12 / 108, dram_bytes_per_s=2.04e12),
    "H100": Device("H100", 90, 132, l2_bytes=50 << 20, mma_flops_per_sm=989e12 / 132, dram_bytes_per_s=3.35e12),
    "H200": Device("H200", 90, 132, l2_bytes=60 << 20, mma_flops_per_sm=989e12 / 132, dram_bytes_per_s=4.8e12),
    "B200": Device("B200", 100, 148, l2_bytes=126 << 20, mma_flops_per_sm=2250e12 / 148, dram_bytes_per_s=8e12),
}
# Dense 16-bit tensor-core FLOPs a clock an SM, by the compute capability that introduced them (the datasheets' peaks
# over SMs x boost clock); an arch between two takes the lower's.
MMA_FLOPS_PER_CLOCK = {70: 1024, 80: 2048, 90: 4096, 100: 8192}
INTERPRETER = Device("interpreter", 0, INTERPRETER_SMS, concurrent=False)


@functools.cache
def _query(index: int) -> Device:
    p = torch.cuda.get_device_properties(index)
    arch = p.major * 10 + p.minor
    clocks = _clocks(index)  # kHz and bits, from the driver (torch does not expose them)
    known = max([a for a in MMA_FLOPS_PER_CLOCK if a <= arch], default=min(MMA_FLOPS_PER_CLOCK))
    sm_hz = clocks.get("sm_clock_rate", 0) * 1e3
    mem_hz = clocks.get("mem_clock_rate", 0) * 1e3
    bus_bits = clocks.get("mem_bus_width", 0)
    return Device(
        name=p.name, arch=arch, sms=p.multi_processor_count,
        regs_per_sm=getattr(p, "regs_per_multiprocessor", 65536),
        smem_per_sm=getattr(p, "shared_memory_per_multiprocessor", 0) or Device.smem_per_sm,
        smem_per_block=getattr(p, "shared_memory_per_block_optin", 0) or Device.smem_per_block,
        l2_bytes=getattr(p, "L2_cache_size", 0) or Device.l2_bytes,
        threads_per_sm=getattr(p, "max_threads_per_multi_processor", 0) or Device.threads_per_sm,
        mma_flops_per_sm=sm_hz * MMA_FLOPS_PER_CLOCK[known] or Device.mma_flops_per_sm,
        dram_bytes_per_s=mem_hz * 2 * bus_bits / 8 or Device.dram_bytes_per_s,  # double data rate
    )


def _clocks(index: int) -> dict:
    """The SM and memory clocks (kHz) and the memory bus width (bits) Triton's CUDA driver reads; {} if it cannot."""
    try:
        from triton.runtime import driver

        return dict(driver.active.utils.get_device_properties(index))
    except Exception:  # another backend, or a driver without them: the defaults rank instead
        return {}


def of(device: torch.device) -> Device:
    """The ``Device`` a tensor on ``device`` runs on: queried once per CUDA device; ``INTERPRETER`` off CUDA and
    under the interpreter (a CPU run never asks CUDA)."""
    if interpreting() or device.type != "cuda":
        return INTERPRETER
    return _query(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (``of(device).sms``): persistent grids are sized from it."""
    return of(device).sms


# --------------------------------------------------------------------------- tuned data

TUNED_DIR = pathlib.Path(__file__).parent / "tuned"
T = TypeVar("T")


@functools.cache
def _files() -> dict[int, dict[str, Any]]:
    """The tuned files by compute capability (``tuned/<arch>.json``)."""
    found = {}
    for path in sorted(TUNED_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        missing = {"arch", "triton", "measured_on"} - data.keys()
        if missing:
            raise ValueError(f"{path.name}: missing {sorted(missing)}")
        found[int(data["arch"])] = data
    return found


def tuned_here(device: Device) -> bool:
    """Whether a tuned file covers ``device`` with this Triton (its release starts with the file's ``triton``)."""
    data = _files().get(device.arch)
    return data is not None and triton.__version__.startswith(data["triton"])


def tuning(subject: str, device: Device, defaults: T) -> T:
    """``defaults`` (a frozen dataclass instance) with the tuned file's values for ``subject`` over them, where a file
    covers ``device`` and this Triton (``tuned_here``). A name the dataclass lacks is an error, not a silent skip."""
    if not tuned_here(device):
        return defaults
    return tuned(subject, device.arch, defaults, model_of(device))


def model_of(device: Device) -> str:
    """The key of its tuned file's ``models`` section that ``device``'s name holds (the longest), or ""."""
    models = _files().get(device.arch, {}).get("models", {})
    return max((m for m in models if m in device.name), key=len, default="")


@functools.cache
def tuned(subject: str, arch: int, defaults: T, model: str = "") -> T:
    """``defaults`` with ``tuned/<arch>.json``'s values for ``subject`` over them, and its ``models[model]`` values
    over those, whatever this Triton is (tests and benchmarks plan for a GPU they do not have with it)."""
    if arch not in _files():
        raise ValueError(f"no tuned file for compute capability {arch}; there are {sorted(_files())}")
    data = _files()[arch]
    if model and model not in data.get("models", {}):
        raise ValueError(f"tuned/{arch}.json has no model {model!r}; it has {sorted(data.get('models', {}))}")
    values = dict(data.get(subject, {}))
    values.update(data.get("models", {}).get(model, {}).get(subject, {}) if model else {})
    names = {f.name for f in dataclasses.fields(defaults)}
    unknown = set(values) - names
    if unknown:
        where = f"models.{model}." if model else ""
        raise ValueError(f"tuned/{arch}.json, {where}{subject}: no such choice {sorted(unknown)}")
    return dataclasses.replace(defaults, **{k: _frozen(v) for k, v in values.items()})


def _frozen(value: Any) -> Any:
    """JSON lists as tuples (hashable, as the dataclass fields are); JSON objects keyed by element size as int keys."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((int(k), _frozen(v)) for k, v in value.items()))
    return value
