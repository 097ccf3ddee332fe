"""Prefill/decode in two processes: a prefill worker publishes KV-cache blocks, a decode worker
pulls the blocks of each request and tells the prefill worker, with a notification per batch,
that it may reuse them.

    python3 prefill_decode.py              # runs both roles (the prefill worker in a child)

The two learn each other's endpoint and epoch from a line of JSON (in a deployment, a
registry or the scheduler hands them over); nothing is pickled.
"""

import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np

import orbite
from orbite import Perm, Request

LAYERS, BLOCKS, TOKENS, HEADS, DIM = 4, 64, 16, 8, 64
BLOCK_BYTES = TOKENS * HEADS * DIM * 2  # one layer's keys of one block, float16


def prefill():
    """Fill the KV cache, publish it, and free blocks as decode workers say they have them."""
    with orbite.Engine({"endpoint": "127.0.0.1:0"}) as engine:
        kv = np.empty((LAYERS, BLOCKS, TOKENS, HEADS, DIM), dtype=np.float16)
        for layer in range(LAYERS):
            kv[layer] = np.arange(BLOCKS * TOKENS * HEADS * DIM, dtype=np.float32).reshape(kv.shape[1:]) % 251 + layer
        reg = engine.register(kv, Perm.REMOTE_READ)  # peers may READ it, never write
        print(json.dumps({"endpoint": engine.endpoint, "epoch": engine.epoch, "kv": reg.address,
                          "layer_stride": kv.strides[0], "block_stride": kv.strides[1]}), flush=True)
        freed = 0
        while freed < 3:  # three requests' blocks
            for note in engine.poll_notifications():
                done = json.loads(note.data)
                freed += 1
                print("prefill: %s has blocks %s of request %s" % (note.sender[:8], done["blocks"], done["request"]),
                      file=sys.stderr)
            if freed < 3:
                time.sleep(0.01)
        sys.stdin.read()  # serve until the decode worker is done with us


async def decode(info):
    """Pull each request's blocks (every layer) into local KV memory, concurrently."""
    with orbite.Engine({"enable_source": False}) as engine:
        local = np.zeros((LAYERS, BLOCKS, TOKENS, HEADS, DIM), dtype=np.float16)
        lreg = engine.register(local)
        seg = engine.open_segment(info["endpoint"], info["epoch"])

        async def pull(request_id, blocks):
            reqs = [Request.read(lreg.address + layer * local.strides[0] + b * local.strides[1],
                                 info["kv"] + layer * info["layer_stride"] + b * info["block_stride"], BLOCK_BYTES)
                    for layer in range(LAYERS) for b in blocks]
            note = json.dumps({"request": request_id, "blocks": blocks}).encode()
            batch = engine.submit(seg, reqs, notify=note)  # the note arrives after the data
            report = await batch
            batch.free()
            return report

        reports = await asyncio.gather(pull(1, [0, 1, 2]), pull(2, [10, 11]), pull(3, list(range(20, 28))))
        for r in reports:
            assert r.done and r.status == 0 and r.notification == orbite.NotifyState.DELIVERED
        expected = np.arange(BLOCKS * TOKENS * HEADS * DIM, dtype=np.float32).reshape(local.shape[1:]) % 251
        for b in [0, 1, 2, 10, 11] + list(range(20, 28)):
            for layer in range(LAYERS):
                assert np.array_equal(local[layer, b], (expected[b] + layer).astype(np.float16))
        seg.close()
        return sum(r.completed_bytes for r in reports)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "prefill":
        prefill()
        return 0
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "prefill"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    info = json.loads(child.stdout.readline())
    moved = asyncio.run(decode(info))
    child.stdin.close()
    assert child.wait(30) == 0
    print("decode: pulled %d bytes of KV cache in 3 requests" % moved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
