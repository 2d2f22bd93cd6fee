#!/usr/bin/env bash
# dflash-lab STAND-IN for the launcher of the training job on production ct200.
# Starts /root/train.py in the background with nohup, the way the team started the
# real job by hand, appending its output to /root/train_slammed5.log.
# Set TRAIN_IGNORE_SIGTERM=1 for a job that only SIGKILL stops.
set -euo pipefail

env_file=${TRAIN_ENV_FILE:-/etc/dflash-lab/training.env}
# Settings from the env file apply only where the caller did not set them,
# so `TRAIN_IGNORE_SIGTERM=1 /root/run.sh` wins over the file.
if [[ -f $env_file ]]; then
  while IFS='=' read -r key value; do
    [[ $key =~ ^[A-Z_][A-Z0-9_]*$ ]] || continue
    if [[ -z ${!key+x} ]]; then
      export "$key=$value"
    fi
  done <"$env_file"
fi
log=${TRAIN_LOG:-/root/train_slammed5.log}
train=${TRAIN_SCRIPT:-/root/train.py}

cd "$(dirname "$log")"
nohup python3 "$train" >>"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$(dirname "$log")/train.pid"
echo "training started: pid $pid, log $log"
