"""The NVML source on a real NVIDIA GPU, next to ``nvidia-smi``.

The tests drive the source through a fake ``libnvidia-ml.so.1``; this check runs it
against the real driver: three readings (idle, while a GPU load runs, after it), each
printed beside ``nvidia-smi``'s figures for the same moment, and checks that

- every GPU is listed with its UUID and name as ``nvidia-smi`` shows them;
- memory used agrees within 5 % (or 256 MiB) and power within 15 % (or 30 W);
- under load the utilization reads at least 50 % and the load's process is listed
  with its GPU memory; idle it reads at most 20 %.

    python -m bench.nvml_on_gpu [--load-command "python3 load.py"] [--json out.json]

Without ``--load-command`` a PyTorch matrix-multiply loop is the load. Exits 1 when a
check fails, 2 when the host has no NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import shlex
import subprocess
import sys
import time
from typing import Any

from collector.records import DeviceSample, HostFacts, ProcessSample
from collector.sources.nvml import NvmlSource

_TORCH_LOAD = (
    "import time, torch\n"
    "a = torch.randn(8192, 8192, device='cuda')\n"
    "end = time.time() + 60\n"
    "while time.time() < end:\n"
    "    b = a @ a\n"
    "    torch.cuda.synchronize()\n"
)
_SMI_FIELDS = ("uuid", "name", "memory.used", "power.draw", "utilization.gpu")


def smi_readings() -> dict[str, dict[str, str]]:
    """``nvidia-smi``'s figures per GPU UUID (memory in MiB, power in W, util in %)."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = csv.reader(io.StringIO(out), skipinitialspace=True)
    return {row[0]: dict(zip(_SMI_FIELDS, row, strict=True)) for row in rows if row}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def check_reading(
    phase: str,
    devices: list[DeviceSample],
    processes: list[ProcessSample],
    smi: dict[str, dict[str, str]],
    load_pid: int | None,
) -> list[str]:
    """What disagrees in one reading (empty: all checks hold)."""
    failures: list[str] = []
    gpus = [d for d in devices if d.kind == "gpu"]
    if {d.uuid for d in gpus} != set(smi):
        failures.append(f"{phase}: GPUs {sorted(d.uuid for d in gpus)} vs nvidia-smi {sorted(smi)}")
    for gpu in gpus:
        theirs = smi.get(gpu.uuid)
        if theirs is None:
            continue
        if gpu.name != theirs["name"]:
            failures.append(f"{phase}: {gpu.uuid} name {gpu.name!r} vs {theirs['name']!r}")
        used_mib = _number(theirs["memory.used"])
        if used_mib is not None and gpu.memory_used_bytes is not None:
            ours = gpu.memory_used_bytes / 2**20
            if abs(ours - used_mib) > max(0.05 * used_mib, 256):
                failures.append(f"{phase}: memory used {ours:.0f} MiB vs {used_mib:.0f} MiB")
        power = _number(theirs["power.draw"])
        if (
            power is not None
            and gpu.power_w is not None
            and abs(gpu.power_w - power) > max(0.15 * power, 30)
        ):
            failures.append(f"{phase}: power {gpu.power_w:.0f} W vs {power:.0f} W")
        util = gpu.utilization_gpu_pct
        if phase == "load" and (util is None or util < 50):
            failures.append(f"load: utilization {util} % (>= 50 wanted)")
        if phase == "idle" and util is not None and util > 20:
            failures.append(f"idle: utilization {util} % (<= 20 wanted)")
    if phase == "load" and load_pid is not None:
        mine = [p for p in processes if p.pid == load_pid and p.role == "gpu"]
        if not mine or not (mine[0].gpu_memory_bytes or 0) > 0:
            failures.append(f"load: process {load_pid} not listed with GPU memory: {mine}")
    return failures


def _reading(source: NvmlSource) -> tuple[list[DeviceSample], list[ProcessSample], HostFacts]:
    records = source.collect()
    devices = [r for r in records if isinstance(r, DeviceSample)]
    processes = [r for r in records if isinstance(r, ProcessSample)]
    facts = next(r for r in records if isinstance(r, HostFacts))
    return devices, processes, facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-command", help="a command that keeps the GPU busy ~60 s")
    parser.add_argument("--json", help="write every reading here")
    args = parser.parse_args(argv)

    source = NvmlSource("gpu-host")
    dump: list[dict[str, Any]] = []
    failures: list[str] = []
    command = (
        shlex.split(args.load_command) if args.load_command else [sys.executable, "-c", _TORCH_LOAD]
    )
    load: subprocess.Popen[bytes] | None = None
    try:
        for phase in ("idle", "load", "after"):
            if phase == "load":
                load = subprocess.Popen(command)
                time.sleep(15)  # the load's CUDA context and first kernels
            elif phase == "after" and load is not None:
                load.kill()
                load.wait(timeout=30)
                time.sleep(5)
            source.collect()  # a first tick primes the per-process and GPM samples
            time.sleep(2)
            devices, processes, facts = _reading(source)
            if facts.nvml_absent:
                print(f"no NVIDIA GPU: {facts.nvml_absent}")
                return 2
            smi = smi_readings()
            pid = load.pid if load is not None and phase == "load" else None
            failures += check_reading(phase, devices, processes, smi, pid)
            print(f"== {phase}")
            for d in devices:
                print(
                    f"  {d.kind} {d.index} {d.name} util {d.utilization_gpu_pct} % "
                    f"mem {d.memory_used_bytes} B power {d.power_w} W sm_active "
                    f"{d.sm_active_pct} % healthy {d.healthy} {d.error or ''}"
                )
            for p in processes:
                if p.role == "gpu":
                    print(f"  process {p.pid} gpu mem {p.gpu_memory_bytes} B sm {p.sm_util_pct} %")
            for uuid, row in smi.items():
                print(f"  nvidia-smi {uuid}: {row}")
            dump.append(
                {
                    "phase": phase,
                    "devices": [dataclasses.asdict(d) for d in devices],
                    "processes": [dataclasses.asdict(p) for p in processes],
                    "nvidia_smi": smi,
                }
            )
    finally:
        if load is not None and load.poll() is None:
            load.kill()
        source.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(dump, out, indent=1)
    for failure in failures:
        print(f"FAIL {failure}")
    print("all checks hold" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
