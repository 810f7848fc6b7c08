"""Timing calls to a budget with ``torch.utils.benchmark``, the device synchronised."""

from __future__ import annotations

import time

import torch


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


IQR_THRESHOLD = 0.1  # adaptive timing stops once the blocks' IQR is under 10 % of their median


def time_calls(fn, args: tuple, timing: dict, device: str, *, called: int = 0) -> dict:
    """Per-call milliseconds of ``fn(*args)`` timed to a budget with ``torch.utils.benchmark``:
    ``timing.warmup`` calls (less the ``called`` calls of ``fn(*args)`` the caller has just made
    itself, e.g. to compare its outputs: they warmed it up the same way), then
    ``blocked_autorange(min_run_time=timing.min_run_time_s)``, or with ``timing.max_run_time_s``
    ``adaptive_autorange`` (at least four blocks, until their IQR is under ``IQR_THRESHOLD`` of
    the median or ``max_run_time_s`` has passed).
    A timing of fixed counts (``warmup``, ``groups``, ``group_size``: the protocol of the first
    releases, :mod:`laya_build.release.formats`) times ``groups`` blocks of ``group_size`` calls.

    The clock synchronises ``device`` before each reading, so a block's time covers every
    CUDA kernel its calls launched; the torch thread count is left as the process has it
    (the Timer's default would time single-threaded).  Returns the median and IQR of the
    per-call times of the blocks, how many calls they rest on (``runs`` = blocks x
    ``block_size``) and each block's mean; on a CUDA device timed to a budget also ``gpu``, the
    GPU's clocks, power and clock limits while the blocks ran (:mod:`laya_build.runtime.gpu_state`).
    """
    from torch.utils.benchmark import Timer

    from laya_build.runtime.gpu_state import GpuSampler, device_id

    def clock() -> float:
        synchronize(device)
        return time.perf_counter()

    with torch.inference_mode():
        for _ in range(max(0, timing["warmup"] - called)):
            fn(*args)
        synchronize(device)
        timer = Timer("fn(*args)", globals={"fn": fn, "args": args}, timer=clock, num_threads=torch.get_num_threads())
        if "groups" in timing:  # fixed counts (a release of format 1 made before 2026-11-30 10:27)
            blocks = [timer.timeit(timing["group_size"]) for _ in range(timing["groups"])]
            m = type(blocks[0])(
                number_per_run=timing["group_size"],
                raw_times=[t for b in blocks for t in b.raw_times],
                task_spec=blocks[0].task_spec,
            )
            gpu = None
        else:
            with GpuSampler(device_id(device)) as sampler:
                if timing.get("max_run_time_s"):
                    m = timer.adaptive_autorange(
                        threshold=IQR_THRESHOLD,
                        min_run_time=timing["min_run_time_s"],
                        max_run_time=timing["max_run_time_s"],
                    )
                else:
                    m = timer.blocked_autorange(min_run_time=timing["min_run_time_s"])
            gpu = sampler.summary
    return {
        "median_ms": m.median * 1e3,
        "iqr_ms": m.iqr * 1e3,
        "runs": m.number_per_run * len(m.raw_times),
        "block_size": m.number_per_run,
        "blocks_ms": [t * 1e3 / m.number_per_run for t in m.raw_times],
        **({"gpu": gpu} if gpu is not None else {}),
    }
