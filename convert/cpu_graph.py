"""Which graph of an exported folder to serve on this CPU: its instruction-set family, read from the CPU's flags.

An int8 graph is fast only where the CPU has the instructions its kernels were written for (`convert/onnx_int8.py`):
onnxruntime's int8 matmuls use VNNI on AVX-512 VNNI CPUs, and OpenVINO's int8 runs on oneDNN's generic int8 gemm
on CPUs without AVX-512 or VNNI, slower than its own fp32 there. `FAMILIES` says, per family, which graph each
runtime serves by default and the measurement behind it (`docs/benchmarks.md`, "int8 per CPU family"); where no
int8 graph was measured faster than the fp32 graph on a family, the fp32 graph is served. The choice is a function
of the flags alone, never of a timing at load, so every worker of a job on the same kind of CPU embeds with the
same graph (`moe-embed embed` decides once, on the driver, for all its workers).

Flags are the kernel's (`/proc/cpuinfo`, as `lscpu` prints them) on Linux, else numpy's reading of the CPU
(`numpy._core._multiarray_umath.__cpu_features__`), in the kernel's names.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

from moe_embed.convert.onnx_int8 import INT8_VARIANTS
from moe_embed.convert.openvino_int8 import OPENVINO_INT8_FILE

GRAPH_FILE = "onnx/model.onnx"  # an exported folder's fp32 graph (`moe-embed export`)
ARM_MACHINES = ("aarch64", "arm64", "armv8l")
# numpy's feature names -> the Linux kernel's flag names, for the flags the families read
NUMPY_FLAGS = {"AVX2": "avx2", "AVX512F": "avx512f", "AVX512BW": "avx512bw", "AVX512VNNI": "avx512_vnni",
               "FMA3": "fma", "ASIMD": "asimd", "ASIMDDP": "asimddp"}  # fmt: skip


@dataclass(frozen=True)
class CpuFamily:
    """A kind of CPU by its int8 instructions: `any_of` flags make a CPU one (the first family that matches, in
    `FAMILIES` order); `onnxruntime` is the int8 variant onnxruntime serves there (None: the fp32 graph);
    `openvino_int8` whether OpenVINO serves its int8 model there; `evidence` what decided both."""

    name: str
    any_of: tuple[str, ...]
    onnxruntime: str | None
    openvino_int8: bool
    evidence: str


FAMILIES = (
    CpuFamily(
        "avx512_vnni",
        ("avx512_vnni", "amx_int8"),
        "avx512_vnni",
        True,
        "measured: onnxruntime int8 2.5-3.3x PyTorch and 2.3-2.5x its fp32 graph, OpenVINO int8 2.6-3.0x its fp32",
    ),
    CpuFamily(
        "avx512",
        ("avx512bw",),
        None,
        True,
        "onnxruntime's int8 is not measured without VNNI (it has no ISA cap): fp32; OpenVINO int8 1.6-1.8x its "
        "fp32 with oneDNN capped at AVX-512 without VNNI",
    ),
    CpuFamily(
        "avx2",
        ("avx2",),
        None,
        False,
        "onnxruntime int8 at 1.1-1.2x PyTorch on an AVX2 CPU, not shown to beat its fp32 graph: fp32; OpenVINO "
        "int8 0.73-0.77x its fp32 with oneDNN capped at AVX2",
    ),
    CpuFamily(
        "arm64",
        (),
        None,
        False,
        "not measured on an ARM CPU: fp32",
    ),
)


def cpuinfo_field(key: str) -> str | None:
    """The first value of `key` in Linux's `/proc/cpuinfo` (`model name`, `flags`, ...); None where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's flags in the Linux kernel's names (`avx2`, `avx512_vnni`, `asimddp`, ...)."""
    flags = cpuinfo_field("flags") or cpuinfo_field("Features")  # x86; ARM
    if flags is not None:
        return frozenset(flags.split())
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as features
    return frozenset(NUMPY_FLAGS[name] for name, present in features.items() if present and name in NUMPY_FLAGS)


def cpu_family(flags: frozenset[str] | None = None, machine: str | None = None) -> CpuFamily | None:
    """This CPU's family (or the one of `flags` on `machine`), None for a CPU none of `FAMILIES` describes."""
    flags = cpu_flags() if flags is None else flags
    machine = (machine or platform.machine()).lower()
    if machine in ARM_MACHINES:
        return FAMILIES[-1]
    return next((family for family in FAMILIES if family.any_of and set(family.any_of) & flags), None)


def describe(family: CpuFamily | None, flags: frozenset[str]) -> str:
    shown = sorted(flags & {"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp"})
    return f"{family.name if family else 'unknown'} CPU (flags: {', '.join(shown) or 'none of the int8 ones'})"


def family_file(folder: str | Path, runtime: str, family: CpuFamily | None) -> tuple[str, str]:
    """The graph of the exported `folder` that `runtime` (`onnxruntime` or `openvino`) serves on a CPU of `family`
    (None: a CPU no family describes), as a path relative to the folder, and why: the family's int8 graph where it
    is measured faster and the folder has it (or a variant of the same setting, the same graph under another
    family's name: sentence-transformers' names say the setting), else the fp32 graph."""
    if runtime not in ("onnxruntime", "openvino"):
        raise ValueError(f"runtime must be 'onnxruntime' or 'openvino', got {runtime!r}")
    if runtime == "openvino":
        candidates = [OPENVINO_INT8_FILE] if family and family.openvino_int8 else []
    else:
        candidates = same_setting_files(family.onnxruntime) if family and family.onnxruntime else []
    if not candidates:
        why = family.evidence if family else "no int8 graph known faster"
        return GRAPH_FILE, f"the fp32 graph {GRAPH_FILE} ({why})"
    found = next((file for file in candidates if (Path(folder) / file).is_file()), None)
    if found is None:
        return GRAPH_FILE, f"the fp32 graph {GRAPH_FILE}, as the folder has no {candidates[0]} (--quantize int8)"
    return found, f"the int8 graph {found} ({family.evidence})"


def same_setting_files(variant: str) -> list[str]:
    """The files of `variant` and of every variant quantised with its setting, its own first."""
    setting = INT8_VARIANTS[variant].setting
    names = [variant] + [name for name, v in INT8_VARIANTS.items() if name != variant and v.setting == setting]
    return [f"onnx/{INT8_VARIANTS[name].file_name}" for name in names]


def serving_file(folder: str | Path, runtime: str = "onnxruntime") -> tuple[str, str]:
    """The graph of the exported `folder` to serve on this CPU with `runtime` (`family_file` of this CPU's family),
    and a sentence naming the CPU and why."""
    flags = cpu_flags()
    family = cpu_family(flags)
    file, why = family_file(folder, runtime, family)
    return file, f"{describe(family, flags)}: {why}"


__all__ = ["FAMILIES", "CpuFamily", "cpuinfo_field", "cpu_flags", "cpu_family", "family_file", "serving_file"]
