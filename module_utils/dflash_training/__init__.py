"""Stopping the training job that holds the GPUs, and starting it again, run ON the hosts by the dflash_training
module: find the job in /proc (never the serving engine), record it, SIGTERM with a deadline then SIGKILL with
pid-reuse checks, prove the GPUs are free; resume it from its record. Python 3 standard library only; one
concern per file."""
