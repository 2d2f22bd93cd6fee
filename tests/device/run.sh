#!/usr/bin/env bash
# Repeat the real-GPU check on any GPU host with Python 3 (an H200 test machine, a real PRO 6000 box):
#   tests/device/run.sh [OUT_DIR]
# 1. captures the raw driver outputs (nvidia-smi CSV/table/--version, /proc/driver/nvidia/version and each GPU's
#    /proc/driver/nvidia/gpus/<bus>/information, compute apps with a real CUDA process running, /proc/devices,
#    library links, dpkg) into OUT_DIR/captures/;
# 2. runs the repository's read-only parts with `ansible-playbook -i localhost, -c local --check`:
#    GPU probe, driver preflight, plan (playbooks/gpu_host_check.yml) -> OUT_DIR/play.log. The host is in no
#    inventory group, so it is planned on its own GPUs; a plan the planner refuses for this card (the models do not
#    fit it) is a result, said at the end of play.log with what would fit, and does not fail the check. Any other
#    failure of the play does;
# 3. measures the fixed GPU memory overheads the planner budgets for (tests/device/overhead.py, needs torch)
#    -> OUT_DIR/overhead.json.
# Offline hosts: put ansible-core and its wheels in .whl/ (see the device notes in README) and they are used.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/dflash-device-check}}
cap="$out/captures"
mkdir -p "$cap"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if ! python3 -c 'import ansible' 2>/dev/null; then
  site=/tmp/dflash-site
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
  else
    python3 -m pip install -q --target "$site" 'ansible-core>=2.19,<2.20'
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
fi

echo "== captures -> $cap"
fields=index,name,memory.total,driver_version,compute_cap,pci.bus_id,uuid
nvidia-smi --query-gpu=$fields --format=csv > "$cap/query-gpu-header.csv"
nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits > "$cap/query-gpu-noheader-nounits.csv"
nvidia-smi > "$cap/nvidia-smi.txt"
nvidia-smi --version > "$cap/nvidia-smi-version.txt"
cat /proc/driver/nvidia/version > "$cap/proc-driver-nvidia-version.txt"
cat /proc/devices > "$cap/proc-devices.txt"
for info in /proc/driver/nvidia/gpus/*/information; do
  [[ -f "$info" ]] && cp "$info" "$cap/proc-driver-nvidia-gpus-$(basename "$(dirname "$info")" | tr : _)-information.txt"
done
{
  for lib in libnvidia-ml.so.1 libcuda.so.1; do
    for f in $(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF}'); do echo "$f -> $(readlink -f "$f")"; done
  done
  echo "--- dpkg -l '*nvidia*'"
  dpkg -l '*nvidia*' 2>&1 | grep -E '^(ii|hi|rc|iU|iF)' || echo "(no dpkg package)"
} > "$cap/libraries.txt"

# A real CUDA process holding memory, so the process captures show one.
python3 - <<'PY' &
import time, torch
x = torch.empty(10 * 1024**3, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
time.sleep(60)
PY
holder=$!
for _ in $(seq 60); do
  nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break
  sleep 1
done
nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format=csv > "$cap/query-compute-apps.csv"
nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory --format=csv,noheader,nounits > "$cap/query-compute-apps-noheader.csv"
nvidia-smi > "$cap/nvidia-smi-with-process.txt"
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true

echo "== read-only play -> $out/play.log"
play_rc=0
ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_NOCOLOR=1 ansible-playbook -i localhost, -c local \
  -e ansible_python_interpreter="$(command -v python3)" \
  playbooks/gpu_host_check.yml --check --diff 2>&1 | tee "$out/play.log" || play_rc=$?
if [[ $play_rc != 0 ]]; then
  # The task that failed: the last task header before the first failure.
  failed_task=$(awk '/^TASK \[/ {task=$0} /^fatal:/ {print task; exit}' "$out/play.log")
  if [[ $failed_task == *"serving_plan : Compute the deployment plan"* ]] && grep -q "does not fit on" "$out/play.log"; then
    echo "== the planner refused the catalogue's models on this card (play.log says what would fit): a result" \
      | tee -a "$out/play.log"
    play_rc=0
  fi
fi

echo "== memory overheads -> $out/overhead.json"
python3 tests/device/overhead.py | tee "$out/overhead.json"
exit "$play_rc"
