"""Tailrace services: one folder per service, each with its own entry point."""
