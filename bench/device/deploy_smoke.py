#!/usr/bin/env python3
"""The deploy's smoke step against the real engine (device tool; bench/device/h200_serve.sh SMOKE=1).

What `k26ops deploy` asks a served engine after a restart or on a converged run:
the service step's engine agent (k26ops/agents/engine.py, op `smoke`) with the
SmokeStep's own requests (greedy, then sampled; text prompt, the API key from
the secrets the deploy read), through the same `connection: local` session the
other device scripts use. Without a systemd unit here (the device has none),
so the agent's crash check after a failed request is not reached.

    K26_KEY=... python3 bench/device/deploy_smoke.py INVENTORY PORT > OUT.json

Prints one JSON document: the answer without the key (the engine must refuse:
401) and with it (both requests answered, text and spec figures), and the line
the deploy prints for it (steps.engine.smoke_summary). The key is never printed.
"""

from __future__ import annotations

import json
import os
import sys

from k26ops.engine.host import agent
from k26ops.inventory import load
from k26ops.steps.engine import SmokeStep, smoke_outcome, smoke_summary
from k26ops.transport.ssh import connect


def main() -> int:
    inv, port = sys.argv[1], int(sys.argv[2])
    key = os.environ["K26_KEY"]
    host = next(iter(load(inv).hosts.values()))
    body, timeout = SmokeStep({}).request()
    out = {"request": body}
    session = connect(host)
    try:
        for name, api_key in (("without_key", None), ("with_key", key)):
            r = agent(
                session,
                "smoke",
                timeout=timeout,
                port=port,
                host="127.0.0.1",
                unit=None,
                base=None,
                api_key=api_key,
                **body,
            )
            out[name] = {
                "failed": r["failed"],
                "results": [
                    {k: v for k, v in res.items() if k != "body"}
                    | {
                        "body": res["body"]
                        if isinstance(res["body"], str)
                        else {"text": res["body"].get("text"), "meta_info": res["body"].get("meta_info")}
                    }
                    for res in r["results"]
                ],
            }
            if not r["failed"]:
                s = smoke_outcome(r["results"])
                out[name]["deploy_says"] = smoke_summary(s)
    finally:
        session.close()
    print(json.dumps(out, indent=1, default=str).replace(key, "<KEY>"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
