"""The SGLang Model Gateway's control plane, from the host it runs on: ctl.py is both the dflash_gateway_worker
module's code and the host's control-plane client (the smg_gateway role installs it as smg-ctl, whose file there is a
link to this one). Python 3 standard library only."""
