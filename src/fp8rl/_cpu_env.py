"""Thread settings the `fp8rl` command applies before torch (and its OpenMP runtime) loads.

On a small shared CPU, libgomp's threads spin-wait between parallel regions; when another
process holds a core, a thread spinning for a core its sibling needs stalls both
(docs/training.md, "CPU threads"). `GOMP_SPINCOUNT=0` makes them sleep instead. libgomp
reads it once, when it loads, so it must be set before the first `import torch`; a user's own
setting (or an explicit OpenMP wait policy) wins.
"""

from __future__ import annotations

import os

OWN_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def apply_cpu_defaults(environ=os.environ) -> dict[str, str]:
    """Set GOMP_SPINCOUNT=0 unless the user chose a spin or wait policy; returns what was set."""
    if any(name in environ for name in OWN_SETTINGS):
        return {}
    environ["GOMP_SPINCOUNT"] = "0"
    return {"GOMP_SPINCOUNT": "0"}
