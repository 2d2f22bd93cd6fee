"""Verified, resumable, atomic model copies, run ON the hosts by the dflash_model_sync module.

A manifest lists every file of a model folder with its size and sha256. It is computed once at the source
and cached (a file is hashed again only when its size or mtime changes), compared with the destination,
and the missing or different files are pulled with rsync into a staging folder on the same file system,
hashed while rsync writes them, and renamed into the final path only after their sha256 matched, so
nothing half-written ever sits there. Python 3 standard library only; one concern per file.
"""
