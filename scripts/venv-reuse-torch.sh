# Sourced by the scripts that build a peer's venv (check-vllm.sh, check-verl-e2e.sh).
# venv_reusing_torch VENV TORCH_FROM PY LABEL: makes VENV (with PY) if missing, and where
# TORCH_FROM is a python whose torch is the 2.13.0+cpu vLLM pins, reuses that torch (several GB
# saved) through a .pth file pointing at links to torch alone, so none of that venv's other
# packages (its newer transformers) leak in; pip installs torch's small dependencies itself.
venv_reusing_torch() {
  local venv=$1 torch_from=$2 py=$3 label=$4
  if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
  fi
  local site want src links name
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  if [ -n "$torch_from" ] && [ -x "$torch_from" ]; then
    want=$("$torch_from" -c "import torch; print(torch.__version__)")
    if [ "$want" = "2.13.0+cpu" ]; then
      src=$("$torch_from" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
      links="$venv/reused-torch"
      mkdir -p "$links"
      for name in torch functorch torchgen "torch-$want.dist-info"; do
        [ -e "$src/$name" ] && ln -sfn "$src/$name" "$links/$name"
      done
      echo "$(cd "$links" && pwd)" > "$site/zz-reuse-torch.pth"
    else
      echo "$label: $torch_from has torch $want, not the 2.13.0+cpu vLLM pins: pip installs it"
    fi
  fi
}
