"""Inert `torchvision.io` stand-in: the name exists, calling it is an error."""

from typing import Any, NoReturn


def decode_jpeg(*_args: Any, **_kwargs: Any) -> NoReturn:
    """Refuse to decode: this stand-in exists only so the argument parser imports."""
    raise RuntimeError(
        "torchvision stand-in from tests/stubs: decode_jpeg is not available; "
        "this environment only loads the SGLang argument parser"
    )
