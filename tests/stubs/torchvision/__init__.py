"""Inert torchvision stand-in for loading SGLang's argument parser and resolution rules on a CPU machine.

PyPI's torchvision does not import beside the parser venv's CPU torch. SGLang's imports name torchvision only at
import time (0.5.19: `torchvision.io.decode_jpeg`; 0.5.23's model-config imports, through transformers' image
utilities: `torchvision.transforms`, `.functional`, `.v2`, ...). Parsing and resolving a command line never touches
an image, so every `torchvision.*` module is made here on import and every name in it is a placeholder that refuses
to be called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, NoReturn

__version__ = "0.0.0+parser-stand-in"


class Inert:
    """A function, class or enum the stand-in names; calling it is an error, its attributes are placeholders."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Inert:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Inert(f"{self._name}.{attr}")

    def __call__(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise RuntimeError(f"torchvision stand-in from tests/stubs: {self._name} is not available; this environment "
                           "only loads SGLang's argument parser and resolution rules")

    def __mro_entries__(self, _bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # a class that subclasses a stand-in name is a plain class


class _InertModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Inert:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Inert(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every `torchvision.<sub>` module that has no file here an inert package."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec  # a real file of the stand-in (io.py)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
