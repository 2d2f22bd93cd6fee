"""Read-only collectors of a host's state for the dflash_host_state module: one concern per file.

Everything here runs ON the host inside the module (Python 3 standard library only), reads and never
writes, and returns JSON-able data. Outputs that the controller already parses with tested parsers
(nvidia-smi CSV, /proc text, dpkg-query lines) are returned as text; the controller's
dflash_infra.host_state turns the whole result into the state the stages decide from.
"""
