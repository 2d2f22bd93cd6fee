"""LAB STAND-IN internals of the fake `sglang` package: parser, start-up rules, memory log, HTTP server.

None of this is SGLang code; it imitates SGLang's observable behaviour for the dflash-infra lab.
"""
