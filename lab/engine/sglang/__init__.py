"""LAB STAND-IN for SGLang (package `sglang`, version 0.5.23+lab): NOT the real engine.

dflash-infra's lab installs this package where production installs the real `sglang` wheel, through
the same role code path, so deploys can be rehearsed on machines without GPUs. It parses the
command line with the flag table extracted from the real SGLang wheel, applies the real DFLASH
start-up rules, logs start-up lines in SGLang's formats and serves SGLang's HTTP surface with
deterministic, non-inferred answers. It never loads a model and must never be used in production.
See lab/engine/README.md.
"""

from sglang.version import __version__

STANDIN = True

__all__ = ["STANDIN", "__version__"]
