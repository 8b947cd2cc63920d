"""A kernel that tries to leave its container: a correct softmax that raises (verdict `error`)
as soon as any escape works. Passing the contract gate inside the container proves that the
workspace is read-only and its .git hidden, there is no network, no token, and kgate is not root."""

import os
import socket

import torch


def _escapes():
    found = []
    try:
        with open("/workspace/written-by-kernel", "w") as f:
            f.write("x")
        found.append("wrote into the workspace")
    except OSError:
        pass
    # No traffic is sent: with network "none" the only interface is the loopback.
    interfaces = [name for _, name in socket.if_nameindex() if name != "lo"]
    if interfaces:
        found.append("has network interfaces " + ", ".join(interfaces))
    if any("TOKEN" in k for k in os.environ):
        found.append("saw a token variable")
    if os.getuid() == 0:
        found.append("runs as root")
    # actions/checkout leaves the job's token in .git/config unless `persist-credentials: false`
    if os.path.isdir("/workspace/.git") and os.listdir("/workspace/.git"):
        found.append("can read the checkout's .git (and a token actions/checkout may have left there)")
    return found


def softmax(x):
    found = _escapes()
    if found:
        raise RuntimeError("escaped the container: " + "; ".join(found))
    return torch.softmax(x, dim=-1)
