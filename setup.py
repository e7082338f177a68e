"""The one C extension: `tailrace.events._cwire`, the hot loops of the wire encoding
(metadata and everything else is in pyproject.toml)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tailrace.events._cwire", ["libs/tailrace/events/_cwire.c"],
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])])
