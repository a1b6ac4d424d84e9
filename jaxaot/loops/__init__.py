"""Reverse-mode ``while_loop``: primitives, their rules, and the public wrappers."""
