"""Bindery: a Kubernetes scheduler that delegates placement to an external resource manager."""

__version__ = "0.1.0"
