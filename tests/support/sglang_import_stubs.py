"""Staged as `sitecustomize.py` beside SGLang's wheel tree (tests/support/sglang_server.py):
every module that SGLang's own files import and this machine lacks (torch, triton, starlette,
...) becomes a stub, so `sglang.srt.server_args` imports and its real argument parser runs
without a GPU. Only imports made from a file under `/sglang/` are stubbed; everything else
still fails as it would."""

from __future__ import annotations

import abc
import importlib.abc
import importlib.machinery
import sys
import types

# Device namespaces SGLang probes with hasattr(torch, ...): absent, so CUDA is assumed.
ABSENT = {"npu", "xpu", "musa", "hpu", "mlu", "mps"}


class _Meta(abc.ABCMeta):
    """A stub class: any attribute, call, subscript or arithmetic gives another stub."""

    def __getattr__(cls, name: str):
        if (name.startswith("__") and name.endswith("__")) or name in ABSENT:
            raise AttributeError(name)
        return stub_class(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_stub"):
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]  # used as a decorator
            return stub_class(f"{cls.__name__}()")
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __int__(cls) -> int:
        return 0

    __index__ = __int__

    def __float__(cls) -> float:
        return 0.0

    def __lt__(cls, other) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __add__(cls, other):
        return cls

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __add__


def stub_class(name: str) -> type:
    return _Meta(name, (), {"_stub": True})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name == "__version__":
            return "2.9.0"
        if name.startswith("__") or name in ABSENT:
            raise AttributeError(name)
        value = stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: answers only for modules nothing else found."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "sglang":
            return None
        frame = sys._getframe(1)
        while frame is not None and "importlib" in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is not None and "/sglang/" in frame.f_code.co_filename:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


sys.meta_path.append(_Finder())
