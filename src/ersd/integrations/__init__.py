"""Integrations of ERSD into other serving stacks (each optional, imported lazily)."""
