"""How a workload's requests are released: closed loop at a concurrency, or seeded open loop.

Closed loop: ``concurrency`` simulated users each send a request (or a whole session, turn after
turn) and the next one as soon as it ends; it cannot over-saturate a server, so trials compare.

Open loop: requests (for multi-turn presets, sessions) start at seeded times whatever the server
does, so queueing shows. Gaps are gamma-distributed with shape ``burstiness`` and mean ``1/rate``:
burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular. As vLLM's benchmark does,
the gaps are rescaled so that N releases take exactly N / rate seconds. ``concurrency`` then caps
the requests in flight (None: no cap). The release times come from their own seeded generator, so
changing the arrival pattern never changes the requests themselves.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any

from tuner.errors import ConfigError

MIN_BURSTINESS = 1e-3


@dataclass(frozen=True)
class Arrival:
    rate: float | None = None  # releases per second; None is a closed loop
    burstiness: float = 1.0
    concurrency: int | None = 4
    recorded: bool = False  # a trace's own timestamps give the release times

    @property
    def open_loop(self) -> bool:
        return self.rate is not None or self.recorded

    def describe(self) -> str:
        if self.recorded:
            cap = "no cap" if self.concurrency is None else f"at most {self.concurrency} in flight"
            return f"open loop at the trace's timestamps, {cap}"
        if self.rate is None:
            return f"closed loop, concurrency {self.concurrency}"
        shape = "Poisson" if self.burstiness == 1.0 else f"gamma, burstiness {self.burstiness:g}"
        cap = "no cap" if self.concurrency is None else f"at most {self.concurrency} in flight"
        return f"open loop, {self.rate:g}/s ({shape}), {cap}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "burstiness": self.burstiness,
            "concurrency": self.concurrency,
            "recorded": self.recorded,
        }


def check_flags(concurrency: int | None, rate: float | None, burstiness: float | None) -> None:
    """The arrival flags' own ranges, checked before anything is looked up or started."""
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"--concurrency must be at least 1, got {concurrency}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"--rate must be a positive number of requests per second, got {rate}")
    if burstiness is not None and not (math.isfinite(burstiness) and burstiness >= MIN_BURSTINESS):
        # below this the gamma gaps underflow: their sum is 0 and nothing can be rescaled to the rate
        raise ConfigError(f"--burstiness must be at least {MIN_BURSTINESS:g} (1 is Poisson), got {burstiness}")


def override(
    preset: Arrival, concurrency: int | None = None, rate: float | None = None, burstiness: float | None = None
) -> Arrival:
    """Apply the command line over a preset's arrival pattern.

    ``--rate`` makes an open loop (with ``--concurrency`` as its cap); ``--concurrency`` alone makes a
    closed loop; ``--burstiness`` alone reshapes an open-loop preset and is refused for a closed one.
    """
    check_flags(concurrency, rate, burstiness)
    if rate is not None:
        shape = burstiness if burstiness is not None else preset.burstiness if preset.open_loop else 1.0
        return Arrival(rate=rate, burstiness=shape, concurrency=concurrency)
    if concurrency is not None:
        if burstiness is not None:
            raise ConfigError("--burstiness shapes an open loop: give --rate too")
        return Arrival(concurrency=concurrency)
    if burstiness is not None:
        if preset.rate is None:
            raise ConfigError("--burstiness shapes seeded open-loop gaps and this workload has none: give --rate too")
        return replace(preset, burstiness=burstiness)
    return preset


def release_times(n: int, arrival: Arrival, seed: int) -> list[float | None]:
    """Seconds after the start at which each of ``n`` units is released; all None in a closed loop."""
    if arrival.rate is None or n == 0:
        return [None] * n
    rng = random.Random(f"arrivals:{seed}")
    scale = 1.0 / (arrival.rate * arrival.burstiness)
    gaps = [rng.gammavariate(arrival.burstiness, scale) for _ in range(n)]
    stretch = (n / arrival.rate) / sum(gaps)
    times: list[float | None] = []
    now = 0.0
    for gap in gaps:
        times.append(round(now, 6))  # microseconds: stable bytes in the digest and the JSONL
        now += gap * stretch
    return times


def in_flight_cap(arrival: Arrival, units: int) -> int:
    """The driver's concurrency: the closed loop's, the open loop's cap, or every unit at once."""
    if arrival.concurrency is not None:
        return arrival.concurrency
    return max(units, 1)
