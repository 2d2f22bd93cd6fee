"""LAB STAND-IN version of the `sglang` package: the SGLang release it imitates, with the local tag +lab.

lab/engine/build_wheel.sh rewrites this line in its build copy when asked for another release.
"""

__version__ = "0.5.23+lab"
