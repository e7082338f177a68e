"""The C extensions (metadata and everything else is in pyproject.toml):
`tailrace.events._cwire`, the hot loops of the wire encoding, and `tailrace.events._cjson`,
the sinks' JSON written from an event's bytes."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(ext_modules=[
    Extension("tailrace.events._cwire", ["libs/tailrace/events/_cwire.c"],
              depends=["libs/tailrace/events/_cbuf.h"], extra_compile_args=_FLAGS),
    Extension("tailrace.events._cjson", ["libs/tailrace/events/_cjson.c"],
              depends=["libs/tailrace/events/_cbuf.h"], extra_compile_args=_FLAGS),
])
