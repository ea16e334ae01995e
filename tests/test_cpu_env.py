"""The `fp8rl` command's thread defaults: GOMP_SPINCOUNT=0 before torch loads, unless chosen."""

import os
import subprocess
import sys

import pytest

from fp8rl._cpu_env import apply_cpu_defaults


def test_sets_spincount_zero_when_the_user_chose_nothing():
    env = {"PATH": "/bin"}
    assert apply_cpu_defaults(env) == {"GOMP_SPINCOUNT": "0"}
    assert env["GOMP_SPINCOUNT"] == "0"


@pytest.mark.parametrize("own", [{"GOMP_SPINCOUNT": "10000"}, {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_a_users_own_setting_wins(own):
    env = dict(own)
    assert apply_cpu_defaults(env) == {}
    assert env == own


def test_the_cli_sets_it_before_torch_is_imported():
    """libgomp reads the variable once at load: the CLI module must set it before importing
    torch, so importing fp8rl.cli in a fresh interpreter must neither import torch first nor
    leave the variable unset."""
    code = (
        "import sys, os; import fp8rl.cli; "
        "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    spin, torch_loaded = out.stdout.split()
    assert spin == "0"
    assert torch_loaded == "False"  # nothing loaded torch before the setting could take effect
