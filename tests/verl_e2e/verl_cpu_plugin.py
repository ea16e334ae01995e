"""`VERL_USE_EXTERNAL_MODULES=verl_cpu_plugin,...`: verl imports this module in every process
that imports verl (Ray workers and vLLM's worker processes included), so the CPU shims are
in place before verl needs them. Test support only (verl_cpu_shims.py)."""

import verl_cpu_shims

verl_cpu_shims.install()
