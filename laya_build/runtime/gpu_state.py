"""The GPU's clocks, power and clock limits while something is timed (``nvidia-smi``, sampled).

A latency figure of a GPU says little without the state the GPU was in: an H200 that draws its
700 W limit lowers its SM clock (1,980 MHz at most) by a few percent, and a compute-bound forward
slows by as much; two machines of one model can differ the same way.  :class:`GpuSampler`
runs ``nvidia-smi --query-gpu ... -lms INTERVAL`` for one GPU beside the timed calls and
summarises its samples (:func:`summarise`): the SM clock (median, least, most), the memory
clock, the power drawn (median, most), the highest temperature, and each clock limit the driver
reported active (``clocks_event_reasons.active``: the power cap, thermal slowdowns, ...) with
the share of samples it was active in.  Where ``nvidia-smi`` is missing or fails, the summary
says why (``{"unavailable": ...}``) and the timing stands without it.

The sampler is a process of its own session, ended (its whole group) when the block ends, also
when the block raises.  Should the timing process itself be killed, the sampler ends at its
next sample: its output is a pipe to the killed process, and writing to it ends ``nvidia-smi``
(SIGPIPE).  Standard library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import threading

INTERVAL_MS = 50  # between samples; nvidia-smi takes a few ms a query
QUERY = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")
# clocks_event_reasons.active's bits (NVML's nvmlClocksEventReasons)
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks",
}
STOP_WAIT_S = 2.0


def nvidia_smi() -> str | None:
    """The ``nvidia-smi`` on ``PATH``, or None."""
    return shutil.which("nvidia-smi")


def device_id(device) -> str | None:
    """The id ``nvidia-smi -i`` takes for torch's CUDA ``device`` (its UUID), or None when it is no
    CUDA device or torch cannot say."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return None if uuid is None else f"GPU-{uuid}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse(line: str) -> dict | None:
    """One sample of :data:`QUERY` (``--format=csv,noheader,nounits``), or None for a line that
    is not one."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != len(QUERY):
        return None
    sm, mem, power, temp = (_number(f) for f in fields[:4])
    try:
        reasons = int(fields[4], 16)
    except ValueError:
        reasons = None
    if sm is None:
        return None
    return {"sm_mhz": sm, "mem_mhz": mem, "power_w": power, "temp_c": temp, "reasons": reasons}


def _spread(values: list[float], *keys: str) -> dict:
    pick = {"median": statistics.median, "min": min, "max": max}
    return {k: round(pick[k](values), 2) for k in keys}


def summarise(samples: list[dict], interval_ms: int = INTERVAL_MS) -> dict:
    """What :class:`GpuSampler` reports of its ``samples``: ``samples``, ``interval_ms``,
    ``sm_clock_mhz`` (median, min, max), ``memory_clock_mhz`` (median), ``power_w`` (median,
    max), ``temperature_c`` (max) where the GPU reported them, and ``clock_limits``: each limit
    active in some sample, with the share of the samples it was active in."""
    out = {"samples": len(samples), "interval_ms": interval_ms}
    for key, name, spread in (
        ("sm_mhz", "sm_clock_mhz", ("median", "min", "max")),
        ("mem_mhz", "memory_clock_mhz", ("median",)),
        ("power_w", "power_w", ("median", "max")),
        ("temp_c", "temperature_c", ("max",)),
    ):
        values = [s[key] for s in samples if s[key] is not None]
        if values:
            out[name] = _spread(values, *spread)
    limits = {}
    for bit, reason in REASONS.items():
        active = sum(1 for s in samples if s["reasons"] is not None and s["reasons"] & bit)
        if active:
            limits[reason] = round(active / len(samples), 3)
    out["clock_limits"] = limits
    return out


def limits(summary: dict) -> list[str]:
    """The clock limits active in some sample of a :func:`summarise` dict, the GPU's idling left
    out (no limit on a timing's clock), by name."""
    return sorted(r for r in summary["clock_limits"] if r != "gpu_idle")


def describe(summaries: list[dict]) -> str | None:
    """One sentence on the GPU's state over several timings' summaries (None: no GPU was
    sampled): the SM clock's range, the most power drawn, and the clock limits that were active."""
    got = [s for s in summaries if s and "samples" in s]
    why = sorted({s["unavailable"] for s in summaries if s and "unavailable" in s})
    if not got:
        return f"The GPU's clocks were not sampled: {'; '.join(why)}." if why else None
    parts = []
    clocks = [s["sm_clock_mhz"] for s in got if "sm_clock_mhz" in s]
    if clocks:
        low, high = min(c["min"] for c in clocks), max(c["max"] for c in clocks)
        parts.append(f"SM clock {low:g}-{high:g} MHz" if low != high else f"SM clock {low:g} MHz")
    powers = [s["power_w"]["max"] for s in got if "power_w" in s]
    if powers:
        parts.append(f"up to {max(powers):g} W")
    active = sorted({r for s in got for r in limits(s)})
    limited = [f"{r} in {sum(1 for s in got if r in s['clock_limits'])} of {len(got)}" for r in active]
    parts.append("clock limits active: " + ", ".join(limited) if limited else "no clock limit active")
    timings = f"{len(got)} timing{'s' if len(got) != 1 else ''}"
    return f"The GPU while timed ({timings}, nvidia-smi): " + "; ".join(parts) + "."


class GpuSampler:
    """``with GpuSampler(gpu) as sampler: ...`` samples the GPU ``gpu`` (an ``nvidia-smi -i`` id;
    None: nothing is sampled) while the block runs; ``sampler.summary`` is then
    :func:`summarise`'s dict, ``{"unavailable": why}``, or None when nothing was asked for."""

    def __init__(self, gpu: str | None, interval_ms: int = INTERVAL_MS):
        self.gpu, self.interval_ms = gpu, interval_ms
        self.summary: dict | None = None
        self._proc: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._why: str | None = None

    def __enter__(self) -> GpuSampler:
        if self.gpu is None:
            return self
        exe = nvidia_smi()
        if exe is None:
            self._why = "nvidia-smi is not on PATH"
            return self
        command = [
            exe,
            "-i",
            self.gpu,
            f"--query-gpu={','.join(QUERY)}",
            "--format=csv,noheader,nounits",
            "-lms",
            str(self.interval_ms),
        ]
        try:
            self._proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,  # its own group: ended whole below
            )
        except OSError as exc:
            self._why = f"{exe} did not start: {exc}"
            return self
        self._reader = threading.Thread(target=self._read, name="gpu-sampler", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            self._lines.append(line.rstrip("\n"))

    def __exit__(self, *exc) -> None:
        if self.gpu is None:
            return
        if self._proc is not None:
            self._stop()
            samples = [s for s in map(parse, self._lines) if s is not None]
            if samples:
                self.summary = summarise(samples, self.interval_ms)
            else:
                said = next((line.strip() for line in self._lines if line.strip()), "")
                code = self._proc.returncode
                self._why = f"nvidia-smi gave no sample (exit code {code}{': ' + said if said else ''})"
        if self.summary is None:
            self.summary = {"unavailable": self._why}

    def _stop(self) -> None:
        proc = self._proc
        for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, None)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        proc.wait()
        self._reader.join(STOP_WAIT_S)
        proc.stdout.close()
