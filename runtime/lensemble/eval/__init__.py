"""Held-out evaluation of world models."""
