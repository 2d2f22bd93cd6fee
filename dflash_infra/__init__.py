"""dflash-infra: plan and deploy SGLang with DFlash speculative decoding to Proxmox GPU containers."""

__version__ = "0.1.0"
