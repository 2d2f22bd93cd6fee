"""Inert torchvision stand-in for loading the SGLang 0.5.19 argument parser on CPU.

Only satisfies import-time names; nothing here is used while parsing arguments.
"""

__version__ = "0.0.0+parser-stand-in"
