"""Tailrace shared library: event model, codecs, config, bus, logging. No service logic."""
