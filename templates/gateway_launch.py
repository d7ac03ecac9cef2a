"""k26ops' launcher of the SGLang Model Gateway (sglang-router), run by the gateway unit
with the gateway release's own python.

sglang-router 0.3.2 takes its admin API key only on the command line
(`--control-plane-api-keys id:name:role:key`), where `ps` and /proc/PID/cmdline
show it to every user. This launcher reads the key from its environment (the unit's
EnvironmentFile, mode 0600), drops it from the environment and adds the argument in
memory before starting the router: the process's argv never holds it.
"""
import os
import sys

KEY_ENV = "K26OPS_GATEWAY_ADMIN_KEY"


def main() -> None:
    args = sys.argv[1:]
    key = os.environ.pop(KEY_ENV, "")
    if key:
        args += ["--control-plane-api-keys", "k26ops:k26ops:admin:" + key]
    from sglang_router.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args(args))


if __name__ == "__main__":
    main()
