"""The planner's steps, in the order `dflash_infra.planner.plan` runs them.

1. `validate`: the request's shape, both models, the speculative settings and the engine release.
2. `sizing.memory_model` + `topology`: the per-GPU memory of each TP size, then the TP and DP to use.
3. `sizing`: the static memory fraction, running requests, context length and the per-GPU split.
4. `argv`: attention kernels and the engine command line, as the release spells its flags.

Each step appends its sentences to one `Notes` (errors refuse the plan, warnings qualify it, reasons
explain each setting) and returns a typed value, or None when it refused.
"""
